"""Context shift: a reply that reaches the end of the context keeps going, losslessly.

On the F16 copy of the default model with a 256-token context, a prompt of
about 230 tokens makes the reply reach the end of the context within a few
dozen tokens. With ``context_shift=True`` the engine keeps ``n_keep`` tokens,
drops half of the rest (as llama-server does) and goes on:

* speculation (each n-gram type, and draft-simple) gives exactly the tokens
  of plain decoding that made the same cut, and drafts after the cut;
* the re-decode path (forced here; recurrent, hybrid and small
  sliding-window caches need it) continues exactly as a fresh generation
  from the kept tokens does;
* every speculator's view after the cut is the kept tokens;
* a chain with a drafter that cannot follow ends the reply at the limit,
  saying why.
"""

from __future__ import annotations

import pytest

from speculators.base import DraftRequest, Speculator
from speculators.chain import SpeculatorChain
from speculators.context_shift import (
    MODE_REDECODE, MODE_SHIFT, cut_tokens, follow_shift, plan_shift, shift_memory,
)
from speculators.engine import Engine, EngineConfig, GenerationError
from speculators.events import STOP_CONTEXT, STOP_LENGTH
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import SpecType

from .prompts import TEXT

GREEDY = SamplingParams(temperature=0.0)
N_CTX = 256
N_KEEP = 8
MAX_TOKENS = 64
#: reply tokens moved into the prompt where only the end of the context matters (keeps the tests short)
LATE = 20


def _spec(types: str) -> SpecParams:
    if types == "none":
        return SpecParams()
    p = SpecParams.from_types(types)
    # smaller n-gram sizes than the defaults, so that they draft on a short reply
    p.ngram_mod.n_match = 8
    p.ngram_mod.n_min = 2
    p.ngram_mod.n_max = 16
    p.ngram_simple.size_n = 3
    p.ngram_simple.size_m = 8
    p.ngram_map_k.size_n = 3
    p.ngram_map_k.size_m = 8
    return p


@pytest.fixture(scope="module")
def engine(f16_model_path):
    eng = Engine(str(f16_model_path), EngineConfig(n_ctx=N_CTX, n_threads=2, reuse_prefix=False))
    assert eng.ctx.n_ctx == N_CTX
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt(engine):
    # a paragraph three times and the start of a fourth: the reply goes on copying
    # (n-grams find it) and reaches the end of the context after about 27 tokens
    toks = engine.model.tokenize("\n\n".join([TEXT[:330]] * 3) + "\n\n" + TEXT[:60], add_special=True)
    assert 200 < len(toks) < N_CTX - 16, len(toks)
    return toks


@pytest.fixture(scope="module")
def plain(engine, prompt):
    engine.set_spec(SpecParams())
    res = engine.run(prompt, max_tokens=MAX_TOKENS, sampling=GREEDY, context_shift=True, n_keep=N_KEEP)
    return res, list(engine.last_shifts)


@pytest.fixture(scope="module")
def late(prompt, plain):
    """The prompt and the first 20 tokens of the plain reply: the context is full 7 tokens later."""
    return prompt + plain[0].tokens[:LATE], plain[0].tokens[LATE:]


def test_plain_reply_keeps_going_past_the_context(engine, prompt, plain):
    res, shifts = plain
    assert res.finish_reason == STOP_LENGTH
    assert len(res.tokens) == MAX_TOKENS
    assert len(prompt) + len(res.tokens) > N_CTX
    assert len(shifts) == 1
    sh = shifts[0]
    # the cut happens when the context is full, and keeps n_keep + half the rest
    assert sh.n_before == N_CTX and sh.n_keep == N_KEEP and sh.n_discard == (N_CTX - N_KEEP) // 2
    assert sh.mode == MODE_SHIFT  # a 256-token context: the sliding-window cache is full-size
    assert len(prompt) + sh.n_reply - 1 == N_CTX
    assert "shifted 1 time" in res.message
    # what the context holds now: the kept tokens, then what followed them
    full = prompt + res.tokens
    kept = cut_tokens(full[:N_CTX], N_KEEP, sh.n_discard)
    assert engine.kv_tokens == kept + full[N_CTX:-1]
    assert engine.ctx.pos_max() == len(engine.kv_tokens) - 1


def test_without_context_shift_the_reply_ends_at_the_limit(engine, late):
    engine.set_spec(SpecParams())
    res = engine.run(late[0], max_tokens=MAX_TOKENS, sampling=GREEDY)
    assert res.finish_reason == STOP_CONTEXT
    assert engine.last_shifts == []
    n = N_CTX - len(late[0]) + 1
    assert res.tokens == late[1][:n]


@pytest.mark.parametrize("types", ["ngram-simple", "ngram-mod", "ngram-cache",
                                   "ngram-simple,ngram-map-k,ngram-mod,ngram-cache"])
