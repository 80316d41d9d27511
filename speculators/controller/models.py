"""What the controller learns of acceptance: per-position rates of a speculator
(:class:`AcceptanceModel`), the rate just after a sentence ends (:class:`BoundaryModel`) and at a
draft resting on a short match (:class:`ShortMatchModel`), and the tokens a verify then yields."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: positions tracked separately; deeper positions share the last one (a lookup run's, each
#: from its own floor: :meth:`AcceptanceModel.rates`)
TRACK = 32
#: a lookup drafter's acceptance at run position ``d`` starts from ``(d + a q_0) / (d + a)``
#: with this ``a`` (1: Laplace's rule of succession)
RUN_PRIOR_A = 1.0
#: positions past the tracked ones worked out over an array from this many on (fewer: one at a
#: time, which costs less than setting an array up)
ARRAY_FROM = 24


def clip_stall(x: float, ref: float) -> float:
    """``x`` held within half and twice ``ref``: a timing taken in a stall (a busy machine, a
    paused drafter's catch-up) moves a running estimate only a little.

    >>> clip_stall(1.0, 0.01), clip_stall(0.001, 0.01), clip_stall(0.012, 0.01)
    (0.02, 0.005, 0.012)
    """
    return min(max(x, 0.5 * ref), 2.0 * ref)


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
        #: the longest rates (and expected tokens) asked for at one depth since the last change:
        #: a shorter draft at that depth reads their first entries (each entry depends on its
        #: position alone), so a step's several looks at one drafter compute them once
        self._memo_key: tuple[int, int] | None = None
        self._memo_rates: list[float] = []
        self._memo_expected: list[float] | None = None
        self._floors: list[float] = []
        self._floors_of: float | None = None

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

    def observe_run(self, pos0: int, n_hit: int, missed: bool) -> None:
        """Draft tokens ``pos0`` to ``pos0 + n_hit - 1`` were accepted and, where ``missed``, the
        next one was not: as :meth:`observe` of each in turn (the same sums, in the same order).

        >>> a, b = AcceptanceModel(decay=1.0), AcceptanceModel(decay=1.0)
        >>> for pos, hit in ((0, True), (1, True), (2, False)):
        ...     a.observe(pos, hit)
        >>> b.observe_run(0, 2, True)
        >>> (a.tries, a.hits, a.last_first) == (b.tries, b.hits, b.last_first)
        True
        """
        if n_hit + missed <= 0:
            return
        tries, hits, last = self.tries, self.hits, TRACK - 1
        if pos0 == 0:
            hit0 = n_hit > 0
            if self.last_first is not None:
                self.tries1[self.last_first] += 1.0
                if hit0:
                    self.hits1[self.last_first] += 1.0
            self.last_first = 1 if hit0 else 0
        end = pos0 + n_hit
        for i in range(pos0, min(end, last)):
            tries[i] += 1.0
            hits[i] += 1.0
        # positions from the last tracked one on share its counts: one 1.0 added per position
        t, h = tries[last], hits[last]
        for _ in range(end - max(pos0, last)):
            t += 1.0
            h += 1.0
        tries[last], hits[last] = t, h
        if missed:
            tries[min(end, last)] += 1.0
        self._rates = None
        self.version += 1

    def rates(self, k: int, depth: int = 0) -> list[float]:
        """Conditional acceptance q_1..q_k (each smoothed toward the one before).

        q_1 is read in the light of the previous first-position outcome
        (smoothed toward the overall q_1). ``depth``: the draft starts that
        many positions in (the rates from ``q_(depth+1)`` on). A new list (the caller's to change).
        """
        key = (self.version, max(depth, 0))
        if key != self._memo_key or len(self._memo_rates) < k:
            self._memo_key, self._memo_rates, self._memo_expected = key, self._rates_at(k, depth), None
        return self._memo_rates[:k]

    def _run_floors(self) -> list[float]:
        """The succession floor ``(d + a q_0) / (d + a)`` of each tracked run position (none at
        the first), worked out once for this prior."""
        p0 = self.prior
        if self._floors_of != p0:
            self._floors = [-math.inf] + [(i + RUN_PRIOR_A * p0) / (i + RUN_PRIOR_A) for i in range(1, TRACK)]
            self._floors_of = p0
        return self._floors

    def _rates_at(self, k: int, depth: int) -> list[float]:
        if self._rates is None:
            out, prev, w = [], self.prior, self.weight
            if self.run_prior:
                for t, h, floor in zip(self.tries, self.hits, self._run_floors()):
                    if floor > prev:
                        prev = floor
                    prev = (h + w * prev) / (t + w)
                    out.append(prev)
            else:
                for t, h in zip(self.tries, self.hits):
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
        lo = max(d, TRACK)
        if d + k - lo < ARRAY_FROM:
            for i in range(lo, d + k):
                out.append((h + w * max(below, (i + RUN_PRIOR_A * p0) / (i + RUN_PRIOR_A))) / (t + w))
            return out
        # over an array: the same operations on each position, in the same order
        pos = np.arange(lo, d + k, dtype=np.float64)
        floor = (pos + RUN_PRIOR_A * p0) / (pos + RUN_PRIOR_A)
        return out + ((h + w * np.maximum(below, floor)) / (t + w)).tolist()

    def expected_tokens(self, k: int, depth: int = 0) -> list[float]:
        """E_1..E_k: tokens a verify step yields with a draft of 1..k tokens (starting
        ``depth`` positions in). A new list."""
        rates = self.rates(k, depth)
        e = self._memo_expected
        if e is None or len(e) < k:
            # E_j depends on q_1..q_j alone: the memo's rates give the longest E_k at once
            e = self._memo_expected = expected_from_rates(self._memo_rates)
        return e[:len(rates)]

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
