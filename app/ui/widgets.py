"""The chat app's widgets: messages with coloured draft runs, the prompt, bars and panels."""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.content import Content, Span
from textual.message import Message
from rich.cells import get_character_cell_size
from textual.reactive import reactive
from textual.strip import Strip
from textual.style import Style
from textual.widget import Widget
from textual.widgets import Footer, Markdown, OptionList, Static, TextArea

try:    # (not exported by Textual: without it the key bar composes itself anew, as Textual's does)
    from textual.widgets._footer import FooterKey
except ImportError:     # pragma: no cover
    FooterKey = None

from speculators.events import GenerationStats, TokenEvent

from .stats import SessionStats, acceptance_bars, pct, reply_footer


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
        from ..storage import truncate_tokens
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


class MessageView(Vertical, can_focus=True):
    """One chat message: who, the text, and (for replies) a line of statistics."""

    BINDINGS = [
        Binding("c", "copy", "Copy message"),
        Binding("right,]", "next_run", "Next drafted run", show=False),
        Binding("left,[", "prev_run", "Previous drafted run", show=False),
    ]

    DEFAULT_CSS = """
    MessageView {
        height: auto;
        padding: 0 1;
        margin: 0 0 1 0;
    }
    MessageView > .msg-head { height: 1; }
    MessageView.-user { border-left: outer $primary 50%; }
    MessageView.-assistant { border-left: outer $secondary 40%; }
    MessageView:focus { background: $boost; }
    MessageView:focus.-user { border-left: outer $primary; }
    MessageView:focus.-assistant { border-left: outer $secondary; }
    MessageView > .msg-foot { color: $text-muted; height: auto; }
    MessageView.-error > ReplyBody { color: $error; }
    MessageView > Markdown { margin: 0; padding: 0; }
    MessageView > Markdown > * { margin-bottom: 0; }
    """

    #: the style of the line that says who wrote a message, by role (the body's first line, or
    #: in the Markdown view the head widget above the Markdown)
    HEAD_STYLES = {"user": "bold $primary", "assistant": "bold $secondary"}

    class CopyRequested(Message):
        """The person asked to copy this message's text."""

        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, role: str, text: str = "", *, tokens: Sequence[TokenEvent] | None = None,
                 stats: Mapping[str, Any] | None = None, status: str | None = None,
                 finish: str | None = None, key: int | None = None, label: str | None = None,
                 coloured: bool = True, markdown: bool = False, styles: Mapping[str, Style] | None = None,
                 palette_version: int = 0, probe: Any = None, error: str | None = None):
        classes = f"-{role}"
        super().__init__(classes=classes)
        self.role = role
        #: the key of the session's turn this view shows
        self.key = key
        self.stats = dict(stats) if stats else None
        self.status = status
        self.finish = finish
        self.streaming = False
        self.error: str | None = error
        self.notes: list[str] = []
        self.label = label or {"user": "You", "assistant": "Assistant", "system": "System"}.get(role, role)
        self.body = ReplyBody(text=text, tokens=tokens, styles=styles, palette_version=palette_version,
                              probe=probe)
        # who wrote it: the first line of the body (a widget fewer a message: every layout of the
        # screen arranges every widget of the chat, a few times a reply), except in the Markdown
        # view, where it is a widget of its own above the Markdown (made when first needed)
        self.body.head = (self.label, self.HEAD_STYLES.get(role, "$text-muted"))
        self.head: Static | None = None
        self.foot = Static("", classes="msg-foot")
        self._live_height = -1
        self._markdown: Markdown | None = None
        self._md_pending = False
        #: F5: drafted tokens in colour; F6: replies laid out as Markdown (the two are independent)
        self.coloured = coloured
        self.markdown = markdown

    @property
    def text(self) -> str:
        return self.body.text

    def compose(self) -> ComposeResult:
        yield self.body
        if self.role == "assistant":
            # (only replies have a line of figures: a widget fewer for the person's messages,
            # and every layout of the screen arranges every widget of the chat)
            yield self.foot

    def on_mount(self) -> None:
        if self.error:
            self.add_class("-error")
        self._update_foot()
        self.set_view(self.coloured, self.markdown)

    # -- streaming -------------------------------------------------------------
    def start_streaming(self, reserve: int = 1) -> None:
        """The reply begins, with ``reserve`` lines of room (see :attr:`ReplyBody.reserve`)."""
        self.streaming = True
        self.body.reserve = reserve
        self.body.set_pending(True)
        self.foot.update("writing…")
        self._live_height = 1

    def add_tokens(self, tokens, times=None) -> None:
        self.body.append_tokens(tokens, times)
        if self._markdown is not None and self._markdown.display:
            self._schedule_markdown()

    def live_stats(self, stats: GenerationStats) -> None:
        line = reply_footer(self.body.tokens, stats.to_dict()) + " · writing…"
        # a new layout (of the whole screen) only when the line's height may change
        width = self.foot.content_size.width
        height = len(Content(line).wrap(width)) if width > 0 else -1
        same = height > 0 and height == self._live_height
        self._live_height = height
        self.foot.update(line, layout=not same)

    def finish_streaming(self, stats: Mapping[str, Any] | None, finish: str | None, text: str | None = None) -> None:
        self.streaming = False
        self.body.reserve = 1
        self.body.set_pending(False)
        self.stats = dict(stats) if stats else None
        self.finish = finish
        self.status = "cancelled" if finish == "cancelled" else "done"
        if text is not None and text != self.body.text:
            if self.body.text.startswith(text):
                self.body.truncate(len(text))   # the trailing whitespace a finished reply drops
            else:
                self.body.set_text(text)
        self._update_foot()
        if self._markdown is not None and self._markdown.display:
            self._schedule_markdown()
        self.body.refresh(layout=True)

    def fail(self, error: str) -> None:
        self.streaming = False
        self.body.reserve = 1
        self.error = error
        self.body.set_pending(False)
        self.add_class("-error")
        if not self.body.text:
            self.body.set_text(error)
        self.foot.update(f"error: {error}" if self.body.text != error else "not sent to the model's history")
        self.body.refresh(layout=True)

    def _update_foot(self) -> None:
        if self.role != "assistant":
            return
        if self.streaming:
            return
        if self.error:
            return
        self.foot.update(reply_footer(self.body.tokens, self.stats, self.finish, self.status, self.notes))

    # -- views -------------------------------------------------------------------
    @property
    def view_mode(self) -> str:
        """``plain`` or ``markdown``, with `` coloured`` where drafted tokens are in colour."""
        return ("markdown" if self.markdown else "plain") + (" coloured" if self.coloured else "")

    def set_view(self, coloured: bool, markdown: bool) -> None:
        """Colour drafted tokens or not; lay the text out as Markdown or as it is (user messages
        and errors: never Markdown). Markdown keeps the colours (see :func:`colour_markdown`)."""
        self.coloured = coloured
        self.markdown = markdown
        self.body.coloured = coloured
        if markdown and self.role == "assistant" and not self.error:
            if self.head is None:
                self.head = Static(Content.styled(*self.body.head), classes="msg-head")
                self.mount(self.head, before=self.body)
            self.head.display = True
            if self._markdown is None:
                self._markdown = Markdown("")
                self.mount(self._markdown, after=self.body)
            self._markdown.display = True
            self.body.display = False
            self._md_pending = False
            self._schedule_markdown(now=True)
        else:
            if self._markdown is not None:
                self._markdown.display = False
            if self.head is not None:
                self.head.display = False
            self.body.display = True

    def set_palette(self, styles: Mapping[str, Style], version: int) -> None:
        self.body.set_palette(styles, version)
        if self._markdown is not None and self._markdown.display and self.coloured:
            self._schedule_markdown(now=True)

    def _schedule_markdown(self, now: bool = False) -> None:
        if self._markdown is None or self._md_pending:
            return
        self._md_pending = True

        async def update() -> None:
            self._md_pending = False
            md = self._markdown
            if md is None:
                return
            await md.update(self.body.text)
            if self.coloured and md is self._markdown:
                colour_markdown(md, self.body._drafted, self.body.draft_styles)
        if self.streaming and not now:
            self.set_timer(0.15, update)
        else:
            self.call_later(update)      # (a timer of 0 s divides by zero in Textual 8)

    # -- actions -------------------------------------------------------------------
    def action_copy(self) -> None:
        self.post_message(self.CopyRequested(self.body.text))

    def _select(self, step: int) -> None:
        runs = self.body.runs
        if not runs or not self.coloured or not self.body.display:
            self.notify("This message has no coloured draft runs" if not runs else
                        "Turn colouring on (F5) to inspect drafted runs" if not self.coloured else
                        "Drafted runs are selected in the plain view (F6)", timeout=3)
            return
        cur = self.body.selected_run
        nxt = (0 if step > 0 else len(runs) - 1) if cur is None else (cur + step) % len(runs)
        self.body.selected_run = nxt
        r = runs[nxt]
        self.post_message(ProvenanceHover(f"run {nxt + 1}/{len(runs)}: {r.describe()}"))

    def action_next_run(self) -> None:
        self._select(1)

    def action_prev_run(self) -> None:
        self._select(-1)

    def on_blur(self) -> None:
        if self.body.selected_run is not None:
            self.body.selected_run = None
            self.post_message(ProvenanceHover(None))


