"""How the chat talks to its model: the messages between the chat's process and the runner.

The runner (:mod:`app.runner_child`) holds the model; the chat's process
(:class:`app.runner.RunnerEngine`) sends it *requests* and reads *answers*.
Every message is one of the dataclasses below, pickled over a socket pair;
both ends are this package. The rules:

- **Every request carries an id** (:attr:`Request.rid`) and every answer names the
  request it answers. The chat's process hands each answer to the request that
  waits for it, and drops an answer whose request was given up (cancelled,
  abandoned): a late answer can never answer another request.
- **The runner does one request at a time**, in the order they came. A request
  cancelled before it started is answered :class:`Cancelled` without running.
- **A stop is a message** (:class:`Cancel`), read by a thread of the runner's own
  while the request runs: the request sees it at its next step, and a decode in
  progress sees it too, through llama.cpp's abort callback (on the CPU backend;
  a GPU backend finishes its batch first).
- **What the chat shows of the engine comes from snapshots**
  (:class:`EngineSnapshot`), sent with every answer: the UI reads the last one it
  holds and never waits for the runner.

A reply, as it crosses::

    chat  → Generate(rid=7, prompt=[...], options=GenerateOptions(max_tokens=64))
    runner → Events(rid=7, events=[StepEvent(...)])      # as the reply is written
    chat  → Cancel(rid=7)                                  # Esc
    runner → Done(rid=7, value=None, snapshot=EngineSnapshot(...))

>>> Cancel(7)
Cancel(rid=7)
>>> isinstance(Generate(1, [1, 2], GenerateOptions()), Request)
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from speculators.base import SpeculatorStats
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

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
    stats: SpeculatorStats | None = None


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
class LookupInfo:
    """The runner's lookup caches, as the statistics panel and the settings pane show them."""

    folder: str
    warnings: list[str] = field(default_factory=list)
    #: ``{"static": CacheInfo, "dynamic": CacheInfo}`` (:class:`app.lookup_store.CacheInfo`)
    caches: dict = field(default_factory=dict)
    #: entries learned and not saved yet
    pending_entries: int = 0
    #: drafted / accepted tokens per cache of the running ngram-cache speculator
    contribution: dict = field(default_factory=dict)


@dataclass
class EngineSnapshot:
    model: ModelInfo
    chain: ChainInfo
    spec: SpecParams
    ctx: ContextInfo
    template: TemplateInfo
    #: whether the model was loaded with the CPU's extra buffer types (see app.cpu_check)
    extra_bufts: bool = True
    pid: int = 0
    #: the devices llama.cpp saw when the model was loaded (RPC servers' included), with their memory
    devices: list = field(default_factory=list)
    #: the lookup caches, where they are open
    lookup: LookupInfo | None = None


# ---------------------------------------------------------------------------
# requests: the chat's process → the runner
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What the chat asks of the runner; answered by :class:`Done`, :class:`Failed` or
    :class:`Cancelled` with the same ``rid``."""

    rid: int


@dataclass(frozen=True)
class Load(Request):
    """Load the model (the first request of every runner); answered with the load's warnings."""

    model_options: Any       # app.options.ModelOptions
    spec: SpecParams


@dataclass(frozen=True)
class SetSpec(Request):
    """Build the speculator chain for ``spec`` (with the lookup caches where ``with_store``)."""

    spec: SpecParams
    with_store: bool = False


@dataclass(frozen=True)
class PromptTokens(Request):
    """Tokens of a chat (through the model's template) or of a text; answered with the tokens."""

    messages: list[dict] | None = None
    text: str | None = None
    raw: bool = False


@dataclass(frozen=True)
class GenerateOptions:
    """:meth:`speculators.engine.Engine.generate`'s keyword arguments, but ``cancel``."""

    max_tokens: int = 512
    sampling: SamplingParams | None = None
    stop: tuple[str, ...] = ()
    stats_interval_s: float = 0.25
    context_shift: bool = False
    n_keep: int = 0


@dataclass(frozen=True)
class Generate(Request):
    """Write a reply; its events come as :class:`Events`, then :class:`Done` (value None)."""

    prompt: list[int]
    options: GenerateOptions = GenerateOptions()


@dataclass(frozen=True)
class Warm(Request):
    """Read ``prompt`` ahead of a reply; answered with the tokens read. A stop is seen between
    pieces (never inside a decode: what was read is kept)."""

    prompt: list[int]


@dataclass(frozen=True)
class OpenStore(Request):
    """Open the lookup caches of the model's vocabulary; answered ``(opened, warnings)``."""

    spec: SpecParams
    root: str | None = None


@dataclass(frozen=True)
class CloseStore(Request):
    """Save and close the lookup caches; answered with the save's result (or None)."""


@dataclass(frozen=True)
class Learn(Request):
    """Teach the dynamic cache a conversation's tokens; answered with the positions learned."""

    tokens: list[int]


@dataclass(frozen=True)
class SaveStore(Request):
    """Save the dynamic cache; answered with :class:`app.lookup_store.SaveResult`."""


@dataclass(frozen=True)
class BuildStatic(Request):
    """Build the static cache from text files; progress comes as :class:`Progress`."""

    files: list[str]


@dataclass(frozen=True)
class LabCostCurve(Request):
    """The target's verify-cost curve (:meth:`speculators.engine.Engine.lab_cost_curve`)."""

    n_max: int = 16


@dataclass(frozen=True)
class Cancel:
    """Stop request ``rid`` (at once where it runs; unrun where it waits). Not answered."""

    rid: int


@dataclass(frozen=True)
class Close:
    """Save the lookup caches, free the model and exit. Not answered."""


ToRunner = Union[Request, Cancel, Close]


# ---------------------------------------------------------------------------
# answers: the runner → the chat's process
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """How far a load or a build has come."""

    rid: int
    done: int
    total: int
    phase: str


@dataclass(frozen=True)
class Events:
    """Events of a reply (:mod:`speculators.events`), in order."""

    rid: int
    events: Sequence[Any]


@dataclass(frozen=True)
class Done:
    """Request ``rid`` ended with ``value``; the engine as it is now."""

    rid: int
    value: Any
    snapshot: EngineSnapshot | None


@dataclass(frozen=True)
class Failed:
    """Request ``rid`` raised ``error`` (picklable; its message is meant for people)."""

    rid: int
    error: BaseException
    snapshot: EngineSnapshot | None


@dataclass(frozen=True)
class Cancelled:
    """Request ``rid`` was cancelled before it began: it did nothing."""

    rid: int
    snapshot: EngineSnapshot | None = None


FromRunner = Union[Progress, Events, Done, Failed, Cancelled]
#: the answers that end a request
ENDINGS = (Done, Failed, Cancelled)
