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
from tests.test_native_llama_cpp import HAVE, _native_completion, as_llama_server  # noqa: F401  (autouse)

N_PREDICT = 32
PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog", "speculative decoding is fun"]
#: case -> spec type; "draft-eagle3@qwen35" is EAGLE3 on the hybrid qwen35 target (its
#: state checkpoints and boundary stash), reading the target's final normed state
#: (layer id = n_layer) as g; "dflash2" a DFlash2 drafter whose selector knows the
#: target's map, so that the lattice walk (ours in Python) depends on the predecessor
CASES = {"draft-eagle3": "draft-eagle3", "draft-dflash": "draft-dflash", "draft-dspark": "draft-dspark",
         "draft-mtp": "draft-mtp", "draft-eagle3@qwen35": "draft-eagle3", "dflash2": "draft-dflash"}
#: symbols on which the "partly wrong" drafters disagree with the target
WRONG_SOME = "eknuz"
EOS_AFTER = "z"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    d: Path = tmp_path_factory.mktemp("predictable")
    m = {"target": write_bigram_target(d / "bigram-target.gguf"),
         "qwen35": write_bigram_qwen35_mtp(d / "qwen35-mtp.gguf"),
         # the same targets ending their replies (EOS) after "z"
         "target-eos": write_bigram_target(d / "bigram-target-eos.gguf", eos_after=EOS_AFTER),
         "qwen35-eos": write_bigram_qwen35_mtp(d / "qwen35-mtp-eos.gguf", eos_after=EOS_AFTER),
         "draft-mtp-some-eos": write_bigram_qwen35_mtp(d / "qwen35-mtp-some-eos.gguf", wrong=WRONG_SOME,
                                                       eos_after=EOS_AFTER)}
    for tag, wrong in (("", ""), ("-some", WRONG_SOME), ("-shifted", CYCLE)):
        # draft-mtp: the MTP block is part of the (qwen35) target
        m["draft-mtp" + tag] = write_bigram_qwen35_mtp(d / f"qwen35-mtp{tag}.gguf", wrong=wrong)
        m["draft-eagle3" + tag] = write_eagle3_predictor(d / f"eagle3{tag}.gguf", wrong=wrong)
        m["draft-eagle3@qwen35" + tag] = write_eagle3_predictor(
            d / f"eagle3-qwen35{tag}.gguf", wrong=wrong, n_embd=32, target_layers=(0, 1, 2),
            fc_from=2, fc_normed=True)
        m["draft-dflash" + tag] = write_dflash_predictor(d / f"dflash{tag}.gguf", wrong=wrong)
        m["draft-dspark" + tag] = write_dflash_predictor(d / f"dspark{tag}.gguf", dspark=True, wrong=wrong)
        # DSpark whose confidence head drops after a vowel (with p_min, drafts end there)
        m["dspark-conf" + tag] = write_dflash_predictor(d / f"dspark-conf{tag}.gguf", dspark=True, wrong=wrong,
                                                        conf_stop="aeiou")
        m["dflash2" + tag] = write_dflash_predictor(d / f"dflash2{tag}.gguf", wrong=wrong, selector_top_k=4,
                                                    selector_boost=20.0)
    return m


def _engine(target: Path, spec_type: str, drafter: Path | None, reuse_prefix: bool = False,
            p_min: float | None = None):
    from speculators.engine import Engine, EngineConfig
    from speculators.params import SpecParams

    spec = SpecParams.from_types(spec_type)
    if drafter is not None:
        spec.draft.model = str(drafter)
    if p_min is not None:
        spec.draft.p_min = p_min
    eng = Engine(str(target), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=reuse_prefix),
                 spec)
    assert eng.chain.skipped == {}, eng.chain.skipped
    return eng


def _generate(eng, prompt: str):
    from speculators.sampling import SamplingParams

    r = eng.run(eng.prompt_tokens(text=prompt, raw=True), max_tokens=N_PREDICT,
                sampling=SamplingParams(temperature=0.0))
    return r.text, r.stats.n_drafted, r.stats.n_accepted


def _engine_run(target: Path, spec_type: str, drafter: Path | None, prompt: str, p_min: float | None = None):
    eng = _engine(target, spec_type, drafter, p_min=p_min)
    try:
        return _generate(eng, prompt)
    finally:
        eng.close()


def _case(models: dict, case: str, variant: str = "", eos: bool = False) -> tuple[str, Path, Path | None]:
    """(spec type, target, drafter) of a case; draft-mtp's drafter is in its target.
    ``eos``: the target that ends its reply after ``EOS_AFTER``."""
    sfx = "-eos" if eos else ""
    if case == "draft-mtp":
        return "draft-mtp", models[case + variant + sfx], None
    target = models[("qwen35" if case.endswith("@qwen35") else "target") + sfx]
    return CASES[case], target, models[case + variant]


