"""The model in a process of its own, so that the chat survives whatever native code does.

The chat's process never loads a model: a *runner* child process
(:mod:`app.runner_child`) holds the model, its context, the speculator chain and
the lookup caches, and the session talks to it through :class:`RunnerEngine`,
which has the engine's interface (``set_spec``, ``prompt_tokens``, ``generate``,
``close``). The messages and the rules they follow are in
:mod:`app.runner_protocol`: every request has an id and every answer names it
(a late answer to a cancelled request is dropped, never taken for another's),
a stop is a message the runner acts on at once, and what the UI shows of the
engine comes from the last :class:`~app.runner_protocol.EngineSnapshot`, so
that nothing the UI does waits for the runner.

Threads of the chat's process, per runner: a *writer* that sends what was queued
(so no caller, the UI's thread included, ever blocks on a busy or stopped
runner's socket), a *reader* that hands each answer to the request waiting for
it, and a *log reader* (llama.cpp's lines, and the runner's death between
requests). A request waits on its own queue.

When the runner dies (a segmentation fault or an abort in llama.cpp, the
kernel's OOM killer, a ``kill``), the request in progress raises
:class:`RunnerCrashed`, whose message says how it died, the last lines it
logged and what to try; a fresh runner is then started in the background
(the model loaded again, the last speculation and lookup caches restored).
The same crash twice in a row with the same settings stops the automatic
restart (:class:`RunnerGaveUp`) until the settings change.

A stop (the chat's Esc) reaches the runner at once and stops a decode in
progress (llama.cpp's abort callback, on the CPU); a runner that has not ended
the reply :attr:`RunnerEngine.GRACE_S` seconds later (stuck in a native call
that cannot be aborted) is killed, and the reply ends as stopped with what it had.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator, Sequence

from . import runner_protocol as rp
from .errors import UserError, describe
from .runner_child import CRASH_ENV, CRASH_ONCE_ENV, EventBatches, contended, die_with_parent, usable_cores
from .runner_protocol import (ChainInfo, ContextInfo, EngineSnapshot, LookupInfo, ModelInfo, SpeculatorInfo,
                              TemplateInfo)

__all__ = ["RunnerEngine", "RunnerStore", "RunnerError", "RunnerCrashed", "RunnerGaveUp", "EngineSnapshot",
           "ModelInfo", "ChainInfo", "ContextInfo", "TemplateInfo", "LookupInfo", "SpeculatorInfo",
           "CRASH_ENV", "CRASH_ONCE_ENV", "EventBatches", "contended", "usable_cores", "die_with_parent",
           "crash_advice", "rpc_lost", "telling_lines"]

Progress = Callable[[int, int, str], None]

#: marks the lookup store of the runner in ``set_spec`` resources
STORE_MARK = "__runner_store__"


class RunnerError(UserError, RuntimeError):
    """The runner could not do what was asked (its message is meant for people)."""


class RunnerCrashed(RunnerError):
    """The runner process died; the message says how, and what it logged last."""

    def __init__(self, message: str, returncode: int | None = None, log_tail: Sequence[str] = ()):
        super().__init__(message)
        self.returncode = returncode
        self.log_tail = list(log_tail)


class RunnerGaveUp(RunnerCrashed):
    """The runner crashed the same way twice in a row: it is not started again automatically."""


# ---------------------------------------------------------------------------
# how a runner's death is told
# ---------------------------------------------------------------------------

def _signal_text(rc: int | None) -> str:
    from .cpu_check import signal_name
    return signal_name(rc)


#: what ggml's RPC client logs before it aborts on a server that went away (ggml-rpc.cpp)
RPC_LOST_MARKS = ("Remote RPC server crashed", "RPC handshake failed", "Failed to connect to")


def rpc_lost(lines: Sequence[str]) -> str | None:
    """What ggml said when an RPC server went away, when that is why the runner died.

    >>> rpc_lost(["x", "/build/ggml/src/ggml-rpc/ggml-rpc.cpp:566: Remote RPC server crashed or returned "
    ...           "malformed response"])
    'ggml-rpc: Remote RPC server crashed or returned malformed response'
    """
    import re
    for line in reversed(list(lines)):
        if any(m in line for m in RPC_LOST_MARKS):
            return "ggml-rpc: " + re.sub(r"^.*?ggml-rpc\.cpp:\d+:\s*", "", line.strip())
    return None


def crash_advice(rc: int | None, chat: bool = True, lines: Sequence[str] = ()) -> str:
    """What to try after the engine's process died with exit status ``rc`` (``lines``: its last log)."""
    if rpc_lost(lines):
        return ("an RPC server (--rpc) stopped answering, and ggml ends the process then; start "
                "`draftlight rpc-server` there again" +
                ("; meanwhile the model runs without it (reload the model in F3 once it is back)" if chat else ""))
    other = "another speculation setting (F3)" if chat else "another --spec-type"
    if rc == -signal.SIGKILL:
        return ("it was killed (SIGKILL), most often by the system when memory runs out: try a smaller "
                "context (-c) or model, or fewer GPU layers")
    if rc in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGILL, -signal.SIGABRT, -signal.SIGFPE):
        return ("that is a crash in llama.cpp's native code: try --extra-bufts off (llama.cpp's --no-repack), "
                f"fewer GPU layers (-ngl), or {other}; `draftlight doctor --json` is what a bug report needs")
    return "try loading the model again (F3)" if chat else "`draftlight doctor` shows what this machine has"


