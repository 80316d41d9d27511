"""A message's text as a Line API widget: drafted tokens coloured by their speculator.

Holds :class:`Run` (consecutive accepted tokens of one draft), :class:`ReplyBody` and the
:class:`ProvenanceHover` message it posts. May touch: the engine's ``TokenEvent`` records it is
given, :mod:`app.ui.wrapping`; never the session or the app.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from textual import events
from textual.content import Content, Span
from textual.geometry import Region
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.style import Style
from textual.widget import Widget

from speculators.events import TokenEvent

from ..wrapping import wrap_lines


@dataclass
class Run:
    """Consecutive accepted tokens of one draft."""

    start: int      # character offsets in the reply text
    end: int
    by: str
    pos0: int       # draft position of its first token
    pos1: int       # ... and of its last
    n: int = 1

    def describe(self) -> str:
        where = f"draft position {self.pos0}" if self.pos0 == self.pos1 else \
            f"draft positions {self.pos0}–{self.pos1}"
        return f"{self.by} · {where} · {self.n} token{'s' if self.n != 1 else ''}"


class ReplyBody(Widget):
    """The text of one message; drafted tokens coloured by their speculator.

    A Line API widget: the text is word-wrapped into line offsets, and only
    the lines on screen are rendered (each cached until it changes). A
    streamed token re-wraps the last line only, so the cost of a frame does
    not grow with the length of the reply.
    """

    DEFAULT_CSS = """
    ReplyBody { height: auto; width: 1fr; }
    """

    coloured: reactive[bool] = reactive(True)
    selected_run: reactive[int | None] = reactive(None)

    def __init__(self, text: str = "", tokens: Sequence[TokenEvent] | None = None, *,
                 styles: Mapping[str, Style] | None = None, palette_version: int = 0, probe: Any = None,
                 **kw: Any):
        super().__init__(**kw)
        #: the draft colours (pushed in by the app when the theme changes)
        self.draft_styles: Mapping[str, Style] = styles or {}
        self.palette_version = palette_version
        #: benchmark hook: records the lag from each token's event to the frame that shows it
        self.probe = probe
        #: the reply's tokens: the engine's own records
        self.tokens: list[TokenEvent] = []
        self._text = ""
        #: starts and (end, by, pos, run) of every drafted token with text, in order
        self._d_starts: list[int] = []
        self._drafted: list[tuple[int, int, str, int, int]] = []
        self.runs: list[Run] = []
        self._last_by: str | None = None
        self._last_pos: int | None = None
        self.n_tokens = 0
        self._wrap_width = -1
        self._lines: list[tuple[int, int]] = []
        #: while a reply streams, its height starts at this many lines and grows twice as many
        #: at a time (:meth:`_height`): a new line within them repaints that line alone instead
        #: of laying the whole screen out again (the app sets it where the model's threads leave
        #: the UI no core of its own)
        self.reserve = 1
        self._strips: dict[int, Strip] = {}
        self._strip_key: tuple = ()
        #: a reply that has not written anything yet shows "…" (a flag, not a CSS class: a class
        #: change re-applies the stylesheet to the node, twice a reply)
        self.pending = False
        #: the message's first line, who wrote it: (label, style), drawn here rather than as a
        #: widget of its own (see :class:`MessageView`); None: no such line
        self.head: tuple[str, str] | None = None
        self._head_strip: tuple[tuple, Strip] | None = None
        #: the content width while a render_lines call paints lines (asked once, not per line:
        #: ``size`` walks up to the screen and asks the compositor every time)
        self._paint_width: int | None = None
        #: lag probe (benchmark): when each token's event reached the worker
        self._times: list[float] = []
        self._probed = 0
        if tokens:
            self.append_tokens(tokens)
        elif text:
            self._text = text

    # -- content ---------------------------------------------------------------
    @property
    def text(self) -> str:
        return self._text

    def set_palette(self, styles: Mapping[str, Style], version: int) -> None:
        self.draft_styles = styles
        self.palette_version = version
        self.refresh()

    @property
    def top(self) -> int:
        """Lines above the text (the head's)."""
        return 0 if self.head is None else 1

    def set_pending(self, pending: bool) -> None:
        if pending != self.pending:
            self.pending = pending
            self._strips.pop(0, None)
            self.refresh()

    def set_text(self, text: str) -> None:
        self._text = text
        self.tokens = []
        self._d_starts.clear()
        self._drafted.clear()
        self.runs.clear()
        self._wrap_width = -1
        self._strips.clear()
        self.refresh(layout=True)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` characters (the engine trimmed a stop string it had streamed)."""
        if n >= len(self._text):
            return
        self._text = self._text[:n]
        from ...storage import truncate_tokens
        self.tokens = truncate_tokens(self.tokens, n)
        kept = [(s0, min(s1, n), by, pos, run) for s0, s1, by, pos, run in self._drafted if s0 < n]
        self._drafted = kept
        self._d_starts = [d[0] for d in kept]
        runs = [r for r in self.runs if r.start < n]
        if runs and runs[-1].end > n:
            runs[-1].end = n
        self.runs = runs
        self._wrap_width = -1
        self._lines = []
        self._strips.clear()
        self.refresh(layout=True)

    def append_tokens(self, tokens: Iterable[TokenEvent], times: Sequence[float] | None = None) -> None:
        """Add tokens (the engine's records: text, drafted_by, draft_pos)."""
        n0 = self.n_tokens
        pieces: list[str] = []
        length = len(self._text)
        for tok in tokens:
            self.tokens.append(tok)
            text, by, pos = tok.text, tok.drafted_by, tok.draft_pos
            self.n_tokens += 1
            if by is None or pos is None:
                self._last_by = None
                self._last_pos = None
            else:
                new_run = (by != self._last_by or self._last_pos is None or pos != self._last_pos + 1
                           or not self.runs)
                if text:
                    if new_run:
                        self.runs.append(Run(length, length + len(text), by, pos, pos))
                    else:
                        r = self.runs[-1]
                        r.end = length + len(text)
                        r.pos1 = pos
                        r.n += 1
                    self._d_starts.append(length)
                    self._drafted.append((length, length + len(text), by, pos, len(self.runs) - 1))
                self._last_by, self._last_pos = by, pos
            if text:
                pieces.append(text)
                length += len(text)
        if times is not None and self.probe is not None:
            self._times.extend([0.0] * (n0 - len(self._times)))
            self._times.extend(times)
        if not pieces:
            return
        self._text += "".join(pieces)
        n_lines = len(self._lines)
        if self._wrap_width <= 0:
            self.refresh(layout=True)
            return
        self._rewrap_tail()
        if self._height(len(self._lines)) != self._height(n_lines):
            self.refresh(layout=True)
        else:
            # the text grew within the lines it has room for: repaint the lines it changed alone
            # (a whole-widget refresh renders every visible line again, at each token)
            first = max(0, n_lines - 1)
            self.refresh(Region(0, self.top + first, max(1, self.size.width), max(1, len(self._lines) - first)))

    # -- wrapping ------------------------------------------------------------------
    def _ensure_wrapped(self, width: int) -> None:
        if width != self._wrap_width:
            self._wrap_width = width
            self._lines = wrap_lines(self._text, 0, width) if self._text else []
            self._strips.clear()

    def _rewrap_tail(self) -> None:
        if not self._lines:
            self._lines = wrap_lines(self._text, 0, self._wrap_width)
            self._strips.clear()
            return
        first = len(self._lines) - 1
        start = self._lines[first][0]
        del self._lines[first:]
        self._lines.extend(wrap_lines(self._text, start, self._wrap_width))
        for y in [y for y in self._strips if y >= first]:
            del self._strips[y]

    def _height(self, n_lines: int) -> int:
        """The height for ``n_lines`` lines of text: themselves, or while a reply streams with
        :attr:`reserve` > 1, ``reserve`` lines from before its first token (the layout that makes
        room for them then comes while the model reads the prompt, not while it writes), then
        twice that many at a time.

        >>> body = ReplyBody()
        >>> [body._height(n) for n in (0, 1, 2)]
        [1, 1, 2]
        >>> body.reserve = 4
        >>> [body._height(n) for n in (0, 1, 4, 5, 12, 13)]
        [4, 4, 4, 12, 12, 20]
        """
        step = max(1, self.reserve)
        if step == 1:
            return max(1, n_lines)
        if n_lines <= step:
            return step
        return step + -(-(n_lines - step) // (2 * step)) * 2 * step

    def get_content_height(self, container, viewport, width: int) -> int:
        self._ensure_wrapped(width)
        return self.top + self._height(len(self._lines))

    # -- rendering -------------------------------------------------------------
    def _palette(self) -> tuple[int, Mapping[str, Style]]:
        return self.palette_version, self.draft_styles

    def _line_content(self, start: int, end: int, styles: Mapping[str, Style]) -> Content:
        text = self._text[start:end]
        if not self.coloured or not self._drafted:
            return Content(text)
        spans: list[Span] = []
        i = bisect_right(self._d_starts, start) - 1
        if i < 0:
            i = 0
        fallback = Style(bold=True)
        d = self._drafted
        while i < len(d) and d[i][0] < end:
            s0, s1, by, pos, run = d[i]
            if s1 > start:
                style = styles.get(by, fallback) + Style.from_meta({"by": by, "pos": pos, "run": run})
                spans.append(Span(max(s0, start) - start, min(s1, end) - start, style))
            i += 1
        sel = self.selected_run
        if sel is not None and 0 <= sel < len(self.runs):
            r = self.runs[sel]
            if r.start < end and r.end > start:
                spans.append(Span(max(r.start, start) - start, min(r.end, end) - start,
                                  Style(reverse=True, underline=True)))
        return Content(text, spans)

    def render_lines(self, crop: Region) -> list[Strip]:
        self._paint_width = self.size.width
        try:
            return super().render_lines(crop)
        finally:
            self._paint_width = None

    def render_line(self, y: int) -> Strip:
        width = self._paint_width if self._paint_width is not None else self.size.width
        self._ensure_wrapped(width)
        probe = self.probe
        if probe is not None and self._probed < len(self._times):
            now = time.perf_counter()
            for i in range(self._probed, len(self._times)):
                if self._times[i]:
                    probe.record(i, now - self._times[i])
            self._probed = len(self._times)
        version, styles = self._palette()
        key = (version, self.coloured, self.selected_run, width)
        if key != self._strip_key:
            self._strip_key = key
            self._strips.clear()
        if self.head is not None:
            if y == 0:
                return self._render_head(width, version)
            y -= 1
        strip = self._strips.get(y)
        if strip is not None:
            return strip
        base = self.visual_style
        if y >= len(self._lines):
            if y == 0 and self.pending:
                content = Content.styled("…", "dim")
            else:
                return Strip.blank(width, base.rich_style)
        else:
            start, end = self._lines[y]
            content = self._line_content(start, end, styles)
        strip = Strip(content.render_segments(base)).extend_cell_length(width, base.rich_style) \
            .crop(0, width)
        self._strips[y] = strip
        return strip

    def _render_head(self, width: int, version: int) -> Strip:
        assert self.head is not None
        base = self.visual_style
        key = (self.head, width, version, self.app.theme, base)
        if self._head_strip is not None and self._head_strip[0] == key:
            return self._head_strip[1]
        label, style = self.head
        content = Content(label, [Span(0, len(label), Style.parse(style))])
        strip = Strip(content.render_segments(base)).extend_cell_length(width, base.rich_style).crop(0, width)
        self._head_strip = (key, strip)
        return strip

    def watch_coloured(self) -> None:
        self.refresh()

    def watch_selected_run(self) -> None:
        self.refresh()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        meta = event.style.meta if event.style else {}
        by = meta.get("by")
        info = None
        if by:
            run = meta.get("run")
            info = f"drafted by {by} at draft position {meta.get('pos')}"
            if isinstance(run, int) and 0 <= run < len(self.runs):
                info += f" (run of {self.runs[run].n} from position {self.runs[run].pos0})"
        if info != self.tooltip:
            self.tooltip = info
        self.post_message(ProvenanceHover(info))

    def on_leave(self, event: events.Leave) -> None:
        self.post_message(ProvenanceHover(None))


class ProvenanceHover(Message):
    """Which speculator drafted the text under the pointer or the selection (None: none)."""

    def __init__(self, info: str | None):
        super().__init__()
        self.info = info
