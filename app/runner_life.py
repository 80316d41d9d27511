"""The runner process's life: starting it, ending it, telling how it died, and starting it again.

A runner (:mod:`app.runner_child`, spawned by module name) is started by
:meth:`RunnerLifeMixin._start` (the model loaded in it, the last speculation and lookup caches
restored). When it dies (a segmentation fault or an abort in llama.cpp, the kernel's OOM killer,
a ``kill``) the request in progress raises :class:`RunnerCrashed`, whose message says how it
died, the last lines it logged and what to try; a fresh runner is then started in the background.
A death between requests is told through ``on_idle_death`` (the session posts
:class:`app.session.RunnerStopped`). The same crash twice in a row with the same settings stops
the automatic restart (:class:`RunnerGaveUp`) until the settings change.

Used by :class:`app.runner.RunnerEngine` (of which :class:`RunnerLifeMixin` is a part); the
wire itself is :mod:`app.runner_link`.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from typing import Callable, Sequence

from . import runner_protocol as rp
from .errors import UserError, describe
from .runner_link import Link

__all__ = ["RunnerError", "RunnerCrashed", "RunnerGaveUp", "RPC_LOST_MARKS", "rpc_lost", "crash_advice",
           "telling_lines", "RunnerLifeMixin", "fspath_or_none"]

Progress = Callable[[int, int, str], None]


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


def fspath_or_none(p: str | os.PathLike | None) -> str | None:
    """A path as the runner is sent it (a plain string), or None."""
    return os.fspath(p) if p is not None else None


# ---------------------------------------------------------------------------
# the process, as the engine runs it
# ---------------------------------------------------------------------------

class RunnerLifeMixin:
    """Starting, restarting and ending the runner (a part of :class:`app.runner.RunnerEngine`).

    It reads the engine's ``closed``, ``extra_env``, ``model_options``, ``load_spec``, ``_snap``,
    ``_last_spec``, ``_store_spec`` and ``lookup_root``; a new runner's answers go to the engine's
    ``_on_answer`` and ``_on_gone``; the load is sent through its ``_request``; the requests in
    flight hear of a death through its ``_calls`` (:class:`app.runner_link.Calls`)."""

    def _init_life(self) -> None:
        #: starting, restarting and ending the runner (never held while a request waits)
        self._life = threading.RLock()
        #: (sequence number, line) of what the runner printed last (llama.cpp's log, Python's errors)
        self._log: collections.deque[tuple[int, str]] = collections.deque(maxlen=300)
        self._log_seq = 0
        self._request_seq = 0    # _log_seq when the request in progress began
        self._idle_seq = 0       # _log_seq when the last request ended (what a runner logs between requests)
        self._link: Link | None = None
        self._crashes: list[tuple] = []          # signatures of crashes since the last good call
        self._gave_up: RunnerGaveUp | None = None
        #: how often the runner was started (1: the first load)
        self.starts = 0
        #: the last crash (its message), for the UI
        self.last_crash: str | None = None
        #: told (from a thread of its own) when the runner died between requests, with what the
        #: chat should say (that it was started again, or why not) and whether it gave up (the
        #: same death twice in a row: not started again); set by the session
        self.on_idle_death: Callable[[str, bool], None] | None = None

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
        link = Link(proc, Connection(parent.detach()), self._on_answer, self._on_gone)
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
                self._request(lambda rid: rp.OpenStore(rid, self._store_spec, fspath_or_none(self.lookup_root)), link=link)
            if self._snap is not None and self._last_spec is not None:
                self._request(lambda rid: rp.SetSpec(rid, self._last_spec, self._store_spec is not None), link=link)
            if self.closed:       # closed while it loaded (close does not wait for a start)
                raise RunnerError("the model was unloaded")
        except BaseException:
            self._kill(link)  # a runner without a model is of no use: the next request starts another
            raise

    def _kill(self, link: Link | None = None) -> None:
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
        self._calls.fail(link)

    def _ensure(self) -> Link:
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

    def _died(self, link: Link) -> RunnerError:
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

    def _restart_soon(self, wait_for: Link | None = None) -> None:
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
