from speculators.engine import Engine, EngineConfig
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from tests.hidden_models import hidden_models_dir, qwen35_mtp_path  # noqa: F401

GREEDY = SamplingParams(temperature=0.0)


def test_checkpointed_target_reuses_the_conversation_prefix(qwen35_mtp_path):
    """A hybrid target (state checkpoints) reuses a chat's earlier turns from a context
    checkpoint: each later turn decodes only what is new, and the text is unchanged."""
    def chat(reuse, spec):
        eng = Engine(str(qwen35_mtp_path), EngineConfig(n_ctx=1024, n_batch=16, n_threads=1, reuse_prefix=reuse), spec)
        try:
            assert eng.use_checkpoints
            toks, outs, decoded, new = [], [], [], []
            for turn in ("hello world", "the quick brown fox", "jumps over the lazy dog", "abc def"):
                t = eng.model.tokenize(" " + turn, add_special=not toks)
                new.append(len(t))
                toks = toks + t
                r = eng.run(toks, max_tokens=24, sampling=GREEDY)
                outs.append(r.tokens)
                decoded.append(r.stats.n_prompt - r.stats.n_prompt_reused)
                toks = toks + r.tokens
            return outs, decoded, new
        finally:
            eng.close()
    for spec in (SpecParams(), SpecParams.from_types("draft-mtp")):
        base, dec0, _ = chat(False, spec)
        got, dec, new = chat(True, spec)
        assert got == base
        print(spec.types, dec0, dec)
        # only the new words (and the reply's last token, never decoded), not the conversation
        assert all(d <= n + 1 for d, n in zip(dec[1:], new[1:])), (dec, new)
        assert dec0[-1] > 3 * dec[-1]


def test_checkpointed_prompt_is_decoded_in_llama_servers_pieces(qwen35_mtp_path):
    """On a target that cannot drop a partial sequence, llama-server decodes a prompt's last
    4 + n_ubatch and last 4 tokens as batches of their own (to keep checkpoints there). The
    batching decides the logits on quantized weights, so the engine splits the same way (and
    keeps a checkpoint 4 tokens before the end, where the next turn usually still agrees)."""
    eng = Engine(str(qwen35_mtp_path), EngineConfig(n_ctx=1024, n_batch=16, n_threads=1))
    try:
        assert eng.use_checkpoints and eng.ctx.n_ubatch == 16
        calls = []
        eng.ctx.decode_hooks.append(lambda chunk, pos: calls.append((pos, len(chunk))))
        prompt = eng.model.tokenize(" ".join(["abc def"] * 30), add_special=True)
        n = len(prompt)
        assert n > 60
        r = eng.run(prompt, max_tokens=2, sampling=GREEDY)
        prefill = [c for c in calls if c[0] < n]
        # pieces: up to n-20 in n_batch chunks, then n-20..n-4, then the last 4
        ends = [p + k for p, k in prefill]
        assert n - 20 in ends and n - 4 in ends and ends[-1] == n, prefill
        assert prefill[-1] == (n - 4, 4) and prefill[-2] == (n - 20, 16)
        assert all(k <= 16 for _, k in prefill)
        assert n - 4 in [c[0] for c in eng._prefix_ckpts]
        # a prompt that grows by a turn starts from that checkpoint (or a later one)
        calls.clear()
        r2 = eng.run(prompt + r.tokens + eng.model.tokenize(" xyz", add_special=False), max_tokens=2, sampling=GREEDY)
        assert r2.stats.n_prompt_reused >= n - 4
        # a short new part is decoded in one piece
        short = eng.model.tokenize(" hello", add_special=True)[:4]
        calls.clear()
        eng.run(short, max_tokens=1, sampling=GREEDY)
        assert [k for p, k in calls if p < len(short)] == [len(short)]
    finally:
        eng.close()
