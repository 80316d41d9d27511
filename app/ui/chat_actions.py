"""The actions on chats: a new chat, the saved chats (F2: resume, rename, delete, export), the
system prompt.

May touch: the session's chats (through its public methods), the conversation's views, the
Chats and text-prompt dialogs.
"""

from __future__ import annotations

from pathlib import Path

from textual import on
from textual.containers import VerticalScroll

from ..errors import describe, user_errors
from .app_part import AppPart
from .screens import ChatsResult, ChatsScreen, TextPromptScreen
from .widgets import PromptInput
from .wording import sentence


class ChatActions(AppPart):
    """The app's part that acts on chats."""

    def action_system_prompt(self) -> None:
        def done(value: str | None) -> None:
            if value is None:
                return
            self.session.set_system_prompt(value)
            self.notify("System prompt saved (also the default for new chats).", timeout=3)
        self.push_screen(TextPromptScreen(
            "System prompt", self.session.system_prompt, multiline=True,
            hint="Sent before the conversation. Applies from the next reply. Ctrl+S saves."), done)

    def action_new_chat(self) -> None:
        self.session.new_chat()
        self._show_conversation()
        self._set_state("ready" if self.session.engine is not None else self.state)
        self.query_one(PromptInput).focus()

    def _show_conversation(self) -> None:
        """Replace the views with the session's turns, scrolled to the latest."""
        for v in self._views():
            v.remove()
        if self._cut_marker is not None:
            self._cut_marker.remove()
            self._cut_marker = None
        self._views_by_key.clear()
        self._hover = None
        turns = self.session.turns
        conv = self.query_one("#conversation", VerticalScroll)
        self._show_welcome(not turns)
        if turns:
            conv.mount_all([self._make_view(t) for t in turns])
        self.call_after_refresh(self._after_show)
        self._refresh_bars()
        self.refresh_bindings()

    def _after_show(self) -> None:
        conv = self.query_one("#conversation", VerticalScroll)
        conv.scroll_end(animate=False, immediate=True)
        self._stick_to_bottom()

    def resume_chat(self, chat_id: int) -> None:
        try:
            self.session.resume(chat_id)
        except user_errors() as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", severity="warning")
            return
        self._show_conversation()
        self.query_one(PromptInput).focus()

    def export_chat(self, chat_id: int | None = None) -> None:
        s = self.session
        cid = chat_id if chat_id is not None else s.chat_id
        if s.history is None or cid is None:
            self.notify("Nothing to export yet — send a message first.", timeout=3)
            return
        try:
            import platformdirs
            folder = Path(platformdirs.user_documents_dir())
        except Exception:
            folder = Path.home()
        title = next((c.title for c in s.list_chats() if c.id == cid), "chat")
        from ..storage import slugify
        default = str(folder / f"{slugify(title)}.md")

        def done(value: str | None) -> None:
            if not value:
                return
            try:
                path = s.export(value.strip(), cid)
            except (*user_errors(), OSError) as e:
                self.notify(f"could not export: {describe(e)}", severity="error")
                return
            self.notify(f"Exported to {path}", timeout=5)
        self.push_screen(TextPromptScreen("Export chat to Markdown", default, hint="File to write:",
                                          ok_label="Export"), done)

    def action_export(self) -> None:
        self.export_chat()

    def action_chats(self) -> None:
        s = self.session
        if s.history is None:
            self.notify(s.history_error or "Chat history is not available.", severity="warning")
            return

        def done(result: ChatsResult | None) -> None:
            if result is None:
                return
            if result.action == "resume" and result.chat_id is not None:
                self.resume_chat(result.chat_id)
            elif result.action == "new":
                self.action_new_chat()
            elif result.action == "export":
                self.export_chat(result.chat_id)
        self.push_screen(ChatsScreen(s.list_chats(), s.chat_id), done)

    @on(ChatsScreen.Rename)
    def _rename_chat(self, msg: ChatsScreen.Rename) -> None:
        try:
            self.session.rename(msg.chat_id, msg.title)
        except user_errors() as e:
            self.notify(sentence(describe(e)), severity="error", timeout=10)
            return
        self._refresh_chats_screen(msg.chat_id)
        self._refresh_bars()

    @on(ChatsScreen.Delete)
    def _delete_chat(self, msg: ChatsScreen.Delete) -> None:
        try:
            if self.session.delete(msg.chat_id):
                self._show_conversation()
        except user_errors() as e:
            self.notify(sentence(describe(e)), severity="error", timeout=10)
            return
        self._refresh_chats_screen()
        self.notify("Chat deleted.", timeout=2)

    def _refresh_chats_screen(self, select: int | None = None) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, ChatsScreen):
                screen.set_chats(self.session.list_chats(), self.session.chat_id, select)
