"""Hidden-state drafters on tiny hand-built models: lossless, counted, refused when wrong."""

from __future__ import annotations

import pytest

from speculators import ext
from speculators.engine import Engine, EngineConfig
from speculators.events import STOP_EOG, STOP_LENGTH, FinishEvent
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from tests.hidden_models import (  # noqa: F401  (session fixtures)
    hidden_models_dir, qwen35_mtp_path, qwen35_nomtp_path, qwen35_wide_mtp_path,
)

GREEDY = SamplingParams(temperature=0.0)

MTP_PROMPTS = [
    "hello world",
    # well over n_batch=16 tokens: the prefill is decoded in several chunks
    "the quick brown fox jumps over the lazy dog and keeps running far away",
    "abc",  # the tiny model ends its reply after a few tokens
    "Zebra 42!",
]


def _run(eng: Engine, toks, max_tokens=48):
    for ev in eng.generate(toks, max_tokens=max_tokens, sampling=GREEDY):
        if isinstance(ev, FinishEvent):
            return ev.result
    raise AssertionError("no finish event")


def _mtp_spec(n_max=4) -> SpecParams:
    spec = SpecParams.from_types("draft-mtp")
    spec.draft.n_max = n_max
    spec.draft.p_min = 0.0
    return spec


@pytest.fixture(scope="module")
def mtp_engine(qwen35_mtp_path):
    eng = Engine(str(qwen35_mtp_path),
                 EngineConfig(n_ctx=512, n_batch=16, n_threads=1, reuse_prefix=False), _mtp_spec())
    yield eng
    eng.close()


def test_ext_reports_missing_symbols_by_name():
    with pytest.raises(ext.MissingSymbolError) as ei:
        ext.require("llama_definitely_not_exported")
    assert "this llama.cpp build lacks llama_definitely_not_exported" in str(ei.value)
    # what the reference calls is exported by the bundled build
    for name in ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn_ith",
                 "llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp",
                 "llama_model_target_layer_ids", "llama_model_dflash_selector_top_k"):
        assert ext.has(name), name


def test_mtp_target_is_hybrid_and_uses_checkpoints(mtp_engine):
    assert mtp_engine.model.is_hybrid
    assert mtp_engine.seq_rm_type == "full" and mtp_engine.use_checkpoints
    assert mtp_engine.chain.skipped == {}
    assert [s.name for s in mtp_engine.chain.speculators] == ["draft-mtp"]


def test_mtp_lossless_and_counted(mtp_engine):
    eng = mtp_engine
    finishes = set()
    total_acc = total_gen = 0
    for text in MTP_PROMPTS:
        toks = eng.model.tokenize(text)
        eng.set_spec(_mtp_spec())
        r = _run(eng, toks)
        eng.set_spec(SpecParams())
        r0 = _run(eng, toks)
        assert r.tokens == r0.tokens, text
        finishes.add(r.finish_reason)
        s = r.stats.speculators["draft-mtp"]
        assert s.n_gen_drafts > 0 and s.n_call_accept == s.n_gen_drafts
        assert s.n_gen_tokens >= s.n_acc_tokens
        total_acc += s.n_acc_tokens
        total_gen += s.n_gen_tokens
    assert len(eng.model.tokenize(MTP_PROMPTS[1])) > eng.ctx.n_batch
    assert finishes == {STOP_LENGTH, STOP_EOG}  # one reply ends early
    # the test model's MTP head is built to be right often, not always
    assert 0 < total_acc < total_gen


def test_mtp_after_loading_without_mtp_layers(qwen35_mtp_path):
    """A target loaded for another type reloads its MTP layers for draft-mtp."""
    eng = Engine(str(qwen35_mtp_path), EngineConfig(n_ctx=256, n_batch=16, n_threads=1, reuse_prefix=False))
    try:
        assert not eng.model.load_mtp
        toks = eng.model.tokenize("hello world")
        r0 = _run(eng, toks, 24)
        eng.set_spec(_mtp_spec(n_max=3))
        assert eng.chain.skipped == {}
        r = _run(eng, toks, 24)
        assert r.tokens == r0.tokens
        assert r.stats.speculators["draft-mtp"].n_gen_drafts > 0
    finally:
        eng.close()


def test_mtp_refused_without_nextn_layers(qwen35_nomtp_path):
    eng = Engine(str(qwen35_nomtp_path), EngineConfig(n_ctx=128, n_batch=16, n_threads=1), _mtp_spec())
    try:
        assert "has no MTP (NextN) layers" in eng.chain.skipped["draft-mtp"]
    finally:
        eng.close()


def test_mtp_refuses_mismatched_hidden_size(mtp_engine, qwen35_wide_mtp_path):
    spec = _mtp_spec()
    spec.draft.model = str(qwen35_wide_mtp_path)
    chain = mtp_engine.set_spec(spec)
    try:
        why = chain.skipped["draft-mtp"]
        assert "hidden size 48 does not match the target's 32" in why
    finally:
        mtp_engine.set_spec(SpecParams())


