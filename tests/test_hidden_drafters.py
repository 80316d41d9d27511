"""Hidden-state drafters on tiny hand-built models: lossless, counted, refused when wrong."""

from __future__ import annotations

import json

import pytest

from speculators import ext
from speculators.engine import Engine, EngineConfig
import numpy as np

from speculators.base import DraftRequest
from speculators.events import STOP_EOG, STOP_LENGTH, FinishEvent, StepEvent
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
    # no recurrent-state snapshots: every verify batch is checkpointed and a partial rejection
    # is rolled back by restoring the checkpoint and replaying the accepted tokens (the path a
    # hybrid target takes when the chat switches to a hidden-state type after loading)
    eng = Engine(str(qwen35_mtp_path),
                 EngineConfig(n_ctx=512, n_batch=16, n_threads=1, reuse_prefix=False, n_rs_seq=0), _mtp_spec())
    yield eng
    eng.close()


def test_the_chats_engine_on_a_hybrid_gets_the_load_plan_and_rolls_back_from_snapshots(qwen35_mtp_path):
    """The chat loads its model before it builds the chain (app.runtime.load_chat_engine, which
    the runner process calls): the model and context are still made for the spec, as bench and
    llama-server make them, so draft-mtp rolls back from recurrent-state snapshots."""
    from app.options import ModelOptions
    from app.runtime import load_chat_engine
    spec = _mtp_spec()
    eng = load_chat_engine(ModelOptions(model=str(qwen35_mtp_path), ctx_size=512, threads=1), spec)
    try:
        assert eng.chain is not None and not eng.chain.speculators    # no chain yet
        assert eng.model.load_mtp and eng.seq_rm_type == "rs" and eng.n_rs_seq == spec.draft.n_max
        eng.set_spec(spec)
        calls = {"get": 0, "set": 0}
        real_get, real_set = eng.ctx.state_get, eng.ctx.state_set
        eng.ctx.state_get = lambda *a, **k: (calls.__setitem__("get", calls["get"] + 1), real_get(*a, **k))[1]
        eng.ctx.state_set = lambda *a, **k: (calls.__setitem__("set", calls["set"] + 1), real_set(*a, **k))[1]
        eng.config.reuse_prefix = False
        drafted = accepted = ck_drafted = ck_accepted = 0
        for text in MTP_PROMPTS:
            r = _run(eng, eng.model.tokenize(text))
            drafted, accepted = drafted + r.stats.n_drafted, accepted + r.stats.n_accepted
        assert drafted > accepted > 0                  # drafts were rolled back ...
        assert calls == {"get": 0, "set": 0}           # ... from snapshots, not checkpoints
    finally:
        eng.close()


def test_mtp_on_a_hybrid_rolls_back_from_state_snapshots(qwen35_mtp_path, mtp_engine):
    """Made with draft-mtp, a hybrid target keeps draft.n_max recurrent-state snapshots as
    llama-server gives it: a rejected draft is rolled back without a checkpoint or a replay,
    and the text is the same."""
    eng = Engine(str(qwen35_mtp_path), EngineConfig(n_ctx=512, n_batch=16, n_threads=1, reuse_prefix=False),
                 _mtp_spec())
    try:
        assert eng.seq_rm_type == "rs" and eng.n_rs_seq == 4 and eng.use_checkpoints
        calls = {"get": 0, "set": 0}
        real_get, real_set = eng.ctx.state_get, eng.ctx.state_set
        eng.ctx.state_get = lambda *a, **k: (calls.__setitem__("get", calls["get"] + 1), real_get(*a, **k))[1]
        eng.ctx.state_set = lambda *a, **k: (calls.__setitem__("set", calls["set"] + 1), real_set(*a, **k))[1]
        mtp_engine.set_spec(_mtp_spec())
        drafted = accepted = ck_drafted = ck_accepted = 0
        for text in MTP_PROMPTS:
            toks = eng.model.tokenize(text)
            r = _run(eng, toks)
            r_ckpt = _run(mtp_engine, toks)
            assert r.tokens == r_ckpt.tokens, text
            # the counts differ where the checkpointed path restored a step: llama-server replays
            # the accepted tokens there as a draft of their own and counts them so (held against
            # llama-server in tests/test_checkpoint_state.py); without a restore they agree
            drafted, accepted = drafted + r.stats.n_drafted, accepted + r.stats.n_accepted
            ck_drafted, ck_accepted = ck_drafted + r_ckpt.stats.n_drafted, ck_accepted + r_ckpt.stats.n_accepted
        assert drafted > accepted > 0   # drafts were rolled back
        assert ck_drafted > ck_accepted > 0
        assert calls == {"get": 0, "set": 0}
        # plain decoding keeps the reference's context (no snapshots)
        plain = Engine(str(qwen35_mtp_path), EngineConfig(n_ctx=512, n_batch=16, n_threads=1))
        assert plain.seq_rm_type == "full" and plain.n_rs_seq == 0
        plain.close()
    finally:
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


