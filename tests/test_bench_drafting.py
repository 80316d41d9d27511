"""Drafting cost with 8k tokens of history (pytest-benchmark).

Run ``python -m pytest tests/test_bench_drafting.py --benchmark-enable`` for
timings; in the normal suite each benchmark runs once, as a plain test.

Two costs are timed apart, for every n-gram type:

* ``test_draft_call_with_8k_history``: a call that drafts. The history ends
  inside a long phrase seen several times before, and every timed call's
  draft is accepted in full (so ngram-map-k does not shorten its next draft
  to what was accepted last time). Every timed call must return a non-empty
  draft -- an empty one would time a lookup that found nothing.
* ``test_draft_call_that_finds_nothing``: a call whose last token was never
  seen, so every lookup misses; every timed call must return nothing.

Target: at most 0.5 ms per draft call (docs/measurements.md, row 16).
"""

from __future__ import annotations

import random

import pytest

from speculators import DraftRequest, SpecParams, SpeculatorChain

TYPES = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
#: how far into a repeated phrase the history stops: more than every type's key
#: (ngram-mod matches 24 tokens, ngram-map 12), with 48+ tokens of the phrase left
INTO_PHRASE = 30


def _history(n=8192, seed=7):
    """Prose-like tokens: 24 phrases of 100-160 tokens in random order, then the
    first tokens of the phrase used most often, so every lookup has a match
    whose continuation was always the same."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(1000, 60000) for _ in range(rng.randrange(100, 160))] for _ in range(24)]
    out: list[int] = []
    uses = [0] * len(phrases)
    while len(out) < n - INTO_PHRASE:
        i = rng.randrange(len(phrases))
        uses[i] += 1
        out.extend(phrases[i])
    out = out[:n - INTO_PHRASE]
    best = max(range(len(phrases)), key=lambda i: uses[i])
    assert uses[best] >= 4  # ngram-cache's strict thresholds need a few samples
    return out + phrases[best][:INTO_PHRASE]


def _chain(types: str, hist: list[int], id_last: int):
    chain = SpeculatorChain.from_params(SpecParams.from_types(types))
    prompt = hist
    chain.begin(prompt)
    req = DraftRequest(prompt=prompt, id_last=id_last, pos0=len(prompt), n_max=chain.n_max)
    return chain, req


@pytest.mark.parametrize("types", TYPES)
def test_draft_call_with_8k_history(benchmark, types):
    hist = _history()
    chain, req = _chain(types, hist[:-1], hist[-1])
    first = chain.draft(req)  # the first call pays for indexing the prompt, as in generation
    chain.accept(len(first))
    lengths: list[int] = []

    def one():
        d = chain.draft(req)
        chain.accept(len(d))
        lengths.append(len(d))
        return d

    draft = benchmark(one)
    assert lengths and all(n > 0 for n in lengths), (types, lengths[:10])
    # what was drafted is the phrase's continuation
    i = len(hist) - 1
    phrase_at = [j for j in range(len(hist) - INTO_PHRASE) if hist[j:j + INTO_PHRASE] == hist[-INTO_PHRASE:]]
    assert phrase_at, "the history ends in a phrase seen before"
    cont = hist[phrase_at[0] + INTO_PHRASE: phrase_at[0] + INTO_PHRASE + len(draft)]
    assert draft == cont, (types, i)


@pytest.mark.parametrize("types", TYPES)
def test_draft_call_that_finds_nothing(benchmark, types):
    hist = _history()
    never_seen = 999  # phrases use ids 1000..59999
    chain, req = _chain(types, hist, never_seen)
    chain.draft(req)
    chain.accept(0)
    lengths: list[int] = []

    def one():
        d = chain.draft(req)
        chain.accept(0)
        lengths.append(len(d))
        return d

    benchmark(one)
    assert lengths and all(n == 0 for n in lengths), (types, lengths[:10])
