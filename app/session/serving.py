"""Serving the chat's model to other programs, from the chat itself (the Server screen's switch).

:meth:`ServeMixin.start_serving` starts :func:`app.serve.start_server` (OpenAI's API and
llama.cpp's ``/completion``, in a thread of its own) on :class:`SharedEngine`: the chat's own
engine, taken under the session's engine lock for each generation, so that a served request and
a chat reply never generate at once: whichever asks second waits (as ``llama-server -np 1``
queues them on its one slot), and a read-ahead of the conversation gives way to a request. The
caches are shared: a request whose prompt extends the last one's reuses its prefix, and the
lookup caches learn each served conversation (``learn``) as they learn the chat's replies.

Each generation request becomes a :class:`ServedRequest`, reported as the chat's replies are:
:class:`~app.session.events.ServedProgress` (one on its way at a time, what arrives meanwhile
coalesces) and :class:`~app.session.events.ServedDone`, which adds its figures to the session's
statistics (F4). :class:`~app.session.events.ServeChanged` says that the server started or
stopped. Touches the engine only through the engine lock, and the session's statistics only on
the owner thread.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from speculators.events import TokenEvent

from ..errors import describe
from .conversation import SessionError
from .events import ServeChanged, ServedDone, ServedProgress

__all__ = ["ServeMixin", "ServedRequest", "SharedEngine", "DEFAULT_PORT"]

#: llama-server's port; the Server screen's default
DEFAULT_PORT = 8080

#: requests kept for the Server screen and the Lab (the oldest go first)
KEEP_SERVED = 200


@dataclass(eq=False)
class ServedRequest:
    """One generation request to the chat's server, as the Server screen shows it.

    The server's thread fills the ``_new_*`` fields under :attr:`lock`; the owner thread moves
    them into the plain fields when it applies a :class:`ServedProgress`, so the UI reads the
    plain fields without a lock.
    """

    rid: int
    client: str
    endpoint: str
    kind: str                          #: "chat", "completions" or "completion" (the request's Job)
    messages: list[dict] | None = None
    text: str | None = None
    #: the prompt, where the request gave it as token ids (llama.cpp's /completion)
    prompt_ids: list[int] | None = None
    arrived: float = field(default_factory=time.time)
    #: "waiting" (for its turn), "generating", or how it ended: the engine's finish reason,
    #: "error" or "gone" (the client left before its turn)
    status: str = "waiting"
    n_prompt: int = 0
    n_cached: int = 0
    tokens: list[TokenEvent] = field(default_factory=list)
    n_drafted: int = 0
    n_accepted: int = 0
    #: accepted draft tokens, by speculator
    by: collections.Counter = field(default_factory=collections.Counter)
    tokens_per_s: float = 0.0
    seconds: float = 0.0
    error: str = ""
    result: Any = None                 #: the engine's GenerationResult, once it finished
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    signalled: bool = False            #: a ServedProgress is on its way to the owner
    _new_tokens: list[TokenEvent] = field(default_factory=list, repr=False)
    _new: dict = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        return self.status not in ("waiting", "generating")

    @property
    def label(self) -> str:
        """The request's prompt in one line: its last message, or its text."""
        if self.messages:
            last = next((m for m in reversed(self.messages) if m.get("role") == "user"), self.messages[-1])
            content = last.get("content")
            text = content if isinstance(content, str) else str(content or "")
        elif self.prompt_ids is not None:
            text = f"({len(self.prompt_ids)} token ids)"
        else:
            text = self.text or ""
        return " ".join(text.split())

    @property
    def reply_text(self) -> str:
        return "".join(t.text for t in self.tokens)


