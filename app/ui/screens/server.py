"""ServerScreen: the requests the chat serves to other programs, as they come, and one reply.

It shows what it is given: the session's list of served requests (read on the UI thread, never
changed here) and whether the model is served. The app tells it which request changed
(:meth:`ServerScreen.request_changed`) and when serving starts or stops
(:meth:`ServerScreen.serving_changed`); the screen answers with messages: :class:`ServerScreen.Toggle`
(start or stop serving) and :class:`ServerScreen.UseInLab` (the Lab on a served request).

What changes is painted at most every :attr:`ServerScreen.PAINT_EVERY_S`: the rows of the
requests that changed (cell by cell; the table is never filled anew) and the new tokens of the
reply shown. The reply is a :class:`~app.ui.widgets.MessageView`, the chat's own: its drafted
tokens are coloured as a chat reply's, with the chat's colouring (F5), layout (F6) and palette.
The reply shown follows the current request (the one generating, else the newest) until the
person selects another row; selecting the current one again follows again.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable, Mapping, Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.style import Style
from textual.widgets import DataTable, Footer, Static

from ..widgets import MessageView

#: the table's columns: (key, heading)
COLUMNS: tuple[tuple[str, str], ...] = (
    ("rid", "#"), ("time", "time"), ("client", "client"), ("endpoint", "endpoint"), ("status", "status"),
    ("prompt", "prompt (cached)"), ("reply", "reply"), ("tps", "tok/s"), ("drafted", "drafted/acc."),
    ("by", "by"),
)

#: a request's state as the table says it: how it ended in OpenAI's words (``finish_reason``), or
#: where it is
STATUS_SHOWN = {"generating": "writing", "stop_string": "stop", "context": "length", "cancelled": "stopped"}


def row_cells(req: Any) -> tuple[str, ...]:
    """A served request's cells, in :data:`COLUMNS`' order.

    >>> from collections import Counter
    >>> from types import SimpleNamespace as R
    >>> req = R(rid=3, arrived=0.0, client="127.0.0.1", endpoint="/v1/chat/completions", status="stop",
    ...         n_prompt=40, n_cached=32, tokens=[1] * 12, tokens_per_s=31.26, n_drafted=9, n_accepted=6,
    ...         by=Counter({"ngram-simple": 4, "ngram-mod": 2}))
    >>> row_cells(req)[:1] + row_cells(req)[4:]
    ('3', 'stop', '40 (32)', '12', '31.3', '9/6', 'ngram-simple 4, ngram-mod 2')
    >>> req.status = "stop_string"; row_cells(req)[4]
    'stop'
    
    """
    by = ", ".join(f"{name} {n}" for name, n in req.by.most_common() if n)
    return (str(req.rid), time.strftime("%H:%M:%S", time.localtime(req.arrived)), req.client, req.endpoint,
            STATUS_SHOWN.get(req.status, req.status), f"{req.n_prompt} ({req.n_cached})" if req.n_prompt else "-", str(len(req.tokens)),
            f"{req.tokens_per_s:.1f}" if req.tokens_per_s else "-",
            f"{req.n_drafted}/{req.n_accepted}" if req.n_drafted else "-", by or "-")


def shown_tokens(req: Any, tokens: Sequence[Any], start: int) -> list[Any]:
    """``tokens`` (the request's from index ``start``) as the client reads them: a chat reply
    without the whitespace it begins with (the transcript's space after "Assistant:", which the
    server leaves out as the chat does). Those tokens are copied, never changed: they are the
    engine's records, which the server also reads.

    >>> from types import SimpleNamespace as R
    >>> from speculators.events import TokenEvent as T
    >>> toks = [T(0, 1, " "), T(1, 2, " Hi", "ngram-mod", 0), T(2, 3, " there")]
    >>> [t.text for t in shown_tokens(R(kind="chat", tokens=toks), toks, 0)]
    ['', 'Hi', ' there']
    >>> [t.text for t in shown_tokens(R(kind="chat", tokens=toks), toks[2:], 2)], toks[1].text
    ([' there'], ' Hi')
    >>> [t.text for t in shown_tokens(R(kind="completions", tokens=toks), toks, 0)]
    [' ', ' Hi', ' there']
    """
    out = list(tokens)
    if req.kind != "chat" or any(t.text.strip() for t in req.tokens[:start]):
        return out
    for i, t in enumerate(out):
        stripped = t.text.lstrip()
        out[i] = dataclasses.replace(t, text=stripped)
        if stripped:
            break
    return out


def state_line(url: str | None, port: int) -> str:
    """The screen's top line: where the model is served, or that it is not.

    >>> state_line("http://127.0.0.1:8080", 8080)
    "Serving on http://127.0.0.1:8080 — OpenAI's API under /v1 · Ctrl+T stops"
    >>> state_line(None, 8081)
    'Not serving · Ctrl+T serves the model on 127.0.0.1:8081 (F3 sets the port)'
    """
    if url:
        return f"Serving on {url} — OpenAI's API under /v1 · Ctrl+T stops"
    return f"Not serving · Ctrl+T serves the model on 127.0.0.1:{port} (F3 sets the port)"


class ServerScreen(Screen[None]):
    """The served requests, live, and the selected one's reply coloured as in the chat."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("f9", "close", "Close", show=False),
        Binding("ctrl+t", "toggle", "Start/stop serving", priority=True),
        Binding("ctrl+l", "use_in_lab", "Use in Lab", priority=True),
    ]

    DEFAULT_CSS = """
    ServerScreen { background: $background; }
    ServerScreen > .srv-title { dock: top; height: 1; background: $panel; padding: 0 1; color: $primary;
        text-style: bold; }
    ServerScreen > #srv-state { height: auto; padding: 0 1; color: $foreground-muted; }
    ServerScreen > #srv-state.-on { color: $success; text-style: bold; }
    ServerScreen > #srv-table { height: 2fr; min-height: 5; margin: 0 1; }
    ServerScreen > #srv-prompt { height: auto; max-height: 3; padding: 0 1; color: $text-muted; }
    ServerScreen > #srv-reply { height: 3fr; padding: 0 1; scrollbar-size-vertical: 1; }
    """

    #: the shortest time between two paints of what changed (a served reply streams a token at a
    #: time; a person reads the table a few times a second)
    PAINT_EVERY_S = 0.1

    class Toggle(Message):
        """Start serving (not serving now) or stop."""

    class UseInLab(Message):
        """Open the Lab with this served request as its prompt."""

        def __init__(self, rid: int):
            super().__init__()
            self.rid = rid

    def __init__(self, requests: Iterable[Any], url: str | None, port: int, *, coloured: bool = True,
                 markdown: bool = False, styles: Mapping[str, Style] | None = None, palette_version: int = 0):
        super().__init__()
        #: the session's served requests, oldest first (a live view: the session adds to it)
        self.requests = requests
        self.url = url
        self.port = port
        self.coloured, self.markdown = coloured, markdown
        self.draft_styles: Mapping[str, Style] = styles or {}
        self.palette_version = palette_version
        #: the requests that have a row, by id
        self._rows: dict[int, Any] = {}
        #: the requests changed since the last paint, and whether a paint is on its way
        self._dirty: set[int] = set()
        self._paint_due = False
        #: the request whose reply is shown, and its view
        self.shown: int | None = None
        self.view: MessageView | None = None
        #: whether the reply shown follows the current request
        self.follow = True
        #: the row the screen itself moved the cursor to (its highlight is not the person's choice)
        self._moving_to: int | None = None

    def compose(self) -> ComposeResult:
        yield Static("Server — the requests other programs send to this chat's model", classes="srv-title")
        yield Static(state_line(self.url, self.port), id="srv-state", classes="-on" if self.url else "")
        yield DataTable(id="srv-table", cursor_type="row", zebra_stripes=True)
        yield Static("No request yet: point an OpenAI client at the address above.", id="srv-prompt")
        yield VerticalScroll(id="srv-reply")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, heading in COLUMNS:
            table.add_column(heading, key=key)
        for req in self.requests:
            self._add_row(req)
        self._follow_current()
        table.focus()

    # -- what the app tells it ------------------------------------------------------------
    def request_changed(self, rid: int) -> None:
        """A served request arrived or moved on: painted with the next paint."""
        self._dirty.add(rid)
        if not self._paint_due:
            self._paint_due = True
            self.set_timer(self.PAINT_EVERY_S, self._paint)

    def serving_changed(self, url: str | None, port: int) -> None:
        self.url, self.port = url, port
        state = self.query_one("#srv-state", Static)
        state.update(state_line(url, port))
        state.set_class(bool(url), "-on")

    def set_palette(self, styles: Mapping[str, Style], version: int) -> None:
        self.draft_styles, self.palette_version = styles, version
        if self.view is not None:
            self.view.set_palette(styles, version)

    # -- painting ---------------------------------------------------------------------------
    def _request(self, rid: int) -> Any:
        req = self._rows.get(rid)
        if req is None:
            req = next((r for r in self.requests if r.rid == rid), None)
        return req

    def _paint(self) -> None:
        self._paint_due = False
        dirty, self._dirty = self._dirty, set()
        table = self.query_one(DataTable)
        for rid in sorted(dirty):
            req = self._request(rid)
            if req is None:
                continue
            if rid not in self._rows:
                self._add_row(req)
                continue
            for (key, _), value in zip(COLUMNS, row_cells(req)):
                if table.get_cell(str(rid), key) != value:
                    table.update_cell(str(rid), key, value, update_width=True)
            if rid == self.shown:
                self._stream(req)
        self._drop_gone()
        if self.follow:
            self._follow_current()

    def _add_row(self, req: Any) -> None:
        self._rows[req.rid] = req
        self.query_one(DataTable).add_row(*row_cells(req), key=str(req.rid))

    def _drop_gone(self) -> None:
        """The rows of requests the session no longer keeps (it keeps the latest 200)."""
        if len(self._rows) <= len(self.requests):     # (a deque's len: cheap)
            return
        kept = {r.rid for r in self.requests}
        table = self.query_one(DataTable)
        for rid in [rid for rid in self._rows if rid not in kept]:
            del self._rows[rid]
            table.remove_row(str(rid))

    def current(self) -> int | None:
        """The current request: the one generating, else the newest."""
        newest = None
        for req in self._rows.values():
            if req.status == "generating":
                return req.rid
            newest = req.rid
        return newest

    def _follow_current(self) -> None:
        rid = self.current()
        if rid is None:
            return
        table = self.query_one(DataTable)
        row = table.get_row_index(str(rid))
        if table.cursor_row != row:
            self._moving_to = rid
            table.move_cursor(row=row)       # (its RowHighlighted shows the request)
        elif self.shown != rid:
            self._show(rid)

    @on(DataTable.RowHighlighted, "#srv-table")
    def _highlighted(self, ev: DataTable.RowHighlighted) -> None:
        if ev.row_key is None or ev.row_key.value is None:
            return
        rid = int(ev.row_key.value)
        # the person's choice of another row holds the reply there; the current row follows again
        moved, self._moving_to = self._moving_to, None
        self.follow = rid == moved or rid == self.current()
        if rid != self.shown:
            self._show(rid)

    def _show(self, rid: int) -> None:
        """Show this request's reply (a new view: its tokens so far, then as they come)."""
        req = self._request(rid)
        if req is None:
            return
        self.shown = rid
        box = self.query_one("#srv-reply", VerticalScroll)
        if self.view is not None:
            self.view.remove()
        view = MessageView("assistant", tokens=shown_tokens(req, req.tokens, 0) or None, key=rid,
                           label=f"#{rid} reply · {req.client} · {req.endpoint}", coloured=self.coloured,
                           markdown=self.markdown, styles=self.draft_styles, palette_version=self.palette_version)
        self.view = view
        box.mount(view)
        if req.done:
            self._finish(req, view)
        else:
            view.start_streaming()
        prompt = " ".join(req.label.split())
        self.query_one("#srv-prompt", Static).update(
            f"prompt ({req.kind}): {prompt[:300]}" + ("…" if len(prompt) > 300 else ""))

    def _stream(self, req: Any) -> None:
        """The shown reply's new tokens, and its final form once the request ended."""
        view = self.view
        if view is None:
            return
        n0 = view.body.n_tokens
        rest = req.tokens[n0:]
        if rest:
            view.add_tokens(shown_tokens(req, rest, n0))
            box = self.query_one("#srv-reply", VerticalScroll)
            if box.max_scroll_y > 0 and not box.is_anchored:
                box.anchor()
        if req.done and view.streaming:
            self._finish(req, view)

    @staticmethod
    def _finish(req: Any, view: MessageView) -> None:
        result = req.result
        stats = result.stats.to_dict() if result is not None else None
        if req.status == "error":
            view.fail(req.error or "the request failed")
            return
        text = None
        if result is not None:
            # the text the client got: a chat reply without the whitespace it began with (and
            # never a stop string, which the streamed tokens may have held)
            text = result.text.lstrip() if req.kind == "chat" else result.text
        view.finish_streaming(stats, req.status, text)
        if req.status == "gone":
            view.foot.update("the client left before its turn")

    # -- actions -------------------------------------------------------------------------------
    def selected(self) -> int | None:
        """The request of the highlighted row."""
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value or 0)

    def action_toggle(self) -> None:
        self.post_message(self.Toggle())

    def action_use_in_lab(self) -> None:
        rid = self.selected()
        if rid is None:
            self.notify("No served request yet.", timeout=3)
            return
        self.post_message(self.UseInLab(rid))

    def action_close(self) -> None:
        if self.is_current:
            self.dismiss(None)
