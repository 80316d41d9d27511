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


#: bytes of each scalar GGUF value type (8 string and 9 array have lengths of their own)
_GGUF_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def copy_with_int32_array(src: Path, dst: Path, key: str, values: Sequence[int]) -> Path:
    """A copy of the GGUF ``src`` (weights and all) with one more metadata key: an INT32 array
    (replacing a key of that name).

    Written byte by byte: the metadata section gains the key, the tensor infos are copied as they
    are (their data offsets count from the start of the data section) and the data section after
    them, aligned as before. (Through ``gguf.GGUFReader``/``GGUFWriter`` the F16 default model,
    with its 262k-token vocabulary, took ~25 s; this takes about as long as copying the file.)
    """
    import mmap
    import shutil
    import struct

    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", mm, 0)
        assert magic == b"GGUF" and version in (2, 3), f"{src}: not a GGUF v2/v3 file"
        off = 24
        kept: list[bytes] = []
        alignment = 32

        def skip_value(vt: int, o: int) -> int:
            if vt == 8:
                return o + 8 + struct.unpack_from("<Q", mm, o)[0]
            if vt == 9:
                et, count = struct.unpack_from("<IQ", mm, o)
                o += 12
                if et == 8:
                    for _ in range(count):
                        o += 8 + struct.unpack_from("<Q", mm, o)[0]
                    return o
                return o + _GGUF_SCALAR_SIZE[et] * count
            return o + _GGUF_SCALAR_SIZE[vt]

        for _ in range(n_kv):
            start = off
            (n,) = struct.unpack_from("<Q", mm, off)
            name = mm[off + 8:off + 8 + n].decode("utf-8")
            off += 8 + n
            (vt,) = struct.unpack_from("<I", mm, off)
            if name == "general.alignment":
                (alignment,) = struct.unpack_from("<I", mm, off + 4)
            off = skip_value(vt, off + 4)
            if name != key:
                kept.append(mm[start:off])
        infos_start = off
        for _ in range(n_tensors):
            off += 8 + struct.unpack_from("<Q", mm, off)[0]
            (n_dims,) = struct.unpack_from("<I", mm, off)
            off += 4 + 8 * n_dims + 4 + 8
        infos = mm[infos_start:off]
        data_start = -(-off // alignment) * alignment

        kb = key.encode("utf-8")
        added = (struct.pack("<Q", len(kb)) + kb + struct.pack("<IIQ", 9, 5, len(values))
                 + struct.pack(f"<{len(values)}i", *values))
        header = struct.pack("<4sIQQ", magic, version, n_tensors, len(kept) + 1) + b"".join(kept) + added + infos
        header += b"\0" * (-len(header) % alignment)
        with open(dst, "wb") as out:
            out.write(header)
            f.seek(data_start)
            shutil.copyfileobj(f, out, 16 << 20)
    return dst
