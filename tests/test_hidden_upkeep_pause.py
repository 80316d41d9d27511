"""The upkeep of draft-eagle3, draft-dflash and draft-dspark paused: lossless, caught up right
before they draft, the same drafts (draft-mtp's: tests/test_mtp_upkeep_pause.py).

After every target batch an EAGLE3 drafter encodes the target's hidden rows (its fc layer) and
decodes each token with the encoded row before it on its own context; a DFlash/DSpark drafter
injects the rows into its cache (their upkeep). Paused, they keep what they would decode (the
target's rows exist only while its batch is decoded: EAGLE3 still encodes them, a small part of
the work) and decode it in one go when asked to draft or resumed (speculators.draft_eagle3,
speculators.draft_dflash). Under the adaptive controller a drafter that does not pay is paused.

Two sets of models: the bigram target with drafters that predict its bigram map
(tests.predictable_models: their drafts are accepted), and a random-weight tiny llama target with
random drafters (tests.hidden_models: their draft logits move when any cell of their context
differs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from speculators.controller import ControllerParams
from speculators.costcurve import CostCurve
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from tests.hidden_models import (dflash_path, dspark_path, eagle3_path, hidden_models_dir,  # noqa: F401 (fixtures)
                                 llama_target_path)
from tests.predictable_models import (expected_text, write_bigram_target, write_dflash_predictor,
                                      write_eagle3_predictor)
from tests.stepping import DraftRecorder, assert_same_drafts, generate_stepwise, resume_at

N_PREDICT = 64
RESUME_AT = 24
PROMPT = "the quick brown fox jumps over the lazy dog"


KINDS = ("draft-eagle3", "draft-dflash", "draft-dspark")


@pytest.fixture(scope="module")
def bigram(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("hidden-pause")
    target = write_bigram_target(d / "bigram-target.gguf")
    return {"draft-eagle3": (target, write_eagle3_predictor(d / "eagle3.gguf")),
            "draft-dflash": (target, write_dflash_predictor(d / "dflash.gguf")),
            "draft-dspark": (target, write_dflash_predictor(d / "dspark.gguf", dspark=True))}


def _random(request, kind: str) -> tuple[Path, Path]:
    fixture = {"draft-eagle3": "eagle3_path", "draft-dflash": "dflash_path", "draft-dspark": "dspark_path"}[kind]
    return request.getfixturevalue("llama_target_path"), request.getfixturevalue(fixture)


def _engine(target: Path, drafter: Path, spec: SpecParams):
    from speculators.engine import Engine, EngineConfig
    eng = Engine(str(target), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=False))
    spec.draft.model = str(drafter)
    return eng, spec


def _caught_up(dr) -> None:
    assert not dr._deferred          # it drafted from a caught-up context


def _run(eng, on_step=None, prompt: str = PROMPT):
    return generate_stepwise(eng, eng.prompt_tokens(text=prompt, raw=True), N_PREDICT,
                             SamplingParams(temperature=0.0), on_step)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["bigram", "random"])
def test_pausing_changes_nothing_of_what_a_fixed_drafter_drafts(which, kind, request):
    """Paused and resumed by hand between steps (no controller; paused before the prompt too),
    the drafter drafts exactly what an always-decoding one drafts at every position, from the
    same logits (the caught-up cells are the ones it would have decoded)."""
    target, drafter = request.getfixturevalue("bigram")[kind] if which == "bigram" else _random(request, kind)
    eng, spec = _engine(target, drafter, SpecParams.from_types(kind))
    expected = None
    try:
        runs = []
        for toggle in (False, True):
            eng.set_spec(spec.copy())
            dr = eng.chain.speculators[0]
            assert dr.name == kind and dr.can_pause
            rec = DraftRecorder(dr, lambda req, dr=dr: _caught_up(dr))
            if toggle:
                dr.set_upkeep(False)            # the prompt's batch too is caught up at the first draft

            def on_step(n, dr=dr):
                if toggle:
                    dr.set_upkeep(n % 3 == 0)       # paused two steps in three
            # (the random target ends its reply at once after the bigram prompt)
            res = _run(eng, on_step, PROMPT if which == "bigram" else "hello world")
            assert res.stats.n_generated == N_PREDICT
            if which == "bigram":
                assert res.text == expected_text(PROMPT, N_PREDICT)
                s = res.stats.speculators[kind]
                assert s.n_acc_tokens >= 0.9 * s.n_gen_tokens > 0, (s.n_gen_tokens, s.n_acc_tokens)
            expected = res.text if expected is None else expected
            assert res.text == expected                  # lossless: the target's own text
            runs.append(rec)
            if toggle:
                assert dr.n_catchups > 5 and dr.n_catchup_tokens > dr.n_catchups
        assert len(runs[0].drafts) > 5
        assert_same_drafts(*runs)
    finally:
        eng.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_controller_pauses_a_drafter_that_does_not_pay_and_resumes_it(kind, bigram):
    """A cost curve with a very fast one-token step: drafting never pays, so the drafter is
    paused from the first steps on and only probed (each probe caught up first, and right);
    part-way the controller is told to take any gain, and the drafter resumes."""
    spec = SpecParams.from_types(kind)
    spec.adaptive = True
    eng, spec = _engine(*bigram[kind], spec)
    try:
        eng.controller_params = ControllerParams(online_cost=False, probe_every=4, probe_every_max=4,
                                                 probe_every_hopeless=4,
                                                 probe_every_hopeless_max=4)
        curve = CostCurve({k: 1.0 + 0.3 * k for k in range(65)})
        curve.t1_s = 1e-6
        eng.cost_curve = curve
        eng.set_spec(spec)
        ctl, dr = eng.controller, eng.chain.speculators[0]
        assert ctl is not None and dr.name == kind
        on_step, paused = resume_at(ctl, dr, RESUME_AT)
        res = _run(eng, on_step)
        assert res.text == expected_text(PROMPT, N_PREDICT), res.text
        assert sum(paused[2:RESUME_AT]) >= RESUME_AT - 4, paused
        assert dr.n_catchups >= 3 and dr.n_catchup_tokens > 2 * dr.n_catchups, (dr.n_catchups, dr.n_catchup_tokens)
        s = res.stats.speculators[kind]
        assert s.n_acc_tokens >= 0.9 * s.n_gen_tokens > 0, (s.n_gen_tokens, s.n_acc_tokens)
        assert paused[-1] == 0 and dr.upkeep
        per = res.stats.controller.per_speculator[kind]
        assert per["upkeep_paused_steps"] >= RESUME_AT - 4 and per["probes"] >= 3
    finally:
        eng.close()