def test_mtp_rollback_replay_keeps_the_mtp_cells_right(mtp_engine):
    """After a partial rejection the checkpointed target re-decodes the accepted tokens. At the
    end of a reply, every MTP cell of the kept sequence must pair its token with the hidden
    state a single prefill of the same tokens gives (no zero row from the replay)."""
    eng = mtp_engine
    eng.set_spec(_mtp_spec())
    (s,) = eng.chain.speculators
    rows: dict[int, np.ndarray] = {}
    in_process = [False]
    real_add, real_process = s.batch.add, s._process

    def add(token, pos, output, h):
        if in_process[0]:
            rows[pos] = np.array(h, dtype=np.float32, copy=True)  # the last write stays in the cell
        return real_add(token, pos, output, h)

    def process(tokens, pos0):
        in_process[0] = True
        try:
            return real_process(tokens, pos0)
        finally:
            in_process[0] = False

    s.batch.add, s._process = add, process
    partial = 0
    try:
        for text in MTP_PROMPTS[:2]:
            rows.clear()
            for ev in eng.generate(eng.model.tokenize(text), max_tokens=48, sampling=GREEDY):
                if isinstance(ev, StepEvent) and ev.n_drafted and ev.n_accepted < ev.n_drafted:
                    partial += 1
            hist = list(eng.kv_tokens)
            got = dict(rows)
            # the same tokens in one prefill (chunks of n_batch), mirrored afresh
            rows.clear()
            eng.ctx.clear()
            s.ctx.clear()
            s.pending_pos, s._last_batch = 0, None
            eng.ctx.decode(hist, 0, logits="none")
            eng.ctx.clear()
            eng.kv_tokens = []
            for pos in range(1, len(hist)):
                assert got[pos].any(), f"{text!r}: position {pos} paired with a zero hidden state"
                np.testing.assert_allclose(got[pos], rows[pos], rtol=0, atol=1e-3,
                                           err_msg=f"{text!r}: position {pos}")
    finally:
        s.batch.add, s._process = real_add, real_process
        eng.set_spec(SpecParams())
    assert partial > 0  # rejections happened, so the engine replayed after restoring
    assert s.n_replays_skipped > 0


def test_mtp_draft_after_a_partial_rejection_without_replay(mtp_engine):
    """A target that can drop a partial sequence does not re-decode after a rejection: accept()
    must drop the rejected drafts' MTP cells itself, or the next draft decode fails."""
    eng = mtp_engine
    eng.set_spec(_mtp_spec(n_max=4))
    (s,) = eng.chain.speculators
    try:
        toks = eng.model.tokenize("hello world")
        eng.ctx.clear()
        eng.ctx.decode(toks, 0, logits="last")  # the hook mirrors it on the MTP context
        id_last = int(np.argmax(eng.ctx.logits(-1)))
        pos0 = len(toks)
        d = s.draft(DraftRequest(prompt=toks, id_last=id_last, pos0=pos0, n_max=4))
        assert len(d) == 4
        eng.ctx.decode([id_last] + d, pos0, logits="all")  # verify: MTP cells pos0..pos0+4
        assert s.ctx.pos_max() == pos0 + 4
        s.accept(1, False)  # id_last and d[0] kept, d[1:] rejected
        assert s.ctx.pos_max() == pos0 + 1 and s.pending_pos == pos0 + 2
        d2 = s.draft(DraftRequest(prompt=toks + [id_last, d[0]], id_last=d[1], pos0=pos0 + 2, n_max=4))
        assert len(d2) == 4  # the draft decode ran
        assert s.ctx.pos_max() == pos0 + 1  # and its own cells are gone again
    finally:
        eng.ctx.clear()
        eng.kv_tokens = []
        eng.set_spec(SpecParams())


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


