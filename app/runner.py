"""The model in a process of its own, so that the chat survives whatever native code does.

The chat's process never loads a model: a *runner* child process holds the
model, its context, the speculator chain and the lookup caches, and the
session talks to it through :class:`RunnerEngine`, which has the engine's
interface (``set_spec``, ``prompt_tokens``, ``generate``, ``close``). What the
UI needs to know of the engine arrives as typed snapshots
(:class:`EngineSnapshot`) after each call; the engine's own event objects
(:class:`~speculators.events.StepEvent`, ...) cross the process boundary
as they are.

When the runner dies (a segmentation fault or an abort in llama.cpp, the
kernel's OOM killer, a ``kill``), the call in progress raises
:class:`RunnerCrashed`, whose message says how it died, the last lines it
logged and what to try; a fresh runner is then started in the background
(the model loaded again, the last speculation and lookup caches restored).
The same crash twice in a row with the same settings stops the automatic
restart (:class:`RunnerGaveUp`) until the settings change.

A stop request (the chat's Esc) is passed on at once; a runner that does not
end the reply within :attr:`RunnerEngine.GRACE_S` seconds (stuck in native
code) is killed, and the reply ends as stopped with what it had.

Protocol (pickled tuples over a socket pair; both ends are this package):

- parent → runner: ``("load", model_options, spec)``, ``("call", method, args, kwargs)``,
  ``("cancel",)``, ``("close",)``;
- runner → parent: ``("progress", done, total, phase)``, ``("events", [event, ...])``,
  ``("ok", value, snapshot)``, ``("error", exception, snapshot)``.

Where the model's threads take every core, a reply's events cross in batches, at most
every :attr:`EventBatches.EVERY_CONTENDED_S` (the first at once): each crossing wakes a
thread of the chat's process, and on such a CPU every wake-up is taken from the model's
threads (one per token cost the model ~0.02x of its speed).
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator, Sequence

from .errors import UserError, describe

Progress = Callable[[int, int, str], None]

#: tests: the runner kills itself with this signal after this many steps of a reply ("segv:3"),
#: or hangs there as if stuck in native code ("hang:3")
CRASH_ENV = "DRAFTLIGHT_RUNNER_CRASH"
#: tests: a file; when given, the crash above happens once only (the file marks that it did)
CRASH_ONCE_ENV = "DRAFTLIGHT_RUNNER_CRASH_ONCE"
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
# snapshots: what the UI may know of the engine
# ---------------------------------------------------------------------------

@dataclass
class ModelInfo:
    path: str
    description: str = ""
    n_vocab: int = 0
    n_ctx_train: int = 0
    is_recurrent: bool = False
    is_hybrid: bool = False
    load_mtp: bool = False
    use_extra_bufts: bool = True


@dataclass
class SpeculatorInfo:
    name: str
    stats: Any = None   # a SpeculatorStats


@dataclass
class ChainInfo:
    speculators: list[SpeculatorInfo] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    adaptive: bool = False
    auto_plan: list | None = None

    def stats(self) -> dict:
        return {s.name: s.stats for s in self.speculators}


@dataclass
class ContextInfo:
    n_ctx: int
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = 0
    #: recurrent-state snapshots the target's context keeps (its load plan)
    n_rs_seq: int = 0


@dataclass
class TemplateInfo:
    stop_strings: tuple[str, ...] = ()


@dataclass
class EngineSnapshot:
    model: ModelInfo
    chain: ChainInfo
    spec: Any                      # SpecParams
    ctx: ContextInfo
    template: TemplateInfo
    #: whether the model was loaded with the CPU's extra buffer types (see app.cpu_check)
    extra_bufts: bool = True
    pid: int = 0
    #: the devices llama.cpp saw when the model was loaded (RPC servers' included), with their memory
    devices: list = field(default_factory=list)


def snapshot(engine: Any) -> EngineSnapshot:
    """The runner side: what the UI may know of ``engine`` now."""
    m = engine.model
    chain = engine.chain
    specs = [SpeculatorInfo(s.name, s.stats.copy() if hasattr(s.stats, "copy") else s.stats)
             for s in getattr(chain, "speculators", [])] if chain is not None else []
    cfg = engine.config
    ctx = getattr(engine, "ctx", None)
    return EngineSnapshot(
        model=ModelInfo(str(m.path), m.description() if hasattr(m, "description") else "",
                        int(getattr(m, "n_vocab", 0) or 0), int(getattr(m, "n_ctx_train", 0) or 0),
                        bool(getattr(m, "is_recurrent", False)), bool(getattr(m, "is_hybrid", False)),
                        bool(getattr(m, "load_mtp", False)), bool(getattr(m, "use_extra_bufts", True))),
        chain=ChainInfo(specs, dict(getattr(chain, "skipped", {}) or {}), bool(getattr(chain, "adaptive", False)),
                        getattr(chain, "auto_plan", None)),
        spec=engine.spec,
        ctx=ContextInfo(int(getattr(ctx, "n_ctx", None) or cfg.n_ctx), int(getattr(cfg, "n_batch", 512)),
                        getattr(ctx, "n_threads", None) or getattr(cfg, "n_threads", None),
                        int(getattr(cfg, "n_gpu_layers", 0) or 0), int(getattr(engine, "n_rs_seq", 0) or 0)),
        template=TemplateInfo(tuple(getattr(getattr(engine, "template", None), "stop_strings", ()) or ())),
        extra_bufts=bool(getattr(m, "use_extra_bufts", True)), pid=os.getpid(),
        devices=list(getattr(engine, "device_list", None) or []))


# ---------------------------------------------------------------------------
# the parent's side
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


class RunnerEngine:
    """The engine, in a runner process (see the module docstring).

    >>> RunnerEngine.GRACE_S
    2.0
    """

    #: seconds a stopped reply may take to end before the runner is killed
    GRACE_S = 2.0
    #: seconds the runner may take to exit when closed
    CLOSE_S = 5.0
    #: how often a request in progress checks its ``cancel`` callable
    POLL_S = 0.25

    def __init__(self, model_options: Any, spec: Any, progress: Progress | None = None, *,
                 env: dict[str, str] | None = None, lookup_root: str | os.PathLike | None = None):
        self.model_options = model_options
        self.load_spec = spec
        self.extra_env = dict(env or {})
        self.lookup_root = lookup_root
        self._lock = threading.RLock()           # one request at a time
        self._send_lock = threading.Lock()       # a stop request may be sent from another thread
        self._generating = False
        #: (sequence number, line) of what the runner printed last (llama.cpp's log, Python's errors)
        self._log: collections.deque[tuple[int, str]] = collections.deque(maxlen=300)
        self._log_seq = 0
        self._request_seq = 0    # _log_seq when the request in progress began
        self._idle_seq = 0       # _log_seq when the last request ended (what a runner logs between requests)
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._snap: EngineSnapshot | None = None
        self._store_spec: Any = None             # the spec the lookup store was opened for
        self._crashes: list[tuple] = []          # signatures of crashes since the last good call
        self._gave_up: RunnerGaveUp | None = None
        self._last_spec: Any = None              # the last speculation set (restored on a restart)
        self._result: tuple = (None, None)       # (value, snapshot) of the last request
        self._reported: subprocess.Popen | None = None   # the runner whose death a caller was told of
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
        with self._lock:
            try:
                self._start(progress)
            except BaseException:
                # the first load failed (a bad model, a crash): nothing to restart, nothing left running
                self.closed = True
                self._reported = self._proc
                self._kill()
                raise

    # -- what the UI may read ----------------------------------------------------------
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
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- the process -----------------------------------------------------------------------
    def _spawn(self) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env.update(self.extra_env)
        env["DRAFTLIGHT_LOG_FD"] = "2"        # llama.cpp's log lines, to the stderr we read
        env["PYTHONFAULTHANDLER"] = "1"       # a crash also prints where Python was
        env["PYTHONUNBUFFERED"] = "1"
        try:
            proc = subprocess.Popen([sys.executable, "-m", "app.runner_child", str(child.fileno())],
                                    pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        finally:
            child.close()
        self._proc = proc
        self._conn = Connection(parent.detach())
        self.starts += 1
        log = self._log
        log.clear()

        def read_log(stream=proc.stdout) -> None:
            for raw in iter(stream.readline, b""):
                self._log_seq += 1
                log.append((self._log_seq, raw.decode("utf-8", "replace").rstrip("\n")))
            stream.close()
            # the runner is gone; between requests, a fresh one is started before anyone asks
            if not self.closed and self._proc is proc:
                self._restart_soon(wait_for=proc)

        threading.Thread(target=read_log, name="draftlight-runner-log", daemon=True).start()

    def _start(self, progress: Progress | None) -> None:
        """Start a runner and load the model in it (and restore the speculation of the last one)."""
        self._spawn()
        try:
            warnings, self._snap = self._call_raw(("load", self.model_options, self.load_spec), progress=progress)
            #: what the load left out (an RPC server that could not be reached), for the UI
            self.load_warnings = list(warnings or [])
        except BaseException:
            self._kill()      # a runner without a model is of no use: the next request starts another
            raise
        if self._store_spec is not None:
            self._call_raw(("call", "open_store", (self._store_spec, self.lookup_root), {}))
        if self._snap is not None and self._last_spec is not None:
            self._call_raw(("call", "set_spec", (self._last_spec, self._store_spec is not None), {}))

    def _kill(self) -> None:
        proc = self._proc
        self._reported = proc     # a death of our making: not one to tell the chat of, nor to restart after
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(5)
        with contextlib.suppress(Exception):
            if self._conn is not None:
                self._conn.close()
        self._conn = None

    def _died(self) -> RunnerCrashed:
        """The runner is gone: say how, count it, and start a fresh one in the background."""
        proc = self._proc
        self._reported = proc
        rc = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = proc.wait(5)
        self._kill()
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

    def _restart_soon(self, wait_for: subprocess.Popen | None = None) -> None:
        def restart() -> None:
            if wait_for is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    wait_for.wait(5)
            died = None
            with self._lock:
                if self.closed or self.alive or self._gave_up is not None:
                    return
                if wait_for is not None:
                    if self._proc is not wait_for or self._reported is wait_for:
                        return   # replaced already, or its death was handled (and a restart asked) where it was seen
                    # nobody was waiting on it (between replies): the chat is told here
                    died = self._died_between(wait_for)
                    if self._gave_up is not None:
                        self._tell(str(self._gave_up), gave_up=True)
                        return
                try:
                    self._start(None)
                    now = "a fresh runner has loaded the model; nothing in the chat was lost"
                except Exception as e:   # a thread of its own: say it at the next request, never here
                    self.last_crash = f"the model runner could not be started again: {describe(e)}"
                    now = f"it could not be started again: {describe(e)}"
            if died is not None:
                self._tell(f"{died[0]}: {now}{died[1]}")
        t = threading.Thread(target=restart, name="draftlight-runner-restart", daemon=True)
        t.start()

    def _died_between(self, proc: subprocess.Popen) -> tuple[str, str]:
        """A runner that died between requests: counted like a crash in a reply (the same death
        twice in a row gives up: :attr:`_gave_up` says why); (what happened, its last lines)."""
        self._reported = proc
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
            self._crashes.append((rc, repr(getattr(self._last_spec, "to_dict", lambda: None)())))
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

    def _ensure(self) -> None:
        if self.closed:
            raise RunnerError("the model was unloaded")
        if self._gave_up is not None:
            raise self._gave_up
        if not self.alive:
            self._start(None)

    # -- requests --------------------------------------------------------------------------
    def _call_raw(self, msg: tuple, progress: Progress | None = None,
                  on_event: Callable[[Any], None] | None = None) -> tuple[Any, EngineSnapshot | None]:
        for item in self._exchange(msg, progress):
            if on_event is not None:
                on_event(item)
        return self._result

    def _exchange(self, msg: tuple, progress: Progress | None = None,
                  cancel: Callable[[], bool] | None = None, may_stick: bool = True) -> Iterator[Any]:
        """Send ``msg``; yield the events that come back; leave ``(value, snapshot)`` in ``_result``.

        Once ``cancel()`` says so the runner is told to stop; unless ``may_stick`` is false, one
        that has not ended the request :attr:`GRACE_S` later is taken for stuck."""
        conn = self._conn
        self._request_seq = self._log_seq
        try:
            with self._send_lock:
                conn.send(msg)
        except (OSError, EOFError, AttributeError):
            raise self._died() from None
        cancel_sent: float | None = None
        while True:
            try:
                # a reply's events, its end and the runner's death wake this at once, and so does
                # a stop (see :meth:`stop`): the timeout is for a stop asked only through ``cancel``
                # and the grace after it (each wake-up on a full CPU is taken from the model)
                ready = conn.poll(self.POLL_S)
            except (OSError, EOFError):
                raise self._died() from None
            if not ready:
                if cancel is not None and cancel():
                    now = time.monotonic()
                    if cancel_sent is None:
                        cancel_sent = now
                        with contextlib.suppress(OSError), self._send_lock:
                            conn.send(("cancel",))
                    elif may_stick and now - cancel_sent > self.GRACE_S:
                        raise _StuckAfterCancel()
                if self._proc is not None and self._proc.poll() is not None and not conn.poll(0):
                    raise self._died()
                continue
            try:
                reply = conn.recv()
            except (OSError, EOFError):
                raise self._died() from None
            kind = reply[0]
            if kind == "events":
                try:
                    yield from reply[1]
                except GeneratorExit:
                    self._abandon(conn)
                    raise
            elif kind == "progress":
                if progress is not None:
                    progress(*reply[1:])
            elif kind == "ok":
                self._ended(reply)
                self._result = (reply[1], reply[2])
                return
            elif kind == "error":
                self._ended(reply)
                raise reply[1]

    def _ended(self, reply: tuple) -> None:
        """A request's end (``("ok" | "error", value, snapshot)``): keep its snapshot of the
        engine, and mark where the runner's log stood when it went idle."""
        if reply[2] is not None:
            self._snap = reply[2]
        self._idle_seq = self._log_seq

    def _abandon(self, conn: Connection) -> None:
        """The caller stopped reading a reply before its end (it closed the generator): stop the
        reply and read what is left of it, so that the next request gets its own answer, not the
        rest of this one. A runner that does not end it within :attr:`GRACE_S` (stuck in native
        code) is killed and started again, as a stop would have it."""
        with contextlib.suppress(OSError), self._send_lock:
            conn.send(("cancel",))
        deadline = time.monotonic() + self.GRACE_S
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not conn.poll(left):
                    break
                reply = conn.recv()
                if reply[0] in ("ok", "error"):
                    self._ended(reply)
                    return
        except (OSError, EOFError):
            pass
        if self._proc is not None and self._proc.poll() is not None:
            self._died()          # it died meanwhile: counted and started again, as in a reply
            return
        self._kill()
        self._restart_soon()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._ensure()
            return self._call_raw(("call", method, args, kwargs))[0]

    def _call_within(self, timeout: float, method: str, *args: Any) -> Any:
        """:meth:`_call`, unless another request holds the runner for ``timeout`` seconds (then None)."""
        if not self._lock.acquire(timeout=timeout):
            return None
        try:
            if self.closed or self._gave_up is not None or not self.alive:
                return None
            return self._call_raw(("call", method, args, {}))[0]
        finally:
            self._lock.release()

    # -- the engine's interface ---------------------------------------------------------------
    def set_spec(self, params: Any, resources: dict | None = None) -> ChainInfo:
        with self._lock:
            if self._gave_up is not None and params.to_dict() != getattr(self._last_spec, "to_dict", dict)():
                self._gave_up = None       # other settings: worth another try
                self._crashes.clear()
            with_store = bool(resources and resources.get(STORE_MARK))
            self._call("set_spec", params, with_store)
            self._last_spec = params
            return self._snap.chain

    def prompt_tokens(self, messages: Sequence[dict] | None = None, text: str | None = None,
                      raw: bool = False) -> list[int]:
        return self._call("prompt_tokens", list(messages) if messages is not None else None, text, raw)

    def generate(self, prompt: Sequence[int], max_tokens: int = 512, sampling: Any = None,
                 stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None,
                 stats_interval_s: float = 0.25, context_shift: bool = False, n_keep: int = 0) -> Iterator[Any]:
        """The engine's events, from the runner; see :meth:`speculators.engine.Engine.generate`."""
        from speculators.events import STOP_CANCELLED, FinishEvent, GenerationResult, GenerationStats, StatsEvent, StepEvent
        kw = dict(max_tokens=max_tokens, sampling=sampling, stop=tuple(stop), stats_interval_s=stats_interval_s,
                  context_shift=context_shift, n_keep=n_keep)
        with self._lock:
            self._ensure()
            tokens: list = []
            last_stats = None
            self._generating = True
            # closed here, under the lock, when the caller stops reading early (see _abandon)
            events = self._exchange(("call", "generate", (list(prompt),), kw), cancel=cancel)
            try:
                for ev in events:
                    if isinstance(ev, StepEvent):
                        tokens.extend(ev.tokens)
                    elif isinstance(ev, StatsEvent):
                        last_stats = ev.stats
                    yield ev
            except _StuckAfterCancel:
                # stopped, but stuck in native code: kill it; the reply ends as stopped with what it had
                self._reported = self._proc
                self._kill()
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
                self._generating = False
            self._crashes.clear()

    def warm(self, prompt: Sequence[int], cancel: Callable[[], bool] | None = None) -> int:
        """Read ``prompt`` ahead of a reply (see :meth:`speculators.engine.Engine.warm`); a
        ``cancel()`` that says so stops it between pieces (it is never killed for being slow to
        stop: it is reading, and ends soon)."""
        with self._lock:
            self._ensure()
            for _ in self._exchange(("call", "warm", (list(prompt),), {}), cancel=cancel, may_stick=False):
                pass
            return self._result[0]

    def stop(self) -> None:
        """Ask the reply in progress to stop now (from any thread; the reply's ``cancel`` callable
        must say so too: it is what makes a runner that does not stop be killed)."""
        conn = self._conn
        if not self._generating or conn is None:
            return
        with contextlib.suppress(OSError, EOFError, ValueError), self._send_lock:
            conn.send(("cancel",))

    # -- the lookup caches (kept in the runner) ------------------------------------------------
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
        return self._call("lab_cost_curve", n_max)

    def open_store(self, spec: Any, lookup_root: str | os.PathLike | None = None) -> tuple[Any, list[str]]:
        """Open the lookup caches of the model's vocabulary in the runner: (a store proxy, warnings)."""
        with self._lock:
            self.lookup_root = lookup_root
            ok, warnings = self._call("open_store", spec, lookup_root)
            if not ok:
                return None, list(warnings)
            self._store_spec = spec
            return RunnerStore(self), list(warnings)

    def lookup_contribution(self) -> dict:
        return self._call("lookup_contribution")

    def close(self) -> None:
        """End the runner (it saves its lookup caches); one busy or stuck for CLOSE_S seconds is killed."""
        got = self._lock.acquire(timeout=self.CLOSE_S)
        try:
            if self.closed:
                return
            self.closed = True
            conn, proc = self._conn, self._proc
            if got and conn is not None and proc is not None and proc.poll() is None:
                with contextlib.suppress(OSError, EOFError), self._send_lock:
                    conn.send(("close",))
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.CLOSE_S)
            self._kill()
        finally:
            if got:
                self._lock.release()


