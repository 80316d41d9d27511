"""The adaptive controller: draft only where it pays, and only as long as it pays.

Beyond the reference (llama.cpp verifies whatever the first drafter in its
chain proposes). Before every step the controller asks the speculators that
are worth asking, estimates for each proposal how many tokens the step
would bring, and verifies the proposal -- cut to its best length -- only
when that beats plain decoding. It never changes what is emitted: every
token is still the target's own choice; only which draft tokens are put to
the target, and how many, changes.

The two things it weighs:

* **the verify-cost curve** ``c(k)`` (:mod:`speculators.costcurve`): a batch
  of ``k + 1`` tokens costs ``c(k)`` one-token steps on this device. It is
  measured at load and refined from the steps it times.
* **each speculator's acceptance by draft position**: ``q_i``, the chance
  that draft token ``i`` is accepted given the ones before it were, from
  decaying counts (recent drafts weigh most, so it follows the
  conversation), smoothed toward the previous position. A lookup
  drafter's position counts from the start of its *run* (the target
  tokens in a row its proposals have predicted), not of the draft: a
  draft that continues a copied passage 20 tokens in is read at
  positions 21, 22, ..., where acceptance is high, while the first
  token after a miss is read at position 1, where it is low. The
  context itself says how deep a copy is before any draft was scored:
  where the tokens just written (and the draft's first token) repeat an
  earlier passage for ``m`` tokens, the draft is read at least
  ``m - MATCH_SLACK`` positions in (:func:`suffix_match`), and a
  lookup drafter's deep positions start from the rule of succession,
  ``(d + q_0) / (d + 1)`` after ``d`` confirmed tokens: a copy in the
  prompt is drafted long from the first step of a fresh chain.

A draft of ``k`` tokens yields ``E_k = 1 + q_1 + q_1 q_2 + ...`` tokens for
``c(k)`` steps of time; plain decoding yields 1 per step. The controller
verifies the proposal with the highest ``E_k / c(k)`` (over speculators and
``k``) when it exceeds ``1 + margin``, cut to that ``k``.

Learning without paying for it: a proposal that is not verified is kept
and scored against the tokens the target goes on to produce (they are the
tokens a verify would have accepted), so a speculator that starts to
predict well again is picked back up without a single wasted verify.
Speculators not worth verifying are asked only now and then (their draft
calls cost time too); model-based drafters, whose drafting is the
expensive part, are asked only when they pay, plus a short real probe now
and then.

A worked example with a scripted speculator and a scripted cost curve::

    >>> from speculators.base import Speculator, DraftRequest
    >>> from speculators.chain import SpeculatorChain
    >>> from speculators.costcurve import CostCurve
    >>> from speculators.types import SpecType
    >>> class Oracle(Speculator):                   # proposes the true continuation
    ...     type = SpecType.NGRAM_SIMPLE
    ...     text = list(range(100, 200))
    ...     def draft(self, req):
    ...         i = req.pos0 + 1
    ...         return self.text[i:i + 8]
    >>> chain = SpeculatorChain([Oracle(8)])
    >>> ctl = Controller(chain, CostCurve({k: 1 + 0.2 * k for k in range(9)}))
    >>> ctl.begin()
    >>> pos, emitted = 0, []
    >>> for _ in range(12):
    ...     d = ctl.decide(DraftRequest(prompt=[], id_last=Oracle.text[pos], pos0=pos, n_max=8))
    ...     ids = Oracle.text[pos + 1: pos + 2 + len(d.draft)]  # the target agrees
    ...     ctl.observe(d, ids)
    ...     pos += len(ids)
    ...     emitted.append(len(d.draft))
    >>> emitted                  # learns from an unverified draft first, then drafts longer
    [0, 3, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import numpy as np

from .base import DraftRequest, Speculator
from .costcurve import CostCurve, mark_stale
from .ngram_simple import TokenHistory
from .types import MODEL_TYPES

#: positions tracked separately; deeper positions share the last one (a lookup run's, each
#: from its own floor: :meth:`AcceptanceModel.rates`)
TRACK = 32
#: a lookup draft whose context repeats an earlier passage for ``m`` tokens (its first draft
#: token included) is read ``m - MATCH_SLACK`` positions into a run: a 4-token match is what a
#: lookup key finds by chance in ordinary text (the default model, greedy, bench/prompts.txt
#: and chat-questions.txt: the next token repeated the earlier passage's 34-53 % of the time
#: after a 4-5 token match, 89-100 % after 6 or more)
MATCH_SLACK = 4
#: a context match this much deeper than the slack lets cold lookup drafters be asked (and a
#: fresh chain's first proposal be verified) at once
MATCH_ASK = 4
#: the longest match looked for
MATCH_CAP = 128
#: an evident copy is verified past an early sentence end once what follows one is accepted at
#: least this often (:meth:`Controller._through_boundary`)
COPY_PAST_BOUNDARY = 0.5
#: a step number never reached (a drafter that is never probed)
NEVER = 1 << 62
#: a lookup drafter's acceptance at run position ``d`` starts from ``(d + a q_0) / (d + a)``
#: with this ``a`` (1: Laplace's rule of succession)
RUN_PRIOR_A = 1.0


def suffix_match(hist: np.ndarray, last: int, nxt: int | None = None, cap: int = MATCH_CAP) -> int:
    """How many tokens at the end of ``hist + [last]`` repeat an earlier passage of it.

    With ``nxt``: only passages followed by ``nxt`` count (the match a draft starting with
    ``nxt`` continues). ``hist`` is an int numpy array; at most ``cap`` is returned.

    >>> import numpy as np
    >>> h = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    >>> suffix_match(h, 8), suffix_match(h, 8, nxt=9), suffix_match(h, 8, nxt=1), suffix_match(h, 4)
    (4, 4, 0, 0)
    >>> suffix_match(h, 8, cap=2)
    2
    """
    n = len(hist)
    if n == 0:
        return 0
    if nxt is None:
        cand = np.flatnonzero(hist == last)
    else:
        cand = np.flatnonzero((hist[:-1] == last) & (hist[1:] == nxt))
        if hist[-1] == last and last == nxt:
            cand = np.append(cand, n - 1)
    if not cand.size:
        return 0
    m = 1
    while m < cap:
        cand = cand[cand >= m]
        if not cand.size:
            break
        cand = cand[hist[cand - m] == hist[n - m]]
        if not cand.size:
            break
        m += 1
    return m


def evident_copy(m_draft: int, run: int, p: "ControllerParams") -> bool:
    """Whether a lookup draft is evidently a copy (:attr:`ControllerParams.copy_match`):
    its own context match ``m_draft`` is long, and ``run`` (the tokens its drafter's proposals
    have predicted in a row, which this draft continues) shows the copy going on.

    >>> p = ControllerParams()
    >>> evident_copy(8, 3, p), evident_copy(8, 0, p), evident_copy(16, 0, p), evident_copy(5, 30, p)
    (True, False, True, False)
    """
    return m_draft >= p.copy_match_alone or (m_draft >= p.copy_match and run > 0)


class SuffixMatcher:
    """:func:`suffix_match` over a growing history, from an index of where each token occurs
    (kept up to date as tokens are appended; rebuilt when the history is rewritten): the
    candidates are the few earlier places of the last token, compared in Python, instead of
    whole-array passes (~60 us a step on a 400-token chat; ~5 us this way).

    >>> sm = SuffixMatcher()
    >>> h = [5, 6, 7, 8, 9, 5, 6, 7]
    >>> sm.sync(h)
    >>> sm.match(8), sm.match(8, nxt=9), sm.match(8, nxt=1), sm.match(4), sm.match(8, cap=2)
    (4, 4, 0, 0, 2)
    >>> h += [8, 9]; sm.sync(h); sm.match(5)                # appended: indexed incrementally
    6
    >>> sm.sync([1, 2, 1]); sm.match(2)                     # rewritten: indexed again
    2
    """

    def __init__(self) -> None:
        self._toks: list[int] = []
        self._where: dict[int, list[int]] = {}
        self._n = 0
        self._last: int | None = None       # tokens[n - 1] when indexed (the list may change in place)

    def sync(self, tokens: list[int]) -> None:
        """Follow ``tokens`` (the history; only read, and only its new end when it grew)."""
        n, old = len(tokens), self._n
        kept = n >= old and (tokens is self._toks or tokens[:old] == self._toks[:old]) and (
            not old or tokens[old - 1] == self._last)
        if not kept:
            self._where, old = {}, 0
        where = self._where
        for i in range(old, n):
            t = tokens[i]
            lst = where.get(t)
            if lst is None:
                where[t] = [i]
            else:
                lst.append(i)
        self._toks, self._n = tokens, n
        self._last = tokens[n - 1] if n else None

    def match(self, last: int, nxt: int | None = None, cap: int = MATCH_CAP) -> int:
        """:func:`suffix_match` of the synced history."""
        toks, n = self._toks, self._n
        if n == 0:
            return 0
        cand = self._where.get(last, ())
        if nxt is not None:
            cand = [p for p in cand if p + 1 < n and toks[p + 1] == nxt]
            if toks[n - 1] == last and last == nxt:
                cand.append(n - 1)
        if not cand:
            return 0
        m = 1
        while m < cap:
            if len(cand) == 1:
                p = cand[0]
                while m < cap and p >= m and toks[p - m] == toks[n - m]:
                    m += 1
                return m
            cand = [p for p in cand if p >= m and toks[p - m] == toks[n - m]]
            if not cand:
                break
            m += 1
        return m


#: a refined verify-cost table that moves no entry by more than this share is not taken up (the
#: decisions derived from the table would be worked out again for nothing)
REL_STILL = 0.003

def clip_stall(x: float, ref: float) -> float:
    """``x`` held within half and twice ``ref``: a timing taken in a stall (a busy machine, a
    paused drafter's catch-up) moves a running estimate only a little.

    >>> clip_stall(1.0, 0.01), clip_stall(0.001, 0.01), clip_stall(0.012, 0.01)
    (0.02, 0.005, 0.012)
    """
    return min(max(x, 0.5 * ref), 2.0 * ref)


#: timed steps of one draft width after which the cost model reads that width from them
BY_K_MIN = 4

#: steps timed before a cached cost curve is checked against them, and how much slower its
#: one-token time may be before it counts as measured under load
STALE_CHECK_STEPS = 24
STALE_FACTOR = 1.5

#: why a step was or was not drafted (keys of :attr:`ControllerStats.reasons`)
REASONS: dict[str, str] = {
    "drafted": "verified a draft expected to beat plain decoding",
    "cut": "verified only the part of the draft expected to pay",
    "probe": "verified a short probe of a drafter not trusted yet",
    "skipped": "a draft was proposed but was expected to be slower than plain decoding",
    "no_proposal": "the drafters asked had nothing to propose",
    "not_asked": "no drafter was worth asking this step (all cold, between probes)",
    "no_room": "no room for a draft (reply or context limit)",
}


@dataclass
class ControllerParams:
    #: a draft is verified when its expected tokens per unit of time beat plain decoding by this much
    margin: float = 0.03
    #: weight kept by older observations each time a speculator's new draft is scored: a lookup
    #: drafter's (it follows the conversation: a copied passage, then none) and a model
    #: drafter's (how well it predicts the target changes slowly; at 0.9 a 79 %-right MTP head
    #: was judged from its last ~10 drafts, at 0.45-0.9, and paused on the low ones)
    decay: float = 0.9
    decay_model: float = 0.97
    #: prior acceptance of a first draft token, and its weight in observations: a lookup
    #: drafter's (most of its proposals in ordinary text are chance matches) and a model
    #: drafter's (a draft model, an MTP head or EAGLE3 is trained to predict the target: the
    #: realistic hybrid's MTP head, greedy on bench/chat-questions.txt, has its first draft
    #: token accepted 79 % of the time, each next one ~77 % given the ones before; from the
    #: lookup prior, four short probes left it judged at 0.06-0.48, and paused)
    prior_accept: float = 0.15
    prior_accept_model: float = 0.5
    prior_weight: float = 1.0
    #: the longest draft ever verified: with the step's own token a verify batch of 64. A batch
    #: one token past a multiple of 16 costs more than that token (on a 2-core AMX CPU, 352
    #: tokens into a copy: 65 tokens 352 ms, 64 tokens 315; 33 181, 32 158); the measured cost
    #: curve is linear between its points and does not show such steps
    max_len: int = 63
    #: share of the step time that asking cold (not worth verifying) cheap drafters may take
    probe_budget: float = 0.006
    #: model drafters: real probes of up to ``probe_len`` tokens (the drafter's own draft
    #: length where that is shorter: a probe shows how its drafts fare at the length it
    #: drafts, deeper positions included), every ``probe_every`` steps (after the first few,
    #: below), doubling after each failed probe up to ``probe_every_max``
    probe_len: int = 3
    probe_every: int = 16
    probe_every_max: int = 256
    #: a model drafter's first ``probe_early_n`` probes come ``probe_every_early`` steps apart
    #: (not held to their share of the time, below): a fresh chain learns soon whether a
    #: drafter pays, rather than a quarter of a reply later
    probe_every_early: int = 4
    probe_early_n: int = 3
    #: probes of a drafter take at most ``probe_share`` of the steps' time (a probe's cost: its
    #: ask, a paused drafter's catch-up on the context it missed included, and its verify, less
    #: what decoding its tokens one by one would have taken), twice that for one whose last probe
    #: brought it near paying (its expected gain at least ``probe_near`` of the threshold),
    #: to take it up soon once it pays; and never closer than ``probe_every`` steps.
    probe_share: float = 0.015
    probe_near: float = 0.9
    #: model drafters measured unable to pay even with every draft accepted (their drafting and
    #: upkeep cost more than a verify saves) are probed rarely, to re-measure their cost: at
    #: least this many steps apart, and so that their probes (a paused drafter's catch-up on
    #: the context it missed included) take at most ``probe_hopeless_share`` of the steps'
    #: time, up to ``probe_every_hopeless_max`` steps apart
    probe_every_hopeless: int = 256
    probe_hopeless_share: float = 0.005
    probe_every_hopeless_max: int = 16384
    #: a model drafter not measured yet is priced from the sizes of its model and the target's
    #: (decoding is mostly reading the weights) times this, on the optimistic side; one that
    #: could not pay even so is neither mirrored nor asked (nor probed: a probe would first
    #: decode the whole context on its model, as costly as a reply)
    prior_optimism: float = 0.75
    #: a model drafter's acceptance by position, as the last chain of the same engine saw it,
    #: starts a new chain's (a rebuilt chain, bench's fresh chain for each reply) as this many
    #: drafts' worth of observations
    remembered_weight: float = 8.0
    #: a model drafter that pays at its overall rate drafts on through this many
    #: rejected first tokens in a row (see ``Controller._decide``)
    miss_tolerance: int = 2
    #: a model drafter's upkeep (mirroring the target's batches) goes on this many steps after
    #: the last one it was asked at (worth it, or probed): pausing it costs a catch-up when it
    #: is asked again
    upkeep_linger: int = 4
    #: refine the cost curve from the steps the engine times
    online_cost: bool = True
    #: weight of a new timing in the online cost estimate
    cost_alpha: float = 0.1
    #: a lookup draft's token right after the end of a sentence (``Controller.boundary``), fewer
    #: than ``boundary_depth`` positions into its run, is accepted at no more than the rate
    #: observed there (:class:`BoundaryModel`), which starts from ``boundary_prior``
    #: (32: a reply that quotes part of a sentence, 15-20 tokens, and stops at its end is
    #: common in a chat; a verify past that end costs ~0.3 of a step per token on a CPU)
    boundary_prior: float = 0.3
    boundary_weight: float = 2.0
    boundary_depth: int = 32
    #: the first token of a lookup draft that starts no run and whose own context match
    #: (``suffix_match`` with the draft's first token) is at most ``short_match`` tokens -- the
    #: pair (last token, draft token) occurs earlier but not the token before it, or the pair
    #: not at all (a cache's own memory) -- is accepted at no more than the rate observed for
    #: such drafts of that drafter (:class:`ShortMatchModel`), which starts from
    #: ``short_prior``. On the chat questions (default model, greedy), such ngram-cache drafts
    #: had their first token accepted 2 times in 6 (a one-token key: " weekend" -> "."), those
    #: matching 2 tokens 11 in 17, 4 tokens 14 in 14; the drafter's rate at its first position,
    #: pooled over them, read ~0.7, and the 1-match bets, rejected, cost 3-5 % of a 14-token reply
    short_match: int = 1
    short_prior: float = 0.3
    short_weight: float = 2.0
    #: a lookup draft is evidently a copy -- verified whole, as long as the fixed type drafts
    #: it, from the first step that shows it -- where its own context match (``suffix_match``
    #: with its first token) is at least ``copy_match`` tokens and it continues a run of its
    #: drafter's (a proposal of it was right up to here), or at least ``copy_match_alone``
    #: tokens without a run. Chance matches in ordinary text are 4-5 tokens (MATCH_SLACK).
    copy_match: int = 8
    copy_match_alone: int = 16


def expected_from_rates(rates: Sequence[float]) -> list[float]:
    """E_1..E_k from the conditional acceptance rates q_1..q_k: the tokens a verify step yields
    (the target's own token, and each draft token while all before it were accepted).

    >>> expected_from_rates([0.5, 0.5])
    [1.5, 1.75]
    """
    out, p, e = [], 1.0, 1.0
    for q in rates:
        p *= q
        e += p
        out.append(e)
    return out


class AcceptanceModel:
    """Decaying per-position acceptance counts of one speculator.

    >>> m = AcceptanceModel(decay=1.0, prior=0.5, weight=1.0)
    >>> m.new_draft(); m.observe(0, True); m.observe(1, False)
    >>> [round(q, 3) for q in m.rates(3)]          # (1+.5)/2, (0+.75)/2, (0+.375)/1
    [0.75, 0.375, 0.375]
    >>> round(m.expected_tokens(2)[-1], 4)          # 1 + .75 + .75*.375
    2.0312
    >>> [round(q, 3) for q in m.rates(2, depth=1)]  # a draft continuing a run one token in
    [0.375, 0.375]

    A lookup drafter's positions count along its run (``run_prior``): position ``d`` starts
    from no less than the rule of succession after ``d`` confirmed tokens,
    ``(d + prior) / (d + 1)``; what is observed there moves it as before:

    >>> r = AcceptanceModel(decay=1.0, prior=0.15, run_prior=True)
    >>> [round(q, 3) for q in r.rates(3)], [round(q, 3) for q in r.rates(2, depth=19)]
    ([0.15, 0.575, 0.717], [0.957, 0.96])
    >>> r.new_draft(); r.observe(19, False); round(r.rates(1, depth=19)[0], 3)   # (0 + .9575) / 2
    0.479

    Past the last tracked position (``TRACK``) a run's positions share that position's counts,
    each from its own floor: 100 tokens into a copy, ``(99 + .15) / 100``:

    >>> round(r.rates(1, depth=99)[0], 4), len(r.rates(40, depth=10))
    (0.9915, 40)
    """

    def __init__(self, decay: float = 0.9, prior: float = 0.15, weight: float = 1.0, streak_weight: float = 0.5,
                 run_prior: bool = False):
        self.decay = decay
        self.prior = prior
        self.weight = weight
        self.streak_weight = streak_weight
        self.run_prior = run_prior
        self.tries = [0.0] * TRACK
        self.hits = [0.0] * TRACK
        #: first-position counts by the previous first-position outcome (0: missed, 1: hit):
        #: drafts come in streaks (a copied passage, then none), and this follows them
        self.tries1 = [0.0, 0.0]
        self.hits1 = [0.0, 0.0]
        self.last_first: int | None = None
        self._rates: list[float] | None = None
        self._first_overall = prior
        #: bumped on every change (callers cache what they derive from the rates)
        self.version = 0

    def new_draft(self) -> None:
        """A new draft is about to be scored: older observations fade."""
        d = self.decay
        if d < 1.0:
            self.tries = [x * d for x in self.tries]
            self.hits = [x * d for x in self.hits]
            self.tries1 = [x * d for x in self.tries1]
            self.hits1 = [x * d for x in self.hits1]
        self._rates = None
        self.version += 1

    def seed(self, rates: Sequence[float], weight: float) -> None:
        """Start from ``rates`` (q_1, q_2, ... as an earlier model of the same drafter had them),
        as if seen ``weight`` times at each position: what this drafter does on this target is
        known before its first draft, and what it does now soon outweighs it.

        >>> m = AcceptanceModel(decay=1.0, prior=0.5)
        >>> m.seed([0.8, 0.7], 2.0)
        >>> [round(q, 3) for q in m.rates(3)]      # (1.6 + .5) / 3, (1.4 + .7) / 3, then as the last
        [0.7, 0.7, 0.7]
        """
        for i, q in enumerate(rates[:TRACK]):
            self.tries[i] += weight
            self.hits[i] += weight * float(q)
        self._rates = None
        self.version += 1

    def observe(self, pos: int, hit: bool) -> None:
        """Draft token ``pos`` (0-based) was reached and was (not) accepted."""
        i = min(pos, TRACK - 1)
        self.tries[i] += 1.0
        if hit:
            self.hits[i] += 1.0
        if pos == 0:
            if self.last_first is not None:
                self.tries1[self.last_first] += 1.0
                if hit:
                    self.hits1[self.last_first] += 1.0
            self.last_first = 1 if hit else 0
        self._rates = None
        self.version += 1

    def rates(self, k: int, depth: int = 0) -> list[float]:
        """Conditional acceptance q_1..q_k (each smoothed toward the one before).

        q_1 is read in the light of the previous first-position outcome
        (smoothed toward the overall q_1). ``depth``: the draft starts that
        many positions in (the rates from ``q_(depth+1)`` on).
        """
        if self._rates is None:
            out, prev, w, p0 = [], self.prior, self.weight, self.prior
            for i, (t, h) in enumerate(zip(self.tries, self.hits)):
                if self.run_prior and i:
                    prev = max(prev, (i + RUN_PRIOR_A * p0) / (i + RUN_PRIOR_A))
                prev = (h + w * prev) / (t + w)
                out.append(prev)
            self._first_overall = out[0]
            if self.last_first is not None:
                s, ws = self.last_first, self.streak_weight
                out[0] = (self.hits1[s] + ws * out[0]) / (self.tries1[s] + ws)
            self._rates = out
        r = self._rates
        d = max(depth, 0)
        if d + k <= TRACK:
            return r[d:d + k]
        if not self.run_prior:
            d = min(d, TRACK - 1)
            return r[d:] + [r[-1]] * (d + k - TRACK)
        # a run's positions past the last tracked one share its counts, each from its own
        # succession floor (what is observed that deep still moves them all)
        last = TRACK - 1
        t, h, w, p0, below = self.tries[last], self.hits[last], self.weight, self.prior, r[last - 1]
        out = r[d:] if d < TRACK else []
        for i in range(max(d, TRACK), d + k):
            out.append((h + w * max(below, (i + RUN_PRIOR_A * p0) / (i + RUN_PRIOR_A))) / (t + w))
        return out

    def expected_tokens(self, k: int, depth: int = 0) -> list[float]:
        """E_1..E_k: tokens a verify step yields with a draft of 1..k tokens (starting
        ``depth`` positions in)."""
        return expected_from_rates(self.rates(k, depth))

    def expected_overall(self, k: int) -> list[float]:
        """E_1..E_k with the first position at its overall rate, whatever the last first
        position's outcome was: what drafts bring over a stretch, misses included.

        >>> m = AcceptanceModel(decay=1.0, prior=0.5)
        >>> for hit in (True, True, True, False, False):
        ...     m.new_draft(); m.observe(0, hit)
        >>> round(m.rates(1)[0], 3)             # after a miss: (0 + .5 q) / (1 + .5), q = 3.5 / 6
        0.194
        >>> round(m.expected_overall(1)[0], 3)  # 1 + q
        1.583
        """
        return expected_from_rates(self.overall_rates(k))

    def overall_rates(self, k: int) -> list[float]:
        """q_1..q_k with q_1 at its overall rate (:meth:`expected_overall`)."""
        r = self.rates(k)          # brings the overall first rate up to date
        return [self._first_overall] + r[1:]

    @property
    def n_observed(self) -> float:
        return self.tries[0]


class BoundaryModel:
    """How often a lookup draft early in its run is still right just after the end of a sentence.

    A reply that echoes the person's words ("I have eggs, spinach and some cheese.") matches
    their message for 6-10 tokens and ends with its sentence; a copy goes on into the next.
    Both look alike to a lookup drafter until the sentence ends: this is the rate at that fork,
    learned (with decay) from what the model wrote there, beginning at a cautious prior.

    >>> b = BoundaryModel(prior=0.3, weight=2.0, decay=1.0)
    >>> round(b.rate, 3)
    0.3
    >>> for hit in (True, True, True, True):
    ...     b.observe(hit)
    >>> round(b.rate, 3)                    # (4 + 2 * .3) / (4 + 2): copies go on
    0.767
    """

    def __init__(self, prior: float = 0.3, weight: float = 2.0, decay: float = 0.9):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.hits = 0.0
        self.tries = 0.0

    @property
    def rate(self) -> float:
        return (self.hits + self.weight * self.prior) / (self.tries + self.weight)

    def observe(self, hit: bool) -> None:
        self.hits = self.hits * self.decay + (1.0 if hit else 0.0)
        self.tries = self.tries * self.decay + 1.0


class ShortMatchModel(BoundaryModel):
    """How often a lookup drafter's draft is right at its first token where it rests on little
    of the context (see ``ControllerParams.short_match``): a key of one token that occurred
    once, or a cache's memory of other text. Learned from what the model wrote there, drafts
    verified or only proposed alike, beginning at a cautious prior.

    >>> m = ShortMatchModel(prior=0.3, weight=2.0, decay=1.0)
    >>> for hit in (False, True, False):
    ...     m.observe(hit)
    >>> round(m.rate, 3)                    # (1 + 2 * .3) / (3 + 2)
    0.32
    """


@dataclass
class _Record:
    """A proposal being scored against what the target produces."""

    tokens: list[int]
    start: int          # absolute position of tokens[0]
    scored: int = 0
    depth0: int = 0     # the acceptance position of tokens[0] (see _SpecState.run)
    short: bool = False  # its first token rests on a short match (ControllerParams.short_match)


class _SpecState:
    def __init__(self, spec: Speculator, params: ControllerParams):
        self.spec = spec
        self.expensive = spec.type in MODEL_TYPES
        self.model = AcceptanceModel(params.decay_model if self.expensive else params.decay,
                                     params.prior_accept_model if self.expensive else params.prior_accept,
                                     params.prior_weight, run_prior=not self.expensive)
        self.record: _Record | None = None
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
        self.u_s: float | None = None
        self.pausable = callable(getattr(spec, "set_upkeep", None)) and bool(getattr(spec, "can_pause", True))
        self.upkeep_on = True
        #: the last step it was asked (worth it, or probed): its upkeep lingers a few steps after
        self.last_active = -NEVER
        #: its verified drafts (probes included) whose first token was rejected, in a row
        self.missed_in_row = 0
        self._tp_snap: float | None = None
        #: the drafter cannot pay even at full acceptance (its costs alone exceed what it saves)
        self.hopeless = False
        #: this speculator's counters in ControllerStats.per_speculator
        self.per: dict[str, float] = {}
        #: steps between asks while cold (from the cost of a call)
        self.interval = 1
        self._pot_key: tuple | None = None
        self._pot: tuple[int, float] = (0, 0.0)
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


_PER_SPEC_COUNTERS = ("verified", "skipped", "cut", "tokens_cut", "shadow", "probes", "calls", "calls_saved",
                      "upkeep_ms", "upkeep_paused_steps")
_PER_SPEC_SNAPSHOT = ("accept_est", "gain_est", "active", "upkeep_est", "upkeep_on", "hopeless")


@dataclass
class ControllerStats:
    """What the controller decided, and why (per reply: engine stats hold the difference).

    Counters add and subtract field by field; the snapshot fields (the
    current estimates: ``cost_curve``, ``t1_ms``, ``cost_source``,
    ``last_reason`` and each speculator's ``accept_est``, ``gain_est``,
    ``active``) come from the newer operand (the right one in ``+``, the
    left one in ``-``).
    """

    n_steps: int = 0         # steps decided
    n_drafted: int = 0       # steps that verified a draft (probes included)
    n_skipped: int = 0       # a draft was proposed but not worth verifying
    n_no_proposal: int = 0   # the drafters asked proposed nothing
    n_not_asked: int = 0     # no drafter was worth asking
    n_no_room: int = 0       # no room for a draft
    n_cut: int = 0           # verified drafts cut shorter than proposed
    n_tokens_cut: int = 0    # draft tokens dropped by those cuts
    n_probes: int = 0        # verified probes of cold model drafters
    n_shadow: int = 0        # proposals scored without verifying them
    n_calls_saved: int = 0   # draft calls not made (cold drafters between probes)
    per_speculator: dict[str, dict[str, float]] = field(default_factory=dict)
    cost_curve: list[float] = field(default_factory=list)   # c(0..16), snapshot
    cost_source: str = ""                                   # measured / cached / given
    t1_ms: float | None = None                              # one-token step, snapshot
    last_reason: str = ""

    @property
    def reasons(self) -> dict[str, int]:
        return {"drafted": self.n_drafted - self.n_probes - self.n_cut, "cut": self.n_cut,
                "probe": self.n_probes, "skipped": self.n_skipped, "no_proposal": self.n_no_proposal,
                "not_asked": self.n_not_asked, "no_room": self.n_no_room}

    def _combine(self, other: "ControllerStats", sign: int) -> "ControllerStats":
        newer = other if sign > 0 else self
        out = ControllerStats()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name.startswith("n_"):
                setattr(out, f.name, a + sign * b)
            elif f.name != "per_speculator":
                v = getattr(newer, f.name)
                setattr(out, f.name, list(v) if isinstance(v, list) else v)
        per: dict[str, dict[str, float]] = {}
        for name in list(self.per_speculator) + [n for n in other.per_speculator if n not in self.per_speculator]:
            a = self.per_speculator.get(name, {})
            b = other.per_speculator.get(name, {})
            nd = newer.per_speculator.get(name) or (a if sign > 0 else b) or {}
            d = {k: a.get(k, 0) + sign * b.get(k, 0) for k in _PER_SPEC_COUNTERS}
            d.update({k: nd.get(k, 0) for k in _PER_SPEC_SNAPSHOT})
            per[name] = d
        out.per_speculator = per
        return out

    def __add__(self, other: "ControllerStats") -> "ControllerStats":
        return self._combine(other, 1)

    def __sub__(self, other: "ControllerStats") -> "ControllerStats":
        return self._combine(other, -1)

    def copy(self) -> "ControllerStats":
        return self - ControllerStats()

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["per_speculator"] = {k: dict(v) for k, v in self.per_speculator.items()}
        d["cost_curve"] = list(self.cost_curve)
        d["reasons"] = self.reasons
        return d

    def summary(self) -> list[str]:
        """Short lines (about 40 columns) for a statistics panel."""
        lines = [f"steps {self.n_steps} · drafted {self.n_drafted} (cut {self.n_cut})",
                 f"skipped {self.n_skipped} · nothing to draft {self.n_no_proposal + self.n_not_asked}"]
        if self.n_probes:
            lines.append(f"probes {self.n_probes}")
        if self.cost_curve:
            c = self.cost_curve
            pts = " ".join(f"{k}:{c[k]:.2f}" for k in (1, 2, 4, 8) if k < len(c))
            lines.append(f"verify cost ({self.cost_source or 'given'}) {pts}")
        for name, p in self.per_speculator.items():
            if p.get("hopeless") and not p.get("verified"):
                # costs more than it could ever save (measured, or known from its model's size)
                lines.append(f"{name} too costly to pay here · used 0")
                continue
            lines.append(f"{name} {'on' if p.get('active') else 'cold'} · acc {p.get('accept_est', 0) * 100:.0f}% · "
                         f"gain {p.get('gain_est', 0):.2f}× · used {int(p.get('verified', 0))}")
        return lines


class CostModel:
    """The verify-cost curve as the controller uses it: measured, then refined online.

    One per engine (it is the device's, not the chain's), so what the steps
    teach survives a rebuilt chain.
    """

    def __init__(self, curve: CostCurve, params: ControllerParams | None = None):
        self.curve = curve
        self.params = params or ControllerParams()
        # online estimate: one-token step time, decaying sums for a line t = a + b * n
        self._t1: float | None = None
        #: one-token step time read from drafted steps (their time over c(k)), until a
        #: one-token step is timed: where every step drafts, the measured t1 is all there is
        #: otherwise, and a curve measured on a busy machine made drafting look cheap
        self._t1_drafted: float | None = None
        self._reg = [0.0] * 5
        #: per draft width: decaying (weight, mean seconds) of its timed steps -- a curve that
        #: jumps or stays flat between widths (the realistic hybrid: 31, 43, 52.5 and 53 ms for
        #: 0-3 drafted tokens) is read where it is used, which a line cannot do
        self._by_k: dict[int, list[float]] = {}
        self._n_timed = 0
        self._rel: list[float] = []
        self._rel_dirty = True
        #: (curve, its rel(0..max_len)) as measured, before the online refinement
        self._measured: tuple[CostCurve, list[float]] | None = None
        #: bumped whenever rel() changes
        self.version = 0
        #: whether the curve was found measured under load (checked once, after a few steps)
        self.stale = False
        #: what model drafters were measured to cost on this device (per drafter: ``t_call``,
        #: ``u``, ``hopeless``), so that a rebuilt chain starts from it instead of paying for
        #: probes and upkeep again to learn it
        self.drafters: dict[str, dict[str, Any]] = {}

    @property
    def source(self) -> str:
        return self.curve.source

    def refresh(self) -> None:
        """Fold what was observed into rel() now (it is otherwise done every few steps)."""
        self._rel_dirty = True

    def rel(self, k: int) -> float:
        """Verify cost of a ``k``-token draft in one-token steps (measured, refined online)."""
        if self._rel_dirty:
            self._rebuild_rel()
        if k < len(self._rel):
            return self._rel[k]
        return self._rel[-1] + (self._rel[-1] - self._rel[-2]) * (k - len(self._rel) + 1)

    def rel_table(self, n: int) -> list[float]:
        """``[rel(0), ..., rel(n)]`` (the list itself where the table is that long: do not change it)."""
        if self._rel_dirty:
            self._rebuild_rel()
        if n < len(self._rel):
            return self._rel
        return [self.rel(k) for k in range(n + 1)]

    def _online_line(self) -> tuple[float, float, float] | None:
        """(intercept s, slope s/token, weight 0..1) of the timings seen, or None."""
        s0, sx, sy, sxx, sxy = self._reg
        if s0 < 4.0:
            return None
        mx, my = sx / s0, sy / s0
        var = sxx / s0 - mx * mx
        if var < 0.5:
            return None  # every step had (nearly) the same width: no slope to read
        b = max(0.0, (sxy / s0 - mx * my) / var)
        a = my - b * mx
        if a <= 0:
            return None
        return a, b, min(1.0, s0 / 40.0)

    def _rebuild_rel(self) -> None:
        n = self.params.max_len
        measured = self._measured
        if measured is None or measured[0] is not self.curve or len(measured[1]) != n + 1:
            measured = self._measured = (self.curve, [self.curve.rel(k) for k in range(n + 1)])
        base = list(measured[1])
        line = self._online_line() if self.params.online_cost else None
        if line is not None:
            a, b, w = line
            base = [(1 - w) * c + w * min(k + 1.0, 1.0 + b * k / a) for k, c in enumerate(base)]
        t1 = self._t1
        if self.params.online_cost and t1:
            # widths timed often enough are read from their own steps (over one-token steps)
            for k, (wk, mk) in self._by_k.items():
                if 1 <= k <= n and wk >= BY_K_MIN:
                    f = min(1.0, wk / (2 * BY_K_MIN))
                    base[k] = (1 - f) * base[k] + f * min(k + 1.0, max(1.0, mk / t1))
        run = 1.0
        for k in range(n + 1):
            run = max(run, base[k])
            base[k] = run
        base[0] = 1.0
        self._rel_dirty = False
        prev = self._rel
        if len(prev) == len(base) and all(abs(b - a) <= REL_STILL * a for a, b in zip(prev, base)):
            return          # what the new timings moved is too small to matter: decisions keep theirs
        self._rel = base
        self.version += 1

    def _check_stale(self) -> None:
        """A curve whose one-token time is well above the steps timed now was measured while
        something else held the machine: have it measured again at the next load."""
        c = self.curve
        seen = self._t1 if self._t1 is not None else self._t1_drafted
        if self.stale or not c.t1_s or seen is None or not c.cache_path:
            return
        if c.t1_s > STALE_FACTOR * seen:
            self.stale = True
            mark_stale(c.cache_path, seen)

    @property
    def t1_s(self) -> float:
        """Seconds of a one-token step (observed, else measured, else a guess)."""
        if self._t1 is not None:
            return self._t1
        if self._t1_drafted is not None:
            return self._t1_drafted
        return self.curve.t1_s or 0.02

    def observe(self, n_draft: int, seconds: float) -> None:
        """The engine timed a verify step with a draft of ``n_draft`` tokens.

        One-token steps give the absolute step time; all steps feed a
        decaying least-squares line ``t = a + b * n`` that, once the widths
        seen vary enough, refines the measured curve (a busy machine's
        stalls are clipped, not averaged in).
        """
        if seconds <= 0 or not self.params.online_cost:
            return
        if n_draft == 0:
            if self._t1 is None:
                self._t1 = seconds
            else:
                x = clip_stall(seconds, self._t1)
                self._t1 += self.params.cost_alpha * (x - self._t1)
        else:
            x = seconds / max(self.rel(n_draft), 1.0)
            if self._t1_drafted is None:
                self._t1_drafted = x
            else:
                x = clip_stall(x, self._t1_drafted)
                self._t1_drafted += self.params.cost_alpha * (x - self._t1_drafted)
        line = self._online_line()
        if line is not None:
            seconds = clip_stall(seconds, line[0] + line[1] * n_draft)
        d = 1.0 - self.params.cost_alpha / 4
        if n_draft > 0:
            wm = self._by_k.setdefault(n_draft, [0.0, 0.0])
            seconds_k = clip_stall(seconds, wm[1]) if wm[0] >= BY_K_MIN else seconds
            wm[0] = wm[0] * d + 1.0
            wm[1] += (seconds_k - wm[1]) / wm[0]
        s0, sx, sy, sxx, sxy = (v * d for v in self._reg)
        x = float(n_draft)
        self._reg = [s0 + 1.0, sx + x, sy + seconds, sxx + x * x, sxy + x * seconds]
        self._n_timed += 1
        if self._n_timed == STALE_CHECK_STEPS:
            self._check_stale()
        if self._n_timed % 8 == 0:
            self._rel_dirty = True


class Controller:
    """Decides each step's draft; see the module docstring.

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
        self.states: dict[int, _SpecState] = {}
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

    def _state(self, spec: Speculator) -> _SpecState:
        st = _SpecState(spec, self.params)
        self.states[id(spec)] = st
        if st.expensive:
            mem = self.cost.drafters.get(self._cost_key(st))
            if mem:
                # measured by an earlier chain of this engine: start from it
                st.t_call, st.u_s, st.hopeless = mem.get("t_call"), mem.get("u_s"), bool(mem.get("hopeless"))
                if mem.get("accept") is not None:
                    st.model.seed(mem["accept"].overall_rates(min(self._spec_len(st), TRACK)),
                                  self.params.remembered_weight)
                st.probe_s = float(mem.get("probe_s") or 0.0)
                if st.hopeless:
                    self._give_up(st)
                elif st.t_call is not None and st.u_s is not None and not self._worth_probing_soon(st):
                    self._known_short(st)
            else:
                self._price_from_sizes(st)
        return st

    def _known_short(self, st: _SpecState) -> None:
        """A model drafter an earlier chain of this engine measured short of paying (nor near
        it, at its overall rate): a fresh chain does not probe it at once, nor have it mirror
        the prompt first (a draft model of the target's size decoding a 330-token chat
        prompt: ~0.5 s on a 2-core CPU), but at its probes' share of the time, as after its
        early probes in that chain.

        >>> from types import SimpleNamespace
        >>> ctl = Controller.__new__(Controller)
        >>> ctl.params, ctl.cost, ctl.step = ControllerParams(), SimpleNamespace(t1_s=0.02), 0   # 20 ms steps
        >>> st = _SpecState.__new__(_SpecState)
        >>> st.probe_s, st.upkeep_on, st.pausable, st.known_short = 0.5, True, False, False
        >>> ctl._known_short(st); st.next_probe, st.known_short   # 0.5 s / (1.5 % of 20 ms)
        (1667, True)
        >>> st.probe_s = 0.001; ctl._known_short(st); st.next_probe   # never sooner than probe_every
        16
        """
        p = self.params
        st.known_short = True
        # the first probe at its share of the time (a paused draft model's probe first decodes
        # all it missed: the whole prompt the first time)
        interval = self._share_interval(st, p.probe_share, p.probe_every)
        st.probe_every = min(p.probe_every_max, interval)
        st.next_probe = self.step + interval
        self._set_upkeep(st, False)

    def _give_up(self, st: _SpecState) -> None:
        """Until its rare probe (none when its size says it cannot pay): not asked, not mirrored."""
        st.hopeless = True
        st.probe_every = self.params.probe_every_hopeless
        st.next_probe = NEVER if st.t_prior else self.step + st.probe_every
        self._set_upkeep(st, False)

    def _price_from_sizes(self, st: _SpecState) -> None:
        """A drafter whose model is about as large as the target's cannot pay: known before it
        costs anything (a draft model mirrors the whole prompt before its first draft).

        ``spec.cost_prior``: its model's size over the target's, where both are placed alike
        (None: no prior, it is measured). Its drafted tokens are priced at that share of a
        target step (times ``prior_optimism``), its upkeep at nothing: if it is hopeless even
        so, it waits for its rare probe, where it is measured."""
        prior = getattr(st.spec, "cost_prior", None)
        if not prior or prior <= 0:
            return
        st.t_call = self.params.prior_optimism * float(prior) * self.t1_s
        st.t_prior = True
        if self._is_hopeless(st):
            self._give_up(st)
        else:
            st.t_call, st.t_prior = None, False   # it may pay: what it costs is measured

    @staticmethod
    def _cost_key(st: _SpecState) -> str:
        return str(getattr(st.spec, "cost_key", None) or st.name)

    def _measured(self, st: _SpecState) -> None:
        """A model drafter's cost was measured again: whether it can pay at all, remembered for
        this engine's later chains (not from a first, cold call alone: that judges nothing)."""
        if st.t_cold:
            return
        if st.t_call is not None:
            st.hopeless = self._is_hopeless(st)
        self._remember(st)

    def _remember(self, st: _SpecState) -> None:
        key = self._cost_key(st)
        # its acceptance model, once it has seen a draft (else the one remembered before): a
        # later chain starts from its rates (read then, not at every step here)
        accept = st.model if st.model.n_observed > 0.0 else self.cost.drafters.get(key, {}).get("accept")
        self.cost.drafters[key] = {"t_call": st.t_call, "u_s": st.u_s, "hopeless": st.hopeless, "accept": accept,
                                   "probe_s": st.probe_s}

    def _set_upkeep(self, st: _SpecState, on: bool) -> None:
        """Resume or pause a drafter's per-batch work (where it can pause; lossless either way:
        a resumed drafter catches up on the target's tokens before it drafts)."""
        if on == st.upkeep_on or not st.pausable:
            return
        st.spec.set_upkeep(on)
        st.upkeep_on = on

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
        for st in self.states.values():
            st.record = None
            st._tp_snap = None
        self._started = False
        self._out = []
        self._boundary_seen = -1

    # -- the decision ----------------------------------------------------------------
    @staticmethod
    def _depth(st: _SpecState, start: int) -> int:
        """The acceptance position of a draft of ``st`` whose first token is at ``start``:
        its run, where the draft continues it (the bonus token of a verify, which no draft
        predicted, may lie between), else 0."""
        if st.by_run and st.run and 0 < start - st.run_end <= 2:
            return st.run
        return 0

    def _expected(self, st: _SpecState, n: int, depth: int, draft: Sequence[int] | None,
                  prev: int | None = None, short: bool = False) -> list[float]:
        """E_1..E_n of a draft of ``st`` (:meth:`AcceptanceModel.expected_tokens`); where the
        draft's tokens are known (and ``prev``, the token before them), a token after the end
        of a sentence early in a lookup run is taken at no more than :attr:`boundaries`' rate;
        ``short``: the first token rests on a short match, taken at no more than the rate
        seen for such drafts (:class:`ShortMatchModel`)."""
        bnd = self.boundary
        short = short and st.short is not None and n > 0
        ends = draft is not None and bnd is not None and st.by_run and depth < self.params.boundary_depth
        if not short and not ends:
            return st.model.expected_tokens(n, depth)
        rates = st.model.rates(n, depth)
        if short:
            rates[0] = min(rates[0], st.short.rate)
        if not ends:
            return expected_from_rates(rates)
        q_b = self.boundaries.rate
        for i in range(min(n, self.params.boundary_depth - depth)):
            before = int(draft[i - 1]) if i else prev
            if before is not None and rates[i] > q_b and bnd(before):
                rates[i] = q_b
        return expected_from_rates(rates)

    def _best_cut(self, st: _SpecState, n: int, draft_cost: float = 0.0, depth: int = 0,
                  draft: Sequence[int] | None = None, prev: int | None = None,
                  short: bool = False) -> tuple[int, float]:
        """(k, E_k / (c(k) + draft_cost)) maximising throughput over k = 1..n."""
        return self._cut_of(self._expected(st, n, depth, draft, prev, short), draft_cost)

    def _whole(self, st: _SpecState, n: int, depth: int, thr: float, g_cut: float) -> tuple[int, float]:
        """(n, gain) for an evident copy's first ``n`` draft tokens, verified whole: the gain of
        its best cut (``g_cut``) or of all ``n`` tokens, whichever is higher, and at least ``thr``
        (it is verified)."""
        e = st.model.expected_tokens(n, depth)
        return n, max(thr, g_cut, e[-1] / self.cost.rel_table(n)[n])

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
        best_k, best_g = 0, 0.0
        rel = self.cost.rel_table(len(expected))
        for k, e in enumerate(expected, start=1):
            g = e / (rel[k] + draft_cost)
            if g > best_g:
                best_k, best_g = k, g
        return best_k, best_g

    def _draft_cost(self, st: _SpecState, k: float) -> float:
        """Cost of asking ``st`` for a draft of ``k`` tokens, in one-token steps."""
        if st.t_call is None:
            return 0.0
        t = st.t_call * (k if st.expensive else 1.0)
        return t / max(self.t1_s, 1e-6)

    def _upkeep_factor(self, st: _SpecState) -> float:
        """What a pausable drafter's upkeep adds to each step, as a share of the step's cost.

        Upkeep a drafter cannot pause is paid whether or not it drafts: it is no reason
        not to draft, so it does not count here (it shows in the statistics).
        """
        return self._upkeep(st) if st.pausable else 0.0

    def _upkeep(self, st: _SpecState) -> float:
        """A drafter's upkeep as a share of the target's cost for the same batch (0: unknown)."""
        return (st.u_s or 0.0) / max(self.t1_s, 1e-6)

    def _n_ask(self, st: _SpecState, n_max: int) -> int:
        """The longest draft worth asking ``st`` for: its typical length, and one more."""
        n = int(round(st.len_typ))
        if st.expensive:
            n += 1  # a drafter only ever returns what it is asked for: leave it room to show more
            if st.spec.n_max > 0:
                n = min(n, st.spec.n_max)
        return max(1, min(n_max, n))

    def _spec_len(self, st: _SpecState) -> int:
        """The longest draft ``st`` makes (its ``n_max``; the controller's cap where it has none)."""
        n = st.spec.n_max
        return min(n, self.params.max_len) if n > 0 else self.params.max_len

    def _explore(self, st: _SpecState, k: int, n_max: int) -> int:
        """How many tokens to ask a model drafter for that pays at ``k``: one more where the
        position after ``k`` has hardly been seen (under one observation, after decay). Only
        the first ``k`` are verified; the extra one is scored against the target's next
        tokens, so a length cut short on little evidence grows back once its deeper drafts
        prove right, at the cost of drafting one token more now and then.

            >>> from speculators.base import Speculator
            >>> from speculators.chain import SpeculatorChain
            >>> from speculators.costcurve import CostCurve
            >>> from speculators.types import SpecType
            >>> class Head(Speculator):
            ...     type = SpecType.DRAFT_MTP
            ...     def draft(self, req): return [1, 2, 3][:req.n_max]
            >>> head = Head(3)
            >>> ctl = Controller(SpeculatorChain([head]), CostCurve({k: 1 + k for k in range(9)}))
            >>> st = ctl.states[id(head)]
            >>> ctl._explore(st, 1, 8)        # position 2 never seen: asked for 2, 1 verified
            2
            >>> for _ in range(3):
            ...     st.model.new_draft(); st.model.observe(0, True); st.model.observe(1, False)
            >>> ctl._explore(st, 1, 8)        # seen (and missed): asked for 1
            1
            >>> ctl._explore(st, 3, 8)        # its own length: nothing more to ask
            3
        """
        if k >= min(self._spec_len(st), n_max) or k >= TRACK or st.model.tries[k] >= 1.0:
            return k
        return k + 1

    def _potential(self, st: _SpecState, n_max: int, depth: int = 0) -> tuple[int, float]:
        """(best length, expected gain) of asking ``st`` now, its drafting cost included."""
        n = self._n_ask(st, n_max)
        key = (st.model.version, self.cost.version, n, self.step // 16, round(self._upkeep(st), 2), depth)
        if key != st._pot_key:
            st._pot_key = key
            st._pot = self._potential_now(st, n, depth)
        return st._pot

    def _gain_curve(self, st: _SpecState, expected: Sequence[float]) -> tuple[int, float]:
        """(k, gain) maximising E_k / (c(k) (1 + upkeep) + drafting cost) for a model drafter."""
        best_k, best_g = 0, 0.0
        u = self._upkeep_factor(st)
        rel = self.cost.rel_table(len(expected))
        for k, e in enumerate(expected, start=1):
            g = e / (rel[k] * (1.0 + u) + self._draft_cost(st, k))
            if g > best_g:
                best_k, best_g = k, g
        return best_k, best_g

    def _potential_now(self, st: _SpecState, n: int, depth: int = 0) -> tuple[int, float]:
        if st.expensive:
            return self._gain_curve(st, st.model.expected_tokens(n))
        return self._best_cut(st, n, self._draft_cost(st, 1), depth)

    def _soon_interval(self, st: _SpecState) -> int:
        """Steps to the next probe of a drafter that pays (or nearly) over a stretch, after
        ``missed_in_row`` rejected first tokens: ``probe_every_early``, doubling with each miss
        past the ones it drafts through (``miss_tolerance``)."""
        p = self.params
        return min(p.probe_every_max, p.probe_every_early << min(max(0, st.missed_in_row - 1 - p.miss_tolerance), 16))

    def _gain_overall(self, st: _SpecState) -> float:
        """A model drafter's expected gain at its overall rate (its first position's
        acceptance whatever the last one's outcome was): what drafting every step would bring
        over a stretch, its misses included."""
        return self._gain_curve(st, st.model.expected_overall(self._n_ask(st, self.params.max_len)))[1]

    def _worth_probing_soon(self, st: _SpecState) -> bool:
        """Whether a model drafter pays over a stretch, or nearly (its gain at its overall rate
        within ``probe_near`` of the threshold). Such a drafter, paused by a run of misses, is
        probed again within a few steps, and its upkeep lingers meanwhile: a probe of it costs
        about what it brings."""
        p = self.params
        return self._gain_overall(st) >= p.probe_near * (1.0 + p.margin)

    def _is_hopeless(self, st: _SpecState) -> bool:
        """Whether ``st`` could not pay even if every draft token were accepted."""
        if st.t_call is None:
            return False
        n = max(1, st.spec.n_max if st.spec.n_max > 0 else self.params.max_len)
        _, g = self._gain_curve(st, [k + 1.0 for k in range(1, min(n, self.params.max_len) + 1)])
        return g < 1.0 + self.params.margin

    def _hopeless_interval(self, st: _SpecState) -> int:
        """Steps until a hopeless drafter's next probe: its last probe's cost (its catch-up
        included) at most ``probe_hopeless_share`` of the steps' time.

            >>> from types import SimpleNamespace
            >>> ctl = Controller.__new__(Controller)
            >>> ctl.params, ctl.cost = ControllerParams(), SimpleNamespace(t1_s=0.0125)  # 12.5 ms steps
            >>> st = _SpecState.__new__(_SpecState)
            >>> st.probe_s = 0.22                # a probe that first decoded 60 missed tokens
            >>> ctl._hopeless_interval(st)       # 0.22 s / (0.5 % of 12.5 ms)
            3520
            >>> st.probe_s = 0.001
            >>> ctl._hopeless_interval(st)
            256
        """
        p = self.params
        return min(self._share_interval(st, p.probe_hopeless_share, p.probe_every_hopeless),
                   p.probe_every_hopeless_max)

    def _share_interval(self, st: _SpecState, share: float, at_least: int) -> int:
        """Steps between probes of ``st`` so that they (its last probe's cost, a paused
        drafter's catch-up included) take at most ``share`` of the steps' time; never fewer
        than ``at_least``.

            >>> from types import SimpleNamespace
            >>> ctl = Controller.__new__(Controller)
            >>> ctl.params, ctl.cost = ControllerParams(), SimpleNamespace(t1_s=0.02)  # 20 ms steps
            >>> st = _SpecState.__new__(_SpecState)
            >>> st.probe_s = 0.027               # a probe that first caught a paused head up
            >>> ctl._share_interval(st, 0.015, 16), ctl._share_interval(st, 0.03, 16)   # 27 ms / (1.5 % of 20 ms)
            (90, 45)
        """
        t1 = self.t1_s or 0.0
        if t1 <= 0 or share <= 0:
            return at_least
        return max(at_least, math.ceil(st.probe_s / (share * t1) - 1e-9))

    def _probe_interval(self, st: _SpecState) -> int:
        n_cold = max(1, len(self.states))
        share = self._draft_cost(st, 1) if st.t_call is not None else 0.0
        budget = self.params.probe_budget / n_cold
        return max(1, min(64, math.ceil(share / budget))) if share > 0 else 1

    def decide(self, req: DraftRequest) -> Decision:
        """Ask the drafters worth asking; return the draft to verify (maybe none).

        ``req.n_max`` is the longest draft the step has room for (0: none,
        -1: no limit but the controller's own).
        """
        dec = self._decide(req)
        for st in self.states.values():
            if st.expensive:
                # the work done from here to observe() is the step's upkeep
                st._tp_snap = st.spec.stats.t_process_us
        return dec

    def _decide(self, req: DraftRequest) -> Decision:
        p = self.params
        self.step += 1
        s = self.stats
        s.n_steps += 1
        if not self._started:
            self._started = True
            self._base = req.pos0
            self._out = [int(req.id_last)]
        dec = Decision(pos0=req.pos0)
        self.chain.begin_step()
        n_max = p.max_len if req.n_max < 0 else min(req.n_max, p.max_len)
        if n_max <= 0:
            s.n_no_room += 1
            dec.reason = "no_room"
            s.last_reason = dec.reason
            return dec
        thr = 1.0 + p.margin
        # (gain, length, state, draft, probe, depth, short, length verified whole as an evident copy)
        cands: list[tuple[float, int, _SpecState, list[int], bool, int, bool, int]] = []
        shadows: list[tuple[_SpecState, list[int], int, bool]] = []
        asked = 0
        hist, m_ctx = None, 0
        for spec in self.chain.speculators:
            st = self.states.get(id(spec))
            if st is None:
                st = self._state(spec)
            per = st.per or self._bind(st)
            depth = run_depth = self._depth(st, req.pos0 + 1)
            if st.by_run:
                if hist is None:
                    hist = self._hist.sync(req.prompt)[0]
                    self._matcher.sync(hist)
                    m_ctx = self._matcher.match(int(req.id_last))
                depth = max(depth, m_ctx - MATCH_SLACK)
                if m_ctx < spec.context_key <= MATCH_CAP:
                    # its key does not occur earlier in the context: it has nothing to propose
                    st.potential = 0.0
                    st.run = 0
                    s.n_calls_saved += 1
                    per["calls_saved"] += 1
                    continue
            k_pot, g_pot = self._potential(st, n_max, depth)
            st.potential = g_pot
            # a drafter measured too dear to pay is only asked at its probes, which measure it
            # again: its cost, remembered in seconds, would look cheap against the steps of a
            # stretch where the machine runs slower, and its first draft pays its catch-up
            active = not st.hopeless and g_pot >= thr and (st.model.n_observed > 0.0 or depth >= MATCH_ASK)
            lenient = False
            if (not active and st.expensive and not st.hopeless and 0 < st.missed_in_row <= p.miss_tolerance
                    and st.last_active == self.step - 1 and self._gain_overall(st) >= thr):
                # drafting on through a miss or two: a model drafter that pays at its overall
                # rate, judged after a miss by its (few) drafts that followed a miss,
                # would otherwise stop at the first and not learn how it really fares there
                # (the realistic hybrid's MTP head: right first 63 % of the time after a miss,
                # 82 % after a hit; it paid at 55 %); a longer run of misses pauses it
                active = lenient = True
                k_pot = self._gain_curve(st, st.model.expected_overall(self._n_ask(st, n_max)))[0]
            probe = False
            if st.expensive:
                # a drafter's upkeep runs while it pays (and until it is measured, unless it
                # is hopeless from its size), and a few steps more (``upkeep_linger``) where
                # it pays over a stretch, its misses included: one that stops paying after a
                # miss and is probed again a few steps later would otherwise pause and catch
                # up on every short run of misses
                self._set_upkeep(st, active or (st.u_s is None and not st.hopeless)
                                 or (self.step - st.last_active <= p.upkeep_linger and not st.hopeless
                                     and self._worth_probing_soon(st)))
                if not st.upkeep_on:
                    per["upkeep_paused_steps"] += 1
                if active:
                    st.last_active = self.step
                    n_ask = self._explore(st, k_pot, n_max)
                elif self.step >= st.next_probe:
                    st.last_active = self.step
                    n_ask, probe = min(p.probe_len, self._spec_len(st), n_max), True
                    st.next_probe = self.step + st.probe_every
                else:
                    s.n_calls_saved += 1
                    per["calls_saved"] += 1
                    continue
            else:
                if not active:
                    if (st.record is not None) or self.step < st.next_probe:
                        s.n_calls_saved += 1
                        per["calls_saved"] += 1
                        continue
                    st.next_probe = self.step + st.interval
                n_ask = n_max
            tp0 = spec.stats.t_process_us
            t0 = self.clock()
            draft, _ = self.chain.ask(spec, DraftRequest(req.prompt, req.id_last, req.pos0, n_ask))
            dt = self.clock() - t0
            if probe:
                st.probe_s = dt     # with a paused drafter's catch-up: what the probe cost
            # a paused drafter catching up on the target's tokens: upkeep, not drafting
            dt = max(0.0, dt - (spec.stats.t_process_us - tp0) * 1e-6)
            asked += 1
            per["calls"] += 1
            if draft:
                per_tok = dt / len(draft) if st.expensive else dt
                first = st.expensive and st.n_timed == 0
                st.n_timed += 1
                if first and st.t_call is not None and not st.t_prior:
                    pass   # known from an earlier chain of this engine: a first, cold call does not move it
                elif st.t_call is None or st.t_prior or st.t_cold:
                    st.t_call, st.t_cold = per_tok, first
                else:
                    st.t_call = 0.8 * st.t_call + 0.2 * per_tok
                st.t_prior = False
                n_got = min(len(draft), p.max_len)
                if st.expensive and len(draft) >= n_ask:
                    # cut by the ask, not by the drafter: it might have drafted longer
                    n_got = max(n_got, min(st.spec.n_max if st.spec.n_max > 0 else p.max_len, p.max_len))
                st.len_typ = 0.8 * st.len_typ + 0.2 * n_got
                if st.expensive:
                    self._measured(st)
            elif not st.expensive:
                st.t_call = dt if st.t_call is None else 0.8 * st.t_call + 0.2 * dt
            if not st.expensive and (per["calls"] <= 2 or (self.step & 7) == 0):
                st.interval = self._probe_interval(st)   # follows the call's cost, now and then
            if not draft:
                st.run = 0
                continue
            draft = draft[:n_ask]
            if self.useful is not None:
                draft = draft[:self.useful(draft)]
                if not draft:
                    continue    # it drafts the reply's last token: the verify brings that one itself
            short = False
            if st.by_run:
                # how deep into a repeated passage this draft's own match is
                m_draft = self._matcher.match(int(req.id_last), int(draft[0]))
                depth = max(run_depth, m_draft - MATCH_SLACK)
                short = depth == 0 and m_draft <= p.short_match
            # drafting is paid now: only the verify cost decides the cut
            whole = 0
            if lenient:
                k, g = self._cut_of(st.model.expected_overall(len(draft)))   # at its overall rate
            else:
                k, g = self._best_cut(st, len(draft), depth=depth, draft=draft, prev=int(req.id_last), short=short)
                if st.by_run and evident_copy(m_draft, run_depth, p):
                    # evidently a copy: verified whole, as the fixed type would, through the
                    # end of a sentence early in the run while copies are not seen to go on
                    # past one (a miss ends the run, and with it the match that made it evident)
                    n_whole = self._through_boundary(draft, int(req.id_last), depth)
                    if n_whole > k:
                        k, g = self._whole(st, n_whole, depth, thr, g)
                    whole = k
            if st.model.n_observed <= 0.0 and not probe and depth < MATCH_ASK:
                g = 0.0   # nothing known of this drafter yet: its first proposal is scored unverified
            if probe or g >= thr:
                cands.append((g if not probe else 0.0, k if not probe else len(draft), st, draft, probe, depth, short,
                              whole if not probe else 0))
            else:
                shadows.append((st, draft, depth, short))
        chosen = None
        if cands:
            # real candidates first, then the longest evident copy, then the best gain
            cands.sort(key=lambda c: (c[4], -c[7], -c[0]))
            chosen = cands[0]
            for c in cands[1:]:
                shadows.append((c[2], c[3], c[5], c[6]))
        for st, draft, depth, short in shadows:
            self._open_record(st, draft, req.pos0 + 1, depth, short)
            s.n_shadow += 1
            st.per["shadow"] += 1
            if chosen is None:
                st.per["skipped"] += 1
        if chosen is None:
            if shadows:
                s.n_skipped += 1
                dec.reason = "skipped"
                dec.n_proposed = max(len(sh[1]) for sh in shadows)
            elif asked:
                s.n_no_proposal += 1
                dec.reason = "no_proposal"
            else:
                s.n_not_asked += 1
                dec.reason = "not_asked"
            s.last_reason = dec.reason
            return dec
        g, k, st, draft, probe, depth, short, _ = chosen
        per = st.per
        verified = draft[:k]
        self._open_record(st, draft, req.pos0 + 1, depth, short)
        self.chain.commit(st.spec, verified, len(draft))
        s.n_drafted += 1
        per["verified"] += 1
        dec.draft, dec.spec, dec.n_proposed, dec.expected_gain, dec.probe = verified, st.spec, len(draft), g, probe
        if probe:
            s.n_probes += 1
            per["probes"] += 1
            dec.reason = "probe"
        elif k < len(draft):
            s.n_cut += 1
            s.n_tokens_cut += len(draft) - k
            per["cut"] += 1
            per["tokens_cut"] += len(draft) - k
            dec.reason = "cut"
        else:
            dec.reason = "drafted"
        s.last_reason = dec.reason
        return dec

    def _open_record(self, st: _SpecState, draft: Sequence[int], start: int, depth: int,
                     short: bool = False) -> None:
        st.model.new_draft()
        st.record = _Record([int(t) for t in draft], start, depth0=depth, short=short)
        self._score(st)

    def _score(self, st: _SpecState) -> None:
        r = st.record
        if r is None:
            return
        out, base = self._out, self._base
        while r.scored < len(r.tokens):
            idx = r.start + r.scored - base
            if idx >= len(out):
                return
            hit = out[idx] == r.tokens[r.scored]
            st.model.observe(r.depth0 + r.scored, hit)
            if r.short and r.scored == 0 and st.short is not None:
                st.short.observe(hit)
            if (st.by_run and self.boundary is not None and idx != self._boundary_seen
                    and r.depth0 + r.scored < self.params.boundary_depth):
                before = r.tokens[r.scored - 1] if r.scored else (out[idx - 1] if idx > 0 else None)
                if before is not None and self.boundary(before):
                    self._boundary_seen = idx
                    self.boundaries.observe(hit)
            if hit:
                st.run, st.run_end = r.depth0 + r.scored + 1, r.start + r.scored
            else:
                st.run = 0
            r.scored += 1
            if not hit:
                break
        st.record = None

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
        for st in self.states.values():
            if st.record is not None:
                self._score(st)
        if dec.spec is not None and dec.draft:
            st = self.states.get(id(dec.spec))
            if st is not None:
                hit = bool(len(ids) - 1 if n_accepted is None else n_accepted)
                st.missed_in_row = 0 if hit else st.missed_in_row + 1
                if not hit and not dec.probe and st.expensive and self._worth_probing_soon(st):
                    # a drafter that pays (or nearly) over a stretch, paused by a run of misses:
                    # probed again soon, as after a missed probe (below)
                    st.next_probe = min(st.next_probe, self.step + self._soon_interval(st))
        if dec.spec is not None and dec.probe:
            st = self.states.get(id(dec.spec))
            if st is not None:
                n_acc = len(ids) - 1 if n_accepted is None else n_accepted
                p = self.params
                if seconds is not None:
                    # what the probe cost beyond the tokens it produced: the time between probes
                    # is that over the share of the steps' time they may take
                    st.probe_s = max(0.0, st.probe_s + seconds - len(ids) * self.t1_s)
                # its first probes: what it is worth is learnt within a few steps
                early = st.per["probes"] <= p.probe_early_n and not st.known_short
                soon = False
                base = p.probe_every_early if early else p.probe_every
                if st.t_cold:
                    # only its first, cold call is timed: what it costs is not known yet
                    st.probe_every = base
                elif st.hopeless:
                    # its costs alone outweigh what a verify can save: only re-measure now and then
                    st.probe_every = self._hopeless_interval(st)
                elif early:
                    # a fresh chain's first few probes: what the drafter is worth is learnt
                    # within a few steps, whatever they cost (a head whose first two probes
                    # happen to miss, as one in fifteen of a 79 %-right MTP head's do, was
                    # judged on them alone and left for 80 steps: most of a reply)
                    st.probe_every = base
                else:
                    # what it is expected to gain now, with this probe's outcome scored
                    _, g = self._potential(st, p.max_len)
                    if n_acc == 0 and self._worth_probing_soon(st):
                        # a miss after misses, from a drafter whose drafts pay, or nearly, over a
                        # stretch, misses included (a 79 %-right MTP head misses three first
                        # tokens in a row now and then, and after a few drafts that is all its
                        # estimate knows): a probe costs about what it brings, so it is probed
                        # again within its upkeep's linger, backing off while it keeps missing,
                        # instead of waiting out its probes' share of the time (80 steps after
                        # a missed 3-token probe on a CPU)
                        st.probe_every = self._soon_interval(st)
                        soon = True
                    else:
                        if n_acc > 0 and g >= p.probe_near * (1.0 + p.margin):
                            # near paying: probed more often, at twice the share of the time
                            share, n = 2 * p.probe_share, base
                        else:
                            # short of paying: a missed probe doubles the wait, an accepted one
                            # starts it over; either way its probes keep to their share of the time
                            share, n = p.probe_share, (max(p.probe_every, st.probe_every * 2)
                                                       if n_acc == 0 else base)
                        st.probe_every = min(p.probe_every_max, self._share_interval(st, share, n))
                # (decide() set the next probe from the interval before this one's outcome)
                st.next_probe = (self.step + st.probe_every if early or soon
                                 else max(st.next_probe, self.step + st.probe_every))
        if seconds is not None:
            self.observe_time(len(dec.draft), max(seconds - upkeep, 1e-6))

    def _observe_upkeep(self, n_draft: int) -> float:
        """Charge each model drafter the per-batch work it did this step; the seconds in all."""
        total = 0.0
        rel = self.rel(n_draft)
        for st in self.states.values():
            if st._tp_snap is None:
                continue
            dt = (st.spec.stats.t_process_us - st._tp_snap) * 1e-6
            st._tp_snap = None
            if dt <= 0.0:
                continue
            total += dt
            if st.per:
                st.per["upkeep_ms"] += dt * 1e3
            if not st.upkeep_on:
                continue  # a paused drafter's bookkeeping (or a catch-up): not its running cost
            x = dt / rel
            if st.u_s is None:
                st.u_s = x
            else:
                x = clip_stall(x, st.u_s)
                st.u_s += 0.2 * (x - st.u_s)
            self._measured(st)
        return total

    # -- statistics -------------------------------------------------------------------
    def _bind(self, st: _SpecState) -> dict[str, float]:
        st.per = self._per(st.name)
        return st.per

    def _per(self, name: str) -> dict[str, float]:
        d = self.stats.per_speculator.get(name)
        if d is None:
            d = {k: 0 for k in _PER_SPEC_COUNTERS}
            d.update({k: 0 for k in _PER_SPEC_SNAPSHOT})
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
        thr = 1.0 + self.params.margin
        for st in self.states.values():
            d = st.per or self._bind(st)
            d["accept_est"] = round(st.model.rates(1)[0], 4)
            d["gain_est"] = round(st.potential, 4)
            d["active"] = 1 if st.potential >= thr else 0
            d["upkeep_est"] = round(self._upkeep(st), 4)
            d["upkeep_on"] = 1 if st.upkeep_on else 0
            d["hopeless"] = 1 if st.hopeless else 0

    def snapshot(self) -> ControllerStats:
        """A copy of the statistics with the current estimates (cheap enough for every stats event)."""
        self._refresh_stats()
        return self.stats - ControllerStats()
