"""Where each character of rendered Markdown came from in its source text (no Textual: tested alone).

May touch: nothing but its arguments. Used to colour drafted tokens in the Markdown view
(:func:`app.ui.widgets.markdown_colour.colour_markdown`).
"""

from __future__ import annotations


def align_offsets(shown: str, source: str, window: int = 64) -> list[int | None]:
    r"""For each character of ``shown`` (text Markdown rendered from ``source``), its offset in
    ``source``, or None where it has none (a bullet, a replaced character).

    Rendering drops markup (``**``, backticks, link targets, a quote's ``>``) and turns line
    breaks into spaces, so the characters are matched in order, whitespace to any whitespace,
    each searched for at most ``window`` characters ahead of the last match::

        >>> src = "Some **bold** and `code`\nnext line"
        >>> shown = "Some bold and code next line"
        >>> offs = align_offsets(shown, src)
        >>> "".join(src[o] for o in offs).replace("\n", " ") == shown
        True
        >>> src[offs[shown.index("code")]:offs[shown.index("code")] + 4]
        'code'
    """
    out: list[int | None] = []
    j = 0
    n = len(source)
    for ch in shown:
        ws = ch.isspace()
        k, lim = j, min(n, j + window)
        while k < lim and not (source[k] == ch or (ws and source[k].isspace())):
            k += 1
        if k < lim:
            out.append(k)
            j = k + 1
        else:
            out.append(None)
    return out
