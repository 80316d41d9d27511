"""draft-simple: lossless with a real draft model, credited right in a chain,
the reference's draft rules, the vocabulary check, and type detection.

The target is the F16 copy of the default model and the draft its Q2_K copy
(the session fixtures of conftest.py); one engine and one loaded draft
model serve every test (the draft model cache keeps it between set_spec
calls).
"""

from __future__ import annotations

import numpy as np
import pytest

from speculators import draft_simple
from speculators.base import DraftRequest
from speculators.compat import (IncompatibleDraftModel, VocabSummary, check_compatible, compare_vocabs,
                                compatibility, vocab_of_gguf, vocab_of_model)
from speculators.events import FinishEvent, StepEvent
from speculators.gguf_detect import gguf_summary, read_gguf, types_from_gguf
from speculators.llama import Model, ModelError
from speculators.params import DraftParams, SpecParams
from speculators.sampling import SamplingParams
from speculators.types import SpecType

from .gguf_factory import write_header_only, write_tiny_llama
from .lossless import check_lossless

GREEDY = SamplingParams(temperature=0.0)
MAX_TOKENS = 48

PROMPTS = [
    "Write a short poem about the sea.",
    "List three prime numbers and explain why they are prime.",
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the factorial of n.",
    "Explain photosynthesis to a child.",
    "Give me a recipe for pancakes.",
    "Count from one to twenty in words, separated by commas.",
    "Translate 'good morning, how are you?' into Spanish and German.",
    "Describe the rules of chess in a few sentences.",
    "What are the benefits of regular exercise?",
]
#: the chain test runs on a few of them (the n-gram type needs repetitive replies)
CHAIN_PROMPTS = (0, 3, 6, 8)


def draft_spec(path, types: str = "draft-simple", **draft) -> SpecParams:
    p = SpecParams.from_types(types, draft=DraftParams(model=str(path), **draft))
    # small n-gram sizes so that the n-gram types fire on short replies
    p.ngram_simple.size_n = 3
    p.ngram_simple.size_m = 8
    p.ngram_mod.n_match = 8
    p.ngram_mod.n_min = 2
    p.ngram_mod.n_max = 16
    return p


@pytest.fixture(scope="module")
def prompts(f16_engine):
    return [f16_engine.prompt_tokens(text=p) for p in PROMPTS]


@pytest.fixture(scope="module")
def none_outputs(f16_engine, prompts):
    f16_engine.set_spec(SpecParams())
    return [f16_engine.run(p, max_tokens=MAX_TOKENS, sampling=GREEDY).tokens for p in prompts]


def _run_logged(engine, prompt):
    """Generate, recording which speculator returned a draft at each position."""
    log: dict[int, tuple[str, list[int]]] = {}
    for s in engine.chain.speculators:
        orig = s.draft

        def wrapped(req, _orig=orig, _name=s.name):
            out = list(_orig(req))
            if out and req.pos0 not in log:  # the first speculator asked that drafts wins
                log[req.pos0] = (_name, out)
            return out
        s.draft = wrapped  # instance attribute: gone with the chain
    steps: list[StepEvent] = []
    result = None
    for ev in engine.generate(prompt, max_tokens=MAX_TOKENS, sampling=GREEDY):
        if isinstance(ev, StepEvent):
            steps.append(ev)
        elif isinstance(ev, FinishEvent):
            result = ev.result
    assert result is not None
    return result, steps, log


def _check_credit(result, steps, log, n_prompt):
    """Every accepted draft token is credited to the speculator that drafted it."""
    credited: dict[str, int] = {}
    for st in steps:
        accepted = [t for t in st.tokens if t.drafted_by is not None]
        if st.drafted_by is None:
            assert not accepted
            continue
        if not st.tokens:
            continue
        # the step verified [id_last] + draft with id_last (reply token index - 1) at its position
        name, draft = log[n_prompt + st.tokens[0].index - 1]
        assert st.drafted_by == name
        assert all(t.drafted_by == name for t in accepted)
        assert [t.draft_pos for t in accepted] == list(range(len(accepted)))
        assert [t.id for t in accepted] == draft[:len(accepted)]
        assert len(accepted) == min(st.n_accepted, len(st.tokens))
        credited[name] = credited.get(name, 0) + len(accepted)
    assert [t is not None for t in result.drafted_by].count(True) == sum(credited.values())
    return credited


