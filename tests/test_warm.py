"""Reading the conversation ahead of the reply (``Engine.warm``, ``ChatSession.warm``).

The chat has the model read the conversation as it stands while the person types, so
that the reply reads only the new message. On F16 weights the reply must be the one a
cold prompt gives, token for token; in the chat (the real runner, the default model) the
first reply must find the transcript's start read.
"""

from __future__ import annotations

import pytest

from app.session import ReadAhead
from speculators.engine import Engine, EngineConfig
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from .test_runner import runner_session
from .test_session import drain, loaded

GREEDY = SamplingParams(temperature=0.0)
ASK = "Repeat this list exactly: apples, pears, plums, figs, dates, apples, pears."


@pytest.fixture(scope="module")
def engine(f16_model_path, measured_cost_curves):
    # the run's shared curves: Automatic's verify-cost curve of this model is measured once a run
    eng = Engine(str(f16_model_path), EngineConfig(n_ctx=4096, n_threads=2, cost_cache_dir=str(measured_cost_curves)),
                 SpecParams.auto())
    yield eng
    eng.close()


def _cold(eng: Engine) -> None:
    eng.ctx.clear()
    eng.kv_tokens = []


def _reply(eng: Engine, prompt):
    """The reply and its tokens (Automatic's drafted and accepted counts follow its timings, and
    the drafters have seen the read-ahead's own last tokens, as after any earlier turn)."""
    r = eng.run(prompt, max_tokens=40, sampling=GREEDY, stop=tuple(eng.template.stop_strings))
    return r, r.tokens


def test_a_warmed_conversation_is_reused_and_the_reply_is_the_same(engine):
    start = engine.prompt_tokens(messages=[])            # the transcript's fixed start
    prompt = engine.prompt_tokens(messages=[{"role": "user", "content": ASK}])
    common = next(i for i, (a, b) in enumerate(zip(start, prompt)) if a != b)
    assert common > 200                                  # the worked exchanges come first
    _cold(engine)
    cold, want = _reply(engine, prompt)
    assert cold.stats.n_prompt_reused == 0 and cold.stats.n_accepted > 0

    _cold(engine)
    assert engine.warm(start) == len(start)
    assert engine.kv_tokens == start
    assert engine.warm(start) == 0                       # read already: nothing to do
    warmed, got = _reply(engine, prompt)
    assert warmed.stats.n_prompt_reused >= common - 1 and warmed.stats.n_accepted > 0
    assert got == want, "the reply after a read-ahead differs from the cold one (F16: it must not)"


def test_a_stopped_warm_up_keeps_what_it_read(engine):
    start = engine.prompt_tokens(messages=[])
    prompt = engine.prompt_tokens(messages=[{"role": "user", "content": ASK}])
    assert len(start) > Engine.WARM_PIECE
    _cold(engine)
    _, want = _reply(engine, prompt)
    _cold(engine)
    asked = []
    read = engine.warm(start, cancel=lambda: asked.append(1) or len(asked) > 1)   # stop after one piece
    assert read == Engine.WARM_PIECE and engine.kv_tokens == start[:Engine.WARM_PIECE]
    r, got = _reply(engine, prompt)
    assert r.stats.n_prompt_reused == Engine.WARM_PIECE and got == want


def test_a_prompt_the_context_cannot_hold_is_not_read(engine):
    _cold(engine)
    assert engine.warm([engine.model.info.bos] * engine.ctx.n_ctx) == 0 and engine.kv_tokens == []
    assert engine.warm([]) == 0


@pytest.mark.slow
def test_the_chat_reads_its_conversation_before_the_first_message(tmp_path, default_model_path):
    s, q = runner_session(tmp_path, default_model_path, spec="auto", max_tokens=32)
    try:
        assert s.warming is not None, "no read-ahead was started when the model was ready"
        s.warming.join(60)
        start = s.engine.prompt_tokens(messages=s.conversation())
        reply = s.send("What is the capital of France?")
        seen = drain(s, q, lambda: s.job is None, timeout=120)
        # the chat was told the read-ahead began and what it read (its top bar says so)
        said = [e for e in seen if isinstance(e, ReadAhead)]
        assert [e.reading for e in said] == [True, False] and said[-1].tokens == len(start), said
        assert reply.status == "done" and reply.text
        # all of the transcript's start but its last tokens (the reply's own turn begins there)
        assert reply.stats["n_prompt_reused"] >= len(start) - 3, (reply.stats["n_prompt_reused"], len(start))

        # a chat opened from the history is read too: its next reply reads only the new message
        first = s.chat_id
        s.new_chat()
        other = s.send("Say hello.")
        drain(s, q, lambda: s.job is None, timeout=120)
        assert other.status == "done"
        s.resume(first)
        s.warming.join(60)
        read = s.engine.prompt_tokens(messages=s.conversation())
        nxt = s.send("And of Spain?")
        drain(s, q, lambda: s.job is None, timeout=120)
        assert nxt.status == "done"
        assert nxt.stats["n_prompt_reused"] >= len(read) - 3, (nxt.stats["n_prompt_reused"], len(read))
    finally:
        s.close()


def test_an_engine_without_a_read_ahead_is_left_alone(tmp_path):
    s, q, engine = loaded(tmp_path)          # the scripted engine: no warm()
    assert s.warming is None and not s.warm()
    s.close()


@pytest.mark.slow
def test_on_quantized_weights_a_read_ahead_moves_a_reply_only_at_near_ties(default_model_path):
    """The chat reads the transcript's start ahead, then the message: the prompt in two batches
    where ``generate`` reads it in one. On Q4_K_M weights a batch's logits differ from another
    batch shape's by up to ~0.8, so a reply may take the other side of a near-tie (measured:
    "Count from 1 to 100" after 7 tokens, " user" against " assistant", 0.03 apart). Written
    through the cold reply's tokens, the read-ahead one must agree everywhere but at such ties."""
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=1024, n_threads=2), SpecParams())
    try:
        stop = tuple(eng.template.stop_strings)
        start = eng.prompt_tokens(messages=[])
        flips, compared = [], 0
        for ask in ("Count from 1 to 100, separated by commas.", "Tell me about the history of the Eiffel Tower.",
                    ASK):
            prompt = eng.prompt_tokens(messages=[{"role": "user", "content": ask}])
            _cold(eng)
            cold = eng.run(prompt, max_tokens=200, sampling=GREEDY, stop=stop)
            _cold(eng)
            assert eng.warm(start) == len(start)
            warmed = eng.run(prompt, max_tokens=200, sampling=GREEDY, stop=stop, forced=list(cold.written))
            assert warmed.stats.n_prompt_reused >= len(start) - 3     # (the start's last tokens are the turn's)
            assert warmed.tokens == cold.tokens                    # forced: the same reply, read otherwise
            flips += warmed.stats.forced_flips
            compared += len(cold.written)
        assert compared > 200
        assert all(f.margin < 1.0 for f in flips), flips
        assert len(flips) <= compared // 20, flips               # ties are rare, not the rule
    finally:
        eng.close()
