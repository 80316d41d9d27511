"""Hidden-state drafters that are *accepted*: EAGLE3, DFlash, DSpark drafters and a qwen35
MTP block built to predict a bigram target (:mod:`tests.predictable_models`).

With random weights no draft is ever accepted, so a drafter fed the wrong target rows,
positions or tokens would pass every test. Here a correctly fed drafter is accepted
(nearly) always:

* our engine, greedy: the text of ``none``, and most drafts accepted;
* native llama-server (where ``tools/native.py`` built it): the same text and the same
  drafted and accepted counts, with accepted > 0 -- also with drafters that are wrong
  on some symbols, so that rounds end in rejections at known places;
* negative controls: a drafter whose map is off by one symbol, and our own drafters
  fed target rows shifted by one (monkeypatched), are accepted (almost) never -- the
  acceptance checks measure the drafter, not the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.predictable_models import (
    CYCLE, expected_text, write_bigram_qwen35_mtp, write_bigram_target, write_dflash_predictor,
    write_eagle3_predictor,
)
# resolved at import, before the tests' private XDG dirs are set (see test_native_llama_cpp)
from tests.test_native_llama_cpp import HAVE, _native_completion

N_PREDICT = 32
PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog", "speculative decoding is fun"]
SPEC_TYPES = ["draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp"]
#: symbols on which the "partly wrong" drafters disagree with the target
WRONG_SOME = "eknuz"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    d: Path = tmp_path_factory.mktemp("predictable")
    m = {"target": write_bigram_target(d / "bigram-target.gguf")}
    for tag, wrong in (("", ""), ("-some", WRONG_SOME), ("-shifted", CYCLE)):
        # draft-mtp: the MTP block is part of the (qwen35) target
        m["draft-mtp" + tag] = write_bigram_qwen35_mtp(d / f"qwen35-mtp{tag}.gguf", wrong=wrong)
        m["draft-eagle3" + tag] = write_eagle3_predictor(d / f"eagle3{tag}.gguf", wrong=wrong)
        m["draft-dflash" + tag] = write_dflash_predictor(d / f"dflash{tag}.gguf", wrong=wrong)
        m["draft-dspark" + tag] = write_dflash_predictor(d / f"dspark{tag}.gguf", dspark=True, wrong=wrong)
    return m


def _engine_run(target: Path, spec_type: str, drafter: Path | None, prompt: str):
    from speculators.engine import Engine, EngineConfig
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    spec = SpecParams.from_types(spec_type)
    if drafter is not None:
        spec.draft.model = str(drafter)
    eng = Engine(str(target), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=False), spec)
    try:
        assert eng.chain.skipped == {}, eng.chain.skipped
        r = eng.run(eng.prompt_tokens(text=prompt, raw=True), max_tokens=N_PREDICT,
                    sampling=SamplingParams(temperature=0.0))
        return r.text, r.stats.n_drafted, r.stats.n_accepted
    finally:
        eng.close()


def _pair(models: dict, spec_type: str, variant: str = "") -> tuple[Path, Path | None]:
    """(target, drafter) of a spec type; draft-mtp's drafter is in its target."""
    if spec_type == "draft-mtp":
        return models[spec_type + variant], None
    return models["target"], models[spec_type + variant]


def _totals(models, spec_type, variant="", prompts=PROMPTS):
    target, drafter = _pair(models, spec_type, variant)
    drafted = accepted = 0
    for prompt in prompts:
        text, n_d, n_a = _engine_run(target, spec_type, drafter, prompt)
        assert text == expected_text(prompt, N_PREDICT), (spec_type, prompt, text)
        drafted += n_d
        accepted += n_a
    return drafted, accepted


@pytest.mark.parametrize("target", ["target", "draft-mtp"])
def test_targets_are_the_bigram_machine(models, target):
    for prompt in PROMPTS:
        text, n_d, n_a = _engine_run(models[target], "none", None, prompt)
        assert text == expected_text(prompt, N_PREDICT)
        assert (n_d, n_a) == (0, 0)


@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_predicting_drafters_are_accepted(models, spec_type):
    drafted, accepted = _totals(models, spec_type)
    assert drafted > 0
    # measured: 69 drafted, 69 accepted (the target never leaves its cycle)
    assert accepted >= 0.9 * drafted, (spec_type, drafted, accepted)


@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_partly_wrong_drafters_are_partly_accepted(models, spec_type):
    drafted, accepted = _totals(models, spec_type, "-some")
    assert drafted > 0
    # measured: 93 drafted, 60 accepted, for every type (the drafters compute the same map)
    assert 0.4 * drafted <= accepted <= 0.85 * drafted, (spec_type, drafted, accepted)


@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_negative_control_shifted_map_is_rejected(models, spec_type):
    """A drafter predicting next(next(c)): it drafts (junk), the target accepts nothing."""
    drafted, accepted = _totals(models, spec_type, "-shifted")
    assert drafted > 0
    # measured: 261 drafted, 0 accepted
    assert accepted <= 0.05 * drafted, (spec_type, drafted, accepted)


@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_negative_control_rows_shifted_by_one_are_rejected(models, spec_type, monkeypatch):
    """Our own drafter, fed each batch's target rows one position late (as an
    off-by-one bug would), loses its acceptance: the checks above see the rows."""
    from speculators import draft_dflash, draft_eagle3, draft_mtp

    if spec_type == "draft-eagle3":
        orig = draft_eagle3.DraftEagle3._features

        def late(self, n):
            return np.roll(orig(self, n), 1, axis=0)
        monkeypatch.setattr(draft_eagle3.DraftEagle3, "_features", late)
    else:
        mod = draft_mtp if spec_type == "draft-mtp" else draft_dflash
        orig_rows = mod._rows

        def late_rows(ptr, n_rows, n_embd):
            return np.roll(orig_rows(ptr, n_rows, n_embd), 1, axis=0)
        monkeypatch.setattr(mod, "_rows", late_rows)
    drafted, accepted = _totals(models, spec_type)
    assert drafted > 0
    # measured: 261 drafted, 0 accepted (every draft is the junk token)
    assert accepted <= 0.05 * drafted, (spec_type, drafted, accepted)


# -- held against native llama-server ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("variant", ["", "-some"])
@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_accepted_counts_match_llama_server(models, spec_type, variant):
    if not HAVE:
        pytest.skip("native llama.cpp not built; run python tools/native.py build")
    target, drafter = _pair(models, spec_type, variant)
    extra = ["-md", str(drafter)] if drafter is not None else []
    total_accepted = 0
    for prompt in PROMPTS:
        native = _native_completion(target, spec_type, prompt, extra=extra)
        t = native["timings"]
        theirs = (native["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        ours = _engine_run(target, spec_type, drafter, prompt)
        assert theirs[0] == expected_text(prompt, N_PREDICT), (spec_type, prompt, theirs[0])
        assert ours[0] == theirs[0], (spec_type, prompt)
        assert ours[1:] == theirs[1:], (spec_type, variant, prompt, "drafted/accepted", ours[1:], theirs[1:])
        total_accepted += theirs[2]
    assert total_accepted > 0, f"{spec_type}{variant}: llama-server accepted nothing"
