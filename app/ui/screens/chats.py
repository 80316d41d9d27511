"""ChatsScreen: the saved chats, newest first (resume, new, rename, delete, export).

It reads the list it is given (:class:`~app.storage.ChatSummary` rows) and never the store:
renaming and deleting are posted as messages, the choice comes back as a :class:`ChatsResult`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from ...storage import ChatSummary
from .confirm import ConfirmScreen
from .text_prompt import TextPromptScreen


def _ago(t: float) -> str:
    d = max(0.0, time.time() - t)
    if d < 60:
        return "just now"
    if d < 3600:
        return f"{int(d // 60)} min ago"
    if d < 86400:
        return f"{int(d // 3600)} h ago"
    return time.strftime("%Y-%m-%d", time.localtime(t))


def chat_labels(chats: Sequence[ChatSummary]) -> dict[int, tuple[str, str]]:
    """Per chat id: the title to show and, for titles that repeat, when it was started; the
    second and later chats of a title are numbered in the order they were started::

        >>> from app.storage import ChatSummary
        >>> cs = [ChatSummary(3, "Hello", 30.0, 20.0, 2), ChatSummary(2, "Plan", 10.0, 9.0, 4),
        ...       ChatSummary(1, "Hello", 5.0, 1.0, 2)]
        >>> [chat_labels(cs)[c.id][0] for c in cs]          # the list, newest first
        ['Hello (2)', 'Plan', 'Hello']
        >>> chat_labels(cs)[2][1]
        ''
    """
    by_title: dict[str, list[ChatSummary]] = {}
    for c in chats:
        by_title.setdefault(c.title, []).append(c)
    out: dict[int, tuple[str, str]] = {}
    for title, same in by_title.items():
        if len(same) == 1:
            out[same[0].id] = (title, "")
            continue
        for n, c in enumerate(sorted(same, key=lambda c: (c.created, c.id)), 1):
            out[c.id] = (title if n == 1 else f"{title} ({n})",
                         time.strftime("%Y-%m-%d %H:%M", time.localtime(c.created)))
    return out


@dataclass
class ChatsResult:
    """What the person chose in the chats list: ``resume``, ``new`` or ``export`` (with the chat)."""

    action: str
    chat_id: int | None = None


class ChatsScreen(ModalScreen[ChatsResult | None]):
    """Saved chats, newest first: resume, new, rename, delete, export.

    It is given the list and the open chat; it dismisses with a :class:`ChatsResult`.
    Renaming and deleting keep the list open: they are posted as :class:`ChatsScreen.Rename`
    and :class:`ChatsScreen.Delete`, and whoever does them calls :meth:`set_chats` with the new list.
    """

    BINDINGS = [
        Binding("escape,f2", "close", "Close"),
        Binding("enter", "resume", "Resume"),
        Binding("n", "new", "New"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("e", "export", "Export"),
    ]

    DEFAULT_CSS = """
    ChatsScreen { align: center middle; }
    ChatsScreen > Vertical { width: 84; max-width: 96%; height: 85%; padding: 0 1;
        border: round $primary; background: $surface; }
    ChatsScreen .title { text-style: bold; color: $primary; padding: 0 1; }
    ChatsScreen OptionList, ChatsScreen OptionList:focus { height: 1fr; border: none; background: $surface;
        padding: 0; }
    ChatsScreen .hint { color: $text-muted; padding: 0 1; }
    ChatsScreen Footer { dock: bottom; }
    """

    class Rename(Message):
        def __init__(self, chat_id: int, title: str):
            super().__init__()
            self.chat_id = chat_id
            self.title = title

    class Delete(Message):
        def __init__(self, chat_id: int):
            super().__init__()
            self.chat_id = chat_id

    def __init__(self, chats: Sequence[ChatSummary], current: int | None = None):
        super().__init__()
        self.chats = list(chats)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Chats", classes="title")
            yield OptionList(id="chats")
            yield Static(Content.assemble(
                ("Enter", "bold $accent"), " resume  ", ("n", "bold $accent"), " new  ",
                ("r", "bold $accent"), " rename  ", ("d", "bold $accent"), " delete  ",
                ("e", "bold $accent"), " export  ", ("Esc", "bold $accent"), " close"), classes="hint")
        # this screen's own keys (the chat's are not usable here)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.refresh_list(select=self.current)
        self.query_one(OptionList).focus()

    def set_chats(self, chats: Sequence[ChatSummary], current: int | None = None,
                  select: int | None = None) -> None:
        self.chats = list(chats)
        self.current = current
        self.refresh_list(select)

    def refresh_list(self, select: int | None = None) -> None:
        ol = self.query_one(OptionList)
        ol.clear_options()
        labels = chat_labels(self.chats)
        for c in self.chats:
            mark = "● " if c.id == self.current else "  "
            title, started = labels[c.id]
            # the subtitle is dimmed, not given a colour: it stays readable on the highlighted row
            sub = f"    {_ago(c.updated)} · {c.n_messages} messages" + (f" · started {started}" if started else "")
            prompt = Content.assemble((mark, "$accent"), (title, "bold"), "\n", (sub, "dim"))
            ol.add_option(Option(prompt, id=str(c.id)))
        if not self.chats:
            ol.add_option(Option(Content.styled("No saved chats yet — send a message to start one.", "dim"),
                                 id="none", disabled=True))
        if self.chats:
            idx = 0
            if select is not None:
                for i, c in enumerate(self.chats):
                    if c.id == select:
                        idx = i
            ol.highlighted = idx

    def _selected(self) -> int | None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            # a key pressed before the list was highlighted (Enter right after F2): the row the
            # list opens on, this chat's or the newest
            if not self.chats:
                return None
            return self.current if any(c.id == self.current for c in self.chats) else self.chats[0].id
        opt = ol.get_option_at_index(ol.highlighted)
        if opt.id in (None, "none"):
            return None
        return int(opt.id)

    def _title(self, cid: int) -> str:
        return next((c.title for c in self.chats if c.id == cid), "")

    @on(OptionList.OptionSelected)
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_resume()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_resume(self) -> None:
        cid = self._selected()
        if cid is not None:
            self.dismiss(ChatsResult("resume", cid))

    def action_new(self) -> None:
        self.dismiss(ChatsResult("new"))

    def action_rename(self) -> None:
        cid = self._selected()
        if cid is None:
            return

        def done(value: str | None) -> None:
            if value is not None and value.strip():
                self.post_message(self.Rename(cid, value.strip()))
        self.app.push_screen(TextPromptScreen("Rename chat", self._title(cid)), done)

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.post_message(self.Delete(cid))
        self.app.push_screen(ConfirmScreen(f"Delete the chat “{self._title(cid)}”? This cannot be undone."), done)

    def action_export(self) -> None:
        cid = self._selected()
        if cid is not None:
            self.dismiss(ChatsResult("export", cid))
