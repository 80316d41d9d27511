"""The HTTP server: its guards, the application, and :func:`start_server`.

Routes (each also without its ``/v1`` where llama-server has it so; :mod:`app.serve.handlers`):

- ``GET /health``: ``{"status": "ok"}``, or 503 while the model runner is down (after a crash,
  until the fresh one has loaded the model; no API key needed, as llama-server's);
- ``GET /v1/models``: the one model;
- ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /completion``.

Guards, in order: the body's size (:data:`MAX_BODY_BYTES`), the API key
(``Authorization: Bearer KEY``, or llama-server's ``X-Api-Key``) where one is set,
and on a loopback server without a key the ``Host`` and ``Origin`` of the request:
a web page in a browser could otherwise make the browser send requests to
``127.0.0.1`` (a cross-site request, or a DNS name rebound to 127.0.0.1), so a
request naming another host, or sent from a page of another origin, is refused (403).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from aiohttp import web

from speculators.devices import is_loopback
from speculators.sampling import SamplingParams

from .errors import ApiError, ServeError
from .handlers import SETTINGS, WORKER, Settings, endpoint, error_response, health, models
from .schema import parse_chat, parse_completion, parse_completions
from .worker import EngineWorker, RequestInfo, Watch

#: the largest request body read (llama-server has no limit of its own; 8 MiB holds ~2M tokens of text)
MAX_BODY_BYTES = 8 << 20
PUBLIC_PATHS = ("/health", "/v1/health")
#: seconds a closing server gives the requests in progress to end
SHUTDOWN_GRACE_S = 2.0


# ---------------------------------------------------------------------------
# binding (is_loopback: speculators.devices', which rpc-server's check uses too)
# ---------------------------------------------------------------------------

def check_bind(host: str, api_key: str | None) -> list[str]:
    """Refuse an address other than loopback without an API key; the warnings to print where
    one is given.

    >>> check_bind("127.0.0.1", None)
    []
    >>> check_bind("0.0.0.0", None)
    Traceback (most recent call last):
    ...
    app.serve.errors.ServeError: refusing to listen on 0.0.0.0 without an API key: any machine that can reach it could use the model. Add --api-key KEY (clients send "Authorization: Bearer KEY"), or listen on 127.0.0.1
    """
    if api_key is not None and not api_key.strip():
        raise ServeError("the API key is empty")
    if is_loopback(host):
        return []
    if not api_key:
        raise ServeError(f"refusing to listen on {host} without an API key: any machine that can reach it could "
                         f"use the model. Add --api-key KEY (clients send \"Authorization: Bearer KEY\"), or "
                         f"listen on 127.0.0.1")
    return [f"listening on {host}: other machines can reach this server; requests need the API key, and "
            f"HTTP is not encrypted (the key and the conversations cross the network in clear text): a "
            f"trusted network only, or put a TLS proxy in front"]


def _host_name(value: str) -> str:
    """The host of a ``Host`` header (``[::1]:8080`` -> ``::1``)."""
    v = value.strip()
    if v.startswith("["):
        return v[1:v.find("]")] if "]" in v else v
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


@web.middleware
async def _guard(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Every answer of an error in OpenAI's shape; the key, host and origin checks."""
    s: Settings = request.app[SETTINGS]
    try:
        if request.path not in PUBLIC_PATHS:
            if s.api_key is not None:
                given = request.headers.get("Authorization", "") or request.headers.get("X-Api-Key", "")
                if given.startswith("Bearer "):
                    given = given[len("Bearer "):]
                if not hmac.compare_digest(given.strip().encode(), s.api_key.encode()):
                    raise ApiError.unauthorized()
            elif s.loopback:
                _check_local(request)
        return await handler(request)
    except ApiError as e:
        return error_response(e)
    except web.HTTPRequestEntityTooLarge:
        return error_response(ApiError.too_large(s.max_body_bytes))
    except web.HTTPNotFound:
        return error_response(ApiError.not_found(request.path))
    except web.HTTPMethodNotAllowed as e:
        allowed = ", ".join(sorted(e.allowed_methods))
        return error_response(ApiError(f"{request.method} is not allowed on {request.path} (use {allowed})",
                                       "invalid_request_error", status=405))


def _check_local(request: web.Request) -> None:
    """A loopback server without a key answers requests for a loopback host from no other web origin."""
    host = request.headers.get("Host", "")
    if host and not is_loopback(_host_name(host)):
        raise ApiError(f"refused: the request names the host {host!r}, and this server listens on loopback "
                       f"without an API key (start it with --api-key to take requests for other names)",
                       "permission_error")
    origin = request.headers.get("Origin")
    if origin and origin != "null":
        o = urlsplit(origin).hostname or ""
        if not is_loopback(o):
            raise ApiError(f"refused: a request from the web page {origin} (start the server with --api-key to "
                           f"take requests from web pages)", "permission_error")
    elif origin == "null":
        raise ApiError("refused: a request from a sandboxed web page", "permission_error")


