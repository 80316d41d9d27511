"""The settings of the adaptive controller (:class:`ControllerParams`): each field states a rule
of how it decides, and what it was set from."""

from __future__ import annotations

from dataclasses import dataclass


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
