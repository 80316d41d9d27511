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
