"""The engine as the session sees it: the :class:`ChatEngine` protocol, and the default factory.

The session only ever calls these methods; the real engine lives in a runner process of its
own (:class:`app.runner.RunnerEngine`, which sends each call on to :mod:`app.runner_child`),
and the tests' scripted engine has the same interface. Imports the runner lazily (a session
with a scripted engine never starts one).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import SpecType

from ..options import ModelOptions

__all__ = ["ChatEngine", "EngineFactory", "Post", "Progress", "default_engine_factory", "uses_lookup_caches",
           "is_crash", "engine_n_ctx", "stop_strings"]

#: hands an event to the owner thread (the Textual app's ``post_message``, a test's ``queue.put``)
Post = Callable[[Any], Any]
#: (done, total, phase) of a load
Progress = Callable[[int, int, str], None]


class ChatEngine(Protocol):
    """What the session needs of an engine (:class:`speculators.engine.Engine`, or the scripted one)."""

    model: Any            # .path
    chain: Any            # .speculators (each .name), .skipped {type: reason}
    spec: SpecParams
    config: Any           # .n_ctx
    template: Any         # .stop_strings

    def set_spec(self, params: SpecParams, resources: dict | None = None) -> Any: ...

    def prompt_tokens(self, messages: Sequence[dict] | None = None, text: str | None = None,
                      raw: bool = False) -> list[int]: ...

    def generate(self, prompt: Sequence[int], max_tokens: int = 512, sampling: SamplingParams | None = None,
                 stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None,
                 stats_interval_s: float = 0.25, context_shift: bool = False,
                 n_keep: int = 0) -> Iterator[Any]: ...

    def close(self) -> None: ...


class EngineFactory(Protocol):
    def __call__(self, model_options: ModelOptions, spec: SpecParams, progress: Progress) -> ChatEngine: ...


def default_engine_factory(model_options: ModelOptions, spec: SpecParams, progress: Progress) -> ChatEngine:
    """The real engine, in a runner process of its own (:mod:`app.runner`): the default model
    (assembled on first run) or ``--model``. A crash of native code ends the runner, not the chat."""
    from ..runner import RunnerEngine
    return RunnerEngine(model_options, spec, progress)


def uses_lookup_caches(spec: SpecParams) -> bool:
    """ngram-cache is asked for, by name or under ``auto``."""
    from speculators.auto import uses_type
    return uses_type(spec, SpecType.NGRAM_CACHE)


def is_crash(e: BaseException) -> bool:
    """The engine's process died (see :mod:`app.runner`)."""
    from ..runner import RunnerCrashed
    return isinstance(e, RunnerCrashed)


def engine_n_ctx(engine: Any) -> int:
    """The context size of the loaded ``engine`` (4096 where it does not say)."""
    ctx = getattr(engine, "ctx", None)
    n = getattr(ctx, "n_ctx", None) or getattr(getattr(engine, "config", None), "n_ctx", None)
    return int(n or 4096)


def stop_strings(engine: Any) -> tuple[str, ...]:
    """The strings that end a reply under the engine's chat template."""
    return tuple(getattr(getattr(engine, "template", None), "stop_strings", ()) or ())