def _totals(models, case, variant="", prompts=PROMPTS):
    spec_type, target, drafter = _case(models, case, variant)
    drafted = accepted = 0
    for prompt in prompts:
        text, n_d, n_a = _engine_run(target, spec_type, drafter, prompt)
        assert text == expected_text(prompt, N_PREDICT), (case, prompt, text)
        drafted += n_d
        accepted += n_a
    return drafted, accepted


@pytest.mark.parametrize("target", ["target", "qwen35"])
def test_targets_are_the_bigram_machine(models, target):
    for prompt in PROMPTS:
        text, n_d, n_a = _engine_run(models[target], "none", None, prompt)
        assert text == expected_text(prompt, N_PREDICT)
        assert (n_d, n_a) == (0, 0)


@pytest.mark.parametrize("case", CASES)
def test_predicting_drafters_are_accepted(models, case):
    drafted, accepted = _totals(models, case)
    assert drafted > 0
    # measured: 69 drafted, 69 accepted (the target never leaves its cycle)
    assert accepted >= 0.9 * drafted, (case, drafted, accepted)


@pytest.mark.parametrize("case", CASES)
def test_partly_wrong_drafters_are_partly_accepted(models, case):
    drafted, accepted = _totals(models, case, "-some")
    assert drafted > 0
    # measured: 93 drafted, 60 accepted in every case (the drafters compute the same map) but
    # dflash2: 78 drafted, 65 accepted (its selector rescues some)
    assert 0.4 * drafted <= accepted <= 0.9 * drafted, (case, drafted, accepted)


@pytest.mark.parametrize("case", [c for c in CASES if c != "dflash2"])  # (its selector knows better)
def test_negative_control_shifted_map_is_rejected(models, case):
    """A drafter predicting next(next(c)): it drafts (junk), the target accepts nothing."""
    drafted, accepted = _totals(models, case, "-shifted")
    assert drafted > 0
    # measured: 261 drafted, 0 accepted
    assert accepted <= 0.05 * drafted, (case, drafted, accepted)


# (not EAGLE3 on the hybrid target: after a rejection the engine restores a checkpoint and
# decodes the accepted tokens again, often one row, which a roll within the batch leaves be;
# not DFlash2: its selector knows the true map and picks the right one of a split state)
@pytest.mark.parametrize("case", ["draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp"])
def test_negative_control_rows_shifted_by_one_are_rejected(models, case, monkeypatch):
    """Our own drafter, fed each batch's target rows one position late (as an
    off-by-one bug would), loses its acceptance: the checks above see the rows."""
    from speculators import draft_dflash, draft_eagle3, draft_mtp

    def late_rows(rows):
        def late(ptr, n_rows, n_embd):
            return np.roll(rows(ptr, n_rows, n_embd), 1, axis=0)
        return late

    if CASES[case] == "draft-eagle3":
        orig = draft_eagle3.DraftEagle3._features

        def late(self, n):
            return np.roll(orig(self, n), 1, axis=0)
        monkeypatch.setattr(draft_eagle3.DraftEagle3, "_features", late)
    elif case == "draft-mtp":
        monkeypatch.setattr(draft_mtp, "_rows", late_rows(draft_mtp._rows))
    else:
        orig_f = draft_dflash.DraftDFlash._features

        def late_f(self, n):
            return np.roll(orig_f(self, n), 1, axis=0)
        monkeypatch.setattr(draft_dflash.DraftDFlash, "_features", late_f)
    drafted, accepted = _totals(models, case)
    assert drafted > 0
    # measured: 261 drafted, 0 accepted (every draft is the junk token)
    assert accepted <= 0.05 * drafted, (case, drafted, accepted)


def test_negative_control_dflash2_walk_needs_its_predecessor(models, monkeypatch):
    """A lattice walk that always reads predecessor 0's scores (an indexing bug) drafts
    differently on the DFlash2 drafter: the counts held against llama-server see the walk."""
    from speculators import draft_dflash

    right = _totals(models, "dflash2", "-some")

    def walk_from_first(lattice, top_k, p_min):
        return [int(row[int(np.argmax(row[top_k:2 * top_k]))]) for row in lattice[1:]]
    monkeypatch.setattr(draft_dflash, "walk_lattice", walk_from_first)
    wrong = _totals(models, "dflash2", "-some")
    # measured: (78 drafted, 65 accepted) against (91, 61)
    assert wrong != right and wrong[1] < right[1], (right, wrong)


# -- held against native llama-server ----------------------------------------------------------

