"""The routes: health, the model, and the three kinds of generation (whole or streamed).

A generation request waits for its turn (:attr:`EngineWorker.lock`), reads its prompt
(the chat's messages through the runner's ``prompt_tokens``, or a raw text), checks it
against the context, and runs in the worker thread while the event loop turns its events
into the answer (:mod:`app.serve.responses`). A watcher sets the request's ``cancel``
once its client has gone, whether it is waiting for its turn, generating or streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from speculators.events import FinishEvent, StepEvent
from speculators.sampling import SamplingParams

from .errors import ApiError
from .responses import Reply
from .schema import Job, parse_body
from .worker import NO_WATCH, EngineWorker, Record, RequestInfo, Watch, now

log = logging.getLogger("draftlight.serve")

#: how often a request checks whether its client is still there
WATCH_S = 0.1

WORKER = web.AppKey("worker", EngineWorker)
SETTINGS = web.AppKey("settings", object)


@dataclass
class Settings:
    engine: Any
    model_id: str
    api_key: str | None
    loopback: bool
    sampling: SamplingParams
    max_tokens: int | None
    max_body_bytes: int
    #: told of each generation request (:class:`~app.serve.worker.Watch`); None: nobody watches
    observe: Callable[[RequestInfo], Watch] | None = None


def model_id(s: Settings) -> str:
    """The model's name in the API: the engine's own where it names the model it has now (the
    chat's, whose model can change), else the server's."""
    return getattr(s.engine, "model_id", None) or s.model_id


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body, ensure_ascii=False), status=status, content_type="application/json")


def error_response(e: ApiError) -> web.Response:
    return json_response(e.body(), e.status)


async def _read_json(request: web.Request) -> dict:
    s: Settings = request.app[SETTINGS]
    if request.content_length is not None and request.content_length > s.max_body_bytes:
        raise ApiError.too_large(s.max_body_bytes)
    return parse_body(await request.read())


async def health(request: web.Request) -> web.Response:
    engine = request.app[SETTINGS].engine
    if not getattr(engine, "alive", True):
        last = getattr(engine, "last_crash", None)
        return error_response(ApiError("the model runner is not running" + (f": {last}" if last else ""),
                                       "unavailable_error"))
    return json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    s: Settings = request.app[SETTINGS]
    engine = s.engine
    meta: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        meta = {"n_ctx": engine.ctx.n_ctx, "n_ctx_train": engine.model.n_ctx_train, "n_vocab": engine.model.n_vocab,
                "description": engine.model.description}
    model = {"id": model_id(s), "object": "model", "created": int(time.time()), "owned_by": "draftlight",
             "meta": meta}
    return json_response({"object": "list", "data": [model]})


def endpoint(parse: Callable[..., Job]) -> Callable:
    async def handle(request: web.Request) -> web.StreamResponse:
        s: Settings = request.app[SETTINGS]
        job = parse(await _read_json(request), s.sampling, s.max_tokens)
        return await _generate(request, job)
    return handle


async def _watch(request: web.Request, cancel: threading.Event) -> None:
    """Set ``cancel`` once the client has gone (its connection closed)."""
    while not cancel.is_set():
        t = request.transport
        if t is None or t.is_closing():
            cancel.set()
            return
        await asyncio.sleep(WATCH_S)


def _chain_names(engine: Any) -> list[str]:
    with contextlib.suppress(Exception):
        return [sp.name for sp in engine.chain.speculators]
    return []


async def _prompt(worker: EngineWorker, job: Job) -> list[int]:
    engine = worker.engine
    if job.tokens is not None:
        n_vocab = int(getattr(engine.model, "n_vocab", 0) or 0)
        bad = [t for t in job.tokens if t < 0 or (n_vocab and t >= n_vocab)]
        if bad:
            raise ApiError.invalid(f"token id {bad[0]} is not in the model's vocabulary (0 to {n_vocab - 1})",
                                   param="prompt")
        return list(job.tokens)
    if job.messages is not None:
        return await worker.call(engine.prompt_tokens, messages=job.messages)
    return await worker.call(engine.prompt_tokens, text=job.text, raw=True)


def api_error(e: BaseException) -> ApiError:
    """How an engine's failure is answered."""
    from ..errors import UserError, describe
    from ..runner import RunnerCrashed, RunnerError
    if isinstance(e, ApiError):
        return e
    if isinstance(e, RunnerCrashed):
        return ApiError.server(str(e))
    if isinstance(e, RunnerError):
        return ApiError(str(e), "unavailable_error")
    if isinstance(e, UserError):          # the engine's: a prompt it cannot take, a template that fails
        return ApiError.invalid(describe(e))
    return ApiError.server(describe(e))


async def _generate(request: web.Request, job: Job) -> web.StreamResponse:
    s: Settings = request.app[SETTINGS]
    worker = request.app[WORKER]
    engine = s.engine
    cancel = threading.Event()
    watcher = asyncio.create_task(_watch(request, cancel))
    rec = Record(request.path, "error")
    watch = s.observe(RequestInfo(request.remote or "", request.path, job)) if s.observe else NO_WATCH
    worker.pending += 1
    worker.active.add(cancel)
    try:
        async with worker.lock:
            t0 = now()
            if cancel.is_set():
                rec.finish_reason = "gone"
                return web.Response(status=499)
            try:
                prompt = await _prompt(worker, job)
            except Exception as e:
                raise api_error(e) from None
            rec.n_prompt = len(prompt)
            n_ctx = engine.ctx.n_ctx
            if not prompt:
                raise ApiError.invalid("the prompt is empty", param="prompt")
            if len(prompt) >= n_ctx:
                raise ApiError.over_context(len(prompt), n_ctx)
            stop = list(job.stop)
            if job.kind == "chat":                 # the transcript's next turn ends the reply, as in the chat
                stop += [x for x in (engine.template.stop_strings or ()) if x not in stop]
            max_tokens = job.max_tokens if job.max_tokens is not None else n_ctx - len(prompt)
            watch.started(len(prompt))
            reply = Reply(job, model_id(s), prompt, _chain_names(engine))
            gen = worker.generate(prompt, cancel, max_tokens=max_tokens, sampling=job.sampling, stop=stop,
                                  stats_interval_s=3600.0)
            try:
                if job.stream:
                    return await _stream(request, gen, reply, rec, watch)
                return await _whole(gen, reply, rec, watch)
            finally:
                await gen.close()
                rec.seconds = now() - t0
    except ApiError as e:
        rec.error = e.message                  # answered by the guard, in OpenAI's shape
        raise
    finally:
        worker.pending -= 1
        worker.active.discard(cancel)
        watcher.cancel()
        if rec.finish_reason == "error" and not rec.error:
            rec.error = "the request failed"
        worker.record(rec)
        watch.ended(rec)
        log.info("%s", rec.line())


def _note(rec: Record, reply: Reply) -> None:
    st = reply.result.stats
    rec.finish_reason = reply.result.finish_reason
    rec.n_cached, rec.n_tokens = st.n_prompt_reused, st.n_generated
    rec.n_drafted, rec.n_accepted, rec.tokens_per_s = st.n_drafted, reply.figures.n_accepted, st.tokens_per_s


async def _whole(gen, reply: Reply, rec: Record, watch: Watch = NO_WATCH) -> web.Response:
    while True:
        try:
            ev = await gen.next()
        except Exception as e:
            err = api_error(e)
            rec.error = err.message
            return error_response(err)
        if ev is None:
            break
        if isinstance(ev, StepEvent):
            reply.add(ev)
            watch.step(ev)
        elif isinstance(ev, FinishEvent):
            reply.finish(ev.result)
            watch.finished(ev.result)
    if reply.result is None:
        rec.error = "the reply ended without its result"
        return error_response(ApiError.server(rec.error))
    _note(rec, reply)
    return json_response(reply.body())


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _stream(request: web.Request, gen, reply: Reply, rec: Record,
                  watch: Watch = NO_WATCH) -> web.StreamResponse:
    """Server-sent events; the headers go with the first event, so that a failure before it
    (the prompt's reading) is a plain error answer with its status, as in llama-server."""
    resp: web.StreamResponse | None = None

    async def send(data: bytes) -> None:
        nonlocal resp
        if resp is None:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            for c in reply.first_chunks():
                await resp.write(_sse(c))
        await resp.write(data)

    try:
        while True:
            try:
                ev = await gen.next()
            except Exception as e:
                err = api_error(e)
                rec.error = err.message
                if resp is None:
                    return error_response(err)
                await resp.write(_sse(err.body()))      # the stream ends on the error: no [DONE]
                return resp
            if ev is None:
                break
            if isinstance(ev, StepEvent):
                chunk = reply.chunk(reply.add(ev))
                watch.step(ev)
                if chunk is not None:
                    await send(_sse(chunk))
            elif isinstance(ev, FinishEvent):
                reply.finish(ev.result)
                watch.finished(ev.result)
        if reply.result is None:
            rec.error = "the reply ended without its result"
            if resp is None:
                return error_response(ApiError.server(rec.error))
            await resp.write(_sse(ApiError.server(rec.error).body()))
            return resp
        _note(rec, reply)
        data = b"".join(_sse(c) for c in reply.final_chunks())
        if reply.job.kind != "completion":
            data += b"data: [DONE]\n\n"      # llama.cpp's /completion stream has none
        await send(data)
        await resp.write_eof()
        return resp
    except ConnectionError:
        gen.cancel.set()                      # the client went away: its generation stops
        rec.finish_reason, rec.error = "cancelled", ""
        return resp if resp is not None else web.Response(status=499)

