"""Turning theme data (themes/) into Textual themes and draft-token styles."""

from __future__ import annotations

from textual.color import Color
from textual.style import Style
from textual.theme import Theme

from themes import DraftStyle, ThemeData


def to_textual(t: ThemeData) -> Theme:
    c = t.colors
    return Theme(name=t.name, primary=c["primary"], secondary=c.get("secondary"), accent=c.get("accent"),
                 foreground=c.get("foreground"), background=c.get("background"), surface=c.get("surface"),
                 panel=c.get("panel"), boost=c.get("boost"), success=c.get("success"),
                 warning=c.get("warning"), error=c.get("error"), dark=t.dark)


def to_style(d: DraftStyle) -> Style:
    return Style(foreground=Color.parse(d.fg) if d.fg else None,
                 background=Color.parse(d.bg) if d.bg else None,
                 bold=True if d.bold else None, italic=True if d.italic else None,
                 underline=True if d.underline else None)


def draft_styles(t: ThemeData) -> dict[str, Style]:
    from themes import SPEC_NAMES
    return {name: to_style(t.draft_style(name)) for name in SPEC_NAMES}
