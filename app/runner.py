"""The model in a process of its own, so that the chat survives whatever native code does.

The chat's process never loads a model: a *runner* child process (:mod:`app.runner_child`)
holds the model, its context, the speculator chain and the lookup caches, and the session
(:mod:`app.session`) talks to it through :class:`RunnerEngine`, which has the engine's interface
(``set_spec``, ``prompt_tokens``, ``generate``, ``close``). Where a call goes next: each becomes
a request (:mod:`app.runner_protocol`: every request has an id and every answer names it) sent
over the socket by :mod:`app.runner_link`, whose reader hands the answers back to the request
waiting for them. A stop is a message the runner acts on at once, and what the UI shows of the
engine comes from the last :class:`~app.runner_protocol.EngineSnapshot`, so that nothing the UI
does waits for the runner.

The rooms: this module (the engine's interface and the requests), :mod:`app.runner_link`
(the socket's threads and the requests in flight), :mod:`app.runner_life` (starting the runner,
its death told, :class:`RunnerCrashed`, the restart) and :mod:`app.runner_store` (the lookup
caches in the runner, :class:`RunnerStore`).

A stop (the chat's Esc) reaches the runner at once and stops a decode in progress (llama.cpp's
abort callback, on the CPU); a runner that has not ended the reply :attr:`RunnerEngine.GRACE_S`
seconds later (stuck in a native call that cannot be aborted) is killed, and the reply ends as
stopped with what it had.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from . import runner_protocol as rp
from .runner_child import CRASH_ENV, CRASH_ONCE_ENV, EventBatches, contended, die_with_parent, usable_cores
from .runner_life import (RunnerCrashed, RunnerError, RunnerGaveUp, RunnerLifeMixin, crash_advice, fspath_or_none,
                          rpc_lost, telling_lines)
from .runner_link import Abandoned, Call, Calls, Died, Link, StuckAfterCancel
from .runner_protocol import (ChainInfo, ContextInfo, EngineSnapshot, LookupInfo, ModelInfo, SpeculatorInfo,
                              TemplateInfo)
from .runner_store import STORE_MARK, RunnerStore

__all__ = ["RunnerEngine", "RunnerStore", "RunnerError", "RunnerCrashed", "RunnerGaveUp", "EngineSnapshot",
           "ModelInfo", "ChainInfo", "ContextInfo", "TemplateInfo", "LookupInfo", "SpeculatorInfo",
           "CRASH_ENV", "CRASH_ONCE_ENV", "EventBatches", "contended", "usable_cores", "die_with_parent",
           "crash_advice", "rpc_lost", "telling_lines", "STORE_MARK"]

Progress = Callable[[int, int, str], None]


class RunnerEngine(RunnerLifeMixin):
    """The engine, in a runner process (see the module docstring).

    >>> RunnerEngine.GRACE_S
    2.0
    """

    #: seconds a stopped reply may take to end before the runner is killed
    GRACE_S = 2.0
    #: seconds the runner may take to exit when closed
    CLOSE_S = 5.0
    #: how often a request in progress checks its ``cancel`` callable when nothing arrives
    POLL_S = 0.25
    #: this engine may be closed from any thread while a request runs (the runner is ended)
    closes_anytime = True

    def __init__(self, model_options: Any, spec: Any, progress: Progress | None = None, *,
                 env: dict[str, str] | None = None, lookup_root: str | os.PathLike | None = None):
        self.model_options = model_options
        self.load_spec = spec
        self.extra_env = dict(env or {})
        self.lookup_root = lookup_root
        self._init_life()
        #: the requests in flight, each waiting on its own queue
        self._calls = Calls()
        #: the reply in progress (what :meth:`stop` stops), and its stop
        self._reply: Call | None = None
        self._reply_stop: threading.Event | None = None
        #: answers that ended a request so far (whoever asked)
        self._n_endings = 0
        self._snap: EngineSnapshot | None = None
        self._store_spec: Any = None             # the spec the lookup store was opened for
        self._last_spec: Any = None              # the last speculation set (restored on a restart)
        self.closed = False
        self.load_warnings: list[str] = []
        with self._life:
            try:
                self._start(progress)
            except BaseException:
                # the first load failed (a bad model, a crash): nothing to restart, nothing left running
                self.closed = True
                self._kill()
                raise

    # -- what the UI may read (the last snapshot: never a request) -------------------------
    @property
    def snapshot(self) -> EngineSnapshot | None:
        return self._snap

    @property
    def model(self) -> ModelInfo:
        return self._snap.model

    @property
    def chain(self) -> ChainInfo:
        return self._snap.chain

    @property
    def n_rs_seq(self) -> int:
        return self._snap.ctx.n_rs_seq

    @property
    def spec(self) -> Any:
        return self._snap.spec

    @property
    def ctx(self) -> ContextInfo:
        return self._snap.ctx

    @property
    def config(self) -> ContextInfo:
        return self._snap.ctx

    @property
    def template(self) -> TemplateInfo:
        return self._snap.template

    @property
    def auto_plan(self) -> list | None:
        return self._snap.chain.auto_plan

    @property
    def devices(self) -> list:
        """The devices the runner's llama.cpp saw at load (:class:`speculators.devices.Device`)."""
        return list(self._snap.devices) if self._snap is not None else []

    @property
    def lookup(self) -> LookupInfo | None:
        """The lookup caches as the runner last said (None where they are not open)."""
        return self._snap.lookup if self._snap is not None else None

    @property
    def _proc(self) -> subprocess.Popen | None:
        return self._link.proc if self._link is not None else None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def alive(self) -> bool:
        link = self._link
        return link is not None and not link.gone and link.proc.poll() is None

    # -- answers ---------------------------------------------------------------------------
    def _on_answer(self, link: Link, msg: rp.FromRunner) -> None:
        """(The reader thread) hand ``msg`` to the request it answers; drop it where that
        request was given up. An ending's snapshot is the engine as it is now, whoever asked."""
        if isinstance(msg, rp.ENDINGS):
            if msg.snapshot is not None and link is self._link:
                self._snap = msg.snapshot
            self._idle_seq = self._log_seq
            self._n_endings += 1
        self._calls.deliver(link, msg)

    def _on_gone(self, link: Link) -> None:
        self._calls.fail(link)

    # -- requests --------------------------------------------------------------------------
    def _open(self, make: Callable[[int], rp.Request], link: Link | None = None) -> Call:
        """Send the request ``make(rid)`` (to ``link``, or the runner, started where needed)."""
        link = link or self._ensure()
        call = self._calls.open(link)
        self._request_seq = self._log_seq
        if link.gone:
            self._calls.fail(link)
        else:
            link.send(make(call.rid))
        return call

    def _give_up(self, call: Call, kill_after: float | None = None) -> None:
        """Stop waiting for ``call``: the runner is told to stop it, and its answer will be
        dropped. With ``kill_after``, a runner that has not ended it that many seconds later
        (stuck in native code) is killed and started again."""
        if not self._calls.drop(call):
            return
        call.link.send(rp.Cancel(call.rid))
        if kill_after is None:
            return
        ended = threading.Event()

        def watch() -> None:
            # the runner's next answer of any kind comes after this request ended: it is no longer stuck
            deadline = time.monotonic() + kill_after
            endings = self._n_endings
            while time.monotonic() < deadline and not call.link.gone:
                if self._n_endings != endings:
                    ended.set()
                    return
                time.sleep(0.05)
            if not ended.is_set() and not call.link.gone and self._link is call.link and not self.closed:
                with self._life:
                    if self._link is call.link:
                        self._kill()
                        self._restart_soon()
        threading.Thread(target=watch, name="draftlight-runner-stuck", daemon=True).start()

    def _answers(self, call: Call, cancel: Callable[[], bool] | None = None,
                 progress: Progress | None = None, stuck: str = "kill") -> Iterator[Any]:
        """The events of ``call`` as they come; its value is returned (``StopIteration.value``).

        Once ``cancel()`` says so, the runner is told to stop the request. Where it has not
        ended it :attr:`GRACE_S` later: ``stuck="kill"`` kills the runner (raises
        :class:`StuckAfterCancel`); ``stuck="leave"`` stops waiting (raises :class:`Abandoned`)
        and lets the runner end it in its own time, its answer dropped."""
        cancel_sent: float | None = None
        while True:
            if cancel is not None and cancel_sent is None and cancel():
                cancel_sent = time.monotonic()
                call.link.send(rp.Cancel(call.rid))
            if cancel_sent is not None and time.monotonic() - cancel_sent > self.GRACE_S:
                if stuck == "kill":
                    self._calls.drop(call)
                    with self._life:
                        if self._link is call.link:
                            self._kill()
                    raise StuckAfterCancel()
                self._give_up(call)
                raise Abandoned()
            try:
                msg = call.answers.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            if isinstance(msg, Died):
                raise self._died(call.link)
            if isinstance(msg, rp.Events):
                try:
                    yield from msg.events
                except GeneratorExit:
                    # the caller stopped reading: stop the request; its answer is dropped
                    self._give_up(call, kill_after=self.GRACE_S)
                    raise
            elif isinstance(msg, rp.Progress):
                if progress is not None:
                    progress(msg.done, msg.total, msg.phase)
            elif isinstance(msg, rp.Done):
                return msg.value
            elif isinstance(msg, rp.Failed):
                raise msg.error
            elif isinstance(msg, rp.Cancelled):
                raise Abandoned()

    def _request(self, make: Callable[[int], rp.Request], progress: Progress | None = None,
                 link: Link | None = None) -> Any:
        """Send a request and wait for its value (its events, if any, are not expected)."""
        call = self._open(make, link)
        gen = self._answers(call, progress=progress)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    # -- the engine's interface ------------------------------------------------------------
    def set_spec(self, params: Any, resources: dict | None = None) -> ChainInfo:
        if self._gave_up is not None and params.to_dict() != (self._last_spec.to_dict() if self._last_spec else None):
            self._gave_up = None       # other settings: worth another try
            self._crashes.clear()
        with_store = bool(resources and resources.get(STORE_MARK))
        self._request(lambda rid: rp.SetSpec(rid, params, with_store))
        self._last_spec = params
        return self._snap.chain

    def prompt_tokens(self, messages: Sequence[dict] | None = None, text: str | None = None,
                      raw: bool = False) -> list[int]:
        msgs = [dict(m) for m in messages] if messages is not None else None
        return self._request(lambda rid: rp.PromptTokens(rid, msgs, text, raw))

    def generate(self, prompt: Sequence[int], max_tokens: int = 512, sampling: Any = None,
                 stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None,
                 stats_interval_s: float = 0.25, context_shift: bool = False, n_keep: int = 0) -> Iterator[Any]:
        """The engine's events, from the runner; see :meth:`speculators.engine.Engine.generate`."""
        from speculators.events import StatsEvent, StepEvent
        opts = rp.GenerateOptions(max_tokens, sampling, tuple(stop), stats_interval_s, context_shift, n_keep)
        prompt = list(prompt)
        call = self._open(lambda rid: rp.Generate(rid, prompt, opts))
        tokens: list = []
        last_stats = None
        stopped = threading.Event()
        self._reply = call
        self._reply_stop = stopped

        def cancelled() -> bool:
            return stopped.is_set() or (cancel is not None and cancel())
        events = self._answers(call, cancel=cancelled)
        try:
            for ev in events:
                if isinstance(ev, StepEvent):
                    tokens.extend(ev.tokens)
                elif isinstance(ev, StatsEvent):
                    last_stats = ev.stats
                yield ev
        except StuckAfterCancel:
            # stopped, but stuck in native code: killed; the reply ends as stopped with what it had
            yield self._stopped(prompt, tokens, last_stats,
                                "stopped; the model runner did not respond and was restarted")
            self._restart_soon()
            return
        except Abandoned:
            if not cancelled():
                raise
            # stopped before the runner began it (it was still queued there): an empty reply, stopped
            yield self._stopped(prompt, tokens, last_stats, "stopped before it began")
            return
        finally:
            events.close()
            if self._reply is call:
                self._reply = None
        self._crashes.clear()

    @staticmethod
    def _stopped(prompt: Sequence[int], tokens: list, last_stats: Any, why: str) -> Any:
        """The end of a reply that was stopped with ``tokens`` written."""
        from speculators.events import STOP_CANCELLED, FinishEvent, GenerationResult, GenerationStats
        stats = last_stats or GenerationStats(n_prompt=len(prompt))
        stats.n_generated = len(tokens)
        return FinishEvent(GenerationResult("".join(t.text for t in tokens), [t.id for t in tokens],
                                            [t.drafted_by for t in tokens], [t.draft_pos for t in tokens],
                                            STOP_CANCELLED, stats, why))

    def warm(self, prompt: Sequence[int], cancel: Callable[[], bool] | None = None) -> int:
        """Read ``prompt`` ahead of a reply (see :meth:`speculators.engine.Engine.warm`); a
        ``cancel()`` that says so stops it between pieces (it is never killed for being slow to
        stop: it is reading, and ends soon; after :attr:`GRACE_S` it is no longer waited for)."""
        prompt = list(prompt)
        call = self._open(lambda rid: rp.Warm(rid, prompt))
        gen = self._answers(call, cancel=cancel, stuck="leave")
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            return stop.value or 0
        except Abandoned:
            return 0

    def stop(self) -> None:
        """Stop the reply in progress now (from any thread, the UI's included: it never waits)."""
        call, stop = self._reply, self._reply_stop
        if call is not None:
            call.link.send(rp.Cancel(call.rid))
            if stop is not None:
                stop.set()            # the reply's own wait starts counting the grace from here

    def run(self, prompt: Sequence[int], **kw: Any) -> Any:
        """Generate to the end and return the result (the engine's ``run``; the Lab uses it)."""
        from speculators.events import FinishEvent
        result = None
        for ev in self.generate(prompt, **kw):
            if isinstance(ev, FinishEvent):
                result = ev.result
        return result

    def lab_cost_curve(self, n_max: int = 16) -> list[float]:
        """The target's verify-cost curve (see :meth:`speculators.engine.Engine.lab_cost_curve`)."""
        return self._request(lambda rid: rp.LabCostCurve(rid, n_max))

    # -- the lookup caches (kept in the runner) --------------------------------------------
    def open_store(self, spec: Any, lookup_root: str | os.PathLike | None = None) -> tuple[Any, list[str]]:
        """Open the lookup caches of the model's vocabulary in the runner: (a store proxy, warnings)."""
        self.lookup_root = lookup_root
        ok, warnings = self._request(lambda rid: rp.OpenStore(rid, spec, fspath_or_none(lookup_root)))
        if not ok:
            return None, list(warnings)
        self._store_spec = spec
        return RunnerStore(self), list(warnings)

    def lookup_contribution(self) -> dict:
        """Drafted / accepted tokens per lookup cache, as the runner last said (never waits)."""
        info = self.lookup
        return dict(info.contribution) if info is not None else {}

    def close(self, timeout: float | None = None) -> None:
        """End the runner (it saves its lookup caches) from any thread, a request in progress
        included; one that has not exited ``timeout`` seconds later (:attr:`CLOSE_S`) is killed.
        It never waits for a runner being started (a restart loading its model): that one
        ends itself once it sees :attr:`closed`."""
        if self.closed:
            return
        self.closed = True
        link = self._link
        if link is None:
            return
        link.ended_here = True
        if not link.gone and link.proc.poll() is None:
            call = self._reply
            if call is not None:
                link.send(rp.Cancel(call.rid))
            link.send(rp.Close())
            with contextlib.suppress(subprocess.TimeoutExpired):
                link.proc.wait(self.CLOSE_S if timeout is None else timeout)
        self._kill(link)
