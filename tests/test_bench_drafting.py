"""Drafting cost with 8k tokens of history (pytest-benchmark).

Run ``python -m pytest tests/test_bench_drafting.py --benchmark-enable`` for
timings; in the normal suite each benchmark runs once, as a plain test that
checks the speculator still drafts on this history.
Target: at most 0.5 ms per draft call (see README).
"""

from __future__ import annotations

import random

import pytest

from speculators import DraftRequest, SpecParams, SpeculatorChain


def _history(n=8192, seed=7):
    rng = random.Random(seed)
    # prose-like token stream with repeated phrases, so lookups find matches
    phrases = [[rng.randrange(1000, 60000) for _ in range(rng.randrange(4, 40))] for _ in range(200)]
    out: list[int] = []
    while len(out) < n:
        out.extend(rng.choice(phrases))
    return out[:n]


@pytest.mark.parametrize("types", ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"])
def test_draft_call_with_8k_history(benchmark, types):
    hist = _history()
    chain = SpeculatorChain.from_params(SpecParams.from_types(types))
    prompt = hist[:-1]
    chain.begin(prompt)
    req = DraftRequest(prompt=prompt, id_last=hist[-1], pos0=len(prompt), n_max=chain.n_max)
    chain.draft(req)  # first call pays for indexing the prompt, as in generation
    chain.accept(0)

    def one():
        d = chain.draft(req)
        chain.accept(0)
        return d

    draft = benchmark(one)
    assert isinstance(draft, list)
