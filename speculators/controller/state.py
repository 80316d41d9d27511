"""What the controller keeps per speculator (:class:`SpecState`), the proposals it compares in
a step (:class:`Candidate`), and what it decides (:class:`Decision`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base import Speculator
from ..types import MODEL_TYPES
from .models import AcceptanceModel, ShortMatchModel
from .params import ControllerParams

#: a step number never reached (a drafter that is never probed)
NEVER = 1 << 62


@dataclass
class Record:
    """A proposal being scored against what the target produces."""

    tokens: list[int]
    start: int          # absolute position of tokens[0]
    scored: int = 0
    depth0: int = 0     # the acceptance position of tokens[0] (see SpecState.run)
    short: bool = False  # its first token rests on a short match (ControllerParams.short_match)


class SpecState:
    """What the controller knows of one speculator: its acceptance, its costs, its probes and
    its run, and the proposal of it being scored."""

    def __init__(self, spec: Speculator, params: ControllerParams):
        self.spec = spec
        self.expensive = spec.type in MODEL_TYPES
        self.model = AcceptanceModel(params.decay_model if self.expensive else params.decay,
                                     params.prior_accept_model if self.expensive else params.prior_accept,
                                     params.prior_weight, run_prior=not self.expensive)
        self.record: Record | None = None
        self.next_probe = 0
        self.probe_every = params.probe_every
        #: seconds per draft call (cheap drafters) / per drafted token (model drafters)
        self.t_call: float | None = None
        #: typical proposal length
        self.len_typ = float(max(1, min(spec.n_max if spec.n_max > 0 else params.max_len, params.max_len)))
        self.potential = 0.0
        self.name = spec.name
        #: upkeep: the work a drafter that follows the target does on every target batch (a
        #: draft model decoding it, a hook reading hidden states): seconds per unit of the
        #: verify-cost curve, i.e. ``u * c(k)`` for a batch of k + 1 (None: not measured yet).
        #: Pausable drafters (``set_upkeep``) stop paying it while they are not worth asking.
        self.upkeep_s: float | None = None
        self.pausable = callable(getattr(spec, "set_upkeep", None)) and bool(getattr(spec, "can_pause", True))
        self.upkeep_on = True
        #: the last step it was asked (worth it, or probed): its upkeep lingers a few steps after
        self.last_active = -NEVER
        #: its verified drafts (probes included) whose first token was rejected, in a row
        self.missed_in_row = 0
        #: the drafter's processing time (us) when the step was decided: what it adds until the
        #: step is observed is the step's upkeep
        self.process_us_at_decide: float | None = None
        #: the drafter cannot pay even at full acceptance (its costs alone exceed what it saves)
        self.hopeless = False
        #: this speculator's counters in ControllerStats.per_speculator
        self.counters: dict[str, float] = {}
        #: steps between asks while cold (from the cost of a call)
        self.interval = 1
        #: (best length, gain) of asking it, and what they were worked out from
        self.potential_key: tuple | None = None
        self.potential_cut: tuple[int, float] = (0, 0.0)
        #: ``t_call`` is the size-based prior (the first measurement replaces it)
        self.t_prior = False
        #: ``t_call`` is the time of this drafter's first call only, which builds its graphs and
        #: buffers (several times a warm call): it is replaced by the next one's, and judges nothing
        self.t_cold = False
        #: calls that drafted, timed
        self.n_timed = 0
        #: seconds the last probe cost: its ask (a paused drafter's catch-up included) and,
        #: once it is verified, its verify, less what plain decoding would have taken for the
        #: tokens it produced (a probe whose draft is accepted costs about nothing)
        self.probe_s = 0.0
        #: an earlier chain of this engine measured it short of paying: no early probes
        self.known_short = False
        #: the run: how many target tokens in a row, up to ``run_end`` (absolute position),
        #: this drafter's proposals have predicted. A lookup drafter's next draft continues
        #: it (a copy goes on; its n-gram match is the same one), so its tokens are read at
        #: acceptance positions ``run + 1, run + 2, ...``: a copy found by an unverified
        #: proposal is drafted long at once, instead of from the cautious first positions.
        #: Model drafters (their drafts' own positions are what matters) keep run 0.
        self.by_run = not self.expensive
        self.run = 0
        self.run_end = -10
        #: a lookup drafter's first-token rate where its draft rests on a short match
        self.short = ShortMatchModel(params.short_prior, params.short_weight, params.decay) if self.by_run else None


    @property
    def u_s(self) -> float | None:
        """The upkeep (:attr:`upkeep_s`), by the name callers read before."""
        return self.upkeep_s

    @property
    def per(self) -> dict[str, float]:
        """This speculator's counters (:attr:`counters`), by the name callers read before."""
        return self.counters


#: the name tests and older callers import
_SpecState = SpecState


@dataclass
class Decision:
    """What :meth:`Controller.decide` chose for one step."""

    draft: list[int] = field(default_factory=list)
    spec: Speculator | None = None
    reason: str = "no_proposal"
    n_proposed: int = 0
    expected_gain: float = 1.0
    probe: bool = False
    pos0: int = 0

    @property
    def drafter(self) -> str | None:
        return self.spec.name if self.spec is not None and self.draft else None


@dataclass(frozen=True, slots=True, eq=False)
class Candidate:
    """A proposal of one speculator in one step, as the controller weighs it: verified (the
    best candidate of the step) or only scored (a shadow)."""

    state: SpecState
    #: the proposed tokens (those worth verifying: cut at the reply's end)
    draft: list[int]
    #: the acceptance position of its first token (its run, or its context match)
    depth: int
    #: its first token rests on a short match (:attr:`ControllerParams.short_match`)
    short: bool
    #: expected tokens per unit of verify time of its best cut (0 for a probe)
    gain: float = 0.0
    #: how many of its tokens to verify
    length: int = 0
    #: a short real probe of a drafter not trusted yet
    probe: bool = False
    #: the length verified whole as an evident copy (0: not one)
    whole: int = 0

    def rank(self) -> tuple[bool, int, float]:
        """Sort key, best first: real candidates before probes, then the longest evident copy,
        then the highest gain."""
        return self.probe, -self.whole, -self.gain