def test_speculation_across_a_shift_is_lossless(engine, prompt, plain, types):
    engine.set_spec(_spec(types))
    res = engine.run(prompt, max_tokens=MAX_TOKENS, sampling=GREEDY, context_shift=True, n_keep=N_KEEP)
    assert res.tokens == plain[0].tokens
    assert [s.to_dict() | {"seconds": 0} for s in engine.last_shifts] == \
        [s.to_dict() | {"seconds": 0} for s in plain[1]]
    # the speculators keep drafting (and being right) after the cut
    after = plain[1][0].n_reply
    assert any(res.drafted_by[after:]), res.drafted_by


def test_forced_redecode_is_lossless_and_continues_as_a_fresh_prompt(engine, late, plain):
    prompt = late[0]
    max_tokens = 20
    engine.config.force_shift_redecode = True
    try:
        engine.set_spec(SpecParams())
        base = engine.run(prompt, max_tokens=max_tokens, sampling=GREEDY, context_shift=True, n_keep=N_KEEP)
        (sh,) = engine.last_shifts
        assert sh.mode == MODE_REDECODE and sh.n_discard == plain[1][0].n_discard
        assert base.tokens[:sh.n_reply] == late[1][:sh.n_reply]
        engine.set_spec(_spec("ngram-simple,ngram-mod"))
        spec = engine.run(prompt, max_tokens=max_tokens, sampling=GREEDY, context_shift=True, n_keep=N_KEEP)
        assert spec.tokens == base.tokens
        assert engine.last_shifts[0].mode == MODE_REDECODE
    finally:
        engine.config.force_shift_redecode = False
    # after a re-decode the model sees only the kept tokens: exactly a fresh prompt of them
    full = prompt + base.tokens
    kept = cut_tokens(full[:N_CTX], sh.n_keep, sh.n_discard)
    id_last = full[N_CTX]
    engine.set_spec(SpecParams())
    fresh = engine.run(kept + [id_last], max_tokens=max_tokens - sh.n_reply, sampling=GREEDY)
    assert fresh.tokens == base.tokens[sh.n_reply:]


def test_speculators_see_the_kept_tokens_after_a_shift(engine, prompt):
    p = _spec("ngram-simple,ngram-map-k,ngram-mod,ngram-cache")
    chain = SpeculatorChain.from_params(p, {"model": engine.model, "engine": engine})
    try:
        history = (prompt * 2)[:N_CTX]
        chain.begin(history[:200])
        for i in range(200, N_CTX):  # as the loop drafts along the history
            chain.draft(DraftRequest(prompt=history[:i], id_last=history[i], pos0=i, n_max=8))
            chain.accept(0)
        n_keep, n_discard = plan_shift(len(history), N_CTX, N_KEEP)
        kept = cut_tokens(history, n_keep, n_discard)
        seen = {s.name: s for s in chain.speculators}["ngram-cache"].cache_size
        follow_shift(chain, kept, n_keep, n_discard)
        by = {s.name: s for s in chain.speculators}
        assert by["ngram-simple"]._hist.sync(kept)[0] == kept
        m = by["ngram-map-k"].map
        assert m.size_last_begin == len(kept) and m.idx_last_check == len(kept) and m.keys == []
        mod = by["ngram-mod"]
        assert mod.i_last == len(kept) - mod.mod.get_n()
        # (asked only when the drafters before it had nothing: what it had not counted yet
        # stays to count, at its new place)
        assert seen > n_keep + n_discard and by["ngram-cache"].cache_size == seen - n_discard
        # and they draft from the kept history at once
        tail = kept[-20:]
        req = DraftRequest(prompt=kept + tail[:-1], id_last=tail[-1], pos0=len(kept) + 19, n_max=8)
        assert by["ngram-map-k"].draft(req)
        assert by["ngram-simple"].draft(req)
    finally:
        chain.close()


def test_draft_context_shifts_with_the_target(prompt, q2k_model_path):
    """draft-simple moves its own draft context like the target's (no re-decode) and stays in step."""
    from speculators.draft_simple import DraftSimple
    from speculators.llama import Model
    p = SpecParams.from_types("draft-simple")
    p.draft.n_max = 4
    p.draft.p_min = 0.0
    dm = Model(str(q2k_model_path))
    s = DraftSimple(p, dm, n_ctx=N_CTX, n_threads=2)
    try:
        history = (prompt * 2)[:N_CTX]
        s.begin(history[:200])
        s.process(history, 0)
        assert s.kv == history
        n0 = s.n_process_tokens
        n_keep, n_discard = plan_shift(len(history), N_CTX, N_KEEP)
        kept = cut_tokens(history, n_keep, n_discard)
        follow_shift(SpeculatorChain([s]), kept, n_keep, n_discard)
        assert s.kv == kept and s.target == kept
        assert (s.ctx.pos_min(), s.ctx.pos_max()) == (0, len(kept) - 1)
        assert s.n_process_tokens == n0  # moved, not decoded again
        # it drafts from there without bringing its context in step again
        d = s.draft(DraftRequest(prompt=kept, id_last=history[n_keep + n_discard], pos0=len(kept), n_max=4))
        assert len(d) == 4
        assert s.n_process_tokens == n0 and s.kv == kept
    finally:
        s.close()
        dm.close()


