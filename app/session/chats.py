"""Editing the conversation and the saved chats: regenerate, take back, new, resume, rename, delete, export.

The owner thread's requests that change which messages the conversation holds, and the
history's list of chats. A reply being written is stopped first (its end saved to its own chat:
:meth:`app.session.reply.ReplyMixin._detach_job`); after a change the model reads the
conversation again ahead of the next reply (:mod:`app.session.read_ahead`). Touches the
session's turns, chat id, title and system prompt, and the history.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import storage
from .conversation import SessionError, Turn

__all__ = ["ChatsMixin"]


class ChatsMixin:
    """The session's editing and saved-chats job (a part of :class:`app.session.ChatSession`)."""

    def sent_messages(self, limit: int = 200) -> list[str]:
        """What the person sent before (oldest first), for the prompt's Up/Down."""
        if self.history is None:
            return []
        try:
            return self.history.sent_messages(limit)
        except Exception:
            return []

    def _ensure_chat(self) -> None:
        if self.chat_id is not None or self.history is None:
            return
        self.chat_id = self.history.create_chat(system_prompt=self.system_prompt, model=self.model_label)

    # -- editing the conversation ----------------------------------------------------------
    def regenerate(self) -> Turn:
        """Drop the last reply and write it again."""
        if self.job is not None or self.engine is None:
            raise SessionError("wait for the reply to finish" if self.job else "no model is loaded")
        if self.turns and self.turns[-1].role == "assistant":
            last = self.turns.pop()
            if self.history is not None and last.msg_id is not None:
                self.history.delete_messages([last.msg_id])
        if not self.turns or self.turns[-1].role != "user":
            raise SessionError("nothing to regenerate yet")
        self.turns[-1].error = None
        return self.start_reply()

    def edit_last(self) -> tuple[str, list[Turn]]:
        """Take back the person's last message (and what followed): returns its text and the removed turns."""
        if self.job is not None:
            raise SessionError("stop the reply first (Esc)")
        idx = max((i for i, t in enumerate(self.turns) if t.role == "user"), default=None)
        if idx is None:
            raise SessionError("no message of yours to edit")
        gone = self.turns[idx:]
        del self.turns[idx:]
        if self.history is not None:
            self.history.delete_messages([t.msg_id for t in gone if t.msg_id is not None])
        self.context_start = min(self.context_start, len(self.turns))
        return gone[0].text, gone

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt = text.strip()
        if self.history is not None and self.chat_id is not None:
            # applies from the next reply either way; the chat's copy is saved (or tried again)
            history, chat_id, prompt = self.history, self.chat_id, self.system_prompt
            self._save(("system", chat_id), lambda: history.set_system_prompt(chat_id, prompt))
        self.config.system_prompt = self.system_prompt
        self.saved_config.system_prompt = self.system_prompt
        self.save_config()
        self.warm()

    # -- the saved chats -------------------------------------------------------------------
    def new_chat(self) -> None:
        self._detach_job()
        self.turns = []
        self.chat_id = None
        self.title = ""
        self.context_start = 0
        self.system_prompt = self.config.system_prompt
        self.warm()

    def resume(self, chat_id: int) -> None:
        """Open a saved chat (the reply being written is stopped and saved to its own chat).
        Raises :class:`HistoryError` where the history cannot be read."""
        if self.history is None:
            raise SessionError(self.history_error or "chat history is not available")
        self._retry_unsaved()       # the chat is read back as it was left, where that can be saved
        try:
            chat = self.history.load_chat(chat_id)
        except KeyError:
            raise SessionError("that chat no longer exists") from None
        self._detach_job()
        self.chat_id = chat.id
        self.title = chat.title
        self.system_prompt = chat.system_prompt
        self.context_start = 0
        self.turns = [Turn(m.role, m.content, m.id, list(m.tokens), m.stats, m.status, m.finish_reason,
                           "not answered" if m.status == storage.ERROR and m.role == "user" else None)
                      for m in chat.messages]
        self.warm()

    def list_chats(self) -> list[storage.ChatSummary]:
        return self.history.list_chats() if self.history is not None else []

    def rename(self, chat_id: int, title: str) -> None:
        """Raises :class:`HistoryError` where it cannot be saved (the title is then unchanged)."""
        if self.history is None:
            return
        self.history.rename_chat(chat_id, title)
        if chat_id == self.chat_id:
            self.title = title.strip() or "Untitled chat"

    def delete(self, chat_id: int) -> bool:
        """Delete a saved chat; True when it was the open one (the session is then a new chat).
        Raises :class:`HistoryError` where it cannot be deleted (it is then as it was)."""
        if self.history is None:
            return False
        self.history.delete_chat(chat_id)
        if chat_id == self.chat_id:
            self.new_chat()
            return True
        return False

    def export(self, path: str | os.PathLike, chat_id: int | None = None) -> Path:
        from ..fileutil import atomic_write_text
        cid = chat_id if chat_id is not None else self.chat_id
        if self.history is None or cid is None:
            raise SessionError("nothing to export yet — send a message first")
        p = Path(os.path.expanduser(str(path)))
        atomic_write_text(p, storage.chat_to_markdown(self.history.load_chat(cid)))
        return p