# -- lossless ---------------------------------------------------------------------

@pytest.mark.slow
def test_draft_simple_is_lossless_with_plausible_acceptance(f16_engine, q2k_model_path, prompts,
                                                             none_outputs):
    chain = f16_engine.set_spec(draft_spec(q2k_model_path))
    assert [s.name for s in chain.speculators] == ["draft-simple"] and not chain.skipped
    ds = chain.speculators[0]
    assert ds.ctx.n_ctx == f16_engine.ctx.n_ctx  # as many tokens as the target's context
    drafted = accepted = 0
    compared = 0
    ties = 0
    for prompt, expected in zip(prompts, none_outputs):
        result = f16_engine.run(prompt, max_tokens=MAX_TOKENS, sampling=GREEDY)
        ties += check_lossless(f16_engine, prompt, expected, result.tokens)
        compared += len(expected)
        st = result.stats
        drafted += st.n_drafted
        accepted += st.n_accepted
        s = st.speculators["draft-simple"]
        assert s.n_gen_tokens == st.n_drafted and s.n_acc_tokens == st.n_accepted
        assert s.t_draft_us > 0 and s.t_process_us > 0
        assert all(b in (None, "draft-simple") for b in result.drafted_by)
        # the draft context mirrors the target's: same tokens, same length
        assert ds.kv == f16_engine.kv_tokens
        assert ds.ctx.pos_max() == len(f16_engine.kv_tokens) - 1
    assert len(prompts) >= 10 and compared >= 10 * 20
    assert ties <= 1, f"{ties} prompts diverged (each at a near-tie)"
    rate = accepted / drafted
    print(f"\ndraft-simple: {accepted}/{drafted} accepted ({rate:.1%}) over {len(prompts)} prompts, "
          f"{compared} tokens compared; draft cost {ds.stats.t_draft_us / ds.stats.n_gen_tokens / 1000:.1f} "
          f"ms/drafted token (+{ds.stats.t_process_us / ds.stats.n_gen_tokens / 1000:.1f} ms mirroring)")
    assert 0.2 < rate < 0.98
    cost = ds.cost()
    assert cost["draft_us_per_token"] > 0 and cost["total_us_per_token"] > cost["draft_us_per_token"]
    # at most n_max=3 single-token draft decodes per draft call
    assert ds.n_draft_decodes <= 3 * ds.stats.n_call_draft


@pytest.mark.slow
def test_ngram_and_draft_chain_is_lossless_and_credited(f16_engine, q2k_model_path, prompts,
                                                        none_outputs):
    chain = f16_engine.set_spec(draft_spec(q2k_model_path, "ngram-simple,draft-simple"))
    assert [s.name for s in chain.speculators] == ["ngram-simple", "draft-simple"]
    totals: dict[str, int] = {}
    for i in CHAIN_PROMPTS:
        prompt, expected = prompts[i], none_outputs[i]
        result, steps, log = _run_logged(f16_engine, prompt)
        assert result.tokens == expected
        credited = _check_credit(result, steps, log, len(prompt))
        for name, n in credited.items():
            assert result.stats.speculators[name].n_acc_tokens == n
            totals[name] = totals.get(name, 0) + n
    print(f"\nngram-simple,draft-simple accepted tokens: {totals}")
    assert totals.get("ngram-simple", 0) > 0 and totals.get("draft-simple", 0) > 0