def test_block_drafters_without_drafter_file(llama_engine):
    chain = llama_engine.set_spec(SpecParams.from_types("draft-dflash,draft-dspark"))
    assert "no DFlash drafter is set (--spec-draft-model PATH)" in chain.skipped["draft-dflash"]
    assert "no DSpark drafter is set (--spec-draft-model PATH)" in chain.skipped["draft-dspark"]


# -- DFlash / DFlash2 / DSpark -----------------------------------------------------------------

from speculators import draft_hidden  # noqa: E402
from tests.hidden_models import (  # noqa: E402,F401
    dflash2_path, dflash_bad_layers_path, dflash_path, dspark_bad_hidden_path,
    dspark_bonus_anchor_path, dspark_path,
)

BLOCK_PROMPTS = MTP_PROMPTS


def _block_spec(kind: str, path, n_max=4, p_min=0.0, n_min=0) -> SpecParams:
    spec = SpecParams.from_types(kind)
    spec.draft.n_max = n_max
    spec.draft.n_min = n_min
    spec.draft.p_min = p_min
    spec.draft.model = str(path)
    return spec


def _lossless_over_prompts(eng, kind, path, **kw):
    """Greedy with the drafter equals ``none`` token for token; returns the summed stats."""
    finishes, acc, gen = set(), 0, 0
    for text in BLOCK_PROMPTS:
        toks = eng.model.tokenize(text)
        eng.set_spec(SpecParams())
        r0 = _run(eng, toks, 40)
        chain = eng.set_spec(_block_spec(kind, path, **kw))
        assert chain.skipped == {}, chain.skipped
        r = _run(eng, toks, 40)
        assert r.tokens == r0.tokens, (kind, text)
        finishes.add(r.finish_reason)
        s = r.stats.speculators[kind]
        # drafts generated, and every one verified by the target
        assert s.n_gen_drafts > 0 and s.n_call_accept == s.n_gen_drafts, (kind, text)
        assert s.n_gen_tokens >= s.n_acc_tokens
        acc += s.n_acc_tokens
        gen += s.n_gen_tokens
    eng.set_spec(SpecParams())
    assert len(eng.model.tokenize(BLOCK_PROMPTS[1])) > eng.ctx.n_batch  # several prefill chunks
    assert finishes == {STOP_LENGTH, STOP_EOG}  # one reply ends early
    return acc, gen


def test_dflash_lossless_and_counted(llama_engine, dflash_path):
    acc, gen = _lossless_over_prompts(llama_engine, "draft-dflash", dflash_path, n_max=3)
    assert gen > 0


def test_dflash2_selector_lossless_and_counted(llama_engine, dflash2_path):
    chain = llama_engine.set_spec(_block_spec("draft-dflash", dflash2_path, n_max=3))
    s = chain.speculators[0]
    assert s.is_dflash2 and s.selector_top_k == 4
    _lossless_over_prompts(llama_engine, "draft-dflash", dflash2_path, n_max=3)


def test_dspark_lossless_and_counted(llama_engine, dspark_path):
    acc, gen = _lossless_over_prompts(llama_engine, "draft-dspark", dspark_path, n_max=4)
    # anchor-first: slot 0 reads id_last and the shared LM head, so the random drafter is
    # right now and then -- both the accept and the rollback paths run
    assert 0 < acc < gen


def test_dspark_confidence_cut_off_stays_lossless(llama_engine, dspark_path):
    eng = llama_engine
    toks = eng.model.tokenize(BLOCK_PROMPTS[0])
    r0 = _run(eng, toks, 24)
    # every slot's confidence is below 0.999: no draft survives the cut-off
    eng.set_spec(_block_spec("draft-dspark", dspark_path, p_min=0.999))
    r = _run(eng, toks, 24)
    s = r.stats.speculators["draft-dspark"]
    assert r.tokens == r0.tokens
    assert s.n_call_draft > 0 and s.n_gen_drafts == 0
    # a low threshold keeps whole blocks
    eng.set_spec(_block_spec("draft-dspark", dspark_path, p_min=0.01))
    r = _run(eng, toks, 24)
    s = r.stats.speculators["draft-dspark"]
    assert r.tokens == r0.tokens and s.n_gen_drafts > 0
    eng.set_spec(SpecParams())