class _Watch:
    """A :class:`~app.serve.worker.Watch` that reports one request to the session (server thread).
    The running counts are its own (the owner thread only ever reads copies of them)."""

    def __init__(self, session: "ServeMixin", req: ServedRequest):
        self.session, self.req = session, req
        self.n_drafted = self.n_accepted = 0
        self.by: collections.Counter = collections.Counter()

    def _update(self, tokens: Sequence[TokenEvent] = (), **values: Any) -> None:
        """Hand the owner new tokens and values; post a ServedProgress unless one is on its way."""
        req = self.req
        with req.lock:
            req._new_tokens.extend(tokens)
            req._new.update(values)
            post = not req.signalled
            req.signalled = True
        if post:
            self.session.post(ServedProgress(req.rid))

    def started(self, n_prompt: int) -> None:
        self._update(status="generating", n_prompt=n_prompt)

    def step(self, ev: Any) -> None:
        self.n_drafted += int(ev.n_drafted or 0)
        self.n_accepted += int(ev.n_accepted or 0)
        if ev.n_accepted and ev.drafted_by:
            self.by[ev.drafted_by] += int(ev.n_accepted)
        self._update(ev.tokens, n_drafted=self.n_drafted, n_accepted=self.n_accepted,
                     by=collections.Counter(self.by))

    def finished(self, result: Any) -> None:
        with self.req.lock:
            self.req._new["result"] = result

    def ended(self, rec: Any) -> None:
        with self.req.lock:
            self.req._new.update(status=rec.finish_reason, n_cached=rec.n_cached, tokens_per_s=rec.tokens_per_s,
                                 seconds=rec.seconds, error=rec.error, n_prompt=rec.n_prompt or self.req.n_prompt)
        self.session.post(ServedDone(self.req.rid))


class SharedEngine:
    """The chat's engine as the server sees it (see the module docstring): what it reads of the
    engine is the session's engine of the moment; a generation holds the session's engine lock
    from its first step to its last."""

    #: how often a generation waiting for the engine looks whether its client has gone
    WAIT_STEP_S = 0.1

    def __init__(self, session: "ServeMixin"):
        self._session = session

    def _engine(self) -> Any:
        engine = self._session.engine
        if engine is None:
            from ..serve import ApiError
            raise ApiError("no model is loaded: the chat is loading one, try again shortly", "unavailable_error")
        return engine

    @property
    def model(self) -> Any:
        return self._engine().model

    @property
    def ctx(self) -> Any:
        return self._engine().ctx

    @property
    def template(self) -> Any:
        return self._engine().template

    @property
    def chain(self) -> Any:
        return self._engine().chain

    @property
    def model_id(self) -> str:
        """The name of the model the chat has loaded now (its file's name)."""
        return self._session._served_model_id()

    @property
    def alive(self) -> bool:
        engine = self._session.engine
        return engine is not None and getattr(engine, "alive", True) is not False

    @property
    def last_crash(self) -> str | None:
        return getattr(self._session.engine, "last_crash", None)

    def prompt_tokens(self, messages: Sequence[dict] | None = None, text: str | None = None,
                      raw: bool = False) -> list[int]:
        return self._engine().prompt_tokens(messages=messages, text=text, raw=raw)

    def generate(self, prompt: Sequence[int], cancel: Callable[[], bool] | None = None, **kw: Any) -> Iterator[Any]:
        s = self._session
        s._stop_warm()                 # a read-ahead of the chat gives way to a request
        lock = s.engine_lock
        while not lock.acquire(timeout=self.WAIT_STEP_S):
            if cancel is not None and cancel():
                return                 # the client left while it waited: nothing was generated
        try:
            yield from self._engine().generate(prompt, cancel=cancel, **kw)
        finally:
            lock.release()