@pytest.mark.slow
def test_checkpoint_rollback_is_lossless_too(f16_engine, q2k_model_path, prompts, none_outputs):
    """The path recurrent draft models take: restore a state checkpoint, re-decode."""
    chain = f16_engine.set_spec(draft_spec(q2k_model_path))
    ds = chain.speculators[0]
    ds.use_checkpoints = True
    result = f16_engine.run(prompts[1], max_tokens=32, sampling=GREEDY)
    assert result.tokens == none_outputs[1][:32]
    assert ds.kv == f16_engine.kv_tokens
    assert result.stats.n_accepted > 0


@pytest.mark.slow
def test_prefix_reuse_keeps_the_draft_context_in_step(q2k_model_path):
    """With prompt-prefix reuse the draft context reuses its prefix too."""
    from speculators.engine import Engine, EngineConfig
    eng = Engine(str(q2k_model_path), EngineConfig(n_ctx=512, n_threads=2, reuse_prefix=True))
    try:
        ds = eng.set_spec(draft_spec(q2k_model_path)).speculators[0]
        msgs = [{"role": "user", "content": "Name a colour."}]
        r1 = eng.run(eng.prompt_tokens(messages=msgs), max_tokens=8, sampling=GREEDY)
        assert ds.kv == eng.kv_tokens
        msgs += [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "Another one?"}]
        before = ds.n_process_tokens
        p2 = eng.prompt_tokens(messages=msgs)
        r2 = eng.run(p2, max_tokens=8, sampling=GREEDY)
        assert r2.stats.n_prompt_reused > 0
        assert ds.kv == eng.kv_tokens
        # the reused prefix was not decoded again on the draft model
        assert ds.n_process_tokens - before < len(p2) + r2.stats.n_generated + r2.stats.n_drafted
        assert ds.n_process_tokens - before <= (len(p2) - r2.stats.n_prompt_reused) + r2.stats.n_steps \
            + r2.stats.n_drafted
    finally:
        eng.close()


# -- the reference's draft loop, on scripted logits -----------------------------------

class _ScriptedCtx:
    """Stands in for the draft context: logits come from a script per position."""

    def __init__(self, script: dict[int, np.ndarray], n_ctx: int = 64):
        self.script = script
        self.n_ctx = n_ctx
        self.decoded: list[tuple[list[int], int]] = []
        self.removed: list[int] = []
        self._last = None

    def decode(self, tokens, pos0, logits="last"):
        self.decoded.append((list(tokens), pos0))
        self._last = pos0 + len(tokens) - 1

    def logits(self, i):
        return self.script[self._last]

    def seq_rm(self, p0, p1=-1):
        self.removed.append(p0)
        return True

    def clear(self):
        pass

    def close(self):
        pass


def _logits_for(tok: int, p: float, n_vocab: int = 32) -> np.ndarray:
    """Logits whose top-10 softmax gives ``tok`` probability ``p`` (others equal)."""
    lg = np.full(n_vocab, -50.0, dtype=np.float32)
    others = [i for i in range(n_vocab) if i != tok][:9]
    # p = 1 / (1 + 9 e^-d)  =>  d = -ln((1/p - 1) / 9)
    d = -np.log((1.0 / p - 1.0) / 9.0)
    lg[tok] = d
    lg[others] = 0.0
    return lg


@pytest.fixture()
def scripted(f16_engine, q2k_model_path):
    made = []

    def make(script, **draft):
        params = draft_spec(q2k_model_path, **draft)
        ds = f16_engine.set_spec(params).speculators[0]
        ds.ctx.close()
        ds.ctx = _ScriptedCtx(script)
        ds.kv = [1, 2, 3]
        made.append(ds)
        return ds
    yield make
    f16_engine.set_spec(SpecParams())


def test_draft_stops_below_p_min_and_keeps_the_high_confidence_prefix(scripted):
    # position 3 holds id_last; then drafted tokens at 4, 5, ...
    script = {3: _logits_for(7, 0.95), 4: _logits_for(8, 0.9), 5: _logits_for(9, 0.5), 6: _logits_for(10, 0.99)}
    ds = scripted(script, p_min=0.8, n_max=5)
    out = ds.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=-1))
    assert out == [7, 8]
    assert ds.last_p == pytest.approx([0.95, 0.9], abs=1e-5)
    # id_last at 3, then each kept token but the last is decoded to find the next
    assert ds.ctx.decoded == [([4], 3), ([7], 4), ([8], 5)]
    assert ds.ctx.removed == [3]  # the draft's own tokens are dropped again


