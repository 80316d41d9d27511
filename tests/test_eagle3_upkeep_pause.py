"""draft-eagle3's upkeep paused: lossless, caught up right before it drafts, the same drafts.

After every target batch an EAGLE3 drafter encodes the target's hidden rows (its fc layer) and
decodes each token with the encoded row before it on its own context (its upkeep). Paused, it
only encodes (the rows exist only while the target's batch is decoded) and keeps the (token,
position, row) pairs; they are decoded in one batch when it is asked to draft or resumed
(speculators.draft_eagle3). Under the adaptive controller a drafter that does not pay is paused.

Two pairs of models: the bigram target with an EAGLE3 drafter that predicts its bigram map
(tests.predictable_models: its drafts are accepted), and a random-weight tiny llama target with a
random EAGLE3 drafter (tests.hidden_models: its draft logits move when any cell of its context
differs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speculators.controller import ControllerParams
from speculators.costcurve import CostCurve
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from tests.hidden_models import eagle3_path, hidden_models_dir, llama_target_path  # noqa: F401 (fixtures)
from tests.predictable_models import expected_text, write_bigram_target, write_eagle3_predictor
from tests.stepping import generate_stepwise

N_PREDICT = 64
RESUME_AT = 24
PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def bigram(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("eagle3-pause")
    return write_bigram_target(d / "bigram-target.gguf"), write_eagle3_predictor(d / "eagle3.gguf")


def _engine(target: Path, drafter: Path, spec: SpecParams | None = None):
    from speculators.engine import Engine, EngineConfig
    eng = Engine(str(target), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=False))
    spec = spec or SpecParams.from_types("draft-eagle3")
    spec.draft.model = str(drafter)
    return eng, spec


def _run(eng, on_step=None, prompt: str = PROMPT):
    return generate_stepwise(eng, eng.prompt_tokens(text=prompt, raw=True), N_PREDICT,
                             SamplingParams(temperature=0.0), on_step)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["bigram", "random"])
def test_pausing_changes_nothing_of_what_a_fixed_eagle3_drafter_drafts(which, request):
    """Paused and resumed by hand between steps (no controller; paused before the prompt too),
    the drafter drafts exactly what an always-decoding one drafts at every position, from the
    same logits (the caught-up cells are the ones it would have decoded)."""
    target, drafter = (request.getfixturevalue("bigram") if which == "bigram"
                       else (request.getfixturevalue("llama_target_path"), request.getfixturevalue("eagle3_path")))
    eng, spec = _engine(target, drafter)
    expected = None
    try:
        runs = []
        for toggle in (False, True):
            eng.set_spec(spec.copy())
            e3 = eng.chain.speculators[0]
            assert e3.name == "draft-eagle3" and e3.can_pause
            drafts: dict[int, list[int]] = {}
            first_logits: dict[int, np.ndarray] = {}
            at = [None]
            orig_draft, orig_logits = e3.draft, e3.ctx.logits

            def logits(i, orig=orig_logits, at=at, first_logits=first_logits):
                out = orig(i)
                if at[0] is not None and at[0] not in first_logits:
                    first_logits[at[0]] = np.array(out, copy=True)
                return out

            def logged(req, orig=orig_draft, at=at, drafts=drafts, e3=e3):
                at[0] = req.pos0
                out = list(orig(req))
                drafts[req.pos0] = out
                assert not e3._deferred                  # it drafted from a caught-up context
                return out
            e3.draft, e3.ctx.logits = logged, logits
            if toggle:
                e3.set_upkeep(False)            # the prompt's batch too is caught up at the first draft

            def on_step(n, e3=e3):
                if toggle:
                    e3.set_upkeep(n % 3 == 0)       # paused two steps in three
            # (the random target ends its reply at once after the bigram prompt)
            res = _run(eng, on_step, PROMPT if which == "bigram" else "hello world")
            assert res.stats.n_generated == N_PREDICT
            if which == "bigram":
                assert res.text == expected_text(PROMPT, N_PREDICT)
                s = res.stats.speculators["draft-eagle3"]
                assert s.n_acc_tokens >= 0.9 * s.n_gen_tokens > 0, (s.n_gen_tokens, s.n_acc_tokens)
            expected = res.text if expected is None else expected
            assert res.text == expected                  # lossless: the target's own text
            runs.append((drafts, first_logits))
            if toggle:
                assert e3.n_catchups > 5 and e3.n_catchup_tokens > e3.n_catchups
        (d0, l0), (d1, l1) = runs
        assert d0 == d1 and len(d0) > 5
        assert sorted(l0) == sorted(l1) and len(l0) > 5
        worst = max(float(np.max(np.abs(l0[k] - l1[k]))) for k in l0)
        assert worst <= 2e-4, worst
    finally:
        eng.close()


@pytest.mark.slow
def test_the_controller_pauses_an_eagle3_drafter_that_does_not_pay_and_resumes_it(bigram):
    """A cost curve with a very fast one-token step: drafting never pays, so the drafter is
    paused from the first steps on and only probed (each probe caught up first, and right);
    part-way the controller is told to take any gain, and the drafter resumes."""
    spec = SpecParams.from_types("draft-eagle3")
    spec.adaptive = True
    eng, spec = _engine(*bigram, spec)
    try:
        eng.controller_params = ControllerParams(online_cost=False, probe_every=4, probe_every_max=4,
                                                 probe_every_hopeless=4)
        curve = CostCurve({k: 1.0 + 0.3 * k for k in range(65)})
        curve.t1_s = 1e-6
        eng.cost_curve = curve
        eng.set_spec(spec)
        ctl, e3 = eng.controller, eng.chain.speculators[0]
        assert ctl is not None and e3.name == "draft-eagle3"
        paused: list[int] = []

        def on_step(n):
            paused.append(0 if e3.upkeep else 1)
            if n == RESUME_AT:
                ctl.cost.curve.t1_s = 10.0
                ctl.cost.version += 1
        res = _run(eng, on_step)
        assert res.text == expected_text(PROMPT, N_PREDICT), res.text
        assert sum(paused[2:RESUME_AT]) >= RESUME_AT - 4, paused
        assert e3.n_catchups >= 3 and e3.n_catchup_tokens > 2 * e3.n_catchups, (e3.n_catchups, e3.n_catchup_tokens)
        s = res.stats.speculators["draft-eagle3"]
        assert s.n_acc_tokens >= 0.9 * s.n_gen_tokens > 0, (s.n_gen_tokens, s.n_acc_tokens)
        assert paused[-1] == 0 and e3.upkeep
        per = res.stats.controller.per_speculator["draft-eagle3"]
        assert per["upkeep_paused_steps"] >= RESUME_AT - 4 and per["probes"] >= 3
    finally:
        eng.close()
