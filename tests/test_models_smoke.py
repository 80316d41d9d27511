"""The derived test models load and generate (and are what we think they are)."""

from speculators.llama import Model


def test_derived_models_are_the_expected_types(default_model_path, f16_model_path, q2k_model_path):
    sizes = {p.name: p.stat().st_size for p in (default_model_path, f16_model_path, q2k_model_path)}
    # F16 is much larger than Q4_K_M, Q2_K smaller
    assert sizes[f16_model_path.name] > 1.5 * sizes[default_model_path.name]
    assert sizes[q2k_model_path.name] < sizes[default_model_path.name]
    for p in (f16_model_path, q2k_model_path):
        m = Model(str(p))
        assert m.n_vocab == 262144
        m.close()


# -- a file cut short says so (not "failed to load model") ---------------------------------

import ctypes
import os

import numpy as np
import pytest

from speculators.llama import Context, ModelError


def _cut(src, dst, n):
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read(n))
    return dst


def test_a_file_cut_inside_its_header_says_where(default_model_path, tmp_path):
    # 1 MB of the default model ends in the middle of its 262k-token vocabulary
    p = _cut(default_model_path, tmp_path / "cut-1mb.gguf", 1 << 20)
    with pytest.raises(ModelError) as ei:
        Model(str(p))
    msg = str(ei.value)
    assert "truncated or incomplete" in msg and "ends at byte 1,048,576" in msg and "header" in msg
    assert "\n" not in msg and "llama_model_loader" not in msg


def test_a_file_cut_inside_its_tensor_data_says_how_much_is_missing(default_model_path, tmp_path):
    full = default_model_path.stat().st_size
    p = _cut(default_model_path, tmp_path / "cut-100mb.gguf", 100_000_000)
    with pytest.raises(ModelError) as ei:
        Model(str(p))
    msg = str(ei.value)
    assert "truncated or incomplete" in msg and "the file has 100,000,000 bytes" in msg
    declared = int(msg.split("up to byte ")[1].split(" ")[0].replace(",", ""))
    # the declared end is the end of the real file's last tensor (the file may pad after it)
    assert full - 64 < declared <= full


def test_ggml_block_table_matches_gguf():
    import gguf
    from speculators.gguf_detect import GGML_BLOCK
    sizes = {int(t): v for t, v in gguf.GGML_QUANT_SIZES.items()}
    for t, v in GGML_BLOCK.items():
        if t in sizes:
            assert sizes[t] == v, t


# -- state checkpoints: no per-byte Python copy -----------------------------------------------

def test_state_get_hands_back_the_buffer_llama_cpp_filled(f16_model_path, monkeypatch):
    """The checkpoint is the memory llama.cpp wrote (no copy), and restoring passes it back as is."""
    import llama_cpp as lc

    m = Model(str(f16_model_path))
    ctx = Context(m, n_ctx=512, n_batch=64, n_threads=2)
    try:
        toks = m.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
        ctx.decode(toks, 0, logits="last")
        seen = {}
        real_get, real_set = lc.llama_state_seq_get_data_ext, lc.llama_state_seq_set_data_ext

        def get_spy(c, dst, size, seq, flags):
            seen["dst"] = ctypes.addressof(dst)
            return real_get(c, dst, size, seq, flags)

        def set_spy(c, src, size, seq, flags):
            seen["src"] = ctypes.addressof(src)
            return real_set(c, src, size, seq, flags)

        monkeypatch.setattr(lc, "llama_state_seq_get_data_ext", get_spy)
        monkeypatch.setattr(lc, "llama_state_seq_set_data_ext", set_spy)
        ckpt = ctx.state_get(partial=False)
        assert len(ckpt) > 100_000  # the KV cells of ~50 tokens
        addr = np.frombuffer(ckpt, dtype=np.uint8).ctypes.data
        assert seen["dst"] == addr  # the returned object *is* llama.cpp's output buffer

        n = len(toks)
        ctx.decode([toks[1]], n, logits="last")  # move on by one token
        want = ctx.logits(-1).copy()
        ctx.decode(toks[2:6], n + 1, logits="last")
        ctx.seq_rm(0, -1)
        ctx.state_set(ckpt, partial=False)
        assert seen["src"] == addr  # restored from the same memory, not a copy
        assert ctx.pos_max() == n - 1
        ctx.decode([toks[1]], n, logits="last")
        np.testing.assert_allclose(ctx.logits(-1), want, rtol=0, atol=1e-4)
        # read-only bytes still restore (one copy)
        ctx.seq_rm(0, -1)
        ctx.state_set(bytes(ckpt), partial=False)
        assert ctx.pos_max() == n - 1
    finally:
        ctx.close()
        m.close()
