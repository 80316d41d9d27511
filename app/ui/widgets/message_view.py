"""One chat message: who wrote it, its text (plain or Markdown, coloured or not), its figures.

May touch: its own children (:class:`ReplyBody`, the foot line, a Markdown view); it posts
:class:`MessageView.CopyRequested` and :class:`ProvenanceHover` and never names the app.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.style import Style
from textual.widgets import Markdown, Static

from speculators.events import GenerationStats, TokenEvent

from ..stats import reply_footer
from .markdown_colour import colour_markdown
from .reply_body import ProvenanceHover, ReplyBody


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
