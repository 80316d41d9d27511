"""The runner process: the model, its context, the speculator chain and the lookup caches.

Started by :class:`app.runner.RunnerEngine` (``app.child.module_argv("app.runner_child", FD)``);
it speaks :mod:`app.runner_protocol` over the socket FD. Two threads:

- the *reader* takes every message as it comes: a request joins the queue, a
  :class:`~app.runner_protocol.Cancel` stops the request it names at once (its
  ``cancel`` flag, and the target's decode through llama.cpp's abort callback), or
  marks a queued one to be skipped;
- the *main* thread runs the requests one at a time, in order, and answers each
  with the engine's :class:`~app.runner_protocol.EngineSnapshot`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Sequence

from . import runner_protocol as rp
from .errors import describe

#: tests: the runner kills itself with this signal after this many steps of a reply ("segv:3"),
#: hangs there in Python as if deaf to everything ("hang:3"), or sits in one native call for
#: S seconds, as a decode that cannot be aborted would ("stall:3:10")
CRASH_ENV = "DRAFTLIGHT_RUNNER_CRASH"
#: tests: a file; when given, the crash above happens once only (the file marks that it did)
CRASH_ONCE_ENV = "DRAFTLIGHT_RUNNER_CRASH_ONCE"


# ---------------------------------------------------------------------------
# what the chat may know of the engine
# ---------------------------------------------------------------------------

def snapshot(engine: Any, store: Any = None) -> rp.EngineSnapshot:
    """What the UI may know of ``engine`` (a :class:`speculators.engine.Engine`) and of the
    lookup ``store`` (a :class:`app.lookup_store.LookupStore`) now."""
    m = engine.model
    chain = engine.chain
    specs = [rp.SpeculatorInfo(s.name, s.stats.copy()) for s in chain.speculators] if chain is not None else []
    cfg = engine.config
    ctx = engine.ctx
    return rp.EngineSnapshot(
        model=rp.ModelInfo(str(m.path), m.description(), int(m.n_vocab), int(m.n_ctx_train),
                           bool(m.is_recurrent), bool(m.is_hybrid), bool(m.load_mtp), bool(m.use_extra_bufts)),
        chain=rp.ChainInfo(specs, dict(chain.skipped or {}), bool(chain.adaptive), chain.auto_plan)
        if chain is not None else rp.ChainInfo(),
        spec=engine.spec,
        ctx=rp.ContextInfo(int(ctx.n_ctx), int(cfg.n_batch), ctx.n_threads or cfg.n_threads,
                           int(cfg.n_gpu_layers or 0), int(engine.n_rs_seq or 0)),
        template=rp.TemplateInfo(tuple(engine.template.stop_strings or ())),
        extra_bufts=bool(m.use_extra_bufts), pid=os.getpid(),
        devices=list(engine.device_list or []),
        lookup=lookup_info(engine, store) if store is not None else None)


def lookup_info(engine: Any, store: Any) -> rp.LookupInfo:
    from .lookup_store import LookupStore
    return rp.LookupInfo(str(store.folder), list(store.warnings), store.info(), store.pending_entries,
                         LookupStore.contribution(engine))


# ---------------------------------------------------------------------------
# a reply's events, batched where the model takes every core
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
    ``send`` is given each batch as a list.

    >>> sent = []
    >>> b = EventBatches(sent.append, every_s=60)
    >>> for ev in ("a", "b", "c"):
    ...     b.put(ev)
    >>> b.close()
    >>> [m for m in sent if m] in ([["a"], ["b", "c"]], [["a", "b"], ["c"]], [["a", "b", "c"]])
    True
    >>> sent = []
    >>> b = EventBatches(sent.append, every_s=60)
    >>> b.put("a")
    >>> while not sent: time.sleep(0.01)
    >>> b.put("b"); b.put("c", now=True)
    >>> t0 = time.monotonic()
    >>> while len(sent) < 2 and time.monotonic() - t0 < 30: time.sleep(0.01)
    >>> sent       # "b" and "c" did not wait the 60 s
    [['a'], ['b', 'c']]
    >>> b.close()
    """

    #: between two batches, where the model's threads take every core (the chat paints a
    #: streaming reply at most every 0.1 s there)
    EVERY_CONTENDED_S = 0.1

    def __init__(self, send: Callable[[list], None], every_s: float):
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
                    self._send(batch)
                except (OSError, EOFError, ValueError):
                    self._failed = True      # the chat's process is gone: the reader stops the reply


# ---------------------------------------------------------------------------
# the runner
# ---------------------------------------------------------------------------

