"""A prompt's kept state (``EngineConfig.prompt_states``): the fresh prefill's memory and logits.

bench runs every prompt once a round and row, each run from a fresh prefill; the engine keeps
the state a prompt's prefill left and restores it for the next run of that prompt. The runs
must be those of a fresh prefill: the same logits to the last bit, the same text and drafts.
"""

from __future__ import annotations

import numpy as np
import pytest

from speculators.engine import Engine, EngineConfig
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from .prompts import PROMPTS

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=1234)
CHAIN = "ngram-simple,ngram-map-k,ngram-mod,ngram-cache"


@pytest.fixture(scope="module")
def fresh(default_model_path):
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=4096, n_threads=2, reuse_prefix=False))
    yield eng
    eng.close()


@pytest.fixture
def kept(default_model_path):
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=4096, n_threads=2, reuse_prefix=False,
                                                       prompt_states=2))
    yield eng
    eng.close()


def test_a_restored_prompt_state_has_the_prefills_logits_and_gives_its_text(fresh, kept):
    prompt = fresh.prompt_tokens(text=PROMPTS[0])
    other = fresh.prompt_tokens(text=PROMPTS[1])
    fresh.prefill(prompt)
    want = np.array(fresh.ctx.logits(-1))
    kept.prefill(prompt)            # decoded, and its state kept
    kept.prefill(other)             # the context holds another prompt now
    assert kept.n_prompt_states_used == 0
    kept.prefill(prompt)            # restored
    assert kept.n_prompt_states_used == 1
    assert kept.kv_tokens == prompt and kept.ctx.pos_max() == len(prompt) - 1
    assert np.array_equal(np.array(kept.ctx.logits(-1)), want)
    runs = [(SpecParams(), GREEDY), (SpecParams.from_types(CHAIN), SAMPLED)]
    for spec, sampling in runs:
        fresh.set_spec(spec)
        a = fresh.run(prompt, max_tokens=32, sampling=sampling)
        kept.set_spec(spec)
        b = kept.run(prompt, max_tokens=32, sampling=sampling)
        assert b.tokens == a.tokens, (spec.types, sampling.temperature)
        assert (b.stats.n_drafted, b.stats.n_accepted) == (a.stats.n_drafted, a.stats.n_accepted)
        assert b.drafted_by == a.drafted_by
    assert kept.n_prompt_states_used == 1 + len(runs)
    # the chain drafted on the copy prompt: the restored runs verified drafts too
    assert b.stats.n_accepted > 0


def test_the_oldest_state_goes_and_a_drafter_that_reads_the_prefill_sees_it_decoded(kept):
    p0, p1, p2 = (kept.prompt_tokens(text=f"Question {i}: why is the sky blue?", raw=True) for i in range(3))
    for p in (p0, p1, p2):
        kept.prefill(p)
    kept.prefill(p0)            # two are kept: p0's went when p2's came
    assert kept.n_prompt_states_used == 0
    kept.prefill(p2)
    assert kept.n_prompt_states_used == 1
    # a hidden-state drafter reads the target's outputs as the prompt is decoded (a decode hook):
    # with one on the context the prompt is decoded, and the hook sees every token of it
    seen: list[tuple[int, int]] = []
    kept.ctx.decode_hooks.append(lambda toks, pos0: seen.append((pos0, len(toks))))
    try:
        kept.prefill(p2)
    finally:
        kept.ctx.decode_hooks.clear()
    assert kept.n_prompt_states_used == 1
    assert seen and seen[0][0] == 0 and sum(n for _, n in seen) == len(p2)
