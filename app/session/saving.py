"""Saving to the chat history without ever stopping the chat: writes that fail are kept and tried again.

The history (:class:`app.storage.History`, SQLite) belongs to the owner thread. Every write the
session makes of a turn or a chat's system prompt goes through :meth:`SavingMixin._save`: where
it fails (a lock another program holds, a full disk) the chat goes on in memory, the write is
kept (by what it saves, newest wins) and tried again, oldest first, at the next save; the person
is told once per spell of failures (:class:`HistoryNotice`). Touches only the history.
"""

from __future__ import annotations

from typing import Any, Callable

from ..storage import History, HistoryError
from .conversation import Turn
from .events import HistoryNotice

__all__ = ["SavingMixin"]


class SavingMixin:
    """The session's history-saving job (a part of :class:`app.session.ChatSession`)."""

    #: seconds a history write on the owner (UI) thread waits for a lock another program holds
    #: before it fails and is kept to be tried again (the screen must not stop for it)
    HISTORY_WAIT_S = 0.2
    #: the same, for the last saves when the chat closes
    HISTORY_WAIT_CLOSING_S = 1.0

    def _init_saving(self, history: History | None, open_history: bool) -> None:
        self.history = history
        self.history_error: str | None = None
        if history is None and open_history:
            try:
                self.history = History(timeout=self.HISTORY_WAIT_S)
            except HistoryError as e:
                self.history_error = str(e)
        #: history writes that failed, by what they save (a turn, a chat's system prompt, ...):
        #: tried again, oldest first, at the next save (:meth:`_save`)
        self._unsaved: dict[Any, Callable[[], None]] = {}
        #: why the last save failed, while saves fail (said once: :class:`HistoryNotice`)
        self.history_failing: str | None = None

    def _store_turn(self, turn: Turn, final: bool = False) -> bool:
        """Save ``turn`` as it stands (``final``: its figures, status and end too); whether it
        is saved. Never raises (it runs on event paths and at the exit): a save that fails
        keeps the turn in memory and is tried again at the next save (:meth:`_save`)."""
        if self.history is None or turn.msg_id is None:
            return True
        return self._save(("turn", turn.key), lambda: self._write_turn(turn, final))

    def _save(self, key: Any, write: Callable[[], None]) -> bool:
        """Run a history ``write`` (``key``: what it saves; it replaces a failed write of the
        same thing), after the writes that failed before; whether all are saved now. Never
        raises: where saving fails the chat goes on in memory, what failed is kept to be tried
        again at the next save, and the person is told once (and again when it works)."""
        self._unsaved[key] = write
        return self._retry_unsaved()

    def _retry_unsaved(self) -> bool:
        """Try the writes that failed, oldest first, up to the first that fails again (so one
        save waits out a lock once at most); whether none is left. Said by
        :class:`HistoryNotice`: the first failure of a spell, and its end."""
        if self.history is None:
            self._unsaved.clear()
            return True
        while self._unsaved:
            key, write = next(iter(self._unsaved.items()))
            try:
                write()
            except HistoryError as e:
                if self.history_failing is None:
                    self.post(HistoryNotice(str(e)))
                self.history_failing = str(e)
                return False
            if self._unsaved.get(key) is write:
                del self._unsaved[key]
        if self.history_failing is not None:
            self.history_failing = None
            self.post(HistoryNotice(None))
        return True

    def _write_turn(self, turn: Turn, final: bool) -> None:
        """(:meth:`_store_turn`'s write) the turn as it is now; raises :class:`HistoryError`."""
        if self.history is None or turn.msg_id is None:
            return
        job = self.job
        if job is not None and job.turn is turn:
            # the reply thread appends to these while it writes: save a copy taken under its lock
            with job.lock:
                tokens, text = list(turn.tokens), turn.text
        else:
            tokens, text = turn.tokens, turn.text
        if final:
            self.history.update_message(turn.msg_id, content=text, tokens=tokens, stats=turn.stats,
                                        status=turn.status, finish_reason=turn.finish)
        else:
            self.history.update_message(turn.msg_id, content=text, tokens=tokens)