def _prompt_bindings() -> list:
    """TextArea's bindings minus the keys the app uses (F6/F7 select line/all there)."""
    taken = {"f6", "f7"}
    out = []
    for b in TextArea.BINDINGS:
        keys = [k for k in b.key.split(",") if k.strip() not in taken] if isinstance(b, Binding) else None
        if keys is None:
            out.append(b)
        elif keys:
            out.append(Binding(",".join(keys), b.action, b.description, show=b.show, priority=b.priority,
                               key_display=b.key_display, tooltip=b.tooltip))
    return out


def hand_keys_to(widget: Widget, target: Widget, key: events.Key | None = None) -> None:
    """Give ``target`` the keyboard now, and ``key`` (one meant for it) with it.

    Now, not after the messages already queued as :meth:`Widget.focus` does: a terminal may send
    several keys at once (typed ahead, or a script's), and the ones after this must reach
    ``target``, not ``widget`` (see :func:`typed_ahead`)."""
    widget.screen.set_focus(target)
    if key is not None:
        forward_key(target, key)


def forward_key(target: Widget, key: events.Key) -> None:
    again = events.Key(key.key, key.character)
    again._set_forwarded()        # as the app forwards a key to the focused widget
    target.post_message(again)


def typed_ahead(widget: Widget, event: events.Key) -> bool:
    """A key queued for ``widget`` before the keyboard moved on from it: hand it on to where the
    keyboard is now (True), so keys typed in a row keep their order and target."""
    focused = widget.screen.focused
    if focused is None or focused is widget:
        return False
    event.stop()
    event.prevent_default()
    forward_key(focused, event)
    return True