def test_draft_stops_at_n_max_and_the_requests_limit(scripted):
    script = {p: _logits_for(10 + p, 0.99) for p in range(3, 20)}
    ds = scripted(script, n_max=4)
    assert ds.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=-1)) == [13, 14, 15, 16]
    assert len(ds.ctx.decoded) == 4  # id_last + 3 drafted; the 4th is not decoded
    ds.kv = [1, 2, 3]
    assert ds.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=2)) == [13, 14]


def test_drafts_shorter_than_n_min_are_dropped(scripted):
    script = {3: _logits_for(7, 0.95), 4: _logits_for(8, 0.3)}
    ds = scripted(script, p_min=0.5, n_min=2, n_max=5)
    assert ds.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=-1)) == []
    ds = scripted(script, p_min=0.5, n_min=1, n_max=5)
    assert ds.draft(DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=-1)) == [7]


def test_p_is_the_softmax_over_the_top_10_logits(scripted):
    ds = scripted({}, p_min=0.01)
    rng = np.random.default_rng(1)
    lg = rng.standard_normal(1000).astype(np.float32) * 3
    tok, p = ds._pick(lg)
    top = np.sort(lg.astype(np.float64))[-10:]
    assert tok == int(np.argmax(lg))
    assert p == pytest.approx(np.exp(top[-1]) / np.exp(top).sum(), rel=1e-9)


def test_accept_rolls_the_draft_cache_back_to_what_the_target_kept(scripted):
    ds = scripted({})
    ds.kv = [1, 2, 3]
    ds.target = [1, 2, 3]
    ds.process([4, 7, 8, 9], 3)          # the target verified id_last=4 and a draft 7 8 9
    assert ds.kv == [1, 2, 3, 4, 7, 8, 9]
    ds.accept(1, is_other=True)          # it kept 4 and 7 (whoever drafted)
    assert ds.kv == [1, 2, 3, 4, 7] and ds.target == [1, 2, 3, 4, 7]
    assert ds.ctx.removed[-1] == 5


# -- availability and the vocabulary check ----------------------------------------------

def test_without_a_draft_model_the_type_is_skipped_with_a_reason(f16_engine):
    chain = f16_engine.set_spec(SpecParams.from_types("ngram-simple,draft-simple"))
    assert [s.name for s in chain.speculators] == ["ngram-simple"]
    assert "no draft model" in chain.skipped["draft-simple"]


def test_a_missing_draft_file_is_an_error(f16_engine, tmp_path):
    with pytest.raises(ModelError):
        f16_engine.set_spec(draft_spec(tmp_path / "nope.gguf"))


def test_draft_ctx_size_can_be_set(f16_engine, q2k_model_path):
    ds = f16_engine.set_spec(draft_spec(q2k_model_path, n_ctx=1024)).speculators[0]
    assert ds.ctx.n_ctx == 1024
    f16_engine.set_spec(SpecParams())


def test_the_draft_model_is_loaded_once(f16_engine, q2k_model_path):
    a = f16_engine.set_spec(draft_spec(q2k_model_path)).speculators[0].model
    b = f16_engine.set_spec(draft_spec(q2k_model_path, "ngram-mod,draft-simple")).speculators[-1].model
    assert a is b
    f16_engine.set_spec(SpecParams())
    # kept loaded while idle, for the next set_spec
    assert str(q2k_model_path.resolve()) in draft_simple.cached_draft_models()
    assert f16_engine.set_spec(draft_spec(q2k_model_path)).speculators[0].model is a
    f16_engine.set_spec(SpecParams())


@pytest.fixture(scope="module")
def gemma_texts(f16_model_path):
    return vocab_of_gguf(f16_model_path).text_list()


