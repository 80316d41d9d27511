"""Word wrap of a reply's text into line offsets, in terminal cells (no Textual: tested alone).

May touch: ``rich.cells`` for a character's width. Used by :class:`app.ui.widgets.ReplyBody`.
"""

from __future__ import annotations

from rich.cells import get_character_cell_size


def _cell(ch: str) -> int:
    return 1 if " " <= ch < "\u0300" else get_character_cell_size(ch)


def wrap_lines(text: str, start: int, width: int) -> list[tuple[int, int]]:
    """Greedy word wrap of ``text[start:]`` into ``(start, end)`` offsets, ``width`` cells a line.

    Appending text never changes lines before the last one, so a growing
    reply is re-wrapped from the start of its last line only.
    """
    width = max(1, width)
    out: list[tuple[int, int]] = []
    n = len(text)
    i = start
    while True:
        nl = text.find("\n", i)
        para_end = n if nl < 0 else nl
        if i == para_end:
            out.append((i, i))
        while i < para_end:
            j = i
            w = 0
            last_break = -1
            while j < para_end:
                cw = _cell(text[j])
                if w + cw > width:
                    break
                w += cw
                if text[j] == " ":
                    last_break = j + 1
                j += 1
            if j >= para_end:
                out.append((i, para_end))
                i = para_end
                break
            if text[j] == " ":
                out.append((i, j))
                while j < para_end and text[j] == " ":
                    j += 1
                i = j
                if i == para_end:
                    break
            elif last_break > i:
                out.append((i, last_break))
                i = last_break
            else:
                out.append((i, j if j > i else i + 1))
                i = j if j > i else i + 1
        if nl < 0:
            break
        i = nl + 1
        if i == n:
            out.append((i, i))
            break
    return out