class PromptInput(TextArea, inherit_bindings=False):
    """Multi-line prompt: Enter sends, Shift+Enter / Ctrl+J / Alt+Enter insert a newline.

    With an empty prompt, Up and Down walk through what was sent before; Down from the empty
    prompt (past the newest message sent) goes on to :attr:`below` where it gives a widget
    (the welcome screen's starter requests).
    """

    BINDINGS = _prompt_bindings()

    class Send(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    NEWLINE_KEYS = ("shift+enter", "ctrl+j", "newline", "alt+enter", "ctrl+enter")

    def __init__(self, sent: list[str] | None = None, **kw: Any):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         highlight_cursor_line=False, compact=True, **kw)
        self.sent: list[str] = list(sent or [])
        self._hist_pos: int | None = None
        #: where Down from the empty prompt takes the keyboard (None: nowhere, now)
        self.below: Callable[[], Widget | None] = lambda: None

    def remember(self, text: str) -> None:
        if text and (not self.sent or self.sent[-1] != text):
            self.sent.append(text)
        self._hist_pos = None

    def _show_history(self, pos: int | None) -> None:
        self._hist_pos = pos
        self.text = "" if pos is None else self.sent[pos]
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if typed_ahead(self, event):
            return
        key = event.key
        if key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Send(self.text))
            return
        if key in self.NEWLINE_KEYS or "newline" in event.aliases:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        browsing = self._hist_pos is not None and self.text == self.sent[self._hist_pos]
        if key == "up" and self.sent and (not self.text or browsing):
            event.stop()
            event.prevent_default()
            pos = len(self.sent) - 1 if self._hist_pos is None else max(0, self._hist_pos - 1)
            self._show_history(pos)
            return
        if key == "down" and browsing:
            event.stop()
            event.prevent_default()
            assert self._hist_pos is not None
            nxt = self._hist_pos + 1
            self._show_history(nxt if nxt < len(self.sent) else None)
            return
        if key == "down" and not self.text:
            event.stop()
            event.prevent_default()
            self._hist_pos = None
            target = self.below()
            if target is not None:
                hand_keys_to(self, target)
            return
        if self._hist_pos is not None and not browsing:
            self._hist_pos = None
        await super()._on_key(event)


