"""Reading the conversation ahead of the next reply, while the person reads and types.

:meth:`ReadAheadMixin.warm` starts a thread that has the engine read the conversation as it
stands (:meth:`speculators.engine.Engine.warm`, in the runner), so that the next reply's prompt
is read but for the new message; it posts :class:`ReadAhead` as it begins and ends. A reply
asked for meanwhile waits for the engine lock; a newer read-ahead stops the old one.
Touches only its own state and the engine, under the session's engine lock.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import describe
from .context_fit import reply_room
from .engine import engine_n_ctx, is_crash
from .events import ReadAhead, RunnerStopped

__all__ = ["ReadAheadMixin"]


class ReadAheadMixin:
    """The session's read-ahead job (a part of :class:`app.session.ChatSession`)."""

    def _init_read_ahead(self) -> None:
        #: the read-ahead of the conversation under way (see :meth:`warm`), and its stop
        self.warming: threading.Thread | None = None
        self._warm_cancel: threading.Event | None = None
        #: whether the model is reading the conversation ahead now (its ReadAhead events applied)
        self.reading_ahead = False

    def warm(self) -> bool:
        """Have the model read the conversation as it stands, while the person reads and types
        (:meth:`speculators.engine.Engine.warm`): the next reply's prompt is then read but for
        the new message. A read-ahead of another conversation still under way is stopped (what
        it read is kept); a reply asked for meanwhile waits for this one, whose work is its
        prompt's start. Nothing is read where the model is busy or missing, or where the next
        reply will leave older turns out (its prompt then starts otherwise). Returns whether
        one was started."""
        engine = self.engine
        if self.closed or engine is None or self.job is not None or not callable(getattr(engine, "warm", None)):
            return False
        self._stop_warm()
        cancel = self._warm_cancel = threading.Event()
        self.warming = self._start(self._warm_thread, engine, self.conversation(), self.config.max_tokens,
                                   cancel, name="warm")
        return True

    def _stop_warm(self) -> None:
        if self._warm_cancel is not None:
            self._warm_cancel.set()

    def _warm_thread(self, engine: Any, messages: list[dict], max_tokens: int, cancel: threading.Event) -> None:
        with self.engine_lock:
            if cancel.is_set() or self.engine is not engine or self.closed or getattr(engine, "alive", True) is False:
                return      # (a runner that is down is not started for this: the reply starts it)
            try:
                prompt = engine.prompt_tokens(messages=messages)
                n_ctx = engine_n_ctx(engine)
                if len(prompt) + reply_room(n_ctx, max_tokens) > n_ctx:
                    return      # the reply will leave older turns out: its prompt starts otherwise
                self.post(ReadAhead(True))
                n_read = 0
                try:
                    n_read = engine.warm(prompt, cancel=cancel.is_set) or 0
                finally:
                    self.post(ReadAhead(False, n_read))
            except Exception as e:
                # nothing is lost: the reply reads its prompt itself; a runner that died doing
                # this is said as one that died between replies (it is started again)
                if is_crash(e):
                    from ..runner import RunnerGaveUp
                    self.post(RunnerStopped(describe(e), isinstance(e, RunnerGaveUp)))

    # -- applying its events (owner thread) ------------------------------------------------
    def _on_ReadAhead(self, ev: ReadAhead) -> None:
        self.reading_ahead = ev.reading

    def _on_RunnerStopped(self, ev: RunnerStopped) -> None:
        if not ev.gave_up:
            self.warm()     # the fresh runner's context is empty: it reads the conversation again
