"""A drafter fed by the target's batches, built on an engine whose cache already holds the prompt.

Hidden-state drafters (EAGLE3, DFlash, DSpark, MTP heads) learn the conversation only from the
target's decodes. When a chain is rebuilt on a loaded engine (a settings change in the chat, each
configuration of the Lab or ``bench``), the cached prefix of the next prompt is not decoded again,
so such a drafter used to start with an empty context ("holds positions up to -1 of a 617-token
prompt; drafts may degrade", on the realistic EAGLE3 drafter in ``bench``). The engine now decodes
the next prompt whole after such a rebuild, and reuses the prefix again from then on.
"""

from __future__ import annotations

import pytest

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from tests.hidden_models import hidden_models_dir, qwen35_mtp_path  # noqa: F401 (fixtures)
from tests.predictable_models import write_bigram_target, write_eagle3_predictor

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["draft-eagle3", "draft-mtp"])
def test_a_rebuilt_chain_with_a_hidden_drafter_sees_the_whole_prompt(kind, tmp_path, request):
    from speculators.engine import Engine, EngineConfig
    if kind == "draft-eagle3":
        target, drafter = write_bigram_target(tmp_path / "t.gguf"), write_eagle3_predictor(tmp_path / "e.gguf")
    else:
        target, drafter = request.getfixturevalue("qwen35_mtp_path"), None
    eng = Engine(str(target), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=True))
    try:
        prompt = eng.prompt_tokens(text=PROMPT, raw=True)
        greedy = SamplingParams(temperature=0.0)
        eng.set_spec(SpecParams())
        eng.run(prompt, max_tokens=8, sampling=greedy)       # the prompt is in the cache now
        spec = SpecParams.from_types(kind)
        if drafter is not None:
            spec.draft.model = str(drafter)
        eng.set_spec(spec)
        dr = eng.chain.speculators[0]
        seen = []
        orig = dr.draft

        def logged(req):
            seen.append((req.pos0, dr.ctx.pos_max()))
            return orig(req)
        dr.draft = logged
        r = eng.run(prompt, max_tokens=8, sampling=greedy)
        assert r.stats.n_prompt_reused == 0                  # decoded whole, for the new drafter
        # at its first draft the drafter's context holds the prompt (all but the positions the
        # draft itself writes), not nothing
        pos0, held = seen[0]
        assert pos0 == len(prompt) and held >= len(prompt) - 2, seen[:3]
        # and from then on the prefix is reused again
        r2 = eng.run(prompt, max_tokens=8, sampling=greedy)
        assert r2.stats.n_prompt_reused > 0
    finally:
        eng.close()
