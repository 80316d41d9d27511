"""A draft model whose upkeep the controller pauses: lossless, and caught up before it drafts.

Under Automatic, draft-simple's draft model stops decoding every target batch while it is
not worth asking (speculators.controller); when it is probed, or picked back up, it decodes
what it missed in one batch. The target is the F16 copy of the default model (greedy output
equals plain decoding's token for token, up to the near-ties tests/lossless.py allows), the
draft model its Q2_K copy. A given cost curve with a very fast one-token step makes the
draft model too costly to keep in step, so its upkeep is paused from the first steps on, and
it is probed every few steps; part-way through the reply the controller is told to take any
gain (the one-token step turns slow), so it resumes the upkeep and drafts every step.

Each draft is compared with the draft an always-mirroring draft-simple (the reference's
path, no controller) makes at the same position of the same text: a draft context caught up
in one batch must draft what one fed batch by batch drafts.
"""

from __future__ import annotations

import pytest

from speculators.controller import ControllerParams
from speculators.costcurve import CostCurve
from speculators.params import DraftParams, SpecParams
from speculators.sampling import SamplingParams

from .lossless import check_lossless
from .stepping import generate_stepwise, resume_at

GREEDY = SamplingParams(temperature=0.0)
MAX_TOKENS = 96
PROMPTS = [
    "Count from one to twenty in words, separated by commas.",
    "Explain photosynthesis to a child.",
]
RESUME_AT = 10   # steps before the controller is told to take any gain


def _log_drafts(engine):
    """Wrap draft-simple's draft(): record (pos0, draft, its KV in step with the target)."""
    ds = next(s for s in engine.chain.speculators if s.name == "draft-simple")
    log: list[tuple[int, list[int], bool]] = []
    orig = ds.draft

    def wrapped(req):
        out = list(orig(req))
        # after a draft, the draft context holds exactly the target's tokens before id_last
        in_step = ds.kv == list(req.prompt) and ds.ctx.pos_max() == len(req.prompt) - 1
        log.append((req.pos0, out, in_step))
        return out
    ds.draft = wrapped
    return ds, log


def _generate(engine, prompt, on_step=None):
    return generate_stepwise(engine, prompt, MAX_TOKENS, GREEDY, on_step)


@pytest.mark.slow
@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_paused_and_resumed_draft_model_is_lossless_and_caught_up(f16_engine, q2k_model_path, which):
    eng = f16_engine
    prompt = eng.prompt_tokens(text=PROMPTS[which])
    saved = (eng.controller_params, eng.cost_curve)
    try:
        eng.set_spec(SpecParams())
        expected = eng.run(prompt, max_tokens=MAX_TOKENS, sampling=GREEDY).tokens

        # the reference: draft-simple without the controller mirrors every batch and drafts every step
        eng.set_spec(SpecParams.from_types("draft-simple", draft=DraftParams(model=str(q2k_model_path))))
        _, ref_log = _log_drafts(eng)
        ref = _generate(eng, prompt)
        check_lossless(eng, prompt, expected, ref.tokens)
        ref_drafts = {pos: d for pos, d, _ in ref_log}

        # Automatic, with a one-token step so fast that the draft model cannot pay for its upkeep
        eng.controller_params = ControllerParams(online_cost=False, probe_every=4, probe_every_max=4,
                                                 probe_every_hopeless=4,
                                                 probe_every_hopeless_max=4)
        curve = CostCurve({k: 1.0 + 0.3 * k for k in range(65)})
        curve.t1_s = 0.0005
        eng.cost_curve = curve
        sp = SpecParams.auto()
        sp.draft.model = str(q2k_model_path)
        eng.set_spec(sp)
        ctl = eng.controller
        assert ctl is not None and "draft-simple" in [s.name for s in eng.chain.speculators]
        ds, log = _log_drafts(eng)
        # the one-token step turns slow at RESUME_AT: the draft model is worth its upkeep then
        on_step, paused = resume_at(ctl, ds, RESUME_AT)
        got = _generate(eng, prompt, on_step)
        check_lossless(eng, prompt, expected, got.tokens)

        assert len(paused) > RESUME_AT + 6, "the reply ended before the controller was told to resume"
        assert sum(paused[2:RESUME_AT]) == RESUME_AT - 2, paused            # paused while it did not pay
        # ...caught up at its probes, each on the tokens it missed (3 catch-ups of 10 tokens seen)
        assert ds.n_catchups >= 2 and ds.n_catchup_tokens >= 2 * ds.n_catchups
        # resumed: mirrors again (a step or two off where a rejected draft lowers its estimate)
        assert sum(paused[RESUME_AT + 1:]) <= 3 and ds.upkeep, paused
        assert all(in_step for _, _, in_step in log), log                   # in step whenever it drafts
        # compare with the always-mirroring reference where both drafted at the same position of
        # the same text (up to where the outputs part at a near-tie, if they do)
        n_same = next((i for i, (a, b) in enumerate(zip(expected, got.tokens)) if a != b), len(expected))
        n_same = min(n_same, next((i for i, (a, b) in enumerate(zip(expected, ref.tokens)) if a != b),
                                  len(expected)))
        common = [(pos, d) for pos, d, _ in log if d and pos in ref_drafts and pos - len(prompt) < n_same - 4]
        # (how many positions the two runs share is chance: 2-5 on these prompts; the drafter
        # resumes at its first probe after the step turns slow, as one measured too dear to pay does)
        assert len(common) >= 2, (log, sorted(ref_drafts))
        for pos, d in common:
            n = min(len(d), len(ref_drafts[pos]))
            assert d[:n] == ref_drafts[pos][:n], (pos, d, ref_drafts[pos])
    finally:
        eng.controller_params, eng.cost_curve = saved
        eng.set_spec(SpecParams())