class StarterList(OptionList):
    """The welcome screen's starter requests, one option each: Up/Down pick, Enter (or a click)
    sends (an :class:`OptionList.OptionSelected`, the keyboard back at :attr:`back`). Up from the
    first one, Esc, or typing a character (which goes with it) hand the keyboard back.

    The highlight shows only while the list has the keyboard (it starts on the first request)."""

    DEFAULT_CSS = """
    StarterList, StarterList:focus {
        height: auto; background: transparent; background-tint: transparent; border: none;
        padding: 0; margin: 0;
    }
    """

    def __init__(self, *requests: Any, **kw: Any):
        super().__init__(*requests, compact=True, **kw)
        self.highlighted = None        # (OptionList starts on its first option)
        #: where the keyboard goes back to (the prompt)
        self.back: Widget | None = None

    # (Textual calls each class's handler of an event: these add to OptionList's own)
    def on_focus(self) -> None:
        if self.highlighted is None and self.option_count:
            self.highlighted = 0

    def on_blur(self) -> None:
        self.highlighted = None

    def action_cursor_up(self) -> None:
        if not self.highlighted:
            self.action_leave()
            return
        self.highlighted -= 1

    def action_cursor_down(self) -> None:
        # no wrapping round to the first: the list ends at its last request
        if self.highlighted is None:
            self.highlighted = 0
        elif self.highlighted < self.option_count - 1:
            self.highlighted += 1

    def action_select(self) -> None:
        super().action_select()
        self.action_leave()

    def action_leave(self, key: events.Key | None = None) -> None:
        if self.back is not None:
            hand_keys_to(self, self.back, key)

    #: keys the list acts on as they come (not as bindings, which run once the key has gone up
    #: to the app: by then a key typed after it may have reached the list)
    KEYS = {"up": "cursor_up", "down": "cursor_down", "enter": "select", "escape": "leave",
            "home": "first", "end": "last", "pageup": "page_up", "pagedown": "page_down"}

    async def _on_key(self, event: events.Key) -> None:
        if typed_ahead(self, event):
            return
        action = self.KEYS.get(event.key)
        if action is not None:
            event.stop()
            event.prevent_default()
            getattr(self, f"action_{action}")()
        elif event.is_printable and event.character and event.key != "tab":
            # typing: it was meant for the prompt
            event.stop()
            event.prevent_default()
            self.action_leave(event)


class KeyBar(Footer):
    """The key bar: Textual's footer, except that where only which keys are enabled changed
    (Esc's Stop and Ctrl+R's Regenerate, as each reply starts and ends), it dims and lights
    its keys in place.

    Textual's footer composes itself anew whenever the screen's bindings may have changed: new
    key widgets, styled and laid out, and with them the whole screen laid out again. That was
    twice a reply, ~70 ms of the UI's CPU a reply in a chat of 30 exchanges (taken, on 2 cores,
    from the model's threads). It still composes anew when the keys shown, their order or
    their labels change (a focused message adds its own)."""

    #: what the bar showed when it was last composed (:meth:`_shown`)
    _composed: tuple | None = None

    def _shown(self) -> tuple[tuple, dict[tuple[str, str], tuple[bool, str]]]:
        """What the bar shows (keys, actions, labels, groups, in order) and, per key, whether
        it is enabled and its tooltip."""
        shown: list[tuple] = []
        state: dict[tuple[str, str], tuple[bool, str]] = {}
        for _node, binding, enabled, tooltip in self.screen.active_bindings.values():
            if not binding.show:
                continue
            shown.append((binding.key, binding.action, binding.description, id(binding.group),
                          self.app.get_key_display(binding)))
            state.setdefault((binding.key, binding.action), (enabled, tooltip))
        return (tuple(shown), self.show_command_palette, self.compact), state

    def compose(self) -> ComposeResult:
        if self._bindings_ready:
            self._composed = self._shown()[0]
        yield from super().compose()

    def bindings_changed(self, screen: Any) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        self.call_after_refresh(self._update_keys)

    def _update_keys(self) -> None:
        if not self.is_attached:
            return
        what, state = self._shown()
        if FooterKey is None or what != self._composed:
            self.call_next(self.recompose)
            return
        try:
            for key in self.query(FooterKey):
                enabled, tooltip = state.get((key.key, key.action), (not key._disabled, key.tooltip))
                if key._disabled == enabled:
                    key._disabled = not enabled
                    key.set_class(not enabled, "-disabled")
                if tooltip and key.tooltip != tooltip:
                    key.tooltip = tooltip
        except AttributeError:      # pragma: no cover (a Textual whose keys are made otherwise)
            self.call_next(self.recompose)