def make_app(engine: Any, *, model_id: str, api_key: str | None, loopback: bool,
             sampling: SamplingParams | None = None, max_tokens: int | None = None,
             max_body_bytes: int = MAX_BODY_BYTES,
             learn: Callable[[list[int]], Any] | None = None,
             observe: Callable[[RequestInfo], Watch] | None = None) -> web.Application:
    app = web.Application(middlewares=[_guard], client_max_size=max_body_bytes)
    app[SETTINGS] = Settings(engine, model_id, api_key, loopback, sampling or SamplingParams(), max_tokens,
                             max_body_bytes, observe)
    app[WORKER] = EngineWorker(engine, learn=learn)
    r = app.router
    for path in PUBLIC_PATHS:
        r.add_get(path, health)
    for path in ("/v1/models", "/models"):
        r.add_get(path, models)
    for path in ("/v1/chat/completions", "/chat/completions"):
        r.add_post(path, endpoint(parse_chat))
    for path in ("/v1/completions", "/completions"):
        r.add_post(path, endpoint(parse_completions))
    r.add_post("/completion", endpoint(parse_completion))
    return app


# ---------------------------------------------------------------------------
# running it
# ---------------------------------------------------------------------------

def default_model_id(engine: Any) -> str:
    with contextlib.suppress(Exception):
        return os.path.basename(str(engine.model.path)) or "draftlight"
    return "draftlight"


@dataclass
class ServerHandle:
    """A server running in a thread of its own (:func:`start_server`)."""

    host: str
    port: int
    app: web.Application
    warnings: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    @property
    def model_id(self) -> str:
        """The model's name in the API."""
        return self.app[SETTINGS].model_id

    @property
    def worker(self) -> EngineWorker:
        return self.app[WORKER]

    @property
    def finished(self):
        """The last requests' :class:`~app.serve.worker.Record` s, oldest first."""
        return self.worker.finished

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server has stopped (True) or ``timeout`` passed."""
        return self._stopped.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests, end those in progress (their generations stop) and the thread.
        The engine stays open: it is the caller's."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or self._stopped.is_set():
            return
        with contextlib.suppress(RuntimeError, TimeoutError, concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    async def _shutdown(self) -> None:
        """Stop listening and end the requests in progress: their generations are stopped now
        (each client gets the reply as far as it was written), and each request's own ending
        (its record, its observer's ``ended``) runs before the loop stops."""
        for cancel in list(self.worker.active):
            cancel.set()
        if self._runner is not None:
            await self._runner.cleanup()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=SHUTDOWN_GRACE_S)
        self.worker.shutdown()

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start_server(engine: Any, host: str = "127.0.0.1", port: int = 8080, *, api_key: str | None = None,
                 model_id: str | None = None, sampling: SamplingParams | None = None,
                 max_tokens: int | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 learn: Callable[[list[int]], Any] | None = None,
                 observe: Callable[[RequestInfo], Watch] | None = None) -> ServerHandle:
    """Serve ``engine`` (a :class:`~app.runner.RunnerEngine`, loaded, its speculation set) on
    ``host:port`` (0: a free port, :attr:`ServerHandle.port` says which) from a thread of its
    own; returns once it listens. ``sampling``: the defaults a request's fields override;
    ``max_tokens``: a reply's limit where a request sets none (None: until the context is full).
    ``learn``: teaches the lookup caches each finished conversation (:class:`EngineWorker`).
    ``observe``: called with each generation request as it arrives; its
    :class:`~app.serve.worker.Watch` is told how the request goes (the chat's Server screen).

    Raises :class:`ServeError` for an address other than loopback without ``api_key``, or one
    it cannot listen on.
    """
    warnings = check_bind(host, api_key)
    app = make_app(engine, model_id=model_id or default_model_id(engine), api_key=api_key,
                   loopback=is_loopback(host), sampling=sampling, max_tokens=max_tokens,
                   max_body_bytes=max_body_bytes, learn=learn, observe=observe)
    handle = ServerHandle(host, port, app, warnings)
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        handle._loop = loop
        try:
            # requests in progress at a close get SHUTDOWN_GRACE_S to end (their generations are stopped)
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S)
            loop.run_until_complete(runner.setup())
            handle._runner = runner
            site = web.TCPSite(runner, host, port)
            try:
                loop.run_until_complete(site.start())
            except OSError as e:
                raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                handle.port = server.sockets[0].getsockname()[1]
        except BaseException as e:
            failed.append(e)
            with contextlib.suppress(Exception):
                loop.run_until_complete(handle._shutdown())
            loop.close()
            handle._stopped.set()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            handle._stopped.set()

    thread = threading.Thread(target=run, name="draftlight-serve", daemon=True)
    handle._thread = thread
    thread.start()
    ready.wait()
    if failed:
        raise failed[0]
    return handle
