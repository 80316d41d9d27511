"""The controller itself (:class:`Controller`): each step, which speculator's draft is verified,
and how much of it; what the target then wrote is scored against every proposal.

How it decides is told in :mod:`speculators.controller`; the pricing of a draft is
:class:`~speculators.controller.pricing.Pricing`'s, the probes and upkeep
:class:`~speculators.controller.scheduling.Scheduling`'s.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from ..base import DraftRequest, Speculator
from ..controller_stats import PER_SPEC_COUNTERS, PER_SPEC_SNAPSHOT, ControllerStats
from ..costcurve import CostCurve
from ..ngram_simple import TokenHistory
from ..types import MODEL_TYPES
from .cost import CostModel
from .matching import MATCH_ASK, MATCH_CAP, MATCH_SLACK, SuffixMatcher, evident_copy
from .models import TRACK, BoundaryModel
from .params import ControllerParams
from .pricing import Pricing
from .scheduling import Scheduling
from .state import Candidate, Decision, Record, SpecState


class Controller(Pricing, Scheduling):
    """Decides each step's draft; see :mod:`speculators.controller`.

    ``chain`` is a :class:`~speculators.chain.SpeculatorChain`; the
    controller asks its speculators through :meth:`SpeculatorChain.ask`
    and tells it the chosen draft with :meth:`SpeculatorChain.commit`, so
    the chain's accept accounting works as without the controller.
    """

    def __init__(self, chain, cost: CostCurve | CostModel, params: ControllerParams | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.chain = chain
        #: how many of a draft's tokens are worth verifying (the engine sets it for each
        #: generation: those before the draft's first end-of-generation token or the token that
        #: completes a stop string; the reply would end there, a token the verify brings itself,
        #: so it and what follows could only cost a verify). A lookup drafter that has followed
        #: a copy to the end of the person's message drafts on into the template's turn end and
        #: the copy again; at the end of a reply one drafts the transcript's "User:".
        self.useful: Callable[[Sequence[int]], int] | None = None
        #: whether a token ends a sentence (the engine sets it from the model's vocabulary; see
        #: :class:`BoundaryModel`); None: no boundary is known
        self.boundary: Callable[[int], bool] | None = None
        self.params = params or ControllerParams()
        self.boundaries = BoundaryModel(self.params.boundary_prior, self.params.boundary_weight, self.params.decay)
        self._boundary_seen = -1      # the last position whose outcome after a boundary was counted
        self.cost = cost if isinstance(cost, CostModel) else CostModel(cost, self.params)
        self.curve = self.cost.curve
        self.clock = clock
        self.states: dict[int, SpecState] = {}
        self.stats = ControllerStats(cost_source=self.cost.source)
        self.step = 0
        for s in chain.speculators:
            self._state(s)
        self._base = 0
        self._out: list[int] = []
        self._started = False
        self._snap_version = -1
        #: the context, for :func:`suffix_match` (through :class:`SuffixMatcher`)
        self._hist = TokenHistory()
        self._matcher = SuffixMatcher()
        #: this step's context match (:meth:`_context_match`; None: not worked out yet)
        self._ctx_match: int | None = None
        self._refresh_stats()

    # -- cost (delegated to the shared cost model) ---------------------------------
    def rel(self, k: int) -> float:
        """Verify cost of a ``k``-token draft in one-token steps (measured, refined online)."""
        return self.cost.rel(k)

    @property
    def t1_s(self) -> float:
        return self.cost.t1_s

    def observe_time(self, n_draft: int, seconds: float) -> None:
        self.cost.observe(n_draft, seconds)

    def _state(self, spec: Speculator) -> SpecState:
        state = SpecState(spec, self.params)
        self.states[id(spec)] = state
        if state.expensive:
            mem = self.cost.drafters.get(self._cost_key(state))
            if mem:
                # measured by an earlier chain of this engine: start from it
                state.t_call, state.upkeep_s = mem.get("t_call"), mem.get("upkeep_s")
                state.hopeless = bool(mem.get("hopeless"))
                if mem.get("accept") is not None:
                    state.model.seed(mem["accept"].overall_rates(min(self._spec_len(state), TRACK)),
                                     self.params.remembered_weight)
                state.probe_s = float(mem.get("probe_s") or 0.0)
                if state.hopeless:
                    self._give_up(state)
                elif state.t_call is not None and state.upkeep_s is not None and not self._worth_probing_soon(state):
                    self._known_short(state)
            else:
                self._price_from_sizes(state)
        return state

    # -- per generation ------------------------------------------------------------
    def prepare(self, prompt: Sequence[int]) -> None:
        """The target is reading ``prompt`` (before the reply's first step): the bookkeeping that
        step would otherwise pay inside the reply's time is done now -- the controller's copy of
        the context, and each drafter's ``prepare`` where it has one (the ngram-cache's context
        cache)."""
        self._matcher.sync(self._hist.sync(prompt)[0])
        for spec in self.chain.speculators:
            prep = getattr(spec, "prepare", None)
            if prep is not None:
                prep(prompt)

    def begin(self) -> None:
        """A new generation: proposals still being scored are dropped. A fresh chain's model
        drafters get their state now, before the prompt is read: one an earlier chain found
        not to pay does not mirror the prompt (:meth:`_known_short`)."""
        for spec in self.chain.speculators:
            if spec.type in MODEL_TYPES and id(spec) not in self.states:
                self._state(spec)
        for state in self.states.values():
            state.record = None
            state.process_us_at_decide = None
        self._started = False
        self._out = []
        self._boundary_seen = -1

    def decide(self, req: DraftRequest) -> Decision:
        """Ask the drafters worth asking; return the draft to verify (maybe none).

        ``req.n_max`` is the longest draft the step has room for (0: none,
        -1: no limit but the controller's own).
        """
        dec = self._decide(req)
        for state in self.states.values():
            if state.expensive:
                # the work done from here to observe() is the step's upkeep
                state.process_us_at_decide = state.spec.stats.t_process_us
        return dec

    def _decide(self, req: DraftRequest) -> Decision:
        """One step: every speculator weighed (:meth:`_weigh`), the best candidate verified and
        the other proposals scored unverified (:meth:`_settle`)."""
        self.step += 1
        self.stats.n_steps += 1
        if not self._started:
            self._started = True
            self._base = req.pos0
            self._out = [int(req.id_last)]
        dec = Decision(pos0=req.pos0)
        self.chain.begin_step()
        p = self.params
        n_max = p.max_len if req.n_max < 0 else min(req.n_max, p.max_len)
        if n_max <= 0:
            self.stats.n_no_room += 1
            return self._decided(dec, "no_room")
        threshold = 1.0 + p.margin
        cands: list[Candidate] = []
        shadows: list[Candidate] = []
        asked = 0
        self._ctx_match = None
        for spec in self.chain.speculators:
            state = self.states.get(id(spec))
            if state is None:
                state = self._state(spec)
            was_asked, cand = self._weigh(state, req, n_max)
            asked += was_asked
            if cand is not None:
                (cands if cand.probe or cand.gain >= threshold else shadows).append(cand)
        return self._settle(req, dec, cands, shadows, asked)

    def _decided(self, dec: Decision, reason: str) -> Decision:
        """``dec``, with why it was decided so (a key of :data:`REASONS`), also the stats' last."""
        dec.reason = reason
        self.stats.last_reason = reason
        return dec

    def _context_match(self, req: DraftRequest) -> int:
        """How many tokens the context's end repeats of an earlier passage (worked out once a
        step, when the first lookup drafter needs it)."""
        if self._ctx_match is None:
            hist = self._hist.sync(req.prompt)[0]
            self._matcher.sync(hist)
            self._ctx_match = self._matcher.match(int(req.id_last))
        return self._ctx_match

    def _save_call(self, counters: dict[str, float]) -> None:
        """A drafter not asked this step: a draft call saved."""
        self.stats.n_calls_saved += 1
        counters["calls_saved"] += 1

    def _weigh(self, state: SpecState, req: DraftRequest, n_max: int) -> tuple[bool, Candidate | None]:
        """Whether ``state``'s drafter was asked this step, and its proposal, if it made one."""
        counters = state.counters or self._bind(state)
        depth = run_depth = self._depth(state, req.pos0 + 1)
        if state.by_run:
            ctx_match = self._context_match(req)
            depth = max(depth, ctx_match - MATCH_SLACK)
            if ctx_match < state.spec.context_key <= MATCH_CAP:
                # its key does not occur earlier in the context: it has nothing to propose
                state.potential = 0.0
                state.run = 0
                self._save_call(counters)
                return False, None
        plan = self._plan(state, n_max, depth, counters)
        if plan is None:
            return False, None
        n_ask, probe, lenient = plan
        draft = self._ask(state, req, n_ask, probe, counters)
        if not draft:
            state.run = 0
            return True, None
        draft = draft[:n_ask]
        if self.useful is not None:
            draft = draft[:self.useful(draft)]
            if not draft:
                return True, None   # it drafts the reply's last token: the verify brings that one itself
        return True, self._candidate(state, req, draft, run_depth, depth, lenient, probe)

    def _plan(self, state: SpecState, n_max: int, depth: int,
              counters: dict[str, float]) -> tuple[int, bool, bool] | None:
        """Whether to ask ``state``'s drafter this step: (tokens to ask for, a probe, judged at
        its overall rate), or None (not asked)."""
        p = self.params
        threshold = 1.0 + p.margin
        best_len, best_gain = self._potential(state, n_max, depth)
        state.potential = best_gain
        # a drafter measured too dear to pay is only asked at its probes, which measure it
        # again: its cost, remembered in seconds, would look cheap against the steps of a
        # stretch where the machine runs slower, and its first draft pays its catch-up
        active = (not state.hopeless and best_gain >= threshold
                  and (state.model.n_observed > 0.0 or depth >= MATCH_ASK))
        lenient = False
        if (not active and state.expensive and not state.hopeless and 0 < state.missed_in_row <= p.miss_tolerance
                and state.last_active == self.step - 1 and self._gain_overall(state) >= threshold):
            # drafting on through a miss or two: a model drafter that pays at its overall
            # rate, judged after a miss by its (few) drafts that followed a miss,
            # would otherwise stop at the first and not learn how it really fares there
            # (the realistic hybrid's MTP head: right first 63 % of the time after a miss,
            # 82 % after a hit; it paid at 55 %); a longer run of misses pauses it
            active = lenient = True
            best_len = self._gain_curve(state, state.model.expected_overall(self._n_ask(state, n_max)))[0]
        if state.expensive:
            ask = self._plan_model(state, n_max, active, best_len, counters)
            return None if ask is None else (ask[0], ask[1], lenient)
        if not active:
            if state.record is not None or self.step < state.next_probe:
                self._save_call(counters)
                return None
            state.next_probe = self.step + state.interval
        return n_max, False, lenient

    def _plan_model(self, state: SpecState, n_max: int, active: bool, best_len: int,
                    counters: dict[str, float]) -> tuple[int, bool] | None:
        """A model drafter: its upkeep on or paused, and (tokens to ask for, a probe), or None."""
        p = self.params
        # a drafter's upkeep runs while it pays (and until it is measured, unless it is hopeless
        # from its size), and a few steps more (``upkeep_linger``) where it pays over a stretch,
        # its misses included: one that stops paying after a miss and is probed again a few
        # steps later would otherwise pause and catch up on every short run of misses
        self._set_upkeep(state, active or (state.upkeep_s is None and not state.hopeless)
                         or (self.step - state.last_active <= p.upkeep_linger and not state.hopeless
                             and self._worth_probing_soon(state)))
        if not state.upkeep_on:
            counters["upkeep_paused_steps"] += 1
        if active:
            state.last_active = self.step
            return self._explore(state, best_len, n_max), False
        if self.step >= state.next_probe:
            state.last_active = self.step
            state.next_probe = self.step + state.probe_every
            return min(p.probe_len, self._spec_len(state), n_max), True
        self._save_call(counters)
        return None

    def _ask(self, state: SpecState, req: DraftRequest, n_ask: int, probe: bool,
             counters: dict[str, float]) -> list[int]:
        """Ask ``state``'s drafter for ``n_ask`` tokens through the chain; what it costs is timed."""
        spec = state.spec
        process_us = spec.stats.t_process_us
        t0 = self.clock()
        draft, _ = self.chain.ask(spec, DraftRequest(req.prompt, req.id_last, req.pos0, n_ask))
        dt = self.clock() - t0
        if probe:
            state.probe_s = dt     # with a paused drafter's catch-up: what the probe cost
        # a paused drafter catching up on the target's tokens: upkeep, not drafting
        dt = max(0.0, dt - (spec.stats.t_process_us - process_us) * 1e-6)
        counters["calls"] += 1
        if draft:
            self._timed_draft(state, len(draft), n_ask, dt)
        elif not state.expensive:
            state.t_call = dt if state.t_call is None else 0.8 * state.t_call + 0.2 * dt
        if not state.expensive and (counters["calls"] <= 2 or (self.step & 7) == 0):
            state.interval = self._probe_interval(state)   # follows the call's cost, now and then
        return draft

    def _timed_draft(self, state: SpecState, n_draft: int, n_ask: int, seconds: float) -> None:
        """A call that drafted ``n_draft`` tokens took ``seconds``: its cost and typical length."""
        p = self.params
        per_call = seconds / n_draft if state.expensive else seconds
        first = state.expensive and state.n_timed == 0
        state.n_timed += 1
        if first and state.t_call is not None and not state.t_prior:
            pass   # known from an earlier chain of this engine: a first, cold call does not move it
        elif state.t_call is None or state.t_prior or state.t_cold:
            state.t_call, state.t_cold = per_call, first
        else:
            state.t_call = 0.8 * state.t_call + 0.2 * per_call
        state.t_prior = False
        n_got = min(n_draft, p.max_len)
        if state.expensive and n_draft >= n_ask:
            # cut by the ask, not by the drafter: it might have drafted longer
            n_got = max(n_got, min(state.spec.n_max if state.spec.n_max > 0 else p.max_len, p.max_len))
        state.len_typ = 0.8 * state.len_typ + 0.2 * n_got
        if state.expensive:
            self._measured(state)

    def _candidate(self, state: SpecState, req: DraftRequest, draft: list[int], run_depth: int, depth: int,
                   lenient: bool, probe: bool) -> Candidate:
        """``state``'s proposal weighed: its best cut and what that is expected to gain."""
        p = self.params
        short = False
        m_draft = 0
        if state.by_run:
            # how deep into a repeated passage this draft's own match is
            m_draft = self._matcher.match(int(req.id_last), int(draft[0]))
            depth = max(run_depth, m_draft - MATCH_SLACK)
            short = depth == 0 and m_draft <= p.short_match
        if probe:
            return Candidate(state, draft, depth, short, gain=0.0, length=len(draft), probe=True)
        # drafting is paid now: only the verify cost decides the cut
        whole = 0
        if lenient:
            k, g = self._cut_of(state.model.expected_overall(len(draft)))   # at its overall rate
        else:
            k, g = self._best_cut(state, len(draft), depth=depth, draft=draft, prev=int(req.id_last), short=short)
            if state.by_run and evident_copy(m_draft, run_depth, p):
                # evidently a copy: verified whole, as the fixed type would, through the
                # end of a sentence early in the run while copies are not seen to go on
                # past one (a miss ends the run, and with it the match that made it evident)
                n_whole = self._through_boundary(draft, int(req.id_last), depth)
                if n_whole > k:
                    k, g = self._whole(state, n_whole, depth, 1.0 + p.margin, g)
                whole = k
        if state.model.n_observed <= 0.0 and depth < MATCH_ASK:
            g = 0.0   # nothing known of this drafter yet: its first proposal is scored unverified
        return Candidate(state, draft, depth, short, gain=g, length=k, whole=whole)

    def _settle(self, req: DraftRequest, dec: Decision, cands: list[Candidate], shadows: list[Candidate],
                asked: int) -> Decision:
        """The best candidate is verified; every other proposal is scored against what the
        target writes (a shadow)."""
        chosen = None
        if cands:
            cands.sort(key=Candidate.rank)
            chosen = cands[0]
            shadows.extend(cands[1:])
        for cand in shadows:
            self._open_record(cand.state, cand.draft, req.pos0 + 1, cand.depth, cand.short)
            self.stats.n_shadow += 1
            cand.state.counters["shadow"] += 1
            if chosen is None:
                cand.state.counters["skipped"] += 1
        if chosen is not None:
            return self._verify(req, dec, chosen)
        s = self.stats
        if shadows:
            s.n_skipped += 1
            dec.n_proposed = max(len(c.draft) for c in shadows)
            return self._decided(dec, "skipped")
        if asked:
            s.n_no_proposal += 1
            return self._decided(dec, "no_proposal")
        s.n_not_asked += 1
        return self._decided(dec, "not_asked")

    def _verify(self, req: DraftRequest, dec: Decision, chosen: Candidate) -> Decision:
        """The step verifies ``chosen`` (cut to its length), told to the chain and counted."""
        s, state, draft, k = self.stats, chosen.state, chosen.draft, chosen.length
        counters = state.counters
        verified = draft[:k]
        self._open_record(state, draft, req.pos0 + 1, chosen.depth, chosen.short)
        self.chain.commit(state.spec, verified, len(draft))
        s.n_drafted += 1
        counters["verified"] += 1
        dec.draft, dec.spec, dec.n_proposed = verified, state.spec, len(draft)
        dec.expected_gain, dec.probe = chosen.gain, chosen.probe
        if chosen.probe:
            s.n_probes += 1
            counters["probes"] += 1
            return self._decided(dec, "probe")
        if k < len(draft):
            s.n_cut += 1
            s.n_tokens_cut += len(draft) - k
            counters["cut"] += 1
            counters["tokens_cut"] += len(draft) - k
            return self._decided(dec, "cut")
        return self._decided(dec, "drafted")

    def _open_record(self, state: SpecState, draft: Sequence[int], start: int, depth: int,
                     short: bool = False) -> None:
        state.model.new_draft()
        state.record = Record([int(t) for t in draft], start, depth0=depth, short=short)
        self._score(state)

    def _score(self, state: SpecState) -> None:
        """Score ``state``'s open proposal against what the target has written since: its
        accepted prefix and first miss teach its acceptance (and the rates after a sentence end
        and on a short match, where they apply) and set its run; the record closes at a miss or
        once every token is scored."""
        r = state.record
        if r is None:
            return
        out, toks, first = self._out, r.tokens, r.scored
        idx0 = r.start + first - self._base
        n_avail = min(len(toks) - first, len(out) - idx0)
        if n_avail <= 0:
            if first >= len(toks):
                state.record = None
            return
        if out[idx0:idx0 + n_avail] == toks[first:first + n_avail]:
            n_hit = n_avail
        else:
            n_hit = next(j for j in range(n_avail) if out[idx0 + j] != toks[first + j])
        missed = n_hit < n_avail
        state.model.observe_run(r.depth0 + first, n_hit, missed)
        if r.short and first == 0 and state.short is not None:
            state.short.observe(n_hit > 0)
        if state.by_run and self.boundary is not None:
            self._score_boundaries(r, first, n_hit + missed, n_hit, idx0)
        if n_hit:
            last = first + n_hit - 1
            state.run, state.run_end = r.depth0 + last + 1, r.start + last
        if missed:
            state.run = 0
        r.scored = first + n_hit + missed
        if missed or r.scored >= len(toks):
            state.record = None

    def _score_boundaries(self, r: Record, first: int, n_scored: int, n_hit: int, idx0: int) -> None:
        """The outcome of each scored token (``first`` on) that follows the end of a sentence
        fewer than ``boundary_depth`` positions into its run, for :attr:`boundaries` (each
        position of the reply counted once)."""
        out = self._out
        for j in range(first, min(first + n_scored, self.params.boundary_depth - r.depth0)):
            idx = idx0 + j - first
            if idx == self._boundary_seen:
                continue
            before = r.tokens[j - 1] if j else (out[idx - 1] if idx > 0 else None)
            if before is not None and self.boundary(before):
                self._boundary_seen = idx
                self.boundaries.observe(j - first < n_hit)

    def observe(self, dec: Decision, ids: Sequence[int], seconds: float | None = None,
                n_accepted: int | None = None) -> None:
        """The step's outcome: the tokens the target produced after ``id_last``.

        ``seconds``: the step's time, the drafters' upkeep during it included (it is
        taken out before the verify cost is refined, and charged to the drafters).
        ``n_accepted``: how many of the decision's draft tokens were accepted, where
        that is not ``len(ids) - 1``: a checkpointed step's replay writes the accepted
        tokens and then one more of the target's own, and ``ids`` are all of them (the
        proposals still being scored are compared with every token the target wrote).
        """
        self._out.extend(int(t) for t in ids)
        upkeep = self._observe_upkeep(len(dec.draft))
        for state in self.states.values():
            if state.record is not None:
                self._score(state)
        state = self.states.get(id(dec.spec)) if dec.spec is not None else None
        if state is not None and dec.draft:
            self._after_verify(state, dec, ids, n_accepted)
        if state is not None and dec.probe:
            self._after_probe(state, ids, seconds, n_accepted)
        if seconds is not None:
            self.observe_time(len(dec.draft), max(seconds - upkeep, 1e-6))

    # -- statistics -------------------------------------------------------------------
    def _bind(self, state: SpecState) -> dict[str, float]:
        state.counters = self._per(state.name)
        return state.counters

    def _per(self, name: str) -> dict[str, float]:
        d = self.stats.per_speculator.get(name)
        if d is None:
            d = {k: 0 for k in PER_SPEC_COUNTERS}
            d.update({k: 0 for k in PER_SPEC_SNAPSHOT})
            self.stats.per_speculator[name] = d
        return d

    def _refresh_stats(self) -> None:
        s = self.stats
        if not s.cost_curve or self._snap_version != self.cost.version:
            self.rel(0)
            self._snap_version = self.cost.version
            s.cost_curve = [round(self.rel(k), 3) for k in range(17)]
            t1 = self.t1_s
            s.t1_ms = round(t1 * 1000, 3) if t1 else None
        threshold = 1.0 + self.params.margin
        for state in self.states.values():
            d = state.counters or self._bind(state)
            d["accept_est"] = round(state.model.rates(1)[0], 4)
            d["gain_est"] = round(state.potential, 4)
            d["active"] = 1 if state.potential >= threshold else 0
            d["upkeep_est"] = round(self._upkeep(state), 4)
            d["upkeep_on"] = 1 if state.upkeep_on else 0
            d["hopeless"] = 1 if state.hopeless else 0

    def snapshot(self) -> ControllerStats:
        """A copy of the statistics with the current estimates (cheap enough for every stats event)."""
        self._refresh_stats()
        return self.stats.copy()