class OneLine(Static):
    """A line of fixed height: an update with what it already shows does nothing, and none
    asks for a new layout (while a reply streams these change a few times a second; a layout
    pass over the whole screen each time would take the CPU the model needs)."""

    _shown: Any = None

    def set_line(self, content: Content) -> None:
        # Content's == looks at the text alone; a change of colour is a change too
        key = (content.plain, tuple(content.spans))
        if key == self._shown:
            return
        self._shown = key
        self.update(content, layout=False)


class TopBar(OneLine):
    """One calm line: app name, model, speculation, state."""

    DEFAULT_CSS = """
    TopBar { dock: top; height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    """

    def show(self, model: str, spec: str, state: str, chat: str = "", n_spec: int = 0, auto: bool = False) -> None:
        """Name, model and state always; the speculators and the chat title when they fit whole."""
        width = (self.size.width or 80) - 2
        state_c = Content.styled(state, "$accent" if "…" in state else "$foreground-muted")
        room = max(0, width - state_c.cell_length - 2)
        left = Content.assemble(("draftlight", "bold $primary"), "  ", (model, "$foreground"))
        if spec:
            prefix = "auto: " if auto else ""
            full = Content.assemble("  ·  ", (prefix + spec, "$secondary"))
            short = Content.assemble("  ·  ", (prefix + (f"{n_spec} speculators" if n_spec > 1 else spec), "$secondary"))
            for piece in (full, short):
                if left.cell_length + piece.cell_length <= room:
                    left = left + piece
                    break
        if chat and left.cell_length + 5 + 12 <= room:
            # the chat title only when it has room to be readable
            title = Content.styled(chat, "$foreground-muted").truncate(room - left.cell_length - 5, ellipsis=True)
            left = left + Content("  ·  ") + title
        left = left.truncate(room, ellipsis=True)
        pad = max(1, width - left.cell_length - state_c.cell_length)
        self.set_line(left + " " * pad + state_c)


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


#: what F4's terms mean, at the end of the panel
STATS_TERMS = (
    ("calls b/g/a", "how often the speculator was told a reply Began, asked to Generate a draft, "
                    "and told how much of its draft was Accepted (llama.cpp's #calls(b,g,a))"),
    ("ms b/g/a", "time spent in those three calls"),
    ("drafts gen/acc", "drafts made / drafts of which at least one token was accepted"),
    ("mean acc len", "1 + accepted tokens per verified draft, as llama.cpp reports it"),
    ("on / cold", "Automatic's view: on = its drafts are worth verifying now; cold = not at the "
                  "moment (asked only now and then, to see whether that changed). acc is the "
                  "acceptance it expects, gain the speed-up it expects from verifying"),
)


