"""The engine, seen from the server's event loop.

:class:`RunnerEngine`'s calls block (``generate`` is a blocking iterator), so they run
in one worker thread of their own, and a generation's events reach the event loop
through an :class:`asyncio.Queue` (``loop.call_soon_threadsafe``). One request
generates at a time: the rest wait for :attr:`EngineWorker.lock` (an
:class:`asyncio.Lock`, fair: first come, first served), as ``llama-server -np 1``
queues them on its one slot. A request holds the lock from reading its prompt to the
end of its reply, and gives it back only once the worker thread has left the engine,
so the next request never waits behind the tail of a stopped one.

With a ``learn`` callable (``draftlight serve --lookup-learn``: the ngram-cache's dynamic cache
learns from served conversations, as the chat's does from its replies), each generation that
ends with a result hands it the prompt and the reply's tokens, in the worker thread once the
reply has been given to the request and before the lock is given back (the cache is never
taught while a generation drafts from it).

A generation is stopped through its ``cancel`` event (the engine's ``cancel``
callable): set when the client goes away, or when the server stops reading the
events (an error on its side); the engine stops at its next step (the runner
aborts a decode in progress, and kills a runner stuck in native code after
:attr:`RunnerEngine.GRACE_S`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import threading
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from speculators.events import FinishEvent

log = logging.getLogger("draftlight.serve")

_EVENT, _ERROR, _END = "event", "error", "end"


@dataclass
class Record:
    """What became of one request (the server's log line; tests read :attr:`EngineWorker.finished`)."""

    endpoint: str
    finish_reason: str          #: the engine's reason, "error" or "gone" (the client left before it ran)
    n_prompt: int = 0
    n_cached: int = 0
    n_tokens: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    tokens_per_s: float = 0.0
    seconds: float = 0.0
    error: str = ""

    def line(self) -> str:
        if self.finish_reason == "gone":
            return f"{self.endpoint}: the client left before its turn"
        head = f"{self.endpoint}: {self.n_prompt} prompt tokens ({self.n_cached} cached)"
        if self.finish_reason == "error":
            return f"{head}: error: {self.error}"
        spec = f", drafted {self.n_drafted}, accepted {self.n_accepted}" if self.n_drafted else ""
        return (f"{head}, {self.n_tokens} tokens, {self.tokens_per_s:.1f} tokens/s{spec}, "
                f"finish: {self.finish_reason}, {self.seconds:.2f} s")


@dataclass
class RequestInfo:
    """What an observer is told of a request as it arrives."""

    client: str          #: the client's address ("" where unknown)
    endpoint: str        #: the path it was sent to
    job: Any             #: its :class:`~app.serve.schema.Job`


class Watch:
    """An observer's view of one request (``observe`` in :func:`~app.serve.start_server`); this
    base does nothing. Its methods are called on the server's event loop, in this order:
    :meth:`started` once the prompt is read and fits (never for a request refused before),
    :meth:`step` for each verify step, :meth:`finished` with the result, and :meth:`ended`
    always, with the request's :class:`Record`. They must return at once and raise nothing."""

    def started(self, n_prompt: int) -> None:
        pass

    def step(self, ev: Any) -> None:
        pass

    def finished(self, result: Any) -> None:
        pass

    def ended(self, rec: "Record") -> None:
        pass


NO_WATCH = Watch()


class Generation:
    """One generation running in the worker thread: :meth:`next` gives its events in order
    (None at the end; an engine error is raised); :meth:`close` stops it and waits for the
    thread to leave the engine."""

    def __init__(self, worker: "EngineWorker", prompt: Sequence[int], cancel: threading.Event, **kw: Any):
        self.cancel = cancel
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._ended = False
        engine = worker.engine
        prompt = list(prompt)

        def work() -> None:
            result = None
            try:
                for ev in engine.generate(prompt, cancel=cancel.is_set, **kw):
                    if isinstance(ev, FinishEvent):
                        result = ev.result
                    self._put((_EVENT, ev))
            except BaseException as e:     # every failure reaches the request (a crash: RunnerCrashed)
                self._put((_ERROR, e))
                return
            self._put((_END, None))
            if worker.learn is not None and result is not None and result.tokens:
                worker.learn_from(prompt + list(result.tokens))

        self._future = self._loop.run_in_executor(worker.executor, work)

    def _put(self, item: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):       # the loop is closed: the server stopped
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def next(self) -> Any:
        if self._ended:
            return None
        kind, value = await self._queue.get()
        if kind == _EVENT:
            return value
        self._ended = True
        if kind == _ERROR:
            raise value
        return None

    async def close(self) -> None:
        """Stop the generation (where it runs still) and wait until the engine is free."""
        if not self._future.done():
            self.cancel.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(self._future)


class EngineWorker:
    """The engine's thread and the lock that queues the requests (see the module docstring)."""

    def __init__(self, engine: Any, keep: int = 100, learn: Callable[[list[int]], Any] | None = None):
        self.engine = engine
        #: teaches the lookup caches a finished conversation (None: they are only read)
        self.learn = learn
        #: what learning failed with last (the server goes on serving without it)
        self.learn_error: str | None = None
        #: conversations learned
        self.learned = 0
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftlight-serve-engine")
        self._lock: asyncio.Lock | None = None
        #: the last requests' records, oldest first
        self.finished: collections.deque[Record] = collections.deque(maxlen=keep)
        #: requests waiting for the lock or generating now
        self.pending = 0
        #: the server stopped: no more engine calls
        self.closed = False
        #: the cancel events of the requests in progress (set when the server stops)
        self.active: set[threading.Event] = set()

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:                  # made in the loop that uses it
            self._lock = asyncio.Lock()
        return self._lock

    @property
    def busy(self) -> bool:
        return self._lock is not None and self._lock.locked()

    async def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` in the worker thread (an engine call: ``prompt_tokens``)."""
        self._check_open()
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args, **kw))

    def generate(self, prompt: Sequence[int], cancel: threading.Event, **kw: Any) -> Generation:
        self._check_open()
        return Generation(self, prompt, cancel, **kw)

    def _check_open(self) -> None:
        if self.closed:
            from .errors import ApiError
            raise ApiError("the server is stopping", "unavailable_error")

    def learn_from(self, tokens: list[int]) -> None:
        """Teach the caches ``tokens`` (in the worker thread); a failure is logged, not raised:
        the reply was given already, and serving goes on without learning."""
        assert self.learn is not None
        try:
            self.learn(tokens)
            self.learned += 1
        except Exception as e:
            from ..errors import describe
            self.learn_error = describe(e)
            log.warning("the lookup caches could not learn the last conversation: %s", self.learn_error)

    def record(self, rec: Record) -> None:
        self.finished.append(rec)

    def shutdown(self) -> None:
        self.closed = True
        self.executor.shutdown(wait=False, cancel_futures=True)


def now() -> float:
    return time.perf_counter()
