"""A draft model about as large as the target costs Automatic nothing, from the first reply on.

Before its first draft, a draft model would decode the whole prompt beside the target (its
upkeep) just so that the controller could time it. The controller prices a draft model that
was never measured from the two models' sizes (speculators.draft_simple.size_prior): one
that could not pay even with every draft accepted (the Q2_K copy of the default model drafting
for the default model itself: 94 % of its size) is neither mirrored nor asked, nor probed (a
probe would first decode the whole context on it: 0.22 s on a chat question, ~17 steps, where
probes every 256 steps took 6 % of the time); one that might pay (the same Q2_K copy for the F16 copy, under a
cost curve where drafts are cheap to verify) is measured as before.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from speculators.controller import ControllerParams
from speculators.costcurve import CostCurve
from speculators.draft_simple import size_prior
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "Count from one to twenty in words, separated by commas."
#: the default model's verify-cost curve as measured on a 2-core CPU (its 262k-row output layer
#: makes each verified row cost nearly a token), so that the tests do not depend on a curve an
#: earlier test left on the shared engine
CPU_REL = [1.0, 2.0, 2.3, 2.59, 3.84, 4.08, 4.32, 4.59, 4.86, 5.12, 5.39, 5.66, 5.92, 6.31, 6.69, 7.07, 7.46]


def _cpu_curve() -> CostCurve:
    rel = {k: CPU_REL[k] if k < len(CPU_REL) else CPU_REL[-1] + 0.38 * (k - len(CPU_REL) + 1) for k in range(65)}
    curve = CostCurve(rel)
    curve.t1_s = 0.015
    return curve


def _auto_with(engine, draft_path):
    sp = SpecParams.auto()
    sp.draft.model = str(draft_path)
    engine.set_spec(sp)
    ds = next(s for s in engine.chain.speculators if s.name == "draft-simple")
    st = next(st for st in engine.controller.states.values() if st.spec is ds)
    return ds, st


def test_the_prior_is_the_size_ratio_where_both_models_sit_alike():
    cpu = lambda size: SimpleNamespace(placement="cpu", size_bytes=size)          # noqa: E731
    gpu = lambda size: SimpleNamespace(placement="offloaded", size_bytes=size)    # noqa: E731
    assert size_prior(cpu(1000), cpu(250)) == 0.25
    assert size_prior(gpu(1000), gpu(940)) == 0.94
    # a draft on the GPU for a target on the CPU is far faster than its size says: no prior
    assert size_prior(cpu(1000), gpu(250)) is None
    assert size_prior(SimpleNamespace(placement="split", size_bytes=1000),
                      SimpleNamespace(placement="split", size_bytes=10)) is None


@pytest.mark.slow
def test_a_draft_model_as_large_as_the_target_is_never_mirrored(q4_engine, q2k_model_path):
    eng = q4_engine
    prompt = eng.prompt_tokens(text=PROMPT)
    saved = eng.cost_curve
    try:
        eng.cost_curve = _cpu_curve()
        eng.set_spec(SpecParams())
        plain = eng.run(prompt, max_tokens=48, sampling=GREEDY)
        ds, st = _auto_with(eng, q2k_model_path)
        assert 0.85 < ds.cost_prior < 1.0, ds.cost_prior          # 237 MB over 253 MB
        assert st.hopeless and not ds.upkeep                      # known before it costs anything
        res = eng.run(prompt, max_tokens=48, sampling=GREEDY)
        # the draft model decoded nothing: not the prompt, not a batch, not a draft
        assert ds.n_process_tokens == 0 and ds.n_draft_decodes == 0, ds.cost()
        assert res.stats.speculators["draft-simple"].n_gen_drafts == 0
        per = res.stats.controller.per_speculator["draft-simple"]
        assert per["hopeless"] == 1 and per["upkeep_on"] == 0
        assert "draft-simple too costly to pay here · used 0" in res.stats.controller.summary()
        # whatever else Automatic drafted, the reply is the model's own
        n = next((i for i, (a, b) in enumerate(zip(plain.tokens, res.tokens)) if a != b), None)
        if res.stats.n_drafted == 0:
            assert res.tokens == plain.tokens
        else:
            assert n is None or n > 8, (n, plain.text, res.text)
    finally:
        eng.cost_curve = saved
        eng.set_spec(SpecParams())


@pytest.mark.slow
def test_one_its_size_rules_out_is_never_probed_even_over_many_replies(q4_engine, q2k_model_path):
    eng = q4_engine
    prompt = eng.prompt_tokens(text=PROMPT)
    saved = eng.controller_params, eng.cost_curve
    try:
        eng.controller_params = ControllerParams(probe_every_hopeless=6)
        eng.cost_curve = _cpu_curve()
        ds, st = _auto_with(eng, q2k_model_path)
        assert st.hopeless and st.t_prior and st.t_call is not None
        steps = 0
        for _ in range(4):
            steps += eng.run(prompt, max_tokens=40, sampling=GREEDY).stats.n_steps
        assert steps > 4 * 6
        assert eng.controller.stats.per_speculator["draft-simple"]["probes"] == 0
        assert ds.n_draft_decodes == 0 and ds.n_catchups == 0 and ds.n_process_tokens == 0
    finally:
        eng.controller_params, eng.cost_curve = saved
        eng.set_spec(SpecParams())


def test_a_measured_hopeless_drafter_is_probed_as_rarely_as_its_probe_costs():
    """After a probe that found it hopeless, the next one waits until the probe's cost (its
    catch-up included) is at most ``probe_hopeless_share`` of the steps' time."""
    from speculators.controller import Controller, _SpecState

    ctl = Controller.__new__(Controller)
    ctl.params = ControllerParams()
    ctl.cost = SimpleNamespace(t1_s=0.0125)
    st = _SpecState.__new__(_SpecState)
    # 0.5 % of 12.5 ms steps is 62.5 us a step: at least 256 steps apart, at most 16384
    for probe_s, steps in ((0.0005, 256), (0.05, 800), (0.4, 6400), (5.0, 16384)):
        st.probe_s = probe_s
        assert ctl._hopeless_interval(st) == steps


@pytest.mark.slow
def test_a_draft_model_that_might_pay_is_measured_as_before(f16_engine, q2k_model_path):
    eng = f16_engine
    saved = eng.cost_curve
    try:
        # drafts nearly free to verify (as on a GPU): the Q2_K copy at 44 % of the F16 copy's size
        # could pay, so its size says nothing against it and it mirrors the prompt to be measured
        curve = CostCurve({k: 1.0 + 0.02 * k for k in range(65)})
        curve.t1_s = 0.02
        eng.cost_curve = curve
        ds, st = _auto_with(eng, q2k_model_path)
        assert 0.3 < ds.cost_prior < 0.6, ds.cost_prior
        assert not st.hopeless and st.t_call is None and ds.upkeep
        eng.run(eng.prompt_tokens(text=PROMPT), max_tokens=24, sampling=GREEDY)
        assert ds.n_process_tokens > 0                            # it followed the target
    finally:
        eng.cost_curve = saved
        eng.set_spec(SpecParams())