class StatsPanel(VerticalScroll, can_focus=True):
    """Per-speculator statistics of the session and acceptance by draft position.

    Tab reaches it; the arrows, PageUp/PageDown and Home/End scroll it (a scroll
    container's own keys). The text is :attr:`body`."""

    DEFAULT_CSS = """
    StatsPanel {
        width: 40%; min-width: 30; max-width: 44; dock: right; height: 1fr; padding: 0 1;
        background: $surface; border-left: tall $panel; scrollbar-size-vertical: 1;
    }
    StatsPanel:focus { border-left: tall $primary; }
    StatsPanel > Static { height: auto; }
    """

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.body = Static("")

    def compose(self) -> ComposeResult:
        yield self.body

    def show_stats(self, session: SessionStats, live: bool, styles: Mapping[str, Style],
                   lookup: Mapping[str, Any] | None = None, active: Sequence[str] | None = None,
                   auto: bool | None = None) -> None:
        """``active``: the speculators of the running configuration, in priority order, and
        ``auto``: whether Automatic's controller runs them (None for either: whatever has figures).
        Speculators with figures that are not active any more (and Automatic's decisions, once it
        is off) are listed apart, as earlier in this session; the lookup caches only while
        ngram-cache is active."""
        t = session.totals
        f = t.figures
        lines: list[Content] = [Content.styled("Session statistics" + ("  ● live" if live else ""),
                                               "bold $primary")]
        lines.append(Content(f"replies {t.replies} · tokens {t.n_tokens} · {t.tokens_per_s:.1f} tok/s"))
        lines.append(Content(f"drafted {t.n_drafted} · {f.accepted_text()}"))
        mal = f.mean_acceptance_length
        lines.append(Content(f"mean acceptance length {mal:.2f}" if mal else "mean acceptance length –"))
        names = list(active) if active is not None else list(session.speculators)
        earlier = [n for n in session.speculators if n not in names]
        ctl = session.controller
        ctl_active = ctl is not None and (auto if auto is not None else True)
        lines.append(Content(""))
        if active is not None:
            now = ("Automatic: " if auto else "Speculation: ") + (", ".join(names) if names else "off")
            lines.append(Content.styled(now, "bold $secondary"))
        if ctl_active:
            lines.append(Content.styled("Automatic speculation: what it decided", "bold $secondary"))
            lines.extend(Content(" " + line) for line in ctl.summary())
        if not names:
            lines += [Content.styled("No speculator is on.", "$foreground-muted"),
                      Content.styled("Choose speculation in Settings (F3).", "$foreground-muted")]
        elif not any(n in session.speculators for n in names):
            lines += [Content.styled("No speculator has run yet.", "$foreground-muted")]
        width = max(8, (self.size.width or 40) - 18)
        for name in names:
            s = session.speculators.get(name)
            if s is None:
                continue
            st = styles.get(name)
            lines.append(Content(""))
            lines.append(Content.styled(f"■ {name}" if not (st and st.background) else f" {name} ", st or "bold"))
            lines.append(Content(f" calls b/g/a   {s.n_call_begin}/{s.n_call_draft}/{s.n_call_accept}"))
            lines.append(Content(f" drafts gen/acc {s.n_gen_drafts}/{s.n_acc_drafts}"))
            shown = session.shown_by.get(name, 0)
            extra = f"; {shown} in replies" if shown != s.n_acc_tokens else ""
            lines.append(Content(f" tokens gen/acc {s.n_gen_tokens}/{s.n_acc_tokens} "
                                 f"({pct(s.acceptance_rate)}{extra})"))
            m = s.mean_acceptance_length
            lines.append(Content(f" mean acc len   {m:.2f}" if m else " mean acc len   –"))
            lines.append(Content(f" ms b/g/a  {s.t_begin_us / 1000:.1f}/{s.t_draft_us / 1000:.1f}/"
                                 f"{s.t_accept_us / 1000:.1f}"))
            bars = acceptance_bars(s, width=width)
            if bars:
                lines.append(Content.styled(" acceptance by draft position", "$foreground-muted"))
                for pos, b, rate in bars:
                    lines.append(Content.assemble(f" {pos:>3} ", (b, st or "$accent"), f" {rate * 100:3.0f}%"))
                more = len(s.n_acc_tokens_per_pos) - len(bars)
                if more > 0:
                    lines.append(Content.styled(f"     … {more} more positions", "$foreground-muted"))
        if lookup and (active is None or "ngram-cache" in names):
            lines.append(Content(""))
            lines.append(Content.styled("Lookup caches (ngram-cache)", "bold $secondary"))
            for kind in ("static", "dynamic"):
                c = (lookup.get("caches") or {}).get(kind) or {}
                size = _size(c.get("file_bytes", 0)) if c.get("exists") else "no file yet"
                lines.append(Content(f" {kind:<8} {c.get('entries', 0):,} entries · {size}"))
            src = lookup.get("sources") or {}
            if src:
                lines.append(Content.styled(" accepted / drafted by cache", "$foreground-muted"))
                for kind in ("context", "dynamic", "static"):
                    d = src.get(kind) or {}
                    lines.append(Content(f"  {kind:<8} {d.get('accepted', 0)} / {d.get('drafted', 0)}"))
            pending = lookup.get("pending_entries") or 0
            if pending:
                lines.append(Content.styled(f" {pending:,} entries learned, not saved yet", "$foreground-muted"))
        if earlier or (ctl is not None and not ctl_active):
            # figures of speculation that is not running now: apart, and said to be so
            lines.append(Content(""))
            lines.append(Content.styled("Earlier in this session (not in use now)", "bold $foreground-muted"))
            if ctl is not None and not ctl_active:
                lines.append(Content.styled(" Automatic's controller: off now", "$foreground-muted"))
            for name in earlier:
                s = session.speculators[name]
                lines.append(Content.styled(f" {name:<13} tokens gen/acc {s.n_gen_tokens}/{s.n_acc_tokens} "
                                            f"({pct(s.acceptance_rate)})", "$foreground-muted"))
        if session.speculators or ctl is not None:
            lines.append(Content(""))
            lines.append(Content.styled("What the terms mean", "bold $secondary"))
            for term, meaning in STATS_TERMS:
                lines.append(Content.assemble((f" {term}: ", "bold"), (meaning, "$foreground-muted")))
        self.body.update(Content("\n").join(lines))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class LoadPanel(Vertical):
    """Shown while the model loads, or when it cannot be loaded (with a way to pick another)."""

    DEFAULT_CSS = """
    LoadPanel { height: auto; margin: 1 2; padding: 1 2; border: round $primary 60%; background: $surface; }
    LoadPanel.-error { border: round $error; }
    LoadPanel > .title { text-style: bold; color: $primary; }
    LoadPanel.-error > .title { color: $error; }
    LoadPanel > .detail { color: $text-muted; margin-top: 1; }
    LoadPanel > ProgressBar { margin-top: 1; }
    LoadPanel > .pick { height: auto; margin-top: 1; display: none; }
    LoadPanel.-error > .pick { display: block; }
    LoadPanel.-error > ProgressBar { display: none; }
    LoadPanel .pick Input { width: 1fr; }
    LoadPanel .pick Horizontal { height: auto; margin-top: 1; }
    LoadPanel .pick Button { margin-right: 2; min-width: 12; }
    """

    class Pick(Message):
        """Load the model at ``path`` (None: the embedded default)."""

        def __init__(self, path: str | None):
            super().__init__()
            self.path = path

    def compose(self) -> ComposeResult:
        from textual.containers import Horizontal
        from textual.widgets import Button, Input, ProgressBar
        yield Static("Loading the model…", classes="title", id="load-title")
        yield ProgressBar(total=None, show_eta=False, id="load-bar")
        yield Static("", classes="detail", id="load-detail")
        with Vertical(classes="pick"):
            yield Input(placeholder="path to a .gguf model file", id="model-path")
            with Horizontal():
                yield Button("Load", variant="primary", id="load-path")
                yield Button("Default model", id="load-default")

    def show_progress(self, phase: str, done: int, total: int, path: str | None = None) -> None:
        from textual.widgets import ProgressBar
        self.remove_class("-error")
        title = {"assemble": "Preparing the default model (first run)…",
                 "verify": "Checking the default model…",
                 "probe": "Checking once which llama.cpp CPU kernels work here…"}.get(phase, "Loading the model…")
        if phase in ("assemble", "verify") and total > 0 and done >= total:
            # prepared: what follows (the runner starting, the weights loading) has no steps to count
            title, done, total = "Loading the model…", 0, 0
        self.query_one("#load-title", Static).update(title)
        bar = self.query_one("#load-bar", ProgressBar)
        if total > 0:
            bar.update(total=total, progress=done)
        else:
            bar.update(total=None)
        if path:
            self.query_one("#load-detail", Static).update(path)

    def hide(self) -> None:
        """Out of sight, and its bar no longer animated (a hidden indeterminate bar keeps a
        15-a-second timer that the UI would pay for while replies stream)."""
        from textual.widgets import ProgressBar
        self.query_one("#load-bar", ProgressBar).update(total=1, progress=0)
        self.display = False

    def show_error(self, error: str, path: str | None) -> None:
        from textual.widgets import Input
        self.add_class("-error")
        self.query_one("#load-title", Static).update("The model could not be loaded")
        self.query_one("#load-detail", Static).update(
            Content.assemble((error, "$foreground"), "\n\nEnter the path of another GGUF model, "
                             "or load the embedded default model."))
        inp = self.query_one("#model-path", Input)
        if path and not inp.value:
            inp.value = path
        inp.focus()

    def on_button_pressed(self, event) -> None:
        from textual.widgets import Input
        event.stop()
        if event.button.id == "load-path":
            value = self.query_one("#model-path", Input).value.strip()
            if value:
                self.post_message(self.Pick(value))
        elif event.button.id == "load-default":
            self.post_message(self.Pick(None))

    def on_input_submitted(self, event) -> None:
        event.stop()
        if event.value.strip():
            self.post_message(self.Pick(event.value.strip()))