class ServeMixin:
    """The session's server (a part of :class:`app.session.ChatSession`)."""

    def _init_serving(self) -> None:
        #: the running server (an :class:`app.serve.ServerHandle`), or None
        self.server: Any = None
        #: the requests served, oldest first (owner thread)
        self.served: collections.deque[ServedRequest] = collections.deque(maxlen=KEEP_SERVED)
        self._served_by_id: dict[int, ServedRequest] = {}
        self._rids = itertools.count(1)
        #: whether the lookup caches learn what is served
        self.serve_learns = True
        #: the thread closing the last server (stop_serving)
        self._serve_closing: threading.Thread | None = None

    @property
    def serving_url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def start_serving(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, api_key: str | None = None,
                      learn: bool = True) -> list[str]:
        """Serve the chat's model on ``host:port`` (0: any free port); returns the bind's warnings.
        Raises :class:`SessionError` where it cannot (aiohttp missing, an address other than
        loopback without ``api_key``, the port taken)."""
        if self.server is not None:
            raise SessionError(f"already serving on {self.server.url}")
        import importlib.util
        if importlib.util.find_spec("aiohttp") is None:
            raise SessionError("serving needs aiohttp: python -m pip install aiohttp")
        from ..serve import ServeError, start_server
        if self._serve_closing is not None:
            self._serve_closing.join(timeout=5.0)       # the last server's port is free again
        self.serve_learns = learn
        try:
            self.server = start_server(SharedEngine(self), host, port, api_key=api_key,
                                       model_id=self._served_model_id(), sampling=self.config.sampling,
                                       learn=self._learn_served, observe=self._observe)
        except ServeError as e:
            raise SessionError(str(e)) from None
        except OSError as e:
            raise SessionError(f"cannot listen on {host}:{port}: {describe(e)}") from None
        self.post(ServeChanged(self.server.url, warnings=list(self.server.warnings)))
        return list(self.server.warnings)

    def stop_serving(self) -> None:
        """Stop the server (at once: it closes in a thread of its own, so the caller never waits
        for a request in progress, which is stopped, its client getting what was written)."""
        server, self.server = self.server, None
        if server is None:
            return
        self._serve_closing = self._start(server.close, 5.0, name="serve-close")
        self.post(ServeChanged(None))

    def _served_model_id(self) -> str:
        """The model's name in the API: its file's name (the loaded one's, else the configured one's)."""
        from pathlib import Path
        m = str(getattr(getattr(self.engine, "model", None), "path", "") or "") or self.config.model.model
        return Path(m).name if m else "draftlight"

    def served_request(self, rid: int) -> ServedRequest | None:
        return self._served_by_id.get(rid)

    # -- the server's side (its thread) -----------------------------------------------------
    def _observe(self, info: Any) -> _Watch:
        job = info.job
        req = ServedRequest(next(self._rids), info.client, info.endpoint, job.kind,
                            messages=[dict(m) for m in job.messages] if job.messages is not None else None,
                            text=job.text, prompt_ids=list(job.tokens) if job.tokens is not None else None)
        with req.lock:
            req.signalled = True
        self.post(ServedProgress(req.rid, new=req))
        return _Watch(self, req)

    def _learn_served(self, tokens: list[int]) -> None:
        """Teach the lookup caches a served conversation (the server's worker thread), as the
        chat's replies teach them: under the engine lock, saved where something was learned."""
        store = self.store
        if store is None or not self.serve_learns:
            return
        with self.engine_lock:
            learned = store.learn(tokens)
        if learned:
            self._save_lookup(store)

    # -- applying its events (owner thread) ------------------------------------------------
    def _on_ServedProgress(self, ev: ServedProgress) -> None:
        if ev.new is not None:
            if len(self.served) == self.served.maxlen:
                self._served_by_id.pop(self.served[0].rid, None)
            self.served.append(ev.new)
            self._served_by_id[ev.new.rid] = ev.new
        req = self._served_by_id.get(ev.rid)
        if req is not None:
            self._take_new(req)

    def _on_ServedDone(self, ev: ServedDone) -> None:
        req = self._served_by_id.get(ev.rid)
        if req is None:
            return
        self._take_new(req)
        if req.result is not None:
            self.stats.add(req.result.stats, req.tokens)

    @staticmethod
    def _take_new(req: ServedRequest) -> None:
        with req.lock:
            req.signalled = False
            req.tokens.extend(req._new_tokens)
            req._new_tokens = []
            new, req._new = req._new, {}
        for k, v in new.items():
            setattr(req, k, v)

    def _close_serving(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.close(timeout=2.0)
