"""The chat session: everything the chat does, without Textual.

A :class:`ChatSession` owns the conversation, the engine's lifecycle (load, apply settings,
close), the reply being written, the history, the lookup caches and the statistics, and speaks
in typed events (:mod:`app.session.events`). Each of its jobs is a mixin in a module of its
own; this one holds the state they share, the conversation as the model is given it, sending
a message, the dispatch of events by type and the close.

The path of a message: the UI calls :meth:`ChatSession.send` → the reply thread
(:mod:`app.session.reply`) → the engine's ``generate`` (:class:`app.runner.RunnerEngine`, which
sends it to the runner process) → token events back on the reply thread → a posted
:class:`ReplyProgress` → :meth:`ChatSession.apply` on the owner thread → the UI's handler.

Threads: the public methods are called from one *owner* thread (the UI's). Work that takes
time (loading, generating, rebuilding the chain, saving the lookup caches) runs in threads the
session starts; they report by calling ``post(event)``, which must hand the event back to the
owner thread, where :meth:`ChatSession.apply` brings the session up to date before the UI looks
at it. The Textual app does this with ``post_message``; a test with a queue::

    q = queue.Queue()
    s = ChatSession(config, post=q.put, engine_factory=factory, history=History(tmp / "h.db"))
    s.load()
    drain(s, q, until=lambda: s.engine is not None)
    s.send("Hello")
    drain(s, q, until=lambda: s.job is None)
    s.turns[-1].text          # the reply
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any, Callable

from .. import config as config_mod
from .. import storage
from ..errors import describe
from ..figures import SessionStats
from ..storage import History, HistoryError
from .chats import ChatsMixin
from .conversation import SessionError, Turn
from .engine import ChatEngine, EngineFactory, Post, default_engine_factory
from .events import (ContextTrimmed, EngineFailed, EngineReady, LookupSaved, ReadAhead, ReplyDone, ReplyFailed,
                     ReplyProgress, RunnerStopped, ServedDone, ServedProgress, SpecApplied, StaticBuilt)
from .lab_requests import LabMixin
from .loading import LoadingMixin
from .lookup import LookupMixin
from .read_ahead import ReadAheadMixin
from .reply import ReplyMixin
from .saving import SavingMixin
from .serving import ServeMixin

__all__ = ["ChatSession"]


class ChatSession(LoadingMixin, ReplyMixin, ReadAheadMixin, ChatsMixin, SavingMixin, LookupMixin, LabMixin,
                  ServeMixin):
    """See the module docstring; each base class is one of the session's jobs."""

    #: seconds the runner is given to save its caches and exit when the chat closes (then it is killed)
    CLOSE_RUNNER_S = 0.75

    def __init__(self, config: config_mod.Config | None = None, *, post: Post,
                 engine_factory: EngineFactory | None = None, history: History | None = None,
                 open_history: bool = True, saved_config: config_mod.Config | None = None,
                 persist_config: bool = True, lookup_root: str | os.PathLike | None = None,
                 use_lookup_store: bool = True):
        self.config = config or config_mod.Config()
        #: what config.toml holds; changes made in the app go here too, command-line flags do not
        self.saved_config = saved_config if saved_config is not None else \
            config_mod.Config.from_toml_dict(self.config.to_toml_dict())
        self.persist_config = persist_config
        #: saved_config as config.toml held it when last read or written: a save writes what differs
        self._config_on_disk = self.saved_config.copy()
        self.post = post
        self.engine_factory = engine_factory or default_engine_factory
        self.engine: ChatEngine | None = None
        #: held by whoever uses the engine (a reply throughout, a read-ahead, a settings change)
        self.engine_lock = threading.Lock()
        self._init_saving(history, open_history)
        self._init_lookup(lookup_root, use_lookup_store)
        self._init_loading()
        self._init_reply()
        self._init_read_ahead()
        self._init_serving()
        self.chat_id: int | None = None
        self.title = ""
        self.system_prompt = self.config.system_prompt
        self.turns: list[Turn] = []
        #: index in turns of the first message the model saw for the last reply (0: all)
        self.context_start = 0
        self.stats = SessionStats()
        #: a message sent while the model loads, to send once it is ready
        self.queued: str | None = None
        self.closed = False
        self._threads: list[threading.Thread] = []

    # -- threads ---------------------------------------------------------------------------
    def _start(self, target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=f"draftlight-{name}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()
        return t

    # -- labels ----------------------------------------------------------------------------
    @property
    def model_label(self) -> str:
        if self.engine is None:
            m = self.config.model.model
            return Path(m).stem if m else "default model"
        return Path(str(getattr(self.engine.model, "path", "") or "")).stem or "model"

    @property
    def active_types(self) -> list[str]:
        """Speculators in the chain, in priority order (empty while no model is loaded)."""
        chain = getattr(self.engine, "chain", None)
        return [s.name for s in getattr(chain, "speculators", [])] if chain is not None else []

    @property
    def skipped(self) -> dict[str, str]:
        chain = getattr(self.engine, "chain", None)
        return dict(getattr(chain, "skipped", {}) or {}) if chain is not None else {}

    @property
    def configured_types(self) -> list[str]:
        return [getattr(t, "value", str(t)) for t in self.config.spec.types]

    @property
    def n_ctx(self) -> int:
        cfg = getattr(self.engine, "config", None)
        n = getattr(cfg, "n_ctx", None)
        ctx = getattr(self.engine, "ctx", None)
        return int(getattr(ctx, "n_ctx", None) or n or self.config.model.ctx_size or 4096)

    # -- config ----------------------------------------------------------------------------
    def save_config(self) -> str | None:
        """Write config.toml; returns an error message, or None."""
        if not self.persist_config:
            return None
        try:
            config_mod.save(self.saved_config, since=self._config_on_disk)
        except config_mod.ConfigError as e:
            return describe(e)
        except OSError as e:
            return f"could not save settings: {describe(e)}"
        self._config_on_disk = self.saved_config.copy()
        return None

    def remember_ui(self, **values: Any) -> str | None:
        self.config.ui.update(values)
        self.saved_config.ui.update(values)
        return self.save_config()

    # -- the conversation ------------------------------------------------------------------
    def conversation(self, upto: int | None = None) -> list[dict]:
        """The messages the model is given (before any cut to fit the context)."""
        msgs: list[dict] = []
        if self.system_prompt.strip():
            msgs.append({"role": "system", "content": self.system_prompt})
        for t in self.turns[:upto]:
            if t.sent_to_model:
                msgs.append({"role": t.role, "content": t.text})
        return msgs

    def send(self, text: str) -> Turn | None:
        """Add the person's message and start the reply.

        Returns the reply's turn; None when the message was queued because the
        model is still loading. Raises :class:`SessionError` when it cannot be sent, and
        :class:`HistoryError` when it cannot be saved: then nothing was sent (the conversation
        is as it was), so the person's text stays where they typed it, to send again.
        """
        text = text.strip("\n")
        if not text.strip():
            raise SessionError("the message is empty")
        if self.job is not None:
            raise SessionError("a reply is still being written — Esc stops it")
        if self.engine is None:
            if self.loading:
                self.queued = text
                return None
            raise SessionError("no model is loaded — pick one above")
        self._ensure_chat()
        turn = Turn("user", text)
        if self.history is not None and self.chat_id is not None:
            turn.msg_id = self.history.add_message(self.chat_id, "user", text)
        self.turns.append(turn)
        try:
            reply = self.start_reply()
        except HistoryError:
            # the reply's record could not be added: the message is taken back, its saved
            # record too (at the next save, where the history refuses this one as well)
            self.turns.remove(turn)
            if self.history is not None and turn.msg_id is not None:
                history, msg_id = self.history, turn.msg_id
                self._unsaved[("turn", turn.key)] = lambda: history.delete_messages([msg_id])
            raise
        if self.history is not None and self.chat_id is not None and not self.title:
            self.title = storage.title_from(text)
        self._retry_unsaved()
        return reply

    # -- applying events (owner thread) ----------------------------------------------------
    def apply(self, ev: Any) -> None:
        """Bring the session up to date with an event from one of its threads."""
        handler = self.handlers().get(type(ev))
        if handler is not None:
            handler(ev)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """The session's handler of each event type it keeps itself up to date with (by type:
        a renamed event class is a NameError here, never a handler silently lost)."""
        return {EngineReady: self._on_EngineReady, ReadAhead: self._on_ReadAhead,
                EngineFailed: self._on_EngineFailed, SpecApplied: self._on_SpecApplied,
                ReplyProgress: self._on_ReplyProgress, ContextTrimmed: self._on_ContextTrimmed,
                ReplyDone: self._on_ReplyDone, ReplyFailed: self._on_ReplyFailed,
                RunnerStopped: self._on_RunnerStopped, LookupSaved: self._on_LookupSaved,
                StaticBuilt: self._on_StaticBuilt, ServedProgress: self._on_ServedProgress,
                ServedDone: self._on_ServedDone}

    # -- the end ---------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop the reply (saved as stopped), save the lookup caches, free the model, close the history."""
        if self.closed:
            return
        self.closed = True
        self._stop_warm()
        job = self.job
        if self.history is not None:
            # the last saves may wait a little longer for a lock another program holds
            with contextlib.suppress(HistoryError):
                self.history.set_timeout(self.HISTORY_WAIT_CLOSING_S)
        self._detach_job()
        self._close_serving()        # (after the reply's stop: a request waiting behind it ends at once)
        if job is None:
            self._retry_unsaved()     # (a reply's save, just above, tried them)
        if self._build_cancel is not None:
            self._build_cancel.set()
        store, self.store = self.store, None
        engine, self.engine = self.engine, None
        from ..runner import RunnerEngine
        if isinstance(engine, RunnerEngine):
            # the runner saves its lookup caches as it exits; one that does not exit in time (stuck
            # in native code) is killed: the caches were saved after the last reply
            engine.close(timeout=min(timeout, self.CLOSE_RUNNER_S))
        else:
            # an engine in this process: wait (briefly) for a reply thread to notice the cancel
            # before freeing the model
            if job is not None and job.thread is not None:
                job.thread.join(timeout)
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            if engine is not None and self.engine_lock.acquire(timeout=timeout):
                try:
                    engine.close()
                finally:
                    self.engine_lock.release()
        if self.history is not None:
            self.history.close()
