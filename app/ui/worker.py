"""What runs in worker threads: loading the model, generating a reply, rebuilding the chain.

Each function takes a ``post`` callable (``App.post_message``, safe to call
from any thread) and reports only through messages, so the flow stays one
way: request in, events out. The engine is used by one thread at a time,
guarded by ``lock``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from speculators.events import FinishEvent, StatsEvent, StepEvent
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from .messages import (LoadProgress, ModelLoaded, ModelLoadFailed, ReplyFailed, ReplyFinished,
                       SpecApplied, StatsUpdated, TokenBatch, TokensArrived)

Post = Callable[[Any], Any]


class EngineFactory(Protocol):
    def __call__(self, model_options: Any, spec: SpecParams,
                 progress: Callable[[int, int, str], None]) -> Any: ...


def default_engine_factory(model_options: Any, spec: SpecParams,
                           progress: Callable[[int, int, str], None]) -> Any:
    """The real engine: the default model (assembled on first run) or ``--model``."""
    from speculators.engine import Engine

    from ..runtime import engine_config, resolve_model_path
    from speculators.types import SpecType
    path = resolve_model_path(model_options, progress)
    progress(0, 0, "load")
    config = engine_config(model_options)
    if hasattr(config, "load_mtp"):
        # the chain is built after the model (so a bad chain never blocks it): say now if MTP is wanted
        config.load_mtp = SpecType.DRAFT_MTP in spec.types
    return Engine(path, config, SpecParams())


def describe_error(e: BaseException) -> str:
    """One clear line for an error, never a traceback."""
    msg = str(e).strip()
    if isinstance(e, FileNotFoundError) and getattr(e, "filename", None):
        return f"file not found: {e.filename}"
    if not msg:
        return e.__class__.__name__
    if e.__class__.__name__ in ("ModelError", "GenerationError", "ParamError", "DefaultModelError",
                                "Unavailable", "ChatTemplateError", "ContextFull", "CorruptCacheError"):
        return msg
    return f"{msg} ({e.__class__.__name__})"


def load_engine(factory: EngineFactory, model_options: Any, spec: SpecParams, post: Post) -> None:
    """Thread body: open the engine, then build the chain (a bad chain never blocks the model)."""
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int, phase: str) -> None:
        now = time.perf_counter()
        if done >= total or now - last[0] > 0.05:
            last[0] = now
            post(LoadProgress(done, total, phase))

    path = getattr(model_options, "model", None)
    try:
        engine = factory(model_options, spec, progress)
    except Exception as e:  # every failure becomes a message, never a traceback
        post(ModelLoadFailed(describe_error(e), path))
        return
    spec_error = None
    try:
        engine.set_spec(spec)
    except Exception as e:
        spec_error = describe_error(e)
    post(ModelLoaded(engine, str(getattr(getattr(engine, "model", None), "path", path) or path or ""),
                     time.perf_counter() - t0))
    if spec_error is not None:
        post(SpecApplied({}, spec_error))


def apply_spec(engine: Any, spec: SpecParams, lock: threading.Lock, post: Post) -> None:
    """Thread body: rebuild the speculator chain (the target model stays loaded)."""
    with lock:
        try:
            chain = engine.set_spec(spec)
        except Exception as e:
            post(SpecApplied(dict(getattr(engine.chain, "skipped", {}) or {}), describe_error(e)))
            return
        post(SpecApplied(dict(getattr(chain, "skipped", {}) or {})))


@dataclass
class GenerationRequest:
    reply_key: int
    messages: list[dict]
    max_tokens: int = 1024
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()


def run_generation(engine: Any, req: GenerationRequest, post: Post, cancel: threading.Event,
                   lock: threading.Lock) -> None:
    """Thread body: stream one reply as coalescing :class:`TokensArrived` messages."""
    block = threading.Lock()
    batch: TokenBatch | None = None
    key = req.reply_key
    with lock:
        try:
            prompt = engine.prompt_tokens(messages=req.messages)
            # a model without a chat template chats through a transcript that needs stop strings
            stop = tuple(req.stop) + tuple(getattr(getattr(engine, "template", None), "stop_strings", ()) or ())
            events = engine.generate(prompt, max_tokens=req.max_tokens, sampling=req.sampling,
                                     stop=stop, cancel=cancel.is_set)
            for ev in events:
                if isinstance(ev, StepEvent):
                    if not ev.tokens:
                        continue
                    now = time.perf_counter()
                    with block:
                        new = batch is None or batch.taken
                        if new:
                            batch = TokenBatch(block)
                        assert batch is not None
                        batch.tokens.extend(ev.tokens)
                        batch.times.extend([now] * len(ev.tokens))
                        batch.n_drafted += ev.n_drafted
                        batch.n_accepted += ev.n_accepted
                    if new:
                        post(TokensArrived(key, batch))
                elif isinstance(ev, StatsEvent):
                    post(StatsUpdated(key, dataclasses.replace(ev.stats)))
                elif isinstance(ev, FinishEvent):
                    post(ReplyFinished(key, ev.result))
        except Exception as e:
            post(ReplyFailed(key, describe_error(e)))
