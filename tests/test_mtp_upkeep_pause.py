"""draft-mtp's upkeep paused by the controller: lossless, and caught up right before it drafts.

The MTP head decodes every target batch on its own context (its upkeep), with each token
paired with the target's row before it. Under the adaptive controller, a head that does not
pay stops decoding them; it keeps each position's inputs (the token, the target's row before
it) and decodes them in one batch when it is probed or picked back up (speculators.draft_mtp).

The target is the qwen35 hybrid whose MTP block predicts its bigram map
(tests.predictable_models): fed the right rows at the right positions, its drafts are
accepted; fed rows one position off, never. A cost curve with a very fast one-token step
keeps the head paused from the first steps on (probed every few steps); part-way through the
controller is told to take any gain and the head resumes. Every probe drafts from a caught-up
context; the reply is the target's own text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from speculators.controller import ControllerParams
from speculators.costcurve import CostCurve
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from tests.hidden_models import hidden_models_dir, qwen35_mtp_path  # noqa: F401 (fixtures)
from tests.predictable_models import expected_text, write_bigram_qwen35_mtp
from tests.stepping import DraftRecorder, assert_same_drafts, generate_stepwise, resume_at

N_PREDICT = 64
RESUME_AT = 24
PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory) -> Path:
    return write_bigram_qwen35_mtp(tmp_path_factory.mktemp("mtp-pause") / "qwen35-mtp.gguf")


def _run(eng, on_step=None):
    return generate_stepwise(eng, eng.prompt_tokens(text=PROMPT, raw=True), N_PREDICT,
                             SamplingParams(temperature=0.0), on_step)


@pytest.mark.slow
def test_a_paused_mtp_head_is_caught_up_before_it_drafts_and_stays_lossless(qwen35):
    from speculators.engine import Engine, EngineConfig
    eng = Engine(str(qwen35), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=False))
    try:
        eng.controller_params = ControllerParams(online_cost=False, probe_every=4, probe_every_max=4,
                                                 probe_every_hopeless=4,
                                                 probe_every_hopeless_max=4)
        curve = CostCurve({k: 1.0 + 0.3 * k for k in range(65)})
        curve.t1_s = 1e-6            # drafting never pays: the head is paused and only probed
        eng.cost_curve = curve
        spec = SpecParams.from_types("draft-mtp")
        spec.adaptive = True
        eng.set_spec(spec)
        ctl = eng.controller
        mtp = eng.chain.speculators[0]
        assert ctl is not None and mtp.name == "draft-mtp" and mtp.can_pause

        drafts: list[tuple[int, list[int], bool, int]] = []
        orig = mtp.draft

        def logged(req):
            out = list(orig(req))
            # after a draft, the MTP context holds every position before pos0, nothing at or past it
            drafts.append((req.pos0, out, mtp.ctx.pos_max() == req.pos0 - 1, len(mtp._deferred)))
            return out
        mtp.draft = logged
        on_step, paused = resume_at(ctl, mtp, RESUME_AT)     # then any gain is worth it: it resumes
        res = _run(eng, on_step)
        assert res.text == expected_text(PROMPT, N_PREDICT), res.text           # the target's own
        assert sum(paused[2:RESUME_AT]) >= RESUME_AT - 4, paused                # paused while it did not pay
        before = [d for d in drafts if d[0] - len(eng.prompt_tokens(text=PROMPT, raw=True)) < RESUME_AT - 2]
        assert len(before) >= 3 and mtp.n_catchups >= 3, (drafts, mtp.n_catchups)
        # each probe caught up on more than one missed batch, in one go
        assert mtp.n_catchup_tokens > 2 * mtp.n_catchups, (mtp.n_catchup_tokens, mtp.n_catchups)
        assert all(in_step and backlog == 0 for _, _, in_step, backlog in drafts), drafts
        # the probes' drafts were right: the caught-up head read the right rows at the right places
        s = res.stats.speculators["draft-mtp"]
        assert s.n_acc_tokens >= 0.9 * s.n_gen_tokens and s.n_acc_tokens > 0, (s.n_gen_tokens, s.n_acc_tokens)
        assert paused[-1] == 0 and mtp.upkeep                                    # resumed
        per = res.stats.controller.per_speculator["draft-mtp"]
        assert per["upkeep_paused_steps"] >= RESUME_AT - 4 and per["probes"] >= 3
    finally:
        eng.close()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["bigram", "random"])
def test_pausing_changes_nothing_of_what_a_fixed_mtp_drafts(which, request):
    """Paused and resumed by hand between steps (no controller; paused before the prompt too),
    the head drafts exactly what an always-mirroring head drafts at every position, from the
    same logits. The random-weight head's logits depend on the cells the catch-up decoded (rows
    paired one position off move them by ~1e-3), the bigram head's drafts are accepted."""

    from speculators.engine import Engine, EngineConfig
    path = request.getfixturevalue("qwen35" if which == "bigram" else "qwen35_mtp_path")
    eng = Engine(str(path), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=False))
    expected = None
    try:
        runs = []
        for toggle in (False, True):
            eng.set_spec(SpecParams.from_types("draft-mtp"))
            mtp = eng.chain.speculators[0]
            rec = DraftRecorder(mtp)
            if toggle:
                mtp.set_upkeep(False)           # the prompt's batch too is caught up at the first draft

            def on_step(n, mtp=mtp):
                if toggle:
                    mtp.set_upkeep(n % 3 == 0)      # paused two steps in three
            res = _run(eng, on_step)
            if which == "bigram":
                assert res.text == expected_text(PROMPT, N_PREDICT)
            expected = res.text if expected is None else expected
            assert res.text == expected
            runs.append(rec)
            if toggle:
                assert mtp.n_catchups > 5 and mtp.n_catchup_tokens > mtp.n_catchups
        assert sum(len(d) for d in runs[0].drafts.values()) > 20
        assert_same_drafts(*runs)
    finally:
        eng.close()