def test_dspark_bonus_anchor_layout(llama_engine, dspark_bonus_anchor_path):
    """``sample_from_anchor = false``: slot 0 is a bonus anchor, drafts come from the masks."""
    chain = llama_engine.set_spec(_block_spec("draft-dspark", dspark_bonus_anchor_path, n_max=8))
    s = chain.speculators[0]
    assert not s.anchor_first and s.n_max == 3  # block size 4 - the anchor
    toks = llama_engine.model.tokenize(BLOCK_PROMPTS[0])
    r = _run(llama_engine, toks, 24)
    st = r.stats.speculators["draft-dspark"]
    assert st.n_gen_drafts > 0 and st.n_gen_tokens <= 3 * st.n_gen_drafts
    # without a confidence head a confidence threshold is refused, as in the reference
    chain = llama_engine.set_spec(_block_spec("draft-dspark", dspark_bonus_anchor_path, p_min=0.5))
    assert "DSpark drafter has no confidence head" in chain.skipped["draft-dspark"]
    llama_engine.set_spec(SpecParams())


def test_block_size_clamps_n_max_and_n_min(llama_engine, dflash_path, dspark_path):
    chain = llama_engine.set_spec(_block_spec("draft-dflash", dflash_path, n_max=10, n_min=7))
    s = chain.speculators[0]
    assert (s.block_size, s.n_max, s.n_min) == (4, 3, 3)  # [id_last, 3 masks]
    chain = llama_engine.set_spec(_block_spec("draft-dspark", dspark_path, n_max=10))
    s = chain.speculators[0]
    assert (s.anchor_first, s.n_max) == (True, 4)  # every slot of the block is a draft
    assert chain.n_max == 4
    llama_engine.set_spec(SpecParams())


def test_dflash_refuses_wrong_layer_ids(llama_engine, dflash_bad_layers_path):
    chain = llama_engine.set_spec(_block_spec("draft-dflash", dflash_bad_layers_path))
    why = chain.skipped["draft-dflash"]
    assert "reads target layers [1, 9, 17], but the target has 4 layers" in why


def test_dspark_refuses_wrong_hidden_size(llama_engine, dspark_bad_hidden_path):
    chain = llama_engine.set_spec(_block_spec("draft-dspark", dspark_bad_hidden_path))
    why = chain.skipped["draft-dspark"]
    assert "expects a target hidden size of 48, but the target's is 32" in why


def test_dspark_refuses_a_plain_dflash_file(llama_engine, dflash_path, eagle3_path):
    chain = llama_engine.set_spec(_block_spec("draft-dspark", dflash_path))
    assert "without DSpark's Markov head" in chain.skipped["draft-dspark"]
    chain = llama_engine.set_spec(_block_spec("draft-dflash", eagle3_path))
    assert "is not a DFlash drafter (architecture 'eagle3')" in chain.skipped["draft-dflash"]


def test_block_drafters_report_missing_symbol_and_arch(llama_engine, dflash_path, monkeypatch):
    real = ext._lookup

    def fake(name):
        return None if name == "llama_model_dflash_selector_top_k" else real(name)

    monkeypatch.setattr(ext, "_cache", {})
    monkeypatch.setattr(ext, "_lookup", fake)
    chain = llama_engine.set_spec(_block_spec("draft-dflash", dflash_path))
    assert "this llama.cpp build lacks llama_model_dflash_selector_top_k" in chain.skipped["draft-dflash"]
    monkeypatch.undo()

    import speculators.draft_simple as ds
    from speculators.llama import ModelError

    def no_arch(path, n_gpu_layers=-1, devices=None):
        raise ModelError(f"cannot load model {path}: unknown model architecture: 'dflash'")

    monkeypatch.setattr(ds, "acquire_draft_model", no_arch)
    chain = llama_engine.set_spec(_block_spec("draft-dspark", dflash_path))
    assert "does not know the 'dflash' architecture" in chain.skipped["draft-dspark"]
    monkeypatch.undo()
    llama_engine.set_spec(SpecParams())


