"""The generation loop's edges: limits, stop strings, cancel, full context, bad input."""

from __future__ import annotations

import pytest

from speculators.engine import Engine, EngineConfig, GenerationError
from speculators.events import FinishEvent, StatsEvent, StepEvent
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from .prompts import PROMPTS

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def small_engine(default_model_path):
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=256, n_threads=2))
    yield eng
    eng.close()


def test_max_tokens_is_exact_even_with_long_drafts(q4_engine):
    p = SpecParams.from_types("ngram-simple")
    p.ngram_simple.size_n = 2
    q4_engine.set_spec(p)
    prompt = q4_engine.prompt_tokens(text=PROMPTS[1])
    for n in (1, 2, 7, 19):
        res = q4_engine.run(prompt, max_tokens=n, sampling=GREEDY)
        assert len(res.tokens) == n and res.finish_reason == "length"


def test_stop_string_cuts_the_text(q4_engine):
    q4_engine.set_spec(SpecParams())
    prompt = q4_engine.prompt_tokens(text=PROMPTS[1])
    full = q4_engine.run(prompt, max_tokens=40, sampling=GREEDY)
    words = full.text.split()
    assert len(words) > 6
    stop = words[5]
    res = q4_engine.run(prompt, max_tokens=40, sampling=GREEDY, stop=[stop])
    assert res.finish_reason == "stop_string"
    assert stop not in res.text
    assert full.text.startswith(res.text)
    assert res.text == full.text[:full.text.index(stop)]


def test_context_full_ends_with_a_reason(small_engine):
    small_engine.set_spec(SpecParams.from_types("ngram-simple,ngram-mod"))
    prompt = small_engine.prompt_tokens(text=PROMPTS[0])
    assert 150 < len(prompt) < 256
    res = small_engine.run(prompt, max_tokens=500, sampling=GREEDY)
    assert res.finish_reason == "context"
    assert len(prompt) + len(res.tokens) == 256 + 1  # the last token is sampled, never decoded
    assert "context" in res.message


def test_prompt_longer_than_the_context_is_refused(small_engine):
    prompt = small_engine.prompt_tokens(text=PROMPTS[0] * 3)
    with pytest.raises(GenerationError, match="context holds 256"):
        small_engine.run(prompt, max_tokens=5)
    # the engine is still usable afterwards
    ok = small_engine.run(small_engine.prompt_tokens(text="Hi"), max_tokens=3, sampling=GREEDY)
    assert len(ok.tokens) == 3


def test_empty_prompt_and_bad_limits_are_refused(small_engine):
    with pytest.raises(GenerationError, match="empty"):
        small_engine.run([], max_tokens=5)
    with pytest.raises(GenerationError, match="at least 1"):
        small_engine.run([2, 3], max_tokens=0)


def test_cancel_stops_between_steps_and_keeps_the_text(q4_engine):
    q4_engine.set_spec(SpecParams())
    prompt = q4_engine.prompt_tokens(text=PROMPTS[3])
    seen = []

    def cancel():
        return len(seen) >= 5

    result = None
    for ev in q4_engine.generate(prompt, max_tokens=100, sampling=GREEDY, cancel=cancel):
        if isinstance(ev, StepEvent):
            seen.extend(ev.tokens)
        elif isinstance(ev, FinishEvent):
            result = ev.result
    assert result.finish_reason == "cancelled"
    assert len(result.tokens) == 5 and [t.id for t in seen] == result.tokens
    assert result.text == "".join(t.text for t in seen)


def test_prefix_reuse_gives_the_same_output(f16_model_path):
    eng = Engine(str(f16_model_path), EngineConfig(n_ctx=1024, n_threads=2, reuse_prefix=True))
    try:
        msgs = [{"role": "user", "content": PROMPTS[4]}]
        first = eng.run(eng.prompt_tokens(messages=msgs), max_tokens=24, sampling=GREEDY)
        msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And again?"}]
        prompt2 = eng.prompt_tokens(messages=msgs)
        reused = eng.run(prompt2, max_tokens=24, sampling=GREEDY)
        assert reused.stats.n_prompt_reused > 100
        eng.kv_tokens = []
        eng.ctx.clear()
        fresh = eng.run(prompt2, max_tokens=24, sampling=GREEDY)
        assert fresh.stats.n_prompt_reused == 0
        assert reused.tokens == fresh.tokens
    finally:
        eng.close()


def test_synthetic_acceptance_marks_output_invalid_and_hits_the_rate(q4_engine):
    p = SpecParams.from_types("ngram-simple")
    p.ngram_simple.size_n = 1
    p.ngram_simple.size_m = 4
    p.synth_rates = [1.0, 1.0, 1.0, 1.0]
    q4_engine.set_spec(p)
    prompt = q4_engine.prompt_tokens(text=PROMPTS[0])
    events = list(q4_engine.generate(prompt, max_tokens=40, sampling=GREEDY))
    res = events[-1].result
    assert res.stats.synthetic and res.stats.to_dict()["valid"] is False
    assert res.stats.n_drafted > 0 and res.stats.n_accepted == res.stats.n_drafted
    assert any(isinstance(e, StatsEvent) for e in events)
    p.synth_rates = [0.0, 0.0, 0.0, 0.0]
    q4_engine.set_spec(p)
    res0 = q4_engine.run(prompt, max_tokens=40, sampling=GREEDY)
    assert res0.stats.n_accepted == 0 and res0.stats.n_drafted > 0


def test_rebuilding_the_chain_keeps_the_model(q4_engine):
    model = q4_engine.model
    q4_engine.set_spec(SpecParams.from_types("ngram-mod"))
    q4_engine.set_spec(SpecParams.from_types("ngram-simple,ngram-cache"))
    assert q4_engine.model is model
    assert [s.name for s in q4_engine.chain.speculators] == ["ngram-simple", "ngram-cache"]


def test_drafts_near_the_context_end_leave_llama_servers_room(small_engine):
    """llama-server drafts at most ``n_ctx - n_tokens - 2`` (one cell kept for a context
    shift; server-context.cpp ``get_n_draft_max``); the engine asks for no more."""
    from speculators.base import Speculator
    from speculators.chain import SpeculatorChain
    from speculators.types import SpecType

    class Recorder(Speculator):
        type = SpecType.NGRAM_SIMPLE

        def __init__(self):
            super().__init__(n_max=64)
            self.asked: list[tuple[int, int]] = []

        def draft(self, req):
            self.asked.append((req.pos0, req.n_max))
            return []

    rec = Recorder()
    old = small_engine.chain
    small_engine.chain = SpeculatorChain([rec])
    try:
        n_ctx = small_engine.ctx.n_ctx
        prompt = small_engine.prompt_tokens(text=PROMPTS[1])
        res = small_engine.run(prompt, max_tokens=n_ctx, sampling=GREEDY)
        assert res.finish_reason == "context"
        near_end = [(pos, n) for pos, n in rec.asked if pos > n_ctx - 70]
        assert near_end and all(n <= n_ctx - pos - 2 for pos, n in near_end), near_end[-5:]
    finally:
        small_engine.chain = old