def test_paused_draft_model_is_not_fed_by_a_shift(prompt, q2k_model_path):
    """A draft model Automatic paused decodes nothing at a context shift; it catches up on the
    kept tokens only when it is asked to draft, and then drafts what an unpaused one drafts."""
    from speculators.draft_simple import DraftSimple
    from speculators.llama import Model
    p = SpecParams.from_types("draft-simple")
    p.draft.n_max = 4
    p.draft.p_min = 0.0
    dm = Model(str(q2k_model_path))
    paused = DraftSimple(p, dm, n_ctx=N_CTX, n_threads=2)
    fresh = DraftSimple(p, dm, n_ctx=N_CTX, n_threads=2)
    try:
        history = (prompt * 2)[:N_CTX]
        paused.begin(history[:64])
        paused.process(history[:64], 0)
        paused.set_upkeep(False)
        paused.process(history[64:], 64)          # only noted: the draft context holds 64 tokens
        assert len(paused.kv) == 64 and paused.target == history
        n0 = paused.n_process_tokens
        n_keep, n_discard = plan_shift(len(history), N_CTX, N_KEEP)
        kept = cut_tokens(history, n_keep, n_discard)
        follow_shift(SpeculatorChain([paused]), kept, n_keep, n_discard)
        assert paused.target == kept
        assert paused.n_process_tokens == n0      # nothing decoded while paused
        req = DraftRequest(prompt=kept, id_last=history[n_keep + n_discard], pos0=len(kept), n_max=4)
        d = paused.draft(req)
        assert paused.kv == kept and paused.n_catchups == 1
        fresh.begin(kept)
        fresh.process(kept, 0)
        assert d == fresh.draft(req) and len(d) == 4
    finally:
        paused.close()
        fresh.close()
        dm.close()


def test_memory_shift_moves_positions_and_keeps_going(engine, prompt):
    ctx, model = engine.ctx, engine.model
    history = (prompt * 2)[:N_CTX - 1]
    ctx.clear()
    engine.kv_tokens = []
    ctx.decode(history, 0, logits="none")
    n_keep, n_discard = plan_shift(len(history), N_CTX, N_KEEP)
    assert shift_memory(ctx, model, history, n_keep, n_discard) == MODE_SHIFT
    assert (ctx.pos_min(), ctx.pos_max()) == (0, len(history) - n_discard - 1)
    # the freed cells take new tokens at the following positions
    ctx.decode(history[:n_discard], len(history) - n_discard, logits="last")
    assert ctx.pos_max() == len(history) - 1
    ctx.clear()


class _Opaque(Speculator):
    """A drafter that cannot follow a shift (as the hidden-state drafters)."""

    type = SpecType.DRAFT_MTP
    can_shift = False


def test_a_drafter_that_cannot_follow_ends_the_reply_at_the_limit(engine, late):
    old = engine.chain
    engine.chain = SpeculatorChain([_Opaque(4)])
    try:
        res = engine.run(late[0], max_tokens=MAX_TOKENS, sampling=GREEDY, context_shift=True, n_keep=N_KEEP)
        assert res.finish_reason == STOP_CONTEXT
        assert "context shift is not supported with draft-mtp" in res.message
        assert engine.last_shifts == []
        assert res.tokens == late[1][:N_CTX - len(late[0]) + 1]
    finally:
        engine.chain.close()
        engine.chain = old


def test_negative_n_keep_is_refused(engine, prompt):
    with pytest.raises(GenerationError, match="n_keep"):
        engine.run(prompt, max_tokens=4, context_shift=True, n_keep=-1)


def test_ngram_cache_counts_the_last_steps_tokens_after_a_shift():
    """The tokens accepted in the step that filled the context were not counted yet (the
    context cache counts at its next draft); after the shift they are, at their new places."""
    from speculators.ngram_cache import NgramCacheSpeculator
    s = NgramCacheSpeculator()
    history = list(range(100, 164))
    s.draft(DraftRequest(prompt=history[:58], id_last=history[58], pos0=58))   # has seen 0..58
    # that step accepted history[59:64]: the context is full and is cut
    n_keep, n_discard = 4, 30
    kept = cut_tokens(history, n_keep, n_discard)
    follow_shift(SpeculatorChain([s]), kept, n_keep, n_discard)
    assert s.cache_size == len(kept) - 5
    s.draft(DraftRequest(prompt=kept, id_last=999, pos0=len(kept)))
    assert s.context_cache[(history[60],)] == {history[61]: 1}
    assert s.context_cache[(history[63],)] == {999: 1}
    assert s.cache_size == len(kept) + 1
