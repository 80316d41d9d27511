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
    """A copy of the GGUF ``src`` (weights and all) with one more metadata key: an INT32 array."""
    import gguf
    reader = gguf.GGUFReader(src, "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    align = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if align is not None:
        w.data_alignment = align.contents()
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or field.name == key:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    w.add_key_value(key, [int(v) for v in values], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    for t in reader.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in reader.tensors:
        w.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    w.close()
    return dst
