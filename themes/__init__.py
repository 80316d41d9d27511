"""Themes as data: the built-in ``*.toml`` files beside this module, plus user themes.

A theme file names the interface colours and one style per speculator
type, used to colour the tokens that type drafted and the model accepted::

    name = "dark"            # what config.toml's ui.theme refers to
    label = "Dark"           # shown in the command palette
    dark = true

    [colors]                 # the app's palette (#rgb or #rrggbb)
    primary = "#7aa2f7"
    background = "#1a1b26"
    ...

    [draft]                  # "FG", "FG on BG", plus bold/italic/underline
    "ngram-mod" = "#e0af68"
    "ngram-simple" = "bold #000000 on #00ffff"

User themes live in ``paths.user_themes_dir()`` (``<config dir>/themes``).
A broken user theme is reported (see :func:`load_all`) and skipped; a
type missing from a user theme takes the colour of the built-in theme of
the same darkness. This module does not import Textual.

>>> t = parse_theme({"name": "x", "colors": {"primary": "#123"}, "draft": {"ngram-mod": "#ff0"}})
>>> t.draft["ngram-mod"].fg
'#ffff00'
>>> parse_draft_style("bold #000 on #0ff").bg
'#00ffff'
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from speculators.types import PRIORITY

BUILTIN_DIR = Path(__file__).resolve().parent
BUILTIN_ORDER = ("dark", "light", "high-contrast")
DEFAULT_THEME = "dark"

COLOR_KEYS = ("primary", "secondary", "accent", "foreground", "background", "surface", "panel",
              "boost", "success", "warning", "error")
SPEC_NAMES = tuple(t.value for t in PRIORITY)

_HEX = re.compile(r"^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ThemeError(ValueError):
    """A theme file is malformed (the message says where)."""


@dataclass(frozen=True)
class DraftStyle:
    fg: str | None = None
    bg: str | None = None
    bold: bool = False
    italic: bool = False
    underline: bool = False

    def __str__(self) -> str:
        words = [w for w, on in (("bold", self.bold), ("italic", self.italic),
                                  ("underline", self.underline)) if on]
        if self.fg:
            words.append(self.fg)
        if self.bg:
            words += ["on", self.bg]
        return " ".join(words)


@dataclass
class ThemeData:
    name: str
    label: str
    dark: bool = True
    colors: dict[str, str] = field(default_factory=dict)
    draft: dict[str, DraftStyle] = field(default_factory=dict)
    source: str = "built-in"

    def draft_style(self, spec_type: str) -> DraftStyle:
        return self.draft.get(spec_type) or DraftStyle(fg=self.colors.get("accent") or "#ffaf00")


def _norm_hex(value: str, where: str) -> str:
    if not isinstance(value, str) or not _HEX.match(value.strip()):
        raise ThemeError(f"{where}: expected a colour like #rrggbb, got {value!r}")
    v = value.strip().lower()
    if len(v) == 4:
        v = "#" + "".join(c * 2 for c in v[1:])
    return v


def parse_draft_style(text: str, where: str = "draft") -> DraftStyle:
    """Parse ``"[bold] [italic] [underline] [FG] [on BG]"``."""
    if not isinstance(text, str) or not text.strip():
        raise ThemeError(f"{where}: expected a style string such as '#e0af68' or 'bold #000 on #ff0'")
    fg = bg = None
    flags = {"bold": False, "italic": False, "underline": False}
    words = text.split()
    i = 0
    while i < len(words):
        w = words[i].lower()
        if w in flags:
            flags[w] = True
        elif w == "on":
            if i + 1 >= len(words):
                raise ThemeError(f"{where}: 'on' must be followed by a colour")
            bg = _norm_hex(words[i + 1], where)
            i += 1
        else:
            if fg is not None:
                raise ThemeError(f"{where}: unexpected {words[i]!r}")
            fg = _norm_hex(words[i], where)
        i += 1
    return DraftStyle(fg=fg, bg=bg, **flags)


def parse_theme(data: dict[str, Any], source: str = "built-in",
                fallback: "ThemeData | None" = None) -> ThemeData:
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ThemeError("'name' must be a short name made of letters, digits, '-', '_' or '.'")
    label = data.get("label", name.replace("-", " ").title())
    if not isinstance(label, str):
        raise ThemeError("'label' must be text")
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeError("'dark' must be true or false")
    colors_in = data.get("colors", {})
    if not isinstance(colors_in, dict):
        raise ThemeError("[colors] must be a table")
    colors: dict[str, str] = {}
    for k, v in colors_in.items():
        if k not in COLOR_KEYS:
            raise ThemeError(f"colors.{k}: unknown colour (known: {', '.join(COLOR_KEYS)})")
        colors[k] = _norm_hex(v, f"colors.{k}")
    if "primary" not in colors:
        if fallback is not None and "primary" in fallback.colors:
            colors["primary"] = fallback.colors["primary"]
        else:
            raise ThemeError("colors.primary is required")
    draft_in = data.get("draft", {})
    if not isinstance(draft_in, dict):
        raise ThemeError("[draft] must be a table")
    draft: dict[str, DraftStyle] = {}
    for k, v in draft_in.items():
        if k not in SPEC_NAMES:
            raise ThemeError(f"draft.{k}: unknown speculator type (known: {', '.join(SPEC_NAMES)})")
        draft[k] = parse_draft_style(v, f"draft.{k}")
    if fallback is not None:
        for k in SPEC_NAMES:
            if k not in draft and k in fallback.draft:
                draft[k] = fallback.draft[k]
    return ThemeData(name=name, label=label, dark=dark, colors=colors, draft=draft, source=source)


def load_file(path: Path, fallbacks: dict[str, ThemeData] | None = None) -> ThemeData:
    """Read one theme file; raises :class:`ThemeError` naming the file."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ThemeError(f"{path}: {e}") from None
    fb = None
    if fallbacks:
        fb = fallbacks.get("dark" if data.get("dark", True) is not False else "light")
    try:
        return parse_theme(data, source=str(path), fallback=fb)
    except ThemeError as e:
        raise ThemeError(f"{path}: {e}") from None


def load_builtin() -> dict[str, ThemeData]:
    """The built-in themes, in their fixed order (dark, light, high-contrast, ...)."""
    found = {}
    for p in sorted(BUILTIN_DIR.glob("*.toml")):
        t = load_file(p)
        t.source = "built-in"
        found[t.name] = t
    ordered = {n: found.pop(n) for n in BUILTIN_ORDER if n in found}
    ordered.update(found)
    return ordered


def load_user(directory: Path, builtin: dict[str, ThemeData] | None = None
              ) -> tuple[dict[str, ThemeData], list[str]]:
    """User themes from ``directory``: (themes by name, error messages)."""
    themes: dict[str, ThemeData] = {}
    errors: list[str] = []
    try:
        files = sorted(Path(directory).glob("*.toml"))
    except OSError as e:  # pragma: no cover - unreadable dir
        return themes, [f"{directory}: {e}"]
    for p in files:
        try:
            t = load_file(p, builtin)
        except ThemeError as e:
            errors.append(str(e))
            continue
        t.source = str(p)
        themes[t.name] = t
    return themes, errors


def load_all(user_dir: Path | None) -> tuple[dict[str, ThemeData], list[str]]:
    """Built-in themes then user themes (a user theme may replace a built-in one)."""
    builtin = load_builtin()
    themes = dict(builtin)
    errors: list[str] = []
    if user_dir is not None and Path(user_dir).is_dir():
        user, errors = load_user(user_dir, builtin)
        themes.update(user)
    return themes, errors