def test_missing_symbol_is_reported(mtp_engine, monkeypatch):
    real = ext._lookup

    def fake(name):
        return None if name == "llama_get_embeddings_nextn_ith" else real(name)

    monkeypatch.setattr(ext, "_cache", {})
    monkeypatch.setattr(ext, "_lookup", fake)
    chain = mtp_engine.set_spec(_mtp_spec())
    try:
        assert "this llama.cpp build lacks llama_get_embeddings_nextn_ith" in chain.skipped["draft-mtp"]
    finally:
        monkeypatch.undo()
        mtp_engine.set_spec(SpecParams())


# -- EAGLE3 ----------------------------------------------------------------------------------

from tests.hidden_models import (  # noqa: E402,F401
    eagle3_bad_hidden_path, eagle3_bad_layers_path, eagle3_path, llama_target_path, write_eagle3,
)

EAGLE3_PROMPTS = MTP_PROMPTS


def _eagle3_spec(path, n_max=4) -> SpecParams:
    spec = SpecParams.from_types("draft-eagle3")
    spec.draft.n_max = n_max
    spec.draft.p_min = 0.0
    spec.draft.model = str(path)
    return spec


@pytest.fixture(scope="module")
def llama_engine(llama_target_path):
    eng = Engine(str(llama_target_path),
                 EngineConfig(n_ctx=512, n_batch=16, n_threads=1, reuse_prefix=False))
    yield eng
    eng.close()


def test_eagle3_lossless_and_counted(llama_engine, eagle3_path):
    eng = llama_engine
    finishes = set()
    for text in EAGLE3_PROMPTS:
        toks = eng.model.tokenize(text)
        chain = eng.set_spec(_eagle3_spec(eagle3_path))
        assert chain.skipped == {}
        r = _run(eng, toks, 40)
        eng.set_spec(SpecParams())
        r0 = _run(eng, toks, 40)
        assert r.tokens == r0.tokens, text
        finishes.add(r.finish_reason)
        s = r.stats.speculators["draft-eagle3"]
        assert s.n_gen_drafts > 0 and s.n_call_accept == s.n_gen_drafts
    assert len(eng.model.tokenize(EAGLE3_PROMPTS[1])) > eng.ctx.n_batch
    assert finishes == {STOP_LENGTH, STOP_EOG}


def test_eagle3_state_round_trip(llama_engine, eagle3_path):
    eng = llama_engine
    eng.set_spec(_eagle3_spec(eagle3_path))
    try:
        spec = eng.chain.speculators[0]
        _run(eng, eng.model.tokenize("hello world"), 8)
        data = spec.get_state_raw()
        assert data is not None and len(data) == 4 + 4 * spec.n_embd_dec
        pos, g = spec.pending_pos, spec.pending_g.copy()
        spec.pending_pos, spec.pending_g = -1, g * 0
        spec.set_state_raw(data)
        assert spec.pending_pos == pos and (spec.pending_g == g).all()
        # as in the reference, only recurrent/hybrid targets need the stash
        assert spec.get_state() is None and eng.chain.get_state() is None
        spec._stash = True
        assert eng.chain.get_state() == data
        eng.chain.set_state(data)
        assert spec.pending_pos == pos
    finally:
        eng.set_spec(SpecParams())


def test_eagle3_refuses_wrong_layer_ids(llama_engine, eagle3_bad_layers_path):
    chain = llama_engine.set_spec(_eagle3_spec(eagle3_bad_layers_path))
    why = chain.skipped["draft-eagle3"]
    assert "reads target layers [2, 9, 15], but the target has 4 layers" in why


def test_eagle3_refuses_wrong_hidden_size(llama_engine, eagle3_bad_hidden_path):
    chain = llama_engine.set_spec(_eagle3_spec(eagle3_bad_hidden_path))
    why = chain.skipped["draft-eagle3"]
    assert "expects a target hidden size of 48, but the target's is 32" in why


def test_eagle3_without_drafter_file(llama_engine):
    chain = llama_engine.set_spec(SpecParams.from_types("draft-eagle3"))
    assert "--spec-draft-model" in chain.skipped["draft-eagle3"]


def test_eagle3_on_gemma3_is_refused_with_the_reason(default_model_path, hidden_models_dir):
    """gemma3's graph in the bundled llama.cpp records no layer inputs: say so, don't abort."""
    drafter = write_eagle3(hidden_models_dir / "gemma3-eagle3.gguf", target_hidden=640,
                           target_layers=(2, 9, 15), n_embd=64)
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=256, n_batch=16, n_threads=1))
    try:
        chain = eng.set_spec(_eagle3_spec(drafter))
        why = chain.skipped["draft-eagle3"]
        assert "architecture 'gemma3' does not expose its layer inputs" in why
    finally:
        eng.close()


def test_block_drafters_are_reported_unimplemented(llama_engine):
    chain = llama_engine.set_spec(SpecParams.from_types("draft-dflash,draft-dspark"))
    assert set(chain.skipped) == {"draft-dflash", "draft-dspark"}