@pytest.fixture(scope="module")
def bad_drafts(tmp_path_factory, gemma_texts):
    """Draft files that break one rule each (and two that pass), with the expected message."""
    d = tmp_path_factory.mktemp("drafts")
    small = list(gemma_texts[:1000])
    gpt2 = [b"<pad>", b"<eos>", b"<bos>", b"<unk>", b"<mask>", b"a", b"b", b"ab", "Ċ".encode()]
    changed = list(gemma_texts)
    changed[1000] = b"xyzzy"
    low_ids = list(gemma_texts)
    # (llama.cpp aborts on duplicate token texts: use texts the vocabulary lacks)
    low_ids[0:5] = [b"<draftlight-test-%d>" % i for i in range(5)]
    assert not set(low_ids[0:5]) & set(gemma_texts)
    return {
        "vocab_type": (write_tiny_llama(d / "gpt2.gguf", gpt2, tokenizer="gpt2", pre="gpt-2",
                                        merges=["a b"], bos=2, eos=1),
                       "vocab type differs: target SPM (1) vs draft BPE (2)"),
        "bos": (write_tiny_llama(d / "bos.gguf", small, bos=3),
                "BOS token differs: target add_bos=True id=2 vs draft add_bos=True id=3"),
        "bos_flag": (write_tiny_llama(d / "nobos.gguf", small, add_bos=False),
                     "BOS token differs: target add_bos=True id=2 vs draft add_bos=False id=2"),
        "eos": (write_tiny_llama(d / "eos.gguf", small, add_eos=True),
                "EOS token differs: target add_eos=False id=1 vs draft add_eos=True id=1"),
        "vocab_size": (write_tiny_llama(d / "small.gguf", small),
                       "vocab size difference 261144 is over 128 (target 262144 tokens, draft 1000)"),
        "token_text": (write_tiny_llama(d / "text.gguf", changed),
                       f"token text at id 1000 differs: {gemma_texts[1000].decode()!r} vs 'xyzzy'"),
        "ok_low_ids": (write_tiny_llama(d / "lowids.gguf", low_ids), None),
        "ok_size": (write_tiny_llama(d / "shorter.gguf", gemma_texts[:-100]), None),
    }


RULE_OF = {"bos_flag": "bos"}


@pytest.mark.parametrize("case", ["vocab_type", "bos", "bos_flag", "eos", "vocab_size", "token_text",
                                  "ok_low_ids", "ok_size"])
def test_incompatible_drafts_are_refused_with_the_rule_that_failed(f16_engine, f16_model_path, bad_drafts,
                                                                   case):
    path, message = bad_drafts[case]
    before = f16_engine.set_spec(SpecParams())
    draft = Model(str(path))
    try:
        if message is None:
            check_compatible(f16_engine.model, draft)
            verdict = compatibility(f16_model_path, path)
            assert verdict.ok and verdict.rule is None
            chain = f16_engine.set_spec(draft_spec(path))
            assert [s.name for s in chain.speculators] == ["draft-simple"]
            f16_engine.set_spec(SpecParams())
            return
        rule = RULE_OF.get(case, case)
        with pytest.raises(IncompatibleDraftModel) as ei:
            check_compatible(f16_engine.model, draft)
        assert ei.value.rule == rule
        assert ei.value.reason == message
        assert str(ei.value) == f"draft.model: incompatible with the target model: {message}"
        assert isinstance(ei.value, ValueError)
        # the metadata-only check reaches the same verdict, word for word
        for target in (f16_model_path, f16_engine.model):
            verdict = compatibility(target, path)
            assert (verdict.ok, verdict.rule, verdict.reason) == (False, rule, message)
        # and the engine refuses it before any generation, keeping its chain
        with pytest.raises(IncompatibleDraftModel) as ei2:
            f16_engine.set_spec(draft_spec(path))
        assert ei2.value.reason == message
        assert f16_engine.chain is before
    finally:
        draft.close()


