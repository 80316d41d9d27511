"""Drafted tokens coloured in a rendered Markdown document, block by block.

May touch: the :class:`~textual.widgets.Markdown` widget it is given (its blocks' content);
the character alignment is :func:`app.ui.alignment.align_offsets`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from textual.content import Content, Span
from textual.style import Style
from textual.widgets import Markdown

from ..alignment import align_offsets


def colour_markdown(md: Markdown, drafted: Sequence[tuple[int, int, str, int, int]],
                    styles: Mapping[str, Style]) -> int:
    """Colour the drafted characters of a rendered :class:`Markdown` document (its source is the
    reply's text; ``drafted``: ``(start, end, by, pos, run)`` character ranges of the source, as
    :class:`ReplyBody` keeps them) in their speculator's colour, block by block. Each block's
    content is rebuilt from its own token first, so colouring twice is colouring once. Tables
    stay uncoloured. Returns the characters coloured."""
    from textual.widgets._markdown import MarkdownBlock, MarkdownFence
    source = md.source
    owner: list[tuple[str, int, int] | None] = [None] * len(source)
    for s0, s1, by, pos, run in drafted:
        for c in range(max(0, s0), min(s1, len(source))):
            owner[c] = (by, pos, run)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    fallback = Style(bold=True)
    n_coloured = 0
    for block in md.query(MarkdownBlock):
        if isinstance(block, MarkdownFence):
            fresh = block._highlighted_code
            first_line = 1      # past the opening fence
        elif block._inline_token is not None:
            fresh = block._token_to_content(block._inline_token)
            first_line = 0
        else:
            continue
        l0, l1 = block.source_range
        l0 = min(l0 + first_line, len(starts) - 1)
        l1 = min(max(l1, l0), len(starts) - 1)
        base = starts[l0]
        offsets = align_offsets(fresh.plain, source[base:starts[l1]])
        spans: list[Span] = []
        i = 0
        while i < len(offsets):
            o = offsets[i]
            who = owner[base + o] if o is not None else None
            if who is None:
                i += 1
                continue
            by, pos, run = who
            j = i + 1      # the rest of this draft's run (its tokens are consecutive positions)
            while j < len(offsets) and offsets[j] is not None and (nxt := owner[base + offsets[j]]) is not None \
                    and (nxt[0], nxt[2]) == (by, run):
                j += 1
            spans.append(Span(i, j, styles.get(by, fallback) + Style.from_meta({"by": by, "pos": pos, "run": run})))
            n_coloured += j - i
            i = j
        if spans or block._content.spans != fresh.spans:
            block.set_content(Content(fresh.plain, list(fresh.spans) + spans))
    return n_coloured
