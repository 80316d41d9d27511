"""Hidden-state drafters held against native llama-server (built by ``tools/native.py``).

For draft-mtp (a hybrid qwen35 target with an MTP block) and draft-eagle3, draft-dflash,
draft-dspark (drafters for a llama target), a fresh llama-server per prompt and the
engine, greedy, must give the same text and the same drafted and accepted counts.

The tiny models of :mod:`tests.hidden_models` run everywhere the binaries are built.
With ``DRAFTLIGHT_REALISTIC_MODELS=DIR`` (made by ``python -m tests.build_models
--realistic DIR``) the same comparison also runs on the realistic shapes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hidden_models import (  # noqa: F401  (session fixtures)
    dflash_path, dspark_path, eagle3_path, hidden_models_dir, llama_target_path, qwen35_mtp_path,
)
from tests.test_native_llama_cpp import HAVE, _native_completion, as_llama_server  # noqa: F401  (autouse)

pytestmark = pytest.mark.skipif(not HAVE, reason="native llama.cpp not built; run python tools/native.py build")

N_PREDICT = 32
PROMPTS = ["hello world, the quick brown fox jumps over the lazy dog", "Zebra 42! abc abc abc"]


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


def _compare(target: Path, spec_type: str, drafter: Path | None, prompts=PROMPTS):
    extra = ["-md", str(drafter)] if drafter is not None else []
    total_drafted = 0
    for prompt in prompts:
        native = _native_completion(target, spec_type, prompt, extra=extra)
        t = native["timings"]
        theirs = (native["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        ours = _engine_run(target, spec_type, drafter, prompt)
        assert ours[0] == theirs[0], (spec_type, prompt)
        assert ours[1:] == theirs[1:], (spec_type, prompt, "drafted/accepted", ours[1:], theirs[1:])
        total_drafted += theirs[1]
    if spec_type != "none":
        assert total_drafted > 0, f"{spec_type}: llama-server drafted nothing"


@pytest.mark.slow
def test_draft_mtp_matches_llama_server(qwen35_mtp_path):
    _compare(qwen35_mtp_path, "draft-mtp", None)


@pytest.mark.slow
@pytest.mark.parametrize("spec_type, drafter", [
    ("draft-eagle3", "eagle3_path"), ("draft-dflash", "dflash_path"), ("draft-dspark", "dspark_path")])
def test_block_and_eagle3_drafters_match_llama_server(request, llama_target_path, spec_type, drafter):
    _compare(llama_target_path, spec_type, request.getfixturevalue(drafter))


# -- realistic shapes (opt-in: the models are large) ------------------------------------------

REALISTIC = os.environ.get("DRAFTLIGHT_REALISTIC_MODELS")


@pytest.mark.slow
@pytest.mark.skipif(not REALISTIC, reason="set DRAFTLIGHT_REALISTIC_MODELS=DIR "
                                          "(python -m tests.build_models --realistic DIR)")
@pytest.mark.parametrize("spec_type, target, drafter", [
    # plain decoding too: on the Q4 hybrid, the prompt's batching (llama-server's checkpoint
    # cuts) decides near-tie tokens
    ("none", "hybrid-mtp.gguf", None),
    ("draft-mtp", "hybrid-mtp.gguf", None),
    ("draft-eagle3", "llama-target.gguf", "eagle3.gguf"),
    ("draft-dflash", "llama-target.gguf", "dflash.gguf"),
    ("draft-dspark", "llama-target.gguf", "dspark.gguf"),
])
def test_realistic_models_match_llama_server(spec_type, target, drafter):
    d = Path(REALISTIC)
    _compare(d / target, spec_type, d / drafter if drafter else None, prompts=PROMPTS[:1])