class _StuckAfterCancel(Exception):
    pass


class RunnerStore:
    """The runner's lookup store, as the session uses it (every call goes to the runner)."""

    def __init__(self, engine: RunnerEngine):
        self.engine = engine
        self.folder, self.warnings = engine._call("store_attr", ("folder", "warnings"))

    def resources(self) -> dict:
        return {STORE_MARK: True}

    def learn(self, tokens: Sequence[int]) -> int:
        return self.engine._call("store", "learn", list(tokens))

    @property
    def pending_entries(self) -> int:
        return self.engine._call("store_attr", ("pending_entries",))[0]

    def save(self) -> Any:
        return self.engine._call("store", "save")

    def info(self) -> dict:
        return self.engine._call("store", "info")

    def close(self) -> Any:
        """Save and close the caches in the runner (skipped when it is gone or stays busy)."""
        eng = self.engine
        eng._store_spec = None
        with contextlib.suppress(RunnerError, OSError, EOFError):
            return eng._call_within(eng.CLOSE_S, "close_store")
        return None

    def build_static(self, files: Sequence[str], progress: Progress | None = None,
                     cancel: Callable[[], bool] | None = None) -> Any:
        eng = self.engine
        with eng._lock:
            eng._ensure()
            for _ in eng._exchange(("call", "build_static", ([str(f) for f in files],), {}), progress, cancel):
                pass
            return eng._result[0]