def test_metadata_vocab_equals_the_loaded_vocab(f16_engine, f16_model_path, bad_drafts):
    pairs = [(f16_engine.model, f16_model_path)] + [(None, p) for p, _ in bad_drafts.values()]
    for model, path in pairs:
        m = model or Model(str(path))
        try:
            a, b = vocab_of_model(m), vocab_of_gguf(path)
            assert (a.vocab_type, a.add_bos, a.bos, a.add_eos, a.eos, a.n_tokens) == \
                (b.vocab_type, b.add_bos, b.bos, b.add_eos, b.eos, b.n_tokens), path
            assert a.text_list() == b.text_list(), path
        finally:
            if model is None:
                m.close()


def test_metadata_defaults_follow_llama_cpp(tmp_path):
    """Keys left out: the loader's per-type defaults apply (checked against llama.cpp)."""
    toks = [b"<unk>", b"<s>", b"</s>"] + [f"t{i}".encode() for i in range(3, 60)] + [b"<0x0A>", b""]
    p = write_tiny_llama(tmp_path / "defaults.gguf", toks, bos=None, eos=None, add_bos=None, add_eos=None)
    m = Model(str(p))
    try:
        a, b = vocab_of_model(m), vocab_of_gguf(p)
        assert (b.vocab_type, b.add_bos, b.bos, b.add_eos, b.eos) == (1, True, 1, False, 2)
        assert (a.vocab_type, a.add_bos, a.bos, a.add_eos, a.eos) == (1, True, 1, False, 2)
        assert a.text_list() == b.text_list()
        assert b.text_list()[-1] == b"[EMPTY_61]"
    finally:
        m.close()


def test_compare_vocabs_rule_order_and_the_first_five_ids():
    base = dict(vocab_type=1, add_bos=True, bos=2, add_eos=False, eos=1, n_tokens=300)
    texts = [b"t%d" % i for i in range(300)]
    t = VocabSummary(**base, texts=texts)
    # add_bos off on both sides: the ids do not matter
    compare_vocabs(VocabSummary(**{**base, "add_bos": False}, texts=texts),
                   VocabSummary(**{**base, "add_bos": False, "bos": 9}, texts=list(texts)))
    # sizes within 128: only the common ids are compared
    compare_vocabs(t, VocabSummary(**{**base, "n_tokens": 300 + 128}, texts=texts + [b"x"] * 128))
    with pytest.raises(IncompatibleDraftModel) as ei:
        compare_vocabs(t, VocabSummary(**{**base, "n_tokens": 300 + 129}, texts=texts + [b"x"] * 129))
    assert ei.value.rule == "vocab_size"
    # the type is checked before anything else
    with pytest.raises(IncompatibleDraftModel) as ei:
        compare_vocabs(t, VocabSummary(**{**base, "vocab_type": 2, "bos": 7, "n_tokens": 5}, texts=[]))
    assert ei.value.rule == "vocab_type"
    # texts are not read when an earlier rule fails
    def boom():
        raise AssertionError("texts read")
    with pytest.raises(IncompatibleDraftModel):
        compare_vocabs(t, VocabSummary(**{**base, "eos": 3, "add_eos": True}, texts=boom))


# -- speculative types from a GGUF file ------------------------------------------------

