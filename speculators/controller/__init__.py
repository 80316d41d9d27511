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

The package, one job to a module: :mod:`~speculators.controller.params` (the settings,
:class:`ControllerParams`), :mod:`~speculators.controller.matching` (how deep into a repeated
passage the context is), :mod:`~speculators.controller.models` (acceptance as learnt),
:mod:`~speculators.controller.cost` (the verify-cost curve, :class:`CostModel`),
:mod:`~speculators.controller.state` (what is kept per speculator, the candidates of a step, the
decision), :mod:`~speculators.controller.pricing` (what a draft is expected to bring),
:mod:`~speculators.controller.scheduling` (probes and upkeep) and
:mod:`~speculators.controller.decide` (:class:`Controller`). Its statistics,
:class:`~speculators.controller_stats.ControllerStats`, live apart
(:mod:`speculators.controller_stats`), so that the engine's events carry them without loading
the controller.
"""

from __future__ import annotations

from ..controller_stats import PER_SPEC_COUNTERS, PER_SPEC_SNAPSHOT, REASONS, ControllerStats
from .cost import BY_K_MIN, REL_STILL, STALE_CHECK_STEPS, STALE_FACTOR, CostModel
from .decide import Controller
from .matching import MATCH_ASK, MATCH_CAP, MATCH_SLACK, SuffixMatcher, evident_copy, suffix_match
from .models import (RUN_PRIOR_A, TRACK, AcceptanceModel, BoundaryModel, ShortMatchModel, clip_stall,
                     expected_from_rates)
from .params import ControllerParams
from .pricing import COPY_PAST_BOUNDARY
from .state import NEVER, Candidate, Decision, Record, SpecState, _SpecState

#: the names the statistics' and records' helpers had in the single module this package replaced
_PER_SPEC_COUNTERS, _PER_SPEC_SNAPSHOT, _Record = PER_SPEC_COUNTERS, PER_SPEC_SNAPSHOT, Record

__all__ = [
    "BY_K_MIN", "COPY_PAST_BOUNDARY", "MATCH_ASK", "MATCH_CAP", "MATCH_SLACK", "NEVER", "PER_SPEC_COUNTERS",
    "PER_SPEC_SNAPSHOT", "REASONS", "REL_STILL", "RUN_PRIOR_A", "STALE_CHECK_STEPS", "STALE_FACTOR", "TRACK",
    "AcceptanceModel", "BoundaryModel", "Candidate", "Controller", "ControllerParams", "ControllerStats",
    "CostModel", "Decision", "Record", "ShortMatchModel", "SpecState", "SuffixMatcher", "clip_stall",
    "evident_copy", "expected_from_rates", "suffix_match", "_SpecState",
]