_FAULTHANDLER_PREFIXES = ("Fatal Python error", "Current thread", "Thread 0x", "  File ", "Extension modules",
                          "Stack (most recent", "<no Python frame>", "Total number")


def telling_lines(lines: Sequence[str], n: int = 4) -> list[str]:
    """The last ``n`` lines worth showing (no Python stack dump, no blank lines)."""
    out = [l.strip() for l in lines if l.strip() and not l.startswith(_FAULTHANDLER_PREFIXES)]
    return out[-n:]



# ---------------------------------------------------------------------------
# the chat's side
# ---------------------------------------------------------------------------

class _Died:
    """Put in a request's queue when its runner is gone."""


class _Call:
    """A request in flight: the answers for it arrive in :attr:`answers`, in order."""

    def __init__(self, rid: int, link: "_Link"):
        self.rid = rid
        self.link = link
        self.answers: queue.Queue[rp.FromRunner | _Died] = queue.Queue()


class _Link:
    """One runner process, and the writer and reader threads that talk to it."""

    def __init__(self, proc: subprocess.Popen, conn: Connection,
                 on_answer: Callable[["_Link", rp.FromRunner], None], on_gone: Callable[["_Link"], None]):
        self.proc = proc
        self.conn = conn
        self.gone = False
        #: set where this side ended the runner (killed, closed): its death is not a crash
        self.ended_here = False
        #: set where requests were waiting when it died: they tell of its death, not the log reader
        self.died_under_request = False
        self._outbox: queue.SimpleQueue[rp.ToRunner | None] = queue.SimpleQueue()
        self._on_answer = on_answer
        self._on_gone = on_gone
        threading.Thread(target=self._write, name="draftlight-runner-write", daemon=True).start()
        threading.Thread(target=self._read, name="draftlight-runner-read", daemon=True).start()

    def send(self, msg: rp.ToRunner) -> None:
        """Queue ``msg`` for the runner: never blocks."""
        self._outbox.put(msg)

    def _write(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            try:
                self.conn.send(msg)
            except (OSError, EOFError, ValueError):
                return             # the reader sees the end

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (OSError, EOFError, ValueError):
                break
            self._on_answer(self, msg)
        self.gone = True
        self._outbox.put(None)
        self._on_gone(self)

    def close(self) -> None:
        self._outbox.put(None)
        with contextlib.suppress(OSError):
            self.conn.close()


class _Abandoned(Exception):
    """A request this side stopped waiting for (its answer, when it comes, is dropped)."""


class RunnerEngine:
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
        #: starting, restarting and ending the runner (never held while a request waits)
        self._life = threading.RLock()
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        #: the reply in progress (what :meth:`stop` stops), and its stop
        self._reply: _Call | None = None
        self._reply_stop: threading.Event | None = None
        #: answers that ended a request so far (whoever asked)
        self._n_endings = 0
        #: (sequence number, line) of what the runner printed last (llama.cpp's log, Python's errors)
        self._log: collections.deque[tuple[int, str]] = collections.deque(maxlen=300)
        self._log_seq = 0
        self._request_seq = 0    # _log_seq when the request in progress began
        self._idle_seq = 0       # _log_seq when the last request ended (what a runner logs between requests)
        self._link: _Link | None = None
        self._snap: EngineSnapshot | None = None
        self._store_spec: Any = None             # the spec the lookup store was opened for
        self._crashes: list[tuple] = []          # signatures of crashes since the last good call
        self._gave_up: RunnerGaveUp | None = None
        self._last_spec: Any = None              # the last speculation set (restored on a restart)
        self.closed = False
        #: how often the runner was started (1: the first load)
        self.starts = 0
        self.load_warnings: list[str] = []
        #: the last crash (its message), for the UI
        self.last_crash: str | None = None
        #: told (from a thread of its own) when the runner died between requests, with what the
        #: chat should say (that it was started again, or why not) and whether it gave up (the
        #: same death twice in a row: not started again); set by the session
        self.on_idle_death: Callable[[str, bool], None] | None = None
        with self._life:
            try:
                self._start(progress)
            except BaseException:
                # the first load failed (a bad model, a crash): nothing to restart, nothing left running
                self.closed = True
                self._kill()
                raise

    # -- what the UI may read (the last snapshot: never a request) ------------------------
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

    # -- the process -----------------------------------------------------------------------
    def _spawn(self) -> None:
        from .child import module_argv
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env.update(self.extra_env)
        env["DRAFTLIGHT_LOG_FD"] = "2"        # llama.cpp's log lines, to the stderr we read
        env["PYTHONFAULTHANDLER"] = "1"       # a crash also prints where Python was
        env["PYTHONUNBUFFERED"] = "1"
        try:
            proc = subprocess.Popen(module_argv("app.runner_child", str(child.fileno())),
                                    pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        finally:
            child.close()
        self._log.clear()
        link = _Link(proc, Connection(parent.detach()), self._on_answer, self._on_gone)
        self._link = link
        self.starts += 1
        log = self._log

        def read_log(stream=proc.stdout) -> None:
            for raw in iter(stream.readline, b""):
                self._log_seq += 1
                log.append((self._log_seq, raw.decode("utf-8", "replace").rstrip("\n")))
            stream.close()
            # the runner is gone; between requests, a fresh one is started before anyone asks
            if not self.closed and self._link is link and not link.ended_here:
                self._restart_soon(wait_for=link)

        threading.Thread(target=read_log, name="draftlight-runner-log", daemon=True).start()

    def _start(self, progress: Progress | None) -> None:
        """Start a runner and load the model in it (and restore the speculation of the last one)."""
        self._spawn()
        link = self._link
        try:
            warnings = self._request(lambda rid: rp.Load(rid, self.model_options, self.load_spec), progress, link)
            #: what the load left out (an RPC server that could not be reached), for the UI
            self.load_warnings = list(warnings or [])
            if self._store_spec is not None:
                self._request(lambda rid: rp.OpenStore(rid, self._store_spec, _path(self.lookup_root)), link=link)
            if self._snap is not None and self._last_spec is not None:
                self._request(lambda rid: rp.SetSpec(rid, self._last_spec, self._store_spec is not None), link=link)
            if self.closed:       # closed while it loaded (close does not wait for a start)
                raise RunnerError("the model was unloaded")
        except BaseException:
            self._kill(link)  # a runner without a model is of no use: the next request starts another
            raise

    def _kill(self, link: _Link | None = None) -> None:
        """End the runner (``link``'s, or the current one) now: a death of this side's making,
        not a crash, not restarted."""
        link = link or self._link
        if link is None:
            return
        link.ended_here = True
        if link.proc.poll() is None:
            with contextlib.suppress(OSError):
                link.proc.kill()
            with contextlib.suppress(Exception):
                link.proc.wait(5)
        link.close()
        self._fail_calls(link)

    def _died(self, link: _Link) -> RunnerError:
        """The runner of ``link`` is gone under a request: what to raise (a crash is counted, and a
        fresh runner started in the background)."""
        if self.closed or link.ended_here:
            return RunnerError("the model was unloaded" if self.closed else "the model runner was stopped")
        link.ended_here = True          # told here: not again between requests
        rc = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            rc = link.proc.wait(5)
        link.close()
        time.sleep(0.05)   # the log reader's last lines
        lines = [line for seq, line in list(self._log) if seq > self._request_seq]
        what = f"the model runner stopped ({_signal_text(rc)})"
        tail, logged, gave_up = self._count_death(rc, lines, what, " (it logged nothing since the request began)")
        if gave_up is not None:
            return gave_up
        advice = crash_advice(rc, lines=lines)
        msg = f"{what}: {advice}; a fresh runner is being started for your next message{logged}"
        self.last_crash = msg
        self._restart_soon()
        return RunnerCrashed(msg, rc, tail)

    def _restart_soon(self, wait_for: _Link | None = None) -> None:
        def restart() -> None:
            if wait_for is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    wait_for.proc.wait(5)
                # the socket's reader has seen the end too (requests waiting on it were told)
                t_end = time.monotonic() + 2
                while not wait_for.gone and time.monotonic() < t_end:
                    time.sleep(0.01)
            died = None
            with self._life:
                if self.closed or self.alive or self._gave_up is not None:
                    return
                if wait_for is not None:
                    if self._link is not wait_for or wait_for.ended_here or wait_for.died_under_request:
                        return   # replaced already, or its death is told by the request it ended
                    wait_for.ended_here = True
                    # nobody was waiting on it (between replies): the chat is told here
                    died = self._died_between(wait_for.proc)
                    if self._gave_up is not None:
                        self._tell(str(self._gave_up), gave_up=True)
                        return
                failed: Exception | None = None
                try:
                    self._start(None)
                    now = "a fresh runner has loaded the model; nothing in the chat was lost"
                except Exception as e:   # a thread of its own: said below, and at the next request
                    failed = e
                    self.last_crash = f"the model runner could not be started again: {describe(e)}"
                    now = f"it could not be started again: {describe(e)}"
            if died is not None:
                self._tell(f"{died[0]}: {now}{died[1]}", gave_up=isinstance(failed, RunnerGaveUp))
            elif failed is not None and not self.closed:
                # the runner being started died as it loaded (nobody waits on a restart): said here
                self._tell(describe(failed)[:1].upper() + describe(failed)[1:],
                           gave_up=isinstance(failed, RunnerGaveUp))
        threading.Thread(target=restart, name="draftlight-runner-restart", daemon=True).start()

    def _died_between(self, proc: subprocess.Popen) -> tuple[str, str]:
        """A runner that died between requests: counted like a crash in a reply (the same death
        twice in a row gives up: :attr:`_gave_up` says why); (what happened, its last lines)."""
        rc = proc.returncode
        lines = [line for seq, line in list(self._log) if seq > self._idle_seq]
        what = f"the model runner stopped between replies ({_signal_text(rc)})"
        _, logged, gave_up = self._count_death(rc, lines, what)
        if gave_up is None:
            self.last_crash = what + logged
        return what, logged

    def _count_death(self, rc: int | None, lines: Sequence[str], what: str,
                     silent: str = "") -> tuple[list[str], str, RunnerGaveUp | None]:
        """Count a death of the runner (``what`` says how it ended; ``lines``, what it logged):
        (its telling lines, them as a message's ending, ``silent`` where there are none, and
        the give-up, set in :attr:`_gave_up`, where it died the same way twice in a row with
        this model and these settings)."""
        lost = rpc_lost(lines)
        tail = [lost] if lost else telling_lines(lines)
        if not lost:                     # a helper machine going away says nothing of these settings
            self._crashes.append((rc, repr(self._last_spec.to_dict() if self._last_spec is not None else None)))
        logged = (" — its last lines: " + " | ".join(tail)) if tail else silent
        if len(self._crashes) < 2 or self._crashes[-1] != self._crashes[-2]:
            return tail, logged, None
        msg = (f"{what}, the same way twice in a row with this model and these settings, so it is not "
               f"started again; {crash_advice(rc, lines=lines)}. Change the model or its settings (F3) "
               f"to try again{logged}")
        self._gave_up = RunnerGaveUp(msg, rc, tail)
        self.last_crash = msg
        return tail, logged, self._gave_up

    def _tell(self, msg: str, gave_up: bool = False) -> None:
        cb = self.on_idle_death
        if cb is not None:
            with contextlib.suppress(Exception):
                cb(msg, gave_up)

    def _ensure(self) -> _Link:
        """The runner to send a request to (started where there is none)."""
        with self._life:
            if self.closed:
                raise RunnerError("the model was unloaded")
            if self._gave_up is not None:
                raise self._gave_up
            if not self.alive:
                self._start(None)
            assert self._link is not None
            return self._link

    # -- answers ----------------------------------------------------------------------------
    def _on_answer(self, link: _Link, msg: rp.FromRunner) -> None:
        """(The reader thread) hand ``msg`` to the request it answers; drop it where that
        request was given up. An ending's snapshot is the engine as it is now, whoever asked."""
        if isinstance(msg, rp.ENDINGS):
            if msg.snapshot is not None and link is self._link:
                self._snap = msg.snapshot
            self._idle_seq = self._log_seq
            self._n_endings += 1
            with self._calls_lock:
                call = self._calls.pop(msg.rid, None)
        else:
            with self._calls_lock:
                call = self._calls.get(msg.rid)
        if call is not None and call.link is link:
            call.answers.put(msg)

    def _on_gone(self, link: _Link) -> None:
        self._fail_calls(link)

    def _fail_calls(self, link: _Link) -> None:
        with self._calls_lock:
            calls = [c for c in self._calls.values() if c.link is link]
            for c in calls:
                del self._calls[c.rid]
            if calls:
                link.died_under_request = True
        for c in calls:
            c.answers.put(_Died())

    # -- requests ----------------------------------------------------------------------------
    def _open(self, make: Callable[[int], rp.Request], link: _Link | None = None) -> _Call:
        """Send the request ``make(rid)`` (to ``link``, or the runner, started where needed)."""
        link = link or self._ensure()
        call = _Call(next(self._ids), link)
        with self._calls_lock:
            self._calls[call.rid] = call
        self._request_seq = self._log_seq
        if link.gone:
            self._fail_calls(link)
        else:
            link.send(make(call.rid))
        return call

    def _give_up(self, call: _Call, kill_after: float | None = None) -> None:
        """Stop waiting for ``call``: the runner is told to stop it, and its answer will be
        dropped. With ``kill_after``, a runner that has not ended it that many seconds later
        (stuck in native code) is killed and started again."""
        with self._calls_lock:
            still = self._calls.pop(call.rid, None) is not None
        if not still:
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

    def _answers(self, call: _Call, cancel: Callable[[], bool] | None = None,
                 progress: Progress | None = None, stuck: str = "kill") -> Iterator[Any]:
        """The events of ``call`` as they come; its value is returned (``StopIteration.value``).

        Once ``cancel()`` says so, the runner is told to stop the request. Where it has not
        ended it :attr:`GRACE_S` later: ``stuck="kill"`` kills the runner (raises
        :class:`_StuckAfterCancel`); ``stuck="leave"`` stops waiting (raises :class:`_Abandoned`)
        and lets the runner end it in its own time, its answer dropped."""
        cancel_sent: float | None = None
        while True:
            if cancel is not None and cancel_sent is None and cancel():
                cancel_sent = time.monotonic()
                call.link.send(rp.Cancel(call.rid))
            if cancel_sent is not None and time.monotonic() - cancel_sent > self.GRACE_S:
                if stuck == "kill":
                    with self._calls_lock:
                        self._calls.pop(call.rid, None)
                    with self._life:
                        if self._link is call.link:
                            self._kill()
                    raise _StuckAfterCancel()
                self._give_up(call)
                raise _Abandoned()
            try:
                msg = call.answers.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            if isinstance(msg, _Died):
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
                raise _Abandoned()

    def _request(self, make: Callable[[int], rp.Request], progress: Progress | None = None,
                 link: _Link | None = None) -> Any:
        """Send a request and wait for its value (its events, if any, are not expected)."""
        call = self._open(make, link)
        gen = self._answers(call, progress=progress)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    # -- the engine's interface ---------------------------------------------------------------
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
        from speculators.events import STOP_CANCELLED, FinishEvent, GenerationResult, GenerationStats, StatsEvent, StepEvent
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
        except _StuckAfterCancel:
            # stopped, but stuck in native code: killed; the reply ends as stopped with what it had
            stats = last_stats or GenerationStats(n_prompt=len(prompt))
            stats.n_generated = len(tokens)
            yield FinishEvent(GenerationResult("".join(t.text for t in tokens), [t.id for t in tokens],
                                               [t.drafted_by for t in tokens], [t.draft_pos for t in tokens],
                                               STOP_CANCELLED, stats,
                                               "stopped; the model runner did not respond and was restarted"))
            self._restart_soon()
            return
        finally:
            events.close()
            if self._reply is call:
                self._reply = None
        self._crashes.clear()

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
        except _Abandoned:
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

    # -- the lookup caches (kept in the runner) ------------------------------------------------
    def open_store(self, spec: Any, lookup_root: str | os.PathLike | None = None) -> tuple[Any, list[str]]:
        """Open the lookup caches of the model's vocabulary in the runner: (a store proxy, warnings)."""
        self.lookup_root = lookup_root
        ok, warnings = self._request(lambda rid: rp.OpenStore(rid, spec, _path(lookup_root)))
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


def _path(p: str | os.PathLike | None) -> str | None:
    return os.fspath(p) if p is not None else None


class _StuckAfterCancel(Exception):
    pass


class RunnerStore:
    """The runner's lookup store, as the session uses it. What it shows (:meth:`info`,
    :attr:`pending_entries`) is the runner's last snapshot: reading it never waits."""

    def __init__(self, engine: RunnerEngine):
        self.engine = engine
        info = engine.lookup
        self.folder = info.folder if info is not None else ""
        self.warnings = list(info.warnings) if info is not None else []

    def resources(self) -> dict:
        return {STORE_MARK: True}

    def learn(self, tokens: Sequence[int]) -> int:
        toks = list(tokens)
        return self.engine._request(lambda rid: rp.Learn(rid, toks))

    @property
    def pending_entries(self) -> int:
        info = self.engine.lookup
        return info.pending_entries if info is not None else 0

    def save(self) -> Any:
        return self.engine._request(lambda rid: rp.SaveStore(rid))

    def info(self) -> dict:
        info = self.engine.lookup
        return dict(info.caches) if info is not None else {}

    def close(self) -> None:
        """Have the runner save and close the caches, without waiting for it (the UI's thread
        closes a store when the speculation changes): the runner does it once the request before
        it ends, and a runner that is gone has nothing to close."""
        eng = self.engine
        eng._store_spec = None
        link = eng._link
        if eng.closed or link is None or link.gone:
            return
        call = eng._open(lambda rid: rp.CloseStore(rid), link)
        with eng._calls_lock:
            eng._calls.pop(call.rid, None)        # its answer is not waited for

    def build_static(self, files: Sequence[str], progress: Progress | None = None,
                     cancel: Callable[[], bool] | None = None) -> Any:
        """Build the static cache in the runner. A cancel that the runner has not acted on
        :attr:`RunnerEngine.GRACE_S` later (a long piece of text) is not waited for: the build
        ends as cancelled here, and the runner stops at its next piece (its answer dropped)."""
        from .lookup_store import BuildCancelled
        names = [str(f) for f in files]
        call = self.engine._open(lambda rid: rp.BuildStatic(rid, names))
        gen = self.engine._answers(call, cancel=cancel, progress=progress, stuck="leave")
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            return stop.value
        except _Abandoned:
            raise BuildCancelled() from None
