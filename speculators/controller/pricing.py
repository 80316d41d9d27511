"""What a draft is expected to bring (the controller's pricing): the expected tokens of a
speculator's draft at its acceptance position, the best length to verify, and a drafter's
expected gain with its drafting and upkeep costs.

A mixin of :class:`~speculators.controller.Controller`: it reads ``self.params``,
``self.cost`` (the :class:`~speculators.controller.cost.CostModel`), ``self.boundary`` and
``self.boundaries``, ``self.step`` and ``self.t1_s``.
"""

from __future__ import annotations

from typing import Sequence

from .models import TRACK, expected_from_rates
from .state import SpecState

#: an evident copy is verified past an early sentence end once what follows one is accepted at
#: least this often (:meth:`Pricing._through_boundary`)
COPY_PAST_BOUNDARY = 0.5


class Pricing:
    """The controller's pricing of drafts (see the module docstring)."""

    # -- the decision ----------------------------------------------------------------
    @staticmethod
    def _depth(state: SpecState, start: int) -> int:
        """The acceptance position of a draft of ``state`` whose first token is at ``start``:
        its run, where the draft continues it (the bonus token of a verify, which no draft
        predicted, may lie between), else 0."""
        if state.by_run and state.run and 0 < start - state.run_end <= 2:
            return state.run
        return 0

    def _expected(self, state: SpecState, n: int, depth: int, draft: Sequence[int] | None,
                  prev: int | None = None, short: bool = False) -> list[float]:
        """E_1..E_n of a draft of ``state`` (:meth:`AcceptanceModel.expected_tokens`); where the
        draft's tokens are known (and ``prev``, the token before them), a token after the end
        of a sentence early in a lookup run is taken at no more than :attr:`boundaries`' rate;
        ``short``: the first token rests on a short match, taken at no more than the rate
        seen for such drafts (:class:`ShortMatchModel`)."""
        bnd = self.boundary
        short = short and state.short is not None and n > 0
        ends = draft is not None and bnd is not None and state.by_run and depth < self.params.boundary_depth
        if not short and not ends:
            return state.model.expected_tokens(n, depth)
        rates = state.model.rates(n, depth)
        if short:
            rates[0] = min(rates[0], state.short.rate)
        if not ends:
            return expected_from_rates(rates)
        q_b = self.boundaries.rate
        for i in range(min(n, self.params.boundary_depth - depth)):
            before = int(draft[i - 1]) if i else prev
            if before is not None and rates[i] > q_b and bnd(before):
                rates[i] = q_b
        return expected_from_rates(rates)

    def _best_cut(self, state: SpecState, n: int, draft_cost: float = 0.0, depth: int = 0,
                  draft: Sequence[int] | None = None, prev: int | None = None,
                  short: bool = False) -> tuple[int, float]:
        """(k, E_k / (c(k) + draft_cost)) maximising throughput over k = 1..n."""
        return self._cut_of(self._expected(state, n, depth, draft, prev, short), draft_cost)

    def _whole(self, state: SpecState, n: int, depth: int, threshold: float, g_cut: float) -> tuple[int, float]:
        """(n, gain) for an evident copy's first ``n`` draft tokens, verified whole: the gain of
        its best cut (``g_cut``) or of all ``n`` tokens, whichever is higher, and at least ``threshold``
        (it is verified)."""
        e = state.model.expected_tokens(n, depth)
        return n, max(threshold, g_cut, e[-1] / self.cost.rel_table(n)[n])

    def _through_boundary(self, draft: Sequence[int], prev: int, depth: int) -> int:
        """How many of an evident copy's draft tokens to verify: all of them, or those through
        the first end of a sentence fewer than ``boundary_depth`` positions into the run while
        what follows one is accepted less than half the time (:attr:`boundaries`; a reply that
        quotes part of a sentence stops at its end as often as not). 0: its first token follows
        such an end."""
        bnd = self.boundary
        if bnd is None or self.boundaries.rate >= COPY_PAST_BOUNDARY:
            return len(draft)
        for i in range(min(len(draft), self.params.boundary_depth - depth)):
            before = int(draft[i - 1]) if i else prev
            if bnd(before):
                return i
        return len(draft)

    def _cut_of(self, expected: Sequence[float], draft_cost: float = 0.0) -> tuple[int, float]:
        """(k, E_k / (c(k) + draft_cost)) maximising throughput over the given E_1..E_n."""
        n = len(expected)
        if not n:
            return 0, 0.0
        rel = self.cost.rel_table(n)
        gains = [e / (c + draft_cost) for e, c in zip(expected, rel[1:n + 1])]
        best_g = max(gains)
        if not best_g > 0.0:
            return 0, 0.0
        return gains.index(best_g) + 1, best_g      # the shortest of equal gains

    def _draft_cost(self, state: SpecState, k: float) -> float:
        """Cost of asking ``state`` for a draft of ``k`` tokens, in one-token steps."""
        if state.t_call is None:
            return 0.0
        t = state.t_call * (k if state.expensive else 1.0)
        return t / max(self.t1_s, 1e-6)

    def _upkeep_factor(self, state: SpecState) -> float:
        """What a pausable drafter's upkeep adds to each step, as a share of the step's cost.

        Upkeep a drafter cannot pause is paid whether or not it drafts: it is no reason
        not to draft, so it does not count here (it shows in the statistics).
        """
        return self._upkeep(state) if state.pausable else 0.0

    def _upkeep(self, state: SpecState) -> float:
        """A drafter's upkeep as a share of the target's cost for the same batch (0: unknown)."""
        return (state.upkeep_s or 0.0) / max(self.t1_s, 1e-6)

    def _n_ask(self, state: SpecState, n_max: int) -> int:
        """The longest draft worth asking ``state`` for: its typical length, and one more."""
        n = int(round(state.len_typ))
        if state.expensive:
            n += 1  # a drafter only ever returns what it is asked for: leave it room to show more
            if state.spec.n_max > 0:
                n = min(n, state.spec.n_max)
        return max(1, min(n_max, n))

    def _spec_len(self, state: SpecState) -> int:
        """The longest draft ``state`` makes (its ``n_max``; the controller's cap where it has none)."""
        n = state.spec.n_max
        return min(n, self.params.max_len) if n > 0 else self.params.max_len

    def _explore(self, state: SpecState, k: int, n_max: int) -> int:
        """How many tokens to ask a model drafter for that pays at ``k``: one more where the
        position after ``k`` has hardly been seen (under one observation, after decay). Only
        the first ``k`` are verified; the extra one is scored against the target's next
        tokens, so a length cut short on little evidence grows back once its deeper drafts
        prove right, at the cost of drafting one token more now and then.

            >>> from speculators.base import Speculator
            >>> from speculators.controller import Controller
            >>> from speculators.chain import SpeculatorChain
            >>> from speculators.costcurve import CostCurve
            >>> from speculators.types import SpecType
            >>> class Head(Speculator):
            ...     type = SpecType.DRAFT_MTP
            ...     def draft(self, req): return [1, 2, 3][:req.n_max]
            >>> head = Head(3)
            >>> ctl = Controller(SpeculatorChain([head]), CostCurve({k: 1 + k for k in range(9)}))
            >>> state = ctl.states[id(head)]
            >>> ctl._explore(state, 1, 8)        # position 2 never seen: asked for 2, 1 verified
            2
            >>> for _ in range(3):
            ...     state.model.new_draft(); state.model.observe(0, True); state.model.observe(1, False)
            >>> ctl._explore(state, 1, 8)        # seen (and missed): asked for 1
            1
            >>> ctl._explore(state, 3, 8)        # its own length: nothing more to ask
            3
        """
        if k >= min(self._spec_len(state), n_max) or k >= TRACK or state.model.tries[k] >= 1.0:
            return k
        return k + 1

    def _potential(self, state: SpecState, n_max: int, depth: int = 0) -> tuple[int, float]:
        """(best length, expected gain) of asking ``state`` now, its drafting cost included."""
        n = self._n_ask(state, n_max)
        upkeep = round(self._upkeep(state), 2) if state.upkeep_s else 0.0    # (none measured: 0)
        key = (state.model.version, self.cost.version, n, self.step // 16, upkeep, depth)
        if key != state.potential_key:
            state.potential_key = key
            state.potential_cut = self._potential_now(state, n, depth)
        return state.potential_cut

    def _gain_curve(self, state: SpecState, expected: Sequence[float]) -> tuple[int, float]:
        """(k, gain) maximising E_k / (c(k) (1 + upkeep) + drafting cost) for a model drafter."""
        best_k, best_g = 0, 0.0
        u = self._upkeep_factor(state)
        rel = self.cost.rel_table(len(expected))
        for k, e in enumerate(expected, start=1):
            g = e / (rel[k] * (1.0 + u) + self._draft_cost(state, k))
            if g > best_g:
                best_k, best_g = k, g
        return best_k, best_g

    def _potential_now(self, state: SpecState, n: int, depth: int = 0) -> tuple[int, float]:
        if state.expensive:
            return self._gain_curve(state, state.model.expected_tokens(n))
        return self._best_cut(state, n, self._draft_cost(state, 1), depth)

    def _gain_overall(self, state: SpecState) -> float:
        """A model drafter's expected gain at its overall rate (its first position's
        acceptance whatever the last one's outcome was): what drafting every step would bring
        over a stretch, its misses included."""
        return self._gain_curve(state, state.model.expected_overall(self._n_ask(state, self.params.max_len)))[1]

    def _worth_probing_soon(self, state: SpecState) -> bool:
        """Whether a model drafter pays over a stretch, or nearly (its gain at its overall rate
        within ``probe_near`` of the threshold). Such a drafter, paused by a run of misses, is
        probed again within a few steps, and its upkeep lingers meanwhile: a probe of it costs
        about what it brings."""
        p = self.params
        return self._gain_overall(state) >= p.probe_near * (1.0 + p.margin)

    def _is_hopeless(self, state: SpecState) -> bool:
        """Whether ``state`` could not pay even if every draft token were accepted."""
        if state.t_call is None:
            return False
        n = max(1, state.spec.n_max if state.spec.n_max > 0 else self.params.max_len)
        _, g = self._gain_curve(state, [k + 1.0 for k in range(1, min(n, self.params.max_len) + 1)])
        return g < 1.0 + self.params.margin
