"""Hand-built GGUF files for tests: tiny llama-architecture models with a
vocabulary of our choosing, and header-only files for type detection.

Everything is written with the ``gguf`` package's ``GGUFWriter``; the
models have one block with 8-wide tensors, so llama.cpp loads them in
milliseconds (a 262k-token vocabulary still takes ~1 s to index).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_llama(path: Path, tokens: Sequence[bytes | str], *, tokenizer: str = "llama",
                     pre: str | None = None, merges: Sequence[str] | None = None,
                     bos: int | None = 2, eos: int | None = 1, add_bos: bool | None = True,
                     add_eos: bool | None = False, n_embd: int = 8, n_ff: int = 16,
                     name: str = "tiny", extra_tensors: dict | None = None) -> Path:
    """A loadable one-block llama model with the given vocabulary."""
    import gguf

    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)
    w.add_tokenizer_model(tokenizer)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    if tokenizer == "llama":
        w.add_token_scores([0.0] * n_vocab)
        w.add_token_types([1] * n_vocab)
    if merges is not None:
        w.add_token_merges(list(merges))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    rng = np.random.default_rng(0)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float16 if len(shape) > 1 else np.float32)

    w.add_tensor("token_embd.weight", t(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{n}.weight", t(n_embd, n_embd))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", t(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_up.weight", t(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_down.weight", t(n_embd, n_ff))
    for k, v in (extra_tensors or {}).items():
        w.add_tensor(k, v)
    _finish(w)
    return path


def write_header_only(path: Path, arch: str, tensors: Sequence[str], *, block_count: int | None = None,
                      block_count_type: str = "uint32", name: str | None = None) -> Path:
    """A GGUF with an architecture, optionally a block count, and tiny named tensors."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    if name:
        w.add_name(name)
    if block_count is not None:
        if block_count_type == "uint32":
            w.add_block_count(block_count)
        else:
            w.add_int32(f"{arch}.block_count", block_count)
    for n in tensors:
        w.add_tensor(n, np.zeros(4, dtype=np.float32))
    _finish(w)
    return path


def copy_with_int32_array(src: Path, dst: Path, key: str, values: Sequence[int]) -> Path:
    """A copy of the GGUF ``src`` (weights and all) with one more metadata key: an INT32 array
    (replacing a key of that name).

    Written byte by byte from where :func:`speculators.gguf_detect.read_gguf` found each part: the
    metadata records (with the key), the tensor infos as they are (their data offsets count from
    the start of the data section) and the data section after them, aligned as before. (Through
    ``gguf.GGUFReader``/``GGUFWriter`` the F16 default model, with its 262k-token vocabulary,
    took ~25 s; this takes about as long as copying the file.)
    """
    import shutil
    import struct

    from speculators.gguf_detect import GGUF_TYPE, T_ARRAY, read_gguf

    info = read_gguf(src)
    assert info.infos_span is not None and info.data_offset is not None, f"{src}: no tensor infos"
    kept = [span for k, span in info.kv_spans.items() if k != key]
    kb = key.encode("utf-8")
    added = (struct.pack("<Q", len(kb)) + kb + struct.pack("<IIQ", T_ARRAY, GGUF_TYPE["INT32"], len(values))
             + struct.pack(f"<{len(values)}i", *values))
    with open(src, "rb") as f:
        def part(span: tuple[int, int]) -> bytes:
            f.seek(span[0])
            return f.read(span[1] - span[0])

        header = (struct.pack("<4sIQQ", b"GGUF", info.version, info.n_tensors, len(kept) + 1)
                  + b"".join(part(sp) for sp in kept) + added + part(info.infos_span))
        header += b"\0" * (-len(header) % info.alignment)
        with open(dst, "wb") as out:
            out.write(header)
            f.seek(info.data_offset)
            shutil.copyfileobj(f, out, 16 << 20)
    return dst
