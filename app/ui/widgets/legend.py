"""The legend line: each enabled speculator's colour, or what is under the pointer.

May touch: its own line (it is given what to show).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from textual.content import Content
from textual.style import Style

from .one_line import OneLine


def short_name(t: str) -> str:
    """``ngram-map-k4v`` -> ``map-k4v``, ``draft-mtp`` -> ``mtp``, ``draft-simple`` -> ``draft``
    (``simple`` is ngram-simple's) -- for narrow terminals."""
    if t == "draft-simple":
        return "draft"
    for prefix in ("ngram-", "draft-"):
        if t.startswith(prefix):
            return t[len(prefix):]
    return t


class Legend(OneLine):
    """The colour of each enabled speculator, and what is under the pointer."""

    DEFAULT_CSS = """
    Legend { height: 1; padding: 0 1; color: $text-muted; background: $surface; }
    """

    def show(self, types: Sequence[str], styles: Mapping[str, Style], colouring: bool,
             off_view: str, info: str | None = None, skipped: Mapping[str, str] | None = None,
             waiting: Sequence[str] = ()) -> None:
        """``types``: the speculators in use; ``waiting``: those configured while no model is loaded."""
        width = (self.size.width or 80) - 2
        if info:
            self.set_line(Content.assemble(("▸ ", "$accent"), (info, "$foreground")).truncate(width, ellipsis=True))
            return
        if not colouring:
            self.set_line(Content.assemble(
                (f"colouring off · {off_view} view", "$foreground-muted"), ("  F5 ", "bold $accent"),
                ("colour drafted tokens", "$foreground-muted")).truncate(width, ellipsis=True))
            return
        if not types:
            if waiting:
                msg = "speculation: " + ", ".join(waiting) + " (once a model is loaded)"
            elif skipped:
                msg = "speculation unavailable: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())
            else:
                msg = "no speculation on"
            self.set_line(Content.assemble(("  F3 ", "bold $accent"), ("settings  ", "$foreground-muted"),
                                         (msg, "$foreground-muted")).truncate(width, ellipsis=True))
            return
        long, short = list(types), [short_name(t) for t in types]
        # the labels stay as long as they can: names are shortened first, then the gaps, then
        # the words around them go
        tries = ((True, long, "  ", "   plain: the model itself"), (True, short, "  ", "   plain: the model itself"),
                 (True, short, " ", "  plain: the model"), (False, short, " ", ""))
        for prefix, names, gap, plain in tries:
            pieces: list[Any] = [("drafted by ", "$foreground-muted")] if prefix else []
            for i, (t, label) in enumerate(zip(types, names)):
                if i:
                    pieces.append(gap)
                st = styles.get(t)
                pieces.append(Content.styled(f" {label} ", st) if st is not None and st.background
                              else Content.styled(f"■ {label}", st or ""))
            if plain:
                pieces.append((plain, "$foreground-muted"))
            content = Content.assemble(*pieces)
            if content.cell_length <= width:
                break
        self.set_line(content.truncate(width, ellipsis=True))