def test_types_from_gguf(tmp_path):
    f = tmp_path
    assert types_from_gguf(write_header_only(f / "df.gguf", "dflash", ["fc.weight"])) == [SpecType.DRAFT_DFLASH]
    assert types_from_gguf(write_header_only(f / "ds.gguf", "dflash", ["fc.weight", "markov_w1.weight"])) == \
        [SpecType.DRAFT_DSPARK]
    # the dflash architecture is decided by the Markov head alone
    assert types_from_gguf(write_header_only(f / "dfn.gguf", "dflash", ["blk.0.nextn.eh_proj.weight"],
                                             block_count=1)) == [SpecType.DRAFT_DFLASH]
    # MTP: the nextn projection in the *last* block
    assert types_from_gguf(write_header_only(f / "mtp.gguf", "qwen3", ["blk.3.nextn.eh_proj.weight"],
                                             block_count=4)) == [SpecType.DRAFT_MTP]
    assert types_from_gguf(write_header_only(f / "mtp2.gguf", "qwen3", ["blk.2.nextn.eh_proj.weight"],
                                             block_count=4)) == []
    assert types_from_gguf(write_header_only(f / "plain.gguf", "llama", ["blk.0.attn_q.weight"],
                                             block_count=1)) == []
    # no uint32 block count (the reference would abort): nothing
    assert types_from_gguf(write_header_only(f / "nobc.gguf", "qwen3", ["blk.0.nextn.eh_proj.weight"])) == []
    assert types_from_gguf(write_header_only(f / "i32.gguf", "qwen3", ["blk.0.nextn.eh_proj.weight"],
                                             block_count=1, block_count_type="int32")) == []
    (f / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    assert types_from_gguf(f / "junk.gguf") == []
    assert types_from_gguf(f / "missing.gguf") == []


def test_types_of_the_real_models_are_none(default_model_path, q2k_model_path):
    assert types_from_gguf(default_model_path) == []
    assert types_from_gguf(q2k_model_path) == []


def test_reader_agrees_with_gguf_package(tmp_path, bad_drafts):
    from gguf import GGUFReader

    paths = [write_header_only(tmp_path / "mtp.gguf", "qwen3", ["blk.3.nextn.eh_proj.weight", "x.weight"],
                               block_count=4, name="MTP test"),
             bad_drafts["vocab_type"][0], bad_drafts["vocab_size"][0]]
    for p in paths:
        r = GGUFReader(str(p))
        info = read_gguf(p)
        assert [k for k in r.fields if not k.startswith("GGUF.")] == list(info.kv)
        for k, field in r.fields.items():
            if k.startswith("GGUF."):
                continue
            v = info.kv[k]
            if hasattr(v, "raw"):
                assert [bytes(field.parts[i]) for i in field.data] == v.raw()
            elif isinstance(v, np.ndarray):
                assert list(field.contents()) == pytest.approx(v.tolist())
            else:
                assert field.contents() == pytest.approx(v) if isinstance(v, float) else field.contents() == v
        assert {t.name for t in r.tensors} == set(info.tensors)
        for t in r.tensors:
            ti = info.tensors[t.name]
            assert info.data_offset + ti.offset == t.data_offset
            assert ti.shape == tuple(int(x) for x in t.shape)
        # where each record lies: the key-values one after another, then the tensor infos
        assert [info.kv_spans[k][0] for k in info.kv] == [f.offset for k, f in r.fields.items()
                                                          if not k.startswith("GGUF.")]
        ends = [end for _, end in info.kv_spans.values()]
        assert ends[:-1] == [start for start, _ in list(info.kv_spans.values())[1:]]
        assert info.infos_span == (ends[-1], info.infos_span[1]) and info.infos_span[0] == r.tensors[0].field.offset
        assert info.data_offset == -(-info.infos_span[1] // info.alignment) * info.alignment


def test_gguf_summary(tmp_path, q2k_model_path):
    s = gguf_summary(q2k_model_path)
    assert s.readable and s.error is None
    assert (s.architecture, s.vocab_size, s.block_count, s.file_type) == ("gemma3", 262144, 18, "Q2_K")
    assert s.size_bytes == q2k_model_path.stat().st_size and s.name
    m = gguf_summary(write_header_only(tmp_path / "m.gguf", "qwen3", ["blk.1.nextn.eh_proj.weight"],
                                       block_count=2, name="Tiny MTP"))
    assert (m.name, m.block_count, m.spec_types) == ("Tiny MTP", 2, [SpecType.DRAFT_MTP])
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\xff" * 40)
    b = gguf_summary(tmp_path / "bad.gguf")
    assert not b.readable and b.error
    t = tmp_path / "trunc.gguf"
    with open(q2k_model_path, "rb") as src:
        t.write_bytes(src.read(100_000))
    assert not gguf_summary(t).readable