# ---------------------------------------------------------------------------
# the runner's side
# ---------------------------------------------------------------------------

def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def contended(engine: Any) -> bool:
    """Whether ``engine``'s threads take every core this process may use (none is left for the
    chat's process beside them)."""
    threads = getattr(getattr(engine, "ctx", None), "n_threads", None)
    return isinstance(threads, int) and threads > 0 and threads + 1 > usable_cores()


class EventBatches:
    """Sends a reply's events in batches, at most every ``every_s`` seconds, from a thread of
    its own: the first event at once, then what came since the last batch; an event put with
    ``now=True`` goes at once with what is waiting (the reply's first token: the time to it is
    what a person waits for). :meth:`close` sends what is left and returns when it is sent.

    >>> sent = []
    >>> b = EventBatches(sent.append, every_s=60)
    >>> for ev in ("a", "b", "c"):
    ...     b.put(ev)
    >>> b.close()
    >>> [m for m in sent if m[1]] in ([("events", ["a"]), ("events", ["b", "c"])],
    ...                                [("events", ["a", "b"]), ("events", ["c"])],
    ...                                [("events", ["a", "b", "c"])])
    True
    >>> sent = []
    >>> b = EventBatches(sent.append, every_s=60)
    >>> b.put("a")
    >>> while not sent: time.sleep(0.01)
    >>> b.put("b"); b.put("c", now=True)
    >>> t0 = time.monotonic()
    >>> while len(sent) < 2 and time.monotonic() - t0 < 30: time.sleep(0.01)
    >>> sent       # "b" and "c" did not wait the 60 s
    [('events', ['a']), ('events', ['b', 'c'])]
    >>> b.close()
    """

    #: between two batches, where the model's threads take every core (the chat paints a
    #: streaming reply at most every 0.1 s there)
    EVERY_CONTENDED_S = 0.1

    def __init__(self, send: Callable[[tuple], None], every_s: float):
        self._send = send
        self.every_s = every_s
        self._cond = threading.Condition()
        self._pending: list = []
        self._waiting = False
        self._now = False
        self._closed = False
        self._failed = False
        self._last = float("-inf")
        self._thread = threading.Thread(target=self._run, name="runner-events", daemon=True)
        self._thread.start()

    def put(self, ev: Any, now: bool = False) -> None:
        with self._cond:
            self._pending.append(ev)
            self._now |= now
            if self._waiting or now:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._waiting = True
                    self._cond.wait()
                self._waiting = False
                if not self._pending:
                    return
                # what arrives in the next every_s joins this batch (a put does not wake this wait)
                wait = self._last + self.every_s - time.monotonic()
                if wait > 0 and not self._now:
                    self._cond.wait_for(lambda: self._closed or self._now, timeout=wait)
                batch, self._pending, self._now = self._pending, [], False
            self._last = time.monotonic()
            if not self._failed:
                try:
                    self._send(("events", batch))
                except (OSError, EOFError, ValueError):
                    self._failed = True      # the chat's process is gone: the reader stops the reply