def test_block_drafter_releases_target_outputs(llama_engine, dflash_path, eagle3_path):
    """Layer-input outputs are reference-counted across speculators and chains."""
    eng = llama_engine
    eng.set_spec(_block_spec("draft-dflash", dflash_path))
    users = eng.ctx.__dict__["_hidden_output_users"]
    assert all(users[("layer", i)] == 1 for i in (0, 2, 3))
    eng.set_spec(_block_spec("draft-dflash", dflash_path))  # the new chain is built first
    assert all(users[("layer", i)] == 1 for i in (0, 2, 3))
    eng.set_spec(SpecParams())
    assert all(users[("layer", i)] == 0 for i in (0, 2, 3))


def test_output_limits():
    assert draft_hidden.output_limits(512, 1, 3) == (4, 4)
    assert draft_hidden.output_limits(4, 3, 3) == (4, 4)
    assert draft_hidden.output_limits(512, 2, -1) == (2, 1)


def test_block_drafters_with_checkpoints_and_prefix_reuse(llama_target_path, dspark_path, dflash2_path):
    """Checkpoint rollback re-decodes the accepted tokens (the injection runs again);
    prefix reuse keeps the draft cache's matching prefix."""
    prompts = [BLOCK_PROMPTS[1], BLOCK_PROMPTS[1][:40] + " and stops", BLOCK_PROMPTS[0]]
    for cfg in (dict(force_checkpoints=True, reuse_prefix=False), dict(reuse_prefix=True)):
        eng = Engine(str(llama_target_path), EngineConfig(n_ctx=256, n_batch=16, n_threads=1, **cfg))
        try:
            base = [_run(eng, eng.model.tokenize(t), 24).tokens for t in prompts]
            for kind, path in (("draft-dspark", dspark_path), ("draft-dflash", dflash2_path)):
                eng.set_spec(_block_spec(kind, path, n_max=4))
                n_drafts = n_reused = 0
                for t, b in zip(prompts, base):
                    r = _run(eng, eng.model.tokenize(t), 24)
                    assert r.tokens == b, (cfg, kind, t)
                    n_drafts += r.stats.speculators[kind].n_gen_drafts
                    n_reused += r.stats.n_prompt_reused
                assert n_drafts > 0
                assert (n_reused > 0) == bool(cfg.get("reuse_prefix"))
                eng.set_spec(SpecParams())
        finally:
            eng.close()


def test_dflash_on_gemma3_is_refused_with_the_reason(default_model_path, hidden_models_dir):
    """The default model's graph (gemma3) records no layer inputs in the bundled llama.cpp."""
    from tests.hidden_models import write_dflash
    drafter = write_dflash(hidden_models_dir / "gemma3-dflash.gguf", target_hidden=640,
                           target_layers=(1, 9, 16))
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=256, n_batch=16, n_threads=1))
    try:
        chain = eng.set_spec(_block_spec("draft-dflash", drafter))
        assert "architecture 'gemma3' does not expose its layer inputs" in chain.skipped["draft-dflash"]
    finally:
        eng.close()


def test_bench_loads_a_hybrid_target_as_the_chat_loads_it_for_its_rows(qwen35_mtp_path):
    """bench runs every row on one engine, loaded for the rows it measures as the chat and
    generate load the target for each of them: with a draft-mtp row, the MTP layers and as
    many recurrent-state snapshots as its drafts are long, so a rejected draft is rolled back
    from a snapshot (not from a checkpoint and a replay, which the chat never takes there)."""
    from tests.test_cli import draftlight

    def bench(*types):
        r = draftlight("bench", "-m", str(qwen35_mtp_path), "--raw", "-p", "the quick brown fox", "-n", "24",
                       "--rounds", "1", "--no-baseline", "--json", "-c", "512", "-t", "1",
                       "--spec-draft-n-max", "4", "--spec-draft-p-min", "0", *[a for t in types for a in ("--spec-type", t)])
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    with_mtp = bench("ngram-simple", "draft-mtp")
    assert with_mtp["load_plan"] == {"load_mtp": True, "n_rs_seq": 4}   # n_rs_seq as llama.cpp reports it
    row = next(r for r in with_mtp["rows"] if r["name"] == "draft-mtp")
    assert row["drafted"] > 0
    assert bench("ngram-simple")["load_plan"] == {"load_mtp": False, "n_rs_seq": 0}