class Runner:
    """The runner's side of :mod:`app.runner_protocol` (see the module docstring)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.send_lock = threading.Lock()
        self.inbox: queue.Queue[rp.Request | None] = queue.Queue()
        #: the request running now (None between requests), and whether a stop may abort its decode
        self.current: int | None = None
        self.abortable = False
        #: ids cancelled before they ran
        self.skip: set[int] = set()
        self.state_lock = threading.Lock()
        self.cancel = threading.Event()
        self.engine: Any = None
        self.store: Any = None
        self._lookup: rp.LookupInfo | None = None
        self.can_abort = False
        self.handlers: dict[type, Callable[[Any], Any]] = {
            rp.Load: self.load, rp.SetSpec: self.set_spec, rp.PromptTokens: self.prompt_tokens,
            rp.Generate: self.generate, rp.Warm: self.warm, rp.OpenStore: self.open_store,
            rp.CloseStore: self.close_store, rp.Learn: self.learn, rp.SaveStore: self.save_store,
            rp.BuildStatic: self.build_static, rp.LabCostCurve: self.lab_cost_curve,
        }
        crash = os.environ.get(CRASH_ENV, "")
        parts = crash.split(":")
        self.crash_how = parts[0]
        self.crash_after = int(parts[1]) if crash and len(parts) > 1 and parts[1] else (0 if crash else None)
        self.crash_arg = float(parts[2]) if len(parts) > 2 else 10.0
        self.crash_once = os.environ.get(CRASH_ONCE_ENV)
        if self.crash_once and os.path.exists(self.crash_once):
            self.crash_after = None

    def send(self, msg: rp.FromRunner) -> None:
        with self.send_lock:
            self.conn.send(msg)

    # -- the reader thread ------------------------------------------------------------
    def read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = rp.Close()
            if isinstance(msg, rp.Cancel):
                self.stop(msg.rid)
            elif isinstance(msg, rp.Close):
                self.stop(None)
                self.inbox.put(None)
                return
            else:
                self.inbox.put(msg)

    def stop(self, rid: int | None) -> None:
        """Stop request ``rid`` (None: whatever runs): at once where it runs, unrun where it waits."""
        with self.state_lock:
            if rid is None or rid == self.current:
                self.cancel.set()
                if self.abortable and self.engine is not None:
                    self.engine.abort_decode()
            else:
                self.skip.add(rid)

    # -- the main thread ---------------------------------------------------------------
    def serve(self) -> None:
        threading.Thread(target=self.read, name="runner-read", daemon=True).start()
        while True:
            req = self.inbox.get()
            if req is None:
                break
            with self.state_lock:
                if req.rid in self.skip:
                    self.skip.discard(req.rid)
                    skipped = True
                else:
                    skipped = False
                    self.current = req.rid
                    self.cancel.clear()
                    self.abortable = isinstance(req, rp.Generate) and self.can_abort
            try:
                if skipped:
                    self.send(rp.Cancelled(req.rid, self.snap()))
                    continue
                try:
                    value = self.handlers[type(req)](req)
                    answer: rp.FromRunner = rp.Done(req.rid, value, self.snap(req))
                except Exception as e:
                    answer = rp.Failed(req.rid, _picklable(e), self.snap(req))
                finally:
                    with self.state_lock:
                        self.current = None
                        self.abortable = False
                        if self.engine is not None and self.can_abort:
                            self.engine.clear_abort()
                self.send(answer)
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

    #: the requests after which the lookup caches' figures are read again (they change nothing else)
    CHANGE_LOOKUP = (rp.Load, rp.SetSpec, rp.Generate, rp.OpenStore, rp.CloseStore, rp.Learn, rp.SaveStore,
                     rp.BuildStatic)

    def snap(self, after: rp.Request | None = None) -> rp.EngineSnapshot | None:
        """The engine as it is now; the lookup figures read again where ``after`` may have changed them."""
        if self.engine is None:
            return None
        if self.store is None:
            self._lookup = None
        elif after is None or isinstance(after, self.CHANGE_LOOKUP) or self._lookup is None:
            self._lookup = lookup_info(self.engine, self.store)
        snap = snapshot(self.engine)
        snap.lookup = self._lookup
        return snap

    def progress_for(self, rid: int) -> Callable[[int, int, str], None]:
        def progress(done: int, total: int, phase: str) -> None:
            self.send(rp.Progress(rid, done, total, phase))
        return progress

    # -- requests ----------------------------------------------------------------------
    def load(self, req: rp.Load) -> list[str]:
        from .runtime import load_chat_engine
        self.engine = load_chat_engine(req.model_options, req.spec, self.progress_for(req.rid))
        self.can_abort = bool(self.engine.enable_abort())
        return list(self.engine.load_warnings)

    def set_spec(self, req: rp.SetSpec) -> None:
        res = self.store.resources() if req.with_store and self.store is not None else None
        self.engine.set_spec(req.spec, resources=res)

    def prompt_tokens(self, req: rp.PromptTokens) -> list[int]:
        return self.engine.prompt_tokens(messages=req.messages, text=req.text, raw=req.raw)

    def generate(self, req: rp.Generate) -> None:
        from speculators.events import StepEvent
        rid, o = req.rid, req.options

        def send_events(evs: list) -> None:
            self.send(rp.Events(rid, evs))
        batches = EventBatches(send_events, EventBatches.EVERY_CONTENDED_S) if contended(self.engine) else None
        steps = 0
        shown = False     # whether a token has been put (the first goes at once)
        try:
            for ev in self.engine.generate(req.prompt, max_tokens=o.max_tokens, sampling=o.sampling, stop=o.stop,
                                           cancel=self.cancel.is_set, stats_interval_s=o.stats_interval_s,
                                           context_shift=o.context_shift, n_keep=o.n_keep):
                if batches is not None:
                    first = not shown and isinstance(ev, StepEvent) and bool(ev.tokens)
                    shown |= first
                    batches.put(ev, now=first)
                else:
                    send_events([ev])
                if isinstance(ev, StepEvent):
                    steps += 1
                    if self.crash_after is not None and steps >= self.crash_after:
                        if batches is not None:
                            # the crash comes after these steps were shown (a real one may lose
                            # the last batch's worth: up to EVERY_CONTENDED_S of tokens)
                            batches.close()
                            batches = None
                        self.fault()
        finally:
            if batches is not None:
                batches.close()

    def warm(self, req: rp.Warm) -> int:
        return self.engine.warm(req.prompt, cancel=self.cancel.is_set)

    def open_store(self, req: rp.OpenStore) -> tuple[bool, list[str]]:
        from .lookup_store import LookupStore, LookupStoreError
        if self.store is not None:
            return True, []
        nc = req.spec.ngram_cache
        try:
            self.store = LookupStore.for_model(self.engine.model, static_path=nc.lookup_cache_static or None,
                                               dynamic_path=nc.lookup_cache_dynamic or None, root=req.root)
        except (LookupStoreError, OSError) as e:
            return False, [f"lookup caches unavailable ({describe(e)}); ngram-cache runs without them"]
        return True, list(self.store.warnings)

    def close_store(self, req: rp.CloseStore) -> Any:
        store, self.store = self.store, None
        return store.close() if store is not None else None

    def _store(self) -> Any:
        if self.store is None:
            from .lookup_store import LookupStoreError
            raise LookupStoreError("the lookup caches are not open")
        return self.store

    def learn(self, req: rp.Learn) -> int:
        return self._store().learn(req.tokens)

    def save_store(self, req: rp.SaveStore) -> Any:
        return self._store().save()

    def build_static(self, req: rp.BuildStatic) -> Any:
        return self._store().build_static(req.files, progress=self.progress_for(req.rid), cancel=self.cancel.is_set)

    def lab_cost_curve(self, req: rp.LabCostCurve) -> list[float]:
        return self.engine.lab_cost_curve(req.n_max)

    # -- tests ------------------------------------------------------------------------------
    def fault(self) -> None:
        """Tests: do what :data:`CRASH_ENV` says, once where :data:`CRASH_ONCE_ENV` says so."""
        if self.crash_once:
            open(self.crash_once, "w").close()
            self.crash_after = None
        if self.crash_how == "stall":
            _native_sleep(self.crash_arg)
            return
        _crash_now(self.crash_how)


def _native_sleep(seconds: float) -> None:
    """Tests: sit in one native call (libc's ``usleep``, the GIL released), as a decode that
    cannot be aborted would."""
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    libc.usleep(ctypes.c_uint(int(seconds * 1e6)))


def _picklable(e: BaseException) -> BaseException:
    import pickle

    from .runner import RunnerError
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RunnerError(describe(e))


def _crash_now(name: str) -> None:
    """Tests: die as native code would (no Python clean-up)."""
    if name == "hang":              # stuck, deaf to the stop request
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
    """Stop this process when the one that started it dies (see :func:`app.child.die_with_parent`)."""
    try:
        from .child import die_with_parent as watch
    except ImportError:       # pragma: no cover - app.child is the one implementation
        watch = None
    if watch is not None:
        watch(every_s)
        return
    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=loop, name="die-with-parent", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    conn = Connection(int(argv[0]))
    Runner(conn).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