class _Runner:
    def __init__(self, conn: Connection):
        self.conn = conn
        self.send_lock = threading.Lock()
        self.inbox: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.engine: Any = None
        self.store: Any = None
        crash = os.environ.get(CRASH_ENV, "")
        self.crash_sig, _, n = crash.partition(":")
        self.crash_after = int(n or 0) if crash else None
        self.crash_once = os.environ.get(CRASH_ONCE_ENV)
        if self.crash_once and os.path.exists(self.crash_once):
            self.crash_after = None

    def send(self, msg: tuple) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.cancel.set()
                self.inbox.put(None)
                return
            if msg[0] == "cancel":
                self.cancel.set()
            else:
                self.inbox.put(msg)

    def snap(self) -> EngineSnapshot | None:
        return snapshot(self.engine) if self.engine is not None else None

    def serve(self) -> None:
        threading.Thread(target=self.read, name="runner-read", daemon=True).start()
        while True:
            msg = self.inbox.get()
            if msg is None or msg[0] == "close":
                break
            try:
                if msg[0] == "load":
                    value = self.load(*msg[1:])
                else:
                    _, method, args, kwargs = msg
                    value = getattr(self, "do_" + method)(*args, **kwargs)
                self.send(("ok", value, self.snap()))
            except Exception as e:
                try:
                    self.send(("error", _picklable(e), self.snap()))
                except (OSError, EOFError):
                    break
        self.shutdown()

    def shutdown(self) -> None:
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.close()

    def progress(self, done: int, total: int, phase: str) -> None:
        self.send(("progress", done, total, phase))

    # -- requests --------------------------------------------------------------------
    def load(self, model_options: Any, spec: Any) -> list[str]:
        from .runtime import load_chat_engine
        self.engine = load_chat_engine(model_options, spec, self.progress)
        return list(getattr(self.engine, "load_warnings", []))

    def do_set_spec(self, spec: Any, with_store: bool) -> None:
        res = self.store.resources() if with_store and self.store is not None else None
        self.engine.set_spec(spec, resources=res)

    def do_prompt_tokens(self, messages, text, raw) -> list[int]:
        return self.engine.prompt_tokens(messages=messages, text=text, raw=raw)

    def do_generate(self, prompt: list[int], **kw: Any) -> None:
        from speculators.events import StepEvent
        self.cancel.clear()
        steps = 0
        batches = EventBatches(self.send, EventBatches.EVERY_CONTENDED_S) if contended(self.engine) else None
        shown = False     # whether a token has been put (the first goes at once)
        try:
            for ev in self.engine.generate(prompt, cancel=self.cancel.is_set, **kw):
                if batches is not None:
                    first = not shown and isinstance(ev, StepEvent) and bool(ev.tokens)
                    shown |= first
                    batches.put(ev, now=first)
                else:
                    self.send(("events", [ev]))
                if isinstance(ev, StepEvent):
                    steps += 1
                    if self.crash_after is not None and steps >= self.crash_after:
                        if self.crash_once:
                            open(self.crash_once, "w").close()
                        if batches is not None:
                            # the crash comes after these steps were shown (a real one may lose
                            # the last batch's worth: up to EVERY_CONTENDED_S of tokens)
                            batches.close()
                        _crash_now(self.crash_sig)
        finally:
            if batches is not None:
                batches.close()

    def do_open_store(self, spec: Any, root: Any) -> tuple[bool, list[str]]:
        from .lookup_store import LookupStore, LookupStoreError
        if self.store is not None:
            return True, []
        nc = spec.ngram_cache
        try:
            self.store = LookupStore.for_model(self.engine.model, static_path=nc.lookup_cache_static or None,
                                               dynamic_path=nc.lookup_cache_dynamic or None, root=root)
        except (LookupStoreError, OSError) as e:
            return False, [f"lookup caches unavailable ({describe(e)}); ngram-cache runs without them"]
        return True, list(self.store.warnings)

    def do_close_store(self) -> Any:
        store, self.store = self.store, None
        return store.close() if store is not None else None

    def do_store(self, method: str, *args: Any) -> Any:
        if self.store is None:
            from .lookup_store import LookupStoreError
            raise LookupStoreError("the lookup caches are not open")
        return getattr(self.store, method)(*args)

    def do_store_attr(self, names: Sequence[str]) -> tuple:
        return tuple(getattr(self.store, n) for n in names)

    def do_build_static(self, files: list[str]) -> Any:
        self.cancel.clear()
        return self.store.build_static(files, progress=self.progress, cancel=self.cancel.is_set)

    def do_warm(self, prompt: list[int]) -> int:
        self.cancel.clear()
        return self.engine.warm(prompt, cancel=self.cancel.is_set)

    def do_lab_cost_curve(self, n_max: int) -> list[float]:
        return self.engine.lab_cost_curve(n_max)

    def do_lookup_contribution(self) -> dict:
        from .lookup_store import LookupStore
        return LookupStore.contribution(self.engine)