needs_native = pytest.mark.skipif(not HAVE, reason="native llama.cpp not built; run python tools/native.py build")


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("variant", ["-some"])  # (accepted and rejected drafts; "" adds no path)
@pytest.mark.parametrize("case", CASES)
def test_accepted_counts_match_llama_server(models, case, variant):
    spec_type, target, drafter = _case(models, case, variant)
    extra = ["-md", str(drafter)] if drafter is not None else []
    total_accepted = 0
    for prompt in PROMPTS:
        native = _native_completion(target, spec_type, prompt, extra=extra)
        t = native["timings"]
        theirs = (native["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        ours = _engine_run(target, spec_type, drafter, prompt)
        assert theirs[0] == expected_text(prompt, N_PREDICT), (case, prompt, theirs[0])
        assert ours[0] == theirs[0], (case, prompt)
        assert ours[1:] == theirs[1:], (case, variant, prompt, "drafted/accepted", ours[1:], theirs[1:])
        total_accepted += theirs[2]
    assert total_accepted > 0, f"{case}{variant}: llama-server accepted nothing"


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("case", CASES)
def test_replies_ending_in_eos_match_llama_server(models, case):
    """The target ends its reply (EOS) after "z", inside a drafted run: the same text and
    counts as llama-server at the end of a reply."""
    spec_type, target, drafter = _case(models, case, "-some", eos=True)
    extra = ["-md", str(drafter)] if drafter is not None else []
    for prompt in ("hello world", "speculative decoding is fun"):
        native = _native_completion(target, spec_type, prompt, extra=extra)
        t = native["timings"]
        theirs = (native["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        ours = _engine_run(target, spec_type, drafter, prompt)
        assert theirs[0] == expected_text(prompt, N_PREDICT, EOS_AFTER), (case, prompt, theirs[0])
        assert ours == theirs, (case, prompt, "text/drafted/accepted", ours, theirs)
        assert theirs[2] > 0


@pytest.mark.slow
@needs_native
def test_dspark_confidence_cut_matches_llama_server(models):
    """With p_min 0.5 DSpark's drafts end at the first slot whose confidence is lower (after
    a vowel): the same text and counts as llama-server, and fewer drafts than without."""
    target, drafter = models["target"], models["dspark-conf-some"]
    for prompt in PROMPTS:
        native = _native_completion(target, "draft-dspark", prompt,
                                    extra=["-md", str(drafter), "--spec-draft-p-min", "0.5"])
        t = native["timings"]
        theirs = (native["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        ours = _engine_run(target, "draft-dspark", drafter, prompt, p_min=0.5)
        uncut = _engine_run(target, "draft-dspark", drafter, prompt, p_min=0.0)
        assert ours == theirs, (prompt, "text/drafted/accepted", ours, theirs)
        # measured: (29, 17) (28, 18) (28, 18) against (31, 20) (30, 20) (32, 20) uncut
        assert 0 < ours[2] and ours[1] < uncut[1], (prompt, ours, uncut)


def _native_session(model: Path, spec_type: str, prompts, extra) -> list[tuple]:
    """Greedy completions of ``prompts`` in turn from one llama-server with its prompt
    cache on (each reuses the longest cached prefix, as the engine's reuse_prefix does)."""
    import json
    import subprocess
    import urllib.request

    from tests.test_native_llama_cpp import BIN, _free_port, cpu_flags, wait_healthy

    port = _free_port()
    srv = subprocess.Popen([str(BIN / "llama-server"), "-m", str(model), "-t", "2", "-tb", "2", "-c", "1024",
                            "--no-warmup", "--port", str(port), "--host", "127.0.0.1", "--spec-type", spec_type,
                            "-np", "1", "--no-webui", *cpu_flags(model), *extra], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    out = []
    try:
        wait_healthy(srv, port, lambda: srv.stderr.read().decode()[-2000:])
        for prompt in prompts:
            body = json.dumps({"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                               "cache_prompt": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                         {"Content-Type": "application/json"})
            r = json.load(urllib.request.urlopen(req, timeout=300))
            t = r["timings"]
            out.append((r["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0), t.get("prompt_n")))
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    return out


#: each prompt shares a prefix with the one before (the last is a prefix of it)
REUSE_PROMPTS = ["the quick brown fox", "the quick brown dog jumps", "the quick"]


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("case", CASES)
def test_prefix_reuse_counts_match_llama_server(models, case):
    """Prompts in turn on one engine (reuse_prefix) and one llama-server (prompt cache):
    the drafters' state carried from one reply to the next agrees with llama-server's."""
    spec_type, target, drafter = _case(models, case, "-some")
    native = _native_session(target, spec_type, REUSE_PROMPTS, ["-md", str(drafter)] if drafter else [])
    if target == models["target"]:  # (a hybrid target reuses only from its checkpoints)
        assert native[1][3] < 10 and native[2][3] < 3, "llama-server did not reuse its prompt cache"
    eng = _engine(target, spec_type, drafter, reuse_prefix=True)
    try:
        for prompt, theirs in zip(REUSE_PROMPTS, native):
            ours = _generate(eng, prompt)
            assert ours[0] == theirs[0] == expected_text(prompt, N_PREDICT), (case, prompt)
            assert ours[1:] == theirs[1:3], (case, prompt, "drafted/accepted", ours[1:], theirs[1:3])
            assert theirs[2] > 0
    finally:
        eng.close()
