"""The reply being written: its thread, the tokens it hands over, and how it ends.

:meth:`ReplyMixin.start_reply` starts a thread that fits the conversation into the context
(:mod:`app.session.context_fit`), calls the engine's ``generate`` (in the runner:
:meth:`app.runner.RunnerEngine.generate`) and appends each :class:`~speculators.events.TokenEvent`
to the reply's :class:`~app.session.conversation.Turn` under the job's lock. It posts one
:class:`ReplyProgress` at a time (what arrives meanwhile coalesces), then :class:`ReplyDone` or
:class:`ReplyFailed`; the owner thread joins the text, saves the turn
(:mod:`app.session.saving`) and hands the event on to the UI. After a reply the lookup caches
learn it (:mod:`app.session.lookup`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from speculators.events import STOP_CANCELLED, FinishEvent, GenerationStats, StatsEvent, StepEvent, TokenEvent
from speculators.sampling import SamplingParams

from .. import storage
from ..errors import describe
from .context_fit import fit_to_context, system_tokens
from .conversation import SessionError, Turn
from .engine import ChatEngine, engine_n_ctx, is_crash, stop_strings
from .events import ContextTrimmed, LookupSaved, ReplyDone, ReplyFailed, ReplyProgress

__all__ = ["ReplyJob", "ReplyMixin"]


@dataclass(eq=False)
class ReplyJob:
    """The reply being written: shared by its thread and the owner, under :attr:`lock`."""

    turn: Turn
    messages: list[dict]
    #: index in turns of each non-system message in ``messages``
    turn_index: list[int]
    cancel: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    signalled: bool = False                # a ReplyProgress is on its way to the owner
    live: GenerationStats | None = None    # the live figures the owner has applied
    live_next: GenerationStats | None = None   # newer ones, not applied yet
    n_joined: int = 0                      # tokens already in turn.text
    last_saved: float = field(default_factory=time.perf_counter)
    started: float = field(default_factory=time.perf_counter)
    thread: threading.Thread | None = None
    lstrip_pending: bool = True            # the reply's leading whitespace is not shown
    holds_engine: bool = False             # its thread holds the engine lock (Esc may stop the engine)


class ReplyMixin:
    """The session's reply job (a part of :class:`app.session.ChatSession`)."""

    #: seconds between saves of a streaming reply (a crash loses at most this much of it)
    SAVE_EVERY_S = 0.5
    #: while saving fails, a streaming reply is saved again this far apart (each try may wait
    #: out a lock another program holds: History's timeout, on the owner thread)
    SAVE_RETRY_S = 5.0

    def _init_reply(self) -> None:
        self.job: ReplyJob | None = None

    def start_reply(self) -> Turn:
        """Write a reply to the conversation as it stands (the last turn is the person's)."""
        if self.engine is None:
            raise SessionError("no model is loaded")
        if self.job is not None:
            raise SessionError("a reply is still being written — Esc stops it")
        self._ensure_chat()
        messages = self.conversation()
        turn_index = [i for i, t in enumerate(self.turns) if t.sent_to_model]
        turn = Turn("assistant", status=storage.STREAMING)
        if self.history is not None and self.chat_id is not None:
            turn.msg_id = self.history.add_message(self.chat_id, "assistant", "", status=storage.STREAMING)
        self.turns.append(turn)
        job = ReplyJob(turn, messages, turn_index)
        self.job = job
        job.thread = self._start(self._reply_thread, job, self.engine, self.config.max_tokens,
                                 dataclasses.replace(self.config.sampling), self.config.overflow,
                                 name=f"reply-{turn.key}")
        return turn

    def stop(self) -> None:
        """Stop the reply being written (it ends as stopped, with what it has, by its thread)."""
        if self.job is not None:
            self.job.cancel.set()
            self._stop_engine_now()

    def _stop_engine_now(self) -> None:
        """Tell the engine to stop the reply at once (a runner acts on it now; the reply thread
        would only see its cancel flag at its next look). Only while the reply's own thread holds
        the engine: a reply still waiting for it (behind a served request, a read-ahead) sees its
        cancel flag before it starts, and the engine's generation then is somebody else's."""
        job = self.job
        if job is None or not job.holds_engine:
            return
        stop_now = getattr(self.engine, "stop", None)
        if callable(stop_now):
            stop_now()

    def _detach_job(self) -> None:
        """Stop a reply that is being written; its end is still saved to its own chat."""
        job = self.job
        if job is None:
            return
        job.cancel.set()
        self._stop_engine_now()
        with job.lock:
            job.turn.text = "".join(t.text for t in job.turn.tokens)
        job.turn.status = storage.CANCELLED
        job.turn.finish = STOP_CANCELLED
        self._store_turn(job.turn, final=True)
        self.job = None

    # -- the reply thread ------------------------------------------------------------------
    def _reply_thread(self, job: ReplyJob, engine: ChatEngine, max_tokens: int, sampling: SamplingParams,
                      overflow: str) -> None:
        key = job.turn.key
        with self.engine_lock:
            if job.cancel.is_set() and self.engine is not engine:
                self.post(ReplyFailed(key, "the model was unloaded"))
                return
            job.holds_engine = True
            try:
                prompt, cut = fit_to_context(engine, job.messages, max_tokens, overflow, job.turn_index)
                if cut is not None:
                    self.post(ContextTrimmed(key, cut[0], cut[1], len(prompt), engine_n_ctx(engine)))
                stop = stop_strings(engine)
                result = None
                # under the rolling window a reply that fills the context shifts it (the system
                # prompt stays) instead of stopping, as llama-server does
                rolling = overflow == "rolling"
                n_keep = system_tokens(engine, job.messages) if rolling else 0
                for ev in engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                          cancel=job.cancel.is_set, context_shift=rolling, n_keep=n_keep):
                    if isinstance(ev, StepEvent):
                        if ev.tokens:
                            self._add_tokens(job, ev.tokens)
                    elif isinstance(ev, StatsEvent):
                        self._add_stats(job, dataclasses.replace(ev.stats))
                    elif isinstance(ev, FinishEvent):
                        result = ev.result
                if result is None:
                    raise RuntimeError("the engine ended without a result")
            except Exception as e:
                msg = describe(e)
                if is_crash(e) and job.turn.tokens:
                    msg = f"the reply was cut here: {msg}"
                self.post(ReplyFailed(key, msg))
                return
            finally:
                job.holds_engine = False       # its generation is over: the engine's next is not its
            # the reply is done before the caches learn it (a runner restarted by a stop loads
            # its model before it can learn: the chat does not wait for that)
            self.post(ReplyDone(key, result))
            store = self.store
            if store is None:
                return
            try:
                # under the engine lock: the speculator reads the dynamic cache while drafting
                learned = store.learn(list(prompt) + list(result.tokens))
            except Exception as e:
                self.post(LookupSaved({"error": describe(e)}))
                return
        if learned:
            self._save_lookup(store)

    def _add_tokens(self, job: ReplyJob, tokens: Sequence[TokenEvent]) -> None:
        now = time.perf_counter()
        with job.lock:
            for t in tokens:
                if job.lstrip_pending:
                    # a transcript's "Assistant:" is followed by a space the reply does not begin with
                    stripped = t.text.lstrip()
                    if stripped:
                        job.lstrip_pending = False
                    t.text = stripped
                job.turn.tokens.append(t)
                job.turn.arrived.append(now)
            post = self._signal(job)
        if post:
            self.post(ReplyProgress(job.turn.key))

    def _add_stats(self, job: ReplyJob, stats: GenerationStats) -> None:
        with job.lock:
            job.live_next = stats
            post = self._signal(job)
        if post:
            self.post(ReplyProgress(job.turn.key))

    @staticmethod
    def _signal(job: ReplyJob) -> bool:
        """(Under ``job.lock``) whether a ReplyProgress must be posted: none is on its way."""
        post = not job.signalled
        job.signalled = True
        return post

    def new_tokens(self, turn: Turn, start: int) -> list[TokenEvent]:
        """The tokens of ``turn`` from ``start`` on (safe while the reply is written)."""
        job = self.job
        if job is not None and job.turn is turn:
            with job.lock:
                return turn.tokens[start:]
        return turn.tokens[start:]

    # -- applying its events (owner thread) ------------------------------------------------
    def _job_for(self, key: int) -> ReplyJob | None:
        job = self.job
        return job if job is not None and job.turn.key == key else None

    def _on_ReplyProgress(self, ev: ReplyProgress) -> None:
        job = self._job_for(ev.key)
        if job is None:
            return
        with job.lock:
            job.signalled = False
            tokens = job.turn.tokens
            if job.n_joined < len(tokens):
                job.turn.text += "".join(t.text for t in tokens[job.n_joined:])
                job.n_joined = len(tokens)
            if job.live_next is not None:
                job.live, job.live_next = job.live_next, None
        now = time.perf_counter()
        every = self.SAVE_EVERY_S if self.history_failing is None else self.SAVE_RETRY_S
        if self.history is not None and job.turn.msg_id is not None and now - job.last_saved >= every:
            # the reply so far, so that a crash or a kill loses at most half a second of it (a
            # save that fails keeps the reply here, says so once, and is tried again later)
            job.last_saved = now
            self._store_turn(job.turn)

    def _on_ContextTrimmed(self, ev: ContextTrimmed) -> None:
        if self._job_for(ev.key) is not None:
            self.context_start = ev.first_kept

    def _on_ReplyDone(self, ev: ReplyDone) -> None:
        job = self._job_for(ev.key)
        if job is None:
            return
        r = ev.result
        turn = job.turn
        with job.lock:
            tokens = turn.tokens
        # the reply is the engine's text (a stop string is never in it), less the leading
        # whitespace the turn never showed; a finished reply ends at its last visible character
        # (transcript models end their turn with a newline before the next "User:" line)
        shown = "".join(t.text for t in tokens)
        final = r.text.lstrip()
        if r.finish_reason != STOP_CANCELLED:
            final = final.rstrip()
        if final != shown and shown.startswith(final):
            tokens = storage.truncate_tokens(tokens, len(final))
        turn.tokens = list(tokens)
        turn.text = "".join(t.text for t in turn.tokens)
        turn.stats = r.stats.to_dict()
        turn.finish = r.finish_reason
        turn.status = storage.CANCELLED if r.finish_reason == STOP_CANCELLED else storage.DONE
        self.stats.add(r.stats, turn.tokens)
        self._store_turn(turn, final=True)
        self.job = None

    def _on_ReplyFailed(self, ev: ReplyFailed) -> None:
        job = self._job_for(ev.key)
        if job is None:
            return
        turn = job.turn
        turn.error = ev.error
        turn.status = storage.ERROR
        turn.text = "".join(t.text for t in turn.tokens)
        if self.history is not None and turn.msg_id is not None:
            history, msg_id = self.history, turn.msg_id
            if turn.tokens:
                text, tokens = turn.text, list(turn.tokens)
                self._save(("turn", turn.key), lambda: history.update_message(
                    msg_id, content=text, tokens=tokens, status=storage.ERROR, finish_reason="error"))
            else:
                turn.msg_id = None
                self._save(("turn", turn.key), lambda: history.delete_messages([msg_id]))
        # the person's message that could not be answered is not sent again with the next one
        idx = self.turns.index(turn) if turn in self.turns else -1
        if idx > 0 and not turn.tokens and self.turns[idx - 1].role == "user":
            self.turns[idx - 1].error = ev.error
        self.job = None