def _picklable(e: BaseException) -> BaseException:
    import pickle
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RunnerError(describe(e))


def _crash_now(name: str) -> None:
    """Tests: die as native code would (no Python clean-up)."""
    if name == "hang":              # stuck in native code: deaf to the stop request
        time.sleep(3600)
    sig = {"segv": signal.SIGSEGV, "kill": signal.SIGKILL, "abrt": signal.SIGABRT}.get(name, signal.SIGSEGV)
    if sig == signal.SIGSEGV:
        import faulthandler
        faulthandler.disable()      # a real crash would print the stack; the test wants only the signal
    sys.stderr.write(f"simulated crash: {sig.name}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), sig)
    time.sleep(10)


def die_with_parent(every_s: float = 1.0) -> None:
    """In a child process (the runner, a supervised command): stop when the process that
    started it dies, however it dies (``kill -9`` included), rather than decode on as an
    orphan. A daemon thread looks every ``every_s`` seconds whether the parent changed
    (an orphan is handed to another) and then sends this process SIGTERM. (Linux's
    ``PR_SET_PDEATHSIG`` fires when the parent's *thread* that started the child ends,
    which for the chat's runner may be a worker thread: not used.)"""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    conn = Connection(int(argv[0]))
    _Runner(conn).serve()
    return 0

