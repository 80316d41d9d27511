"""The actions on replies: stop, regenerate, edit the last message, copy.

May touch: the session's reply (through its public methods), the conversation's views, the
clipboard.
"""

from __future__ import annotations

from textual import on, work

from ..errors import describe, user_errors
from .app_part import AppPart
from .clipboard import copy_to_system
from .widgets import MessageView, PromptInput


class ReplyActions(AppPart):
    """The app's part that acts on replies."""

    def action_stop(self) -> None:
        job = self.session.job
        if job is None:
            return
        self.session.stop()
        view = self._views_by_key.get(job.turn.key)
        if view is not None:
            view.foot.update("stopping…")
        self._set_state("stopping…")

    def action_regenerate(self) -> None:
        s = self.session
        last = s.turns[-1] if s.turns else None
        try:
            reply = s.regenerate()
        except user_errors() as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", timeout=3)
            return
        if last is not None and last is not reply and last.role == "assistant":
            self._remove_view(last.key)
        user = s.turns[-2] if len(s.turns) >= 2 else None
        if user is not None and user.key in self._views_by_key:
            self._views_by_key[user.key].remove_class("-error")
        self._mount_turn(reply)
        self._reply_started()

    def _remove_view(self, key: int) -> None:
        v = self._views_by_key.pop(key, None)
        if v is not None:
            v.remove()

    def action_edit_last(self) -> None:
        try:
            text, gone = self.session.edit_last()
        except user_errors() as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", timeout=3)
            return
        for t in gone:
            self._remove_view(t.key)
        prompt = self.query_one(PromptInput)
        prompt.text = text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        if not self.session.turns:
            self._show_welcome(True)
        self._place_cut_marker()

    @on(MessageView.CopyRequested)
    def _copy_message(self, msg: MessageView.CopyRequested) -> None:
        self.copy_text(msg.text, "message")

    def copy_text(self, text: str, what: str = "text") -> None:
        if not text:
            self.notify(f"The {what} is empty.", timeout=2)
            return
        self.copy_to_clipboard(text)  # OSC 52: works over SSH in most terminals
        self._copy_system(text)
        self.notify(f"Copied the {what} ({len(text)} characters).", timeout=2)

    @work(thread=True, group="clipboard", exit_on_error=False)
    def _copy_system(self, text: str) -> None:
        copy_to_system(text)

    def action_copy_reply(self) -> None:
        focused = self.focused
        if isinstance(focused, MessageView):
            self.copy_text(focused.text, "message")
            return
        replies = [v for v in self._views() if v.role == "assistant"]
        if not replies:
            self.notify("No reply to copy yet.", timeout=2)
            return
        self.copy_text(replies[-1].text, "reply")
