"""The speculator chain: priority order, first drafter wins, accept accounting.

This is ``common_speculative`` of llama.cpp for one sequence. A worked
example with two toy speculators::

    >>> from speculators.base import Speculator, DraftRequest
    >>> class Never(Speculator):
    ...     type = SpecType.NGRAM_SIMPLE
    >>> class Always(Speculator):
    ...     type = SpecType.NGRAM_MOD
    ...     def draft(self, req):
    ...         return [5, 6, 7, 8]
    >>> chain = SpeculatorChain([Never(4), Always(4)])
    >>> chain.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=3))
    [5, 6, 7]
    >>> chain.last_drafter
    'ngram-mod'
    >>> chain.accept(2)
    >>> s = chain.stats()["ngram-mod"]
    >>> (s.n_gen_drafts, s.n_gen_tokens, s.n_acc_tokens, s.n_acc_tokens_per_pos)
    (1, 3, 2, [1, 1])
    >>> s.mean_acceptance_length
    3.0
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Sequence

from .base import DraftRequest, Speculator, SpeculatorStats
from .descriptor import FACTORIES, ensure_loaded
from .params import ParamError, SpecParams
from .types import NGRAM_TYPES, PRIORITY, SpecType

#: type -> factory(params, resources) returning a Speculator, or raising
#: :class:`Unavailable` with a reason when what it needs is not loaded.
Factory = Callable[[SpecParams, dict], Speculator]
_REGISTRY: dict[SpecType, Factory] = FACTORIES


class Unavailable(Exception):
    """A speculator type cannot be built with what is loaded (the reason)."""


def register(spec_type: SpecType | str) -> Callable[[Factory], Factory]:
    """The factory of ``spec_type`` (declared beside it: :mod:`speculators.descriptor`)."""
    def deco(f: Factory) -> Factory:
        _REGISTRY[SpecType._intern(str(spec_type))] = f
        return f
    return deco


def _ensure_registered() -> None:
    """Import the implementation modules; each declares its types and registers their factories."""
    ensure_loaded()


def implemented_types() -> frozenset[SpecType]:
    """The types this version of draftlight can build (given what they need)."""
    _ensure_registered()
    return frozenset(_REGISTRY)


class SpeculatorChain:
    """Speculators in priority order; see the module docstring."""

    def __init__(self, speculators: Iterable[Speculator], synth_rates: Sequence[float] = ()):
        order = {t: i for i, t in enumerate(PRIORITY)}
        self.speculators: list[Speculator] = sorted(speculators, key=lambda s: order.get(s.type, 99))
        self.last: Speculator | None = None
        #: types that were asked for but could not be built, with the reason
        self.skipped: dict[str, str] = {}
        #: with ``--spec-type auto``: each type, whether it is used, and why
        self.auto_plan: list | None = None
        #: whether the adaptive controller decides the drafts (speculators.controller)
        self.adaptive = False
        self.synth_rates: list[float] = list(synth_rates)
        self.synth_probs: list[float] = []
        prev = 1.0
        for r in self.synth_rates:
            self.synth_probs.append(r / prev if prev > 0.0 else 0.0)
            prev = r

    # -- construction ------------------------------------------------------
    @classmethod
    def from_params(cls, params: SpecParams, resources: dict | None = None) -> "SpeculatorChain":
        """Build the chain for ``params.types`` (``common_speculative_init``).

        ``resources`` carries what model-based types need (e.g. the target
        model and a loaded draft model). A type whose needs are missing is
        left out and listed in :attr:`skipped`.
        """
        params.validate()
        _ensure_registered()
        resources = resources or {}
        specs: list[Speculator] = []
        skipped: dict[str, str] = {}
        plan = None
        wanted = list(params.types)
        if params.is_auto:
            from .auto import auto_plan_for_resources
            plan = auto_plan_for_resources(params, resources)
            wanted = [SpecType(c.name) for c in plan if c.used]
        built: dict[str, str] = {}
        for t in PRIORITY:
            if t not in wanted:
                continue
            factory = _REGISTRY.get(t)
            if factory is None:
                skipped[t.value] = "not implemented in this version of draftlight"
                continue
            try:
                specs.append(factory(params, resources))
            except Unavailable as e:
                skipped[t.value] = str(e)
            except Exception as e:
                if plan is None or t in NGRAM_TYPES:
                    raise
                # auto: a model-based type that cannot be built is left out, with the reason
                skipped[t.value] = str(e) or e.__class__.__name__
        n_max_eff = max([max(0, s.n_max) for s in specs], default=0)
        rates = resolve_synth_rates(params, n_max_eff)
        chain = cls(specs, rates)
        chain.skipped = skipped
        if plan is not None:
            from .auto import AutoChoice
            chain.auto_plan = [AutoChoice(c.name, False, skipped[c.name]) if c.used and c.name in skipped else c
                               for c in plan]
        chain.adaptive = params.adaptive_on and not rates
        return chain

    # -- the four calls ------------------------------------------------------
    @property
    def n_max(self) -> int:
        return max([max(0, s.n_max) for s in self.speculators], default=0)

    @property
    def last_drafter(self) -> str | None:
        return self.last.name if self.last is not None else None

    @property
    def synthetic(self) -> bool:
        return bool(self.synth_probs)

    def begin(self, prompt: Sequence[int]) -> None:
        for s in self.speculators:
            t0 = time.perf_counter()
            s.begin(prompt)
            s.stats.t_begin_us += (time.perf_counter() - t0) * 1e6
            s.stats.n_call_begin += 1

    def process(self, tokens: Sequence[int], pos0: int) -> bool:
        ok = True
        for s in self.speculators:
            t0 = time.perf_counter()
            ok = s.process(tokens, pos0) and ok
            s.stats.t_process_us += (time.perf_counter() - t0) * 1e6
        return ok

    def draft(self, req: DraftRequest) -> list[int]:
        """Ask each speculator in turn; the first non-empty draft wins."""
        self.last = None
        for s in self.speculators:
            t0 = time.perf_counter()
            result = list(s.draft(req))
            s.stats.t_draft_us += (time.perf_counter() - t0) * 1e6
            s.stats.n_call_draft += 1
            if result:
                if req.n_max > 0 and len(result) > req.n_max:
                    result = result[: req.n_max]
                self.last = s
                s.stats.n_gen_drafts += 1
                s.stats.n_gen_tokens += len(result)
                return result
        return []

    # -- the adaptive controller's calls (speculators.controller) ------------
    def begin_step(self) -> None:
        """A new step: no draft chosen yet."""
        self.last = None

    def ask(self, spec: Speculator, req: DraftRequest) -> tuple[list[int], float]:
        """One speculator's proposal (cut to ``req.n_max``) and the seconds it took.

        Counted as a draft call; it becomes a draft of the chain only if
        :meth:`commit` is called with it.
        """
        tp0 = spec.stats.t_process_us
        t0 = time.perf_counter()
        result = list(spec.draft(req))
        dt = time.perf_counter() - t0
        # a drafter whose upkeep was paused catches up first and counts that as process time
        spec.stats.t_draft_us += max(0.0, dt * 1e6 - (spec.stats.t_process_us - tp0))
        spec.stats.n_call_draft += 1
        if req.n_max > 0 and len(result) > req.n_max:
            result = result[: req.n_max]
        return result, dt

    def commit(self, spec: Speculator, draft: Sequence[int], n_proposed: int | None = None) -> None:
        """``draft`` (from ``spec``, maybe cut from ``n_proposed`` tokens) goes to verification."""
        if not draft:
            self.last = None
            return
        self.last = spec
        spec.stats.n_gen_drafts += 1
        spec.stats.n_gen_tokens += len(draft)
        if n_proposed is not None and len(draft) < n_proposed:
            spec.draft_cut(len(draft))

    def accept(self, n_accepted: int) -> None:
        """Credit the last drafter; tell the others with ``is_other``."""
        impl = self.last
        if impl is None:
            if n_accepted != 0:
                raise ValueError("accept() with accepted tokens but no draft was made")
            return
        st = impl.stats
        t0 = time.perf_counter()
        if len(st.n_acc_tokens_per_pos) < n_accepted:
            st.n_acc_tokens_per_pos.extend([0] * (n_accepted - len(st.n_acc_tokens_per_pos)))
        for i in range(n_accepted):
            st.n_acc_tokens_per_pos[i] += 1
        if n_accepted > 0:
            st.n_acc_drafts += 1
            st.n_acc_tokens += n_accepted
        impl.accept(n_accepted, False)
        st.n_call_accept += 1
        st.t_accept_us += (time.perf_counter() - t0) * 1e6
        for other in self.speculators:
            if other is not impl:
                other.accept(n_accepted, True)

    def get_state(self) -> bytes | None:
        for s in self.speculators:
            data = s.get_state()
            if data is not None:
                return data
        return None

    def set_state(self, data: bytes) -> None:
        for s in self.speculators:
            s.set_state(data)

    # -- statistics --------------------------------------------------------
    def stats(self) -> dict[str, SpeculatorStats]:
        """A snapshot per speculator, in priority order."""
        return {s.name: s.stats.copy() for s in self.speculators}

    def print_stats(self) -> list[str]:
        return [s.stats.summary(s.name) for s in self.speculators]

    def close(self) -> None:
        for s in self.speculators:
            s.close()


def resolve_synth_rates(params: SpecParams, n_max: int) -> list[float]:
    """``common_speculative_synth_rates_resolve``: unconditional per-position rates.

    >>> p = SpecParams(synth_len=2.0)
    >>> [round(r, 4) for r in resolve_synth_rates(p, 2)]
    [0.618, 0.382]
    """
    has_len = params.synth_len is not None
    has_rates = bool(params.synth_rates)
    if not has_len and not has_rates:
        return []
    if has_len and has_rates:
        raise ParamError("synth", "synthetic acceptance length and rates are mutually exclusive")
    if n_max <= 0:
        raise ParamError("synth", "synthetic acceptance requires at least one speculative token")
    if has_rates:
        rates = [float(r) for r in params.synth_rates]
        if len(rates) != n_max:
            raise ParamError("synth_rates",
                             f"synthetic acceptance rates must contain {n_max} values, got {len(rates)}")
        for i, r in enumerate(rates):
            if not math.isfinite(r) or r < 0.0 or r > 1.0:
                raise ParamError("synth_rates", "synthetic acceptance rates must be finite and within [0, 1]")
            if i > 0 and r > rates[i - 1]:
                raise ParamError("synth_rates", "synthetic acceptance rates must be monotonically non-increasing")
        return rates
    length = float(params.synth_len)  # type: ignore[arg-type]
    length_max = n_max + 1.0
    if not math.isfinite(length) or length < 1.0 or length > length_max:
        raise ParamError("synth_len",
                         f"synthetic acceptance length must be finite and within [1, {length_max:.0f}]")
    p = 0.0
    if length == length_max:
        p = 1.0
    elif length > 1.0:
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            total, term = 0.0, mid
            for _j in range(n_max):
                total += term
                term *= mid
            if total < length - 1.0:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi)
    rates, rate = [], p
    for _ in range(n_max):
        rates.append(rate)
        rate *= p
    return rates
