"""On a target that cannot drop part of a verified batch, a rejected draft costs its step's
checkpoint, the restore and a replay; the adaptive controller is told all of it, with the step.

The checkpoint path is forced on the default model (as a hybrid or recurrent target takes it);
each decode, restore and controller observation is recorded in order.
"""

from __future__ import annotations

import time

import pytest

from speculators.engine import Engine, EngineConfig
from speculators.llama import Context
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

TEXT = ("The lighthouse keeper climbed the hundred and twelve steps every evening at dusk. He carried a "
        "can of oil, a cloth, and a small notebook in which he wrote the weather, the ships he saw, and "
        "the colour of the sea. ")


@pytest.fixture
def engine(default_model_path):
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=2048, n_threads=2, force_checkpoints=True,
                                                       reuse_prefix=False))
    yield eng
    eng.close()


def test_the_controller_is_told_a_restored_steps_replay_with_the_step(engine, monkeypatch):
    log: list[tuple] = []
    decode, state_set = Context.decode, Context.state_set

    def timed_decode(self, tokens, pos0, logits="last"):
        t = time.perf_counter()
        decode(self, tokens, pos0, logits)
        log.append(("decode", len(tokens), time.perf_counter() - t))

    def timed_state_set(self, data, partial):
        t = time.perf_counter()
        state_set(self, data, partial)
        log.append(("restore", 0, time.perf_counter() - t))

    monkeypatch.setattr(Context, "decode", timed_decode)
    monkeypatch.setattr(Context, "state_set", timed_state_set)
    engine.set_spec(SpecParams.auto())
    ctrl = engine.controller
    observe = ctrl.observe

    def logged_observe(dec, ids, seconds=None, **kw):
        log.append(("observe", len(dec.draft), seconds))
        return observe(dec, ids, seconds, **kw)

    monkeypatch.setattr(ctrl, "observe", logged_observe)
    assert engine.use_checkpoints
    prompt = engine.prompt_tokens(text="Repeat this text three times, exactly:\n\n" + TEXT)
    res = engine.run(prompt, max_tokens=160, sampling=SamplingParams(temperature=0.0))
    assert res.stats.n_drafted > res.stats.n_accepted > 0

    # a step's first restore: the one right after its verify (a replay may be restored again,
    # where the replay's smaller batch turns a near-tie of these quantized weights the other way)
    restores = [i for i, e in enumerate(log) if e[0] == "restore" and not (i >= 2 and log[i - 2][0] == "restore")]
    assert restores, "no draft was rejected, so no checkpoint was restored"
    for i in restores:
        verify = log[i - 1]
        assert verify[0] == "decode"
        spent = verify[2] + log[i][2]
        j = i + 1
        while log[j][0] == "decode" and log[j + 1][0] == "restore":    # a replay restored again
            spent += log[j][2] + log[j + 1][2]
            j += 2
        replay, told = log[j], log[j + 1]
        assert replay[0] == "decode"
        # the last replay's decode is followed by the restored step's observation (before the
        # next step's decode), whose time holds the verify, every restore and every replay
        assert told[0] == "observe" and told[1] == verify[1] - 1, log[i - 1:j + 2]
        assert told[2] >= spent + replay[2], log[i - 1:j + 2]
    # one observation per decided step (the cost curve's timing decodes and the prompt come
    # first): a step with a restore is not told twice
    seq = log[next(i for i, e in enumerate(log) if e[0] == "observe") - 1:]
    steps = [i for i, e in enumerate(seq) if e[0] == "decode" and not (i and seq[i - 1][0] == "restore")]
    for a, b in zip(steps, steps[1:] + [len(seq)]):
        assert sum(1 for e in seq[a:b] if e[0] == "observe") == 1, seq[a:b]


def test_after_a_replay_the_controller_scores_proposals_against_the_text_written(engine, monkeypatch):
    """A restored step's replay writes the step's accepted tokens and one more of the target's
    own. The controller is told all of them: the text it scores proposals against stays the
    text written. (Told only the step's tokens, it fell one token behind at every replay and
    scored every later proposal against the wrong positions: a drafter that was accepted 7
    times in 10 was estimated at 2 %.)"""
    engine.set_spec(SpecParams.auto())
    ctrl = engine.controller
    n_restores = [0]
    state_set = Context.state_set

    def counted_state_set(self, data, partial):
        n_restores[0] += 1
        state_set(self, data, partial)

    monkeypatch.setattr(Context, "state_set", counted_state_set)
    prompt = engine.prompt_tokens(text="Repeat this text three times, exactly:\n\n" + TEXT)
    res = engine.run(prompt, max_tokens=160, sampling=SamplingParams(temperature=0.0))
    assert n_restores[0] > 0, "no draft was rejected, so nothing was replayed"
    kv = list(engine.kv_tokens[ctrl._base:])
    # what the controller holds as the text from the first decided step on: the tokens in the
    # KV cache from that position (and the last token written, not decoded yet)
    assert len(kv) > 100 and ctrl._out[:len(kv)] == kv, (len(ctrl._out), len(kv))
