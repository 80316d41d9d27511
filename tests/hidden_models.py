"""Tiny GGUF models for the hidden-state drafters, written with ``gguf``.

* :func:`write_qwen35_mtp` -- a tiny ``qwen35`` target (hybrid: one gated
  delta-net layer, one attention layer) with one NextN/MTP block appended,
  as Qwen3.5/3.6 ship it. Its context cannot drop a partial sequence, so
  the engine rolls back with state checkpoints.
* :func:`write_eagle3` -- an ``eagle3`` drafter for a given target (hidden
  size and extracted layer ids of the target).
* :func:`write_tiny_llama_target` -- a tiny 4-layer ``llama`` target whose
  graph records its layer inputs (EAGLE3, DFlash and DSpark read them).
* :func:`write_dflash` -- a ``dflash`` drafter for it: DFlash, DFlash2 (the
  selector lattice) or DSpark (Markov and confidence heads).

Random weights: drafts are mostly rejected, which is fine -- what the tests
check is that the machinery runs and the output stays lossless.

Session fixtures (import them into a test module to use them)::

    from tests.hidden_models import qwen35_mtp_path  # noqa: F401
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

#: vocabulary of the tiny qwen35 target: 3 specials, then single characters
TINY_CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?'0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_spm_vocab(w, tokens: Sequence[str], bos: int = 1, eos: int = 2,
                   scores: Sequence[float] | None = None) -> None:
    w.add_tokenizer_model("llama")
    w.add_token_list(list(tokens))
    w.add_token_scores(list(scores) if scores is not None else [0.0] * len(tokens))
    types = [6 if t.startswith("<0x") and len(t) == 6 else 1 for t in tokens]
    types[0] = 2  # unknown
    types[bos] = 3
    types[eos] = 3
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def tiny_vocab() -> list[str]:
    """<unk> <s> </s>, the 256 byte tokens (SPM falls back to them), then characters."""
    return (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
            + ["\u2581" if c == " " else c for c in TINY_CHARS])


def realistic_vocab() -> tuple[list[str], list[float]]:
    """A 36k-token SPM vocabulary (specials, bytes, characters, then every 2- and 3-letter
    piece with and without the word-start mark), scored so longer pieces win: text
    tokenizes into pieces of a few characters, as with a real tokenizer, and the LM head
    has a realistic size."""
    import itertools
    import string
    base = tiny_vocab()
    pieces: list[str] = []
    for n in (2, 3):
        for t in itertools.product(string.ascii_lowercase, repeat=n):
            w = "".join(t)
            pieces += ["\u2581" + w, w]
    toks = base + pieces
    scores = [0.0] * len(base) + [float(len(p)) for p in pieces]
    return toks, scores


def _mat_fn(rng, scale: float, half: bool):
    """Random (rows, cols) weights scaled by 1/sqrt(cols); F16 for realistic sizes."""
    def mat(rows, cols):
        if half:
            m = rng.standard_normal((rows, cols), dtype=np.float32)
            m *= np.float32(scale / np.sqrt(cols))
            return m.astype(np.float16)
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)
    return mat


def write_qwen35_mtp(path: Path, *, n_embd: int = 32, n_ff: int = 64, n_head: int = 2,
                     n_head_kv: int = 1, head_dim: int = 16, seed: int = 0,
                     with_mtp: bool = True, scale: float = 0.3, mtp_copy: bool = True,
                     n_trunk: int = 2, full_attention_interval: int = 2, d_state: int = 8,
                     n_group: int = 2, dt_rank: int = 2, d_conv: int = 4,
                     rope_dims: int | None = None, rope_sections: Sequence[int] = (4, 2, 2, 0),
                     vocab: tuple[list[str], list[float]] | None = None, half: bool = False,
                     name: str = "tiny-qwen35-mtp") -> Path:
    """A tiny qwen35 target: [delta-net, attention] + one MTP block.

    ``scale`` keeps the layers' contributions small next to the token
    embedding, so the target behaves mostly like a bigram model
    ``x -> f(x)`` with some context dependence. With ``mtp_copy`` the MTP
    block's ``eh_proj`` passes the (normed) embedding of its input token
    through, so it predicts ``f(x_{p+1})`` -- the right answer whenever the
    target follows its bigram map. Drafts are then often, not always,
    accepted, which exercises both the accept and the rollback paths.
    """
    import gguf

    arch = "qwen35"
    vocab, scores = vocab if vocab is not None else (tiny_vocab(), None)
    n_vocab = len(vocab)
    n_mtp = 1 if with_mtp else 0
    key_dim = d_state * n_group
    value_dim = d_state * dt_rank
    conv_dim = key_dim * 2 + value_dim

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_trunk + n_mtp)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(rope_dims or head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_array(f"{arch}.rope.dimension_sections", [int(x) for x in rope_sections])
    w.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    w.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    w.add_uint32(f"{arch}.ssm.state_size", d_state)
    w.add_uint32(f"{arch}.ssm.time_step_rank", dt_rank)
    w.add_uint32(f"{arch}.ssm.group_count", n_group)
    w.add_uint32(f"{arch}.full_attention_interval", full_attention_interval)
    if with_mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", n_mtp)
    w.add_file_type(1 if half else 0)
    _add_spm_vocab(w, vocab, scores=scores)

    rng = np.random.default_rng(seed)
    mat = _mat_fn(rng, scale, half)  # GGUF order: ne0 = cols (input), numpy shape (rows, cols)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    if half:
        w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), dtype=np.float32)
                     .astype(np.float16))
    else:
        w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, n_embd))).astype(np.float32))
    w.add_tensor("output_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd) * 4)

    def attn_block(il):
        q = n_head * head_dim
        w.add_tensor(f"blk.{il}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.post_attention_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.attn_q.weight", mat(2 * q, n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", mat(n_embd, q))
        w.add_tensor(f"blk.{il}.attn_q_norm.weight", ones(head_dim))
        w.add_tensor(f"blk.{il}.attn_k_norm.weight", ones(head_dim))

    def ffn(il):
        w.add_tensor(f"blk.{il}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_down.weight", mat(n_embd, n_ff))

    def delta_net(il):
        w.add_tensor(f"blk.{il}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.post_attention_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.attn_qkv.weight", mat(conv_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_gate.weight", mat(value_dim, n_embd))
        # (the conv kernel stays F32: ggml's ssm_conv reads it as F32)
        w.add_tensor(f"blk.{il}.ssm_conv1d.weight", np.asarray(mat(conv_dim, d_conv), dtype=np.float32))
        w.add_tensor(f"blk.{il}.ssm_dt.bias", np.zeros(dt_rank, dtype=np.float32))
        w.add_tensor(f"blk.{il}.ssm_a", -np.ones(dt_rank, dtype=np.float32))
        w.add_tensor(f"blk.{il}.ssm_beta.weight", mat(dt_rank, n_embd))
        w.add_tensor(f"blk.{il}.ssm_alpha.weight", mat(dt_rank, n_embd))
        w.add_tensor(f"blk.{il}.ssm_norm.weight", ones(d_state))
        w.add_tensor(f"blk.{il}.ssm_out.weight", mat(n_embd, value_dim))

    # every full_attention_interval-th layer is full attention, the others gated delta nets
    for il in range(n_trunk):
        if (il + 1) % full_attention_interval == 0:
            attn_block(il)
        else:
            delta_net(il)
        ffn(il)
    if with_mtp:
        il = n_trunk
        attn_block(il)
        ffn(il)
        eh = mat(n_embd, 2 * n_embd)
        if mtp_copy:  # concat(enorm(e), hnorm(h)): keep e, drop h
            eh = np.concatenate([np.eye(n_embd, dtype=eh.dtype), eh[:, n_embd:] * eh.dtype.type(0.1)], axis=1)
        w.add_tensor(f"blk.{il}.nextn.eh_proj.weight", eh)
        w.add_tensor(f"blk.{il}.nextn.enorm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.nextn.hnorm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.nextn.shared_head_norm.weight", ones(n_embd))
    _finish(w)
    return path



def write_tiny_llama_target(path: Path, *, n_embd: int = 32, n_layer: int = 4, n_ff: int = 64,
                            n_head: int = 2, seed: int = 1, scale: float = 0.3,
                            n_head_kv: int | None = None,
                            vocab: tuple[list[str], list[float]] | None = None, half: bool = False,
                            name: str = "tiny-llama-target") -> Path:
    """A tiny dense ``llama`` target (its graph exposes every layer's input,
    which EAGLE3 and DFlash read; gemma3's does not in this llama.cpp)."""
    import gguf

    vocab, scores = vocab if vocab is not None else (tiny_vocab(), None)
    n_vocab = len(vocab)
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    n_kv = n_embd // n_head * n_head_kv
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(1 if half else 0)
    _add_spm_vocab(w, vocab, scores=scores)
    rng = np.random.default_rng(seed)
    mat = _mat_fn(rng, scale, half)

    if half:
        w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), dtype=np.float32)
                     .astype(np.float16))
    else:
        w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    if half:
        out = mat(n_vocab, n_embd)
        out *= out.dtype.type(4 / scale)
    else:
        out = mat(n_vocab, n_embd) * 4 / scale
    w.add_tensor("output.weight", out)
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.ones(n_embd, np.float32))
        for n, rows in (("attn_q", n_embd), ("attn_k", n_kv), ("attn_v", n_kv), ("attn_output", n_embd)):
            w.add_tensor(f"blk.{il}.{n}.weight", mat(rows, n_embd))
        w.add_tensor(f"blk.{il}.ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{il}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_down.weight", mat(n_embd, n_ff))
    _finish(w)
    return path


def write_eagle3(path: Path, *, target_hidden: int = 32, target_layers: Sequence[int] = (1, 2, 3),
                 n_embd: int = 32, n_ff: int = 64, n_head: int = 2, seed: int = 2,
                 vocab: Sequence[str] | None = None, scores: Sequence[float] | None = None,
                 half: bool = False) -> Path:
    """An ``eagle3`` drafter: fc over 3 target layers, one decoder layer.

    It has no token embedding or LM head of its own, so llama.cpp takes the
    target's (through ``ctx_other``): ``n_embd`` must equal the target's.
    """
    import gguf

    arch = "eagle3"
    vocab = list(vocab) if vocab is not None else tiny_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-eagle3")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_array(f"{arch}.target_layers", [int(x) for x in target_layers])
    w.add_uint32(f"{arch}.target_hidden_size", target_hidden)
    w.add_file_type(1 if half else 0)
    _add_spm_vocab(w, vocab, scores=scores)
    rng = np.random.default_rng(seed)
    mat = _mat_fn(rng, 0.3, half)

    n_enc = len(target_layers) * target_hidden
    w.add_tensor("fc.weight", mat(n_embd, n_enc))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.attn_norm_2.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.attn_q.weight", mat(n_embd, 2 * n_embd))
    w.add_tensor("blk.0.attn_k.weight", mat(n_embd, 2 * n_embd))
    w.add_tensor("blk.0.attn_v.weight", mat(n_embd, 2 * n_embd))
    w.add_tensor("blk.0.attn_output.weight", mat(n_embd, n_embd))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", mat(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_up.weight", mat(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_down.weight", mat(n_embd, n_ff))
    _finish(w)
    return path


def write_dflash(path: Path, *, target_hidden: int = 32, target_layers: Sequence[int] = (0, 2, 3),
                 n_embd: int | None = None, n_layer: int = 1, n_ff: int = 64, n_head: int = 2,
                 block_size: int = 4, mask_token_id: int = 0, dspark: bool = False,
                 markov_rank: int = 8, confidence: bool = True, sample_from_anchor: bool | None = None,
                 selector_top_k: int = 0, selector_rank: int = 8, conv_kernel: int = 2,
                 conv_group: int = 8, seed: int = 3, scale: float = 0.3,
                 vocab: Sequence[str] | None = None, scores: Sequence[float] | None = None,
                 half: bool = False) -> Path:
    """A ``dflash`` drafter: fc over the target's layer inputs + decoder layers.

    Like published DFlash drafters it has no token embedding or LM head of
    its own: llama.cpp takes the target's through ``ctx_other``, so its
    hidden size is the target's (``n_embd`` defaults to ``target_hidden``;
    llama.cpp sizes ``fc`` as ``len(target_layers) * n_embd``, so a drafter
    made for another target is built with ``target_hidden`` = that target's
    hidden size). ``dspark`` adds DSpark's
    Markov head (``markov_w1``/``markov_w2``) and, with ``confidence``, the
    confidence head (``conf_proj``). ``selector_top_k > 0`` makes it a
    DFlash2 drafter: block convolutions and the selector lattice heads.
    The mask token is ``mask_token_id`` of the shared tiny vocabulary.
    """
    import gguf

    arch = "dflash"
    vocab = list(vocab) if vocab is not None else tiny_vocab()
    n_vocab = len(vocab)
    n_embd = target_hidden if n_embd is None else n_embd
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-dspark" if dspark else ("tiny-dflash2" if selector_top_k else "tiny-dflash"))
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_array(f"{arch}.target_layers", [int(x) for x in target_layers])
    w.add_uint32(f"{arch}.target_hidden_size", target_hidden)
    w.add_uint32(f"{arch}.block_size", block_size)
    if dspark:
        w.add_bool(f"{arch}.has_confidence_head", bool(confidence))
    if sample_from_anchor is not None:
        w.add_bool(f"{arch}.sample_from_anchor", bool(sample_from_anchor))
    if selector_top_k:
        w.add_uint32(f"{arch}.conv_kernel_size", conv_kernel)
        w.add_uint32(f"{arch}.conv_group_size", conv_group)
        w.add_uint32(f"{arch}.selector_rank", selector_rank)
        w.add_uint32(f"{arch}.selector_top_k", selector_top_k)
    w.add_file_type(1 if half else 0)
    _add_spm_vocab(w, vocab, scores=scores)
    w.add_mask_token_id(mask_token_id)
    rng = np.random.default_rng(seed)
    mat = _mat_fn(rng, scale, half)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    n_enc = len(target_layers) * n_embd  # llama.cpp: n_embd_inp_enc = n_layers * n_embd
    w.add_tensor("fc.weight", mat(n_embd, n_enc))
    w.add_tensor("enc.output_norm.weight", ones(n_embd))
    w.add_tensor("output_norm.weight", ones(n_embd))
    n_groups = n_embd // conv_group
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.attn_q.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", mat(n_embd, n_head * head_dim))
        w.add_tensor(f"blk.{il}.attn_q_norm.weight", ones(head_dim))
        w.add_tensor(f"blk.{il}.attn_k_norm.weight", ones(head_dim))
        w.add_tensor(f"blk.{il}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{il}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_down.weight", mat(n_embd, n_ff))
        if selector_top_k:
            for kind in ("attn", "ffn"):  # numpy (2, kernel, n_embd) = GGUF {n_embd, kernel, 2}
                w.add_tensor(f"blk.{il}.{kind}_conv_base",
                             (rng.standard_normal((2, conv_kernel, n_embd)) * 0.1 + 0.5).astype(np.float32))
                w.add_tensor(f"blk.{il}.{kind}_conv_proj.weight", mat(2 * conv_kernel * n_groups, n_embd))
    if dspark:
        w.add_tensor("markov_w1.weight", mat(n_vocab, markov_rank) * 3)
        w.add_tensor("markov_w2.weight", mat(n_vocab, markov_rank) * 3)
        if confidence:
            w.add_tensor("conf_proj.weight", mat(1, n_embd + markov_rank))
            w.add_tensor("conf_proj.bias", np.array([1.0], dtype=np.float32))
    if selector_top_k:
        w.add_tensor("selector_hidden.weight", mat(selector_rank, n_embd))
        w.add_tensor("selector_predecessor.weight", mat(n_vocab, selector_rank) * 3)
        w.add_tensor("selector_successor.weight", mat(n_vocab, selector_rank) * 3)
    _finish(w)
    return path


# -- session fixtures ----------------------------------------------------------------------

@pytest.fixture(scope="session")
def hidden_models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hidden-models")


@pytest.fixture(scope="session")
def qwen35_mtp_path(hidden_models_dir) -> Path:
    """A tiny hybrid qwen35 target with one MTP block (written once per session)."""
    return write_qwen35_mtp(hidden_models_dir / "tiny-qwen35-mtp.gguf")


@pytest.fixture(scope="session")
def qwen35_nomtp_path(hidden_models_dir) -> Path:
    """The same tiny qwen35 target without MTP layers."""
    return write_qwen35_mtp(hidden_models_dir / "tiny-qwen35.gguf", with_mtp=False)


@pytest.fixture(scope="session")
def qwen35_wide_mtp_path(hidden_models_dir) -> Path:
    """An MTP-only-sized mismatch: a qwen35 with MTP at another hidden size."""
    return write_qwen35_mtp(hidden_models_dir / "tiny-qwen35-wide.gguf", n_embd=48)


@pytest.fixture(scope="session")
def llama_target_path(hidden_models_dir) -> Path:
    """A tiny 4-layer llama target for EAGLE3 (hidden size 32)."""
    return write_tiny_llama_target(hidden_models_dir / "tiny-llama-target.gguf")


@pytest.fixture(scope="session")
def eagle3_path(hidden_models_dir) -> Path:
    """An EAGLE3 drafter for :func:`llama_target_path` (layers 1, 2, 3)."""
    return write_eagle3(hidden_models_dir / "tiny-eagle3.gguf")


@pytest.fixture(scope="session")
def eagle3_bad_layers_path(hidden_models_dir) -> Path:
    """An EAGLE3 drafter whose layer ids do not exist in the 4-layer target."""
    return write_eagle3(hidden_models_dir / "tiny-eagle3-bad-layers.gguf", target_layers=(2, 9, 15))


@pytest.fixture(scope="session")
def eagle3_bad_hidden_path(hidden_models_dir) -> Path:
    """An EAGLE3 drafter trained on a target with hidden size 48."""
    return write_eagle3(hidden_models_dir / "tiny-eagle3-bad-hidden.gguf", target_hidden=48)


@pytest.fixture(scope="session")
def dflash_path(hidden_models_dir) -> Path:
    """A DFlash drafter for :func:`llama_target_path` (layers 0, 2, 3; block size 4)."""
    return write_dflash(hidden_models_dir / "tiny-dflash.gguf")


@pytest.fixture(scope="session")
def dflash2_path(hidden_models_dir) -> Path:
    """A DFlash2 drafter (block convolutions, selector top-k 4) for the llama target."""
    return write_dflash(hidden_models_dir / "tiny-dflash2.gguf", selector_top_k=4)


@pytest.fixture(scope="session")
def dspark_path(hidden_models_dir) -> Path:
    """A DSpark drafter (Markov + confidence heads, anchor-first) for the llama target."""
    return write_dflash(hidden_models_dir / "tiny-dspark.gguf", dspark=True)


@pytest.fixture(scope="session")
def dspark_bonus_anchor_path(hidden_models_dir) -> Path:
    """A DSpark drafter exported with ``sample_from_anchor = false`` and no confidence head."""
    return write_dflash(hidden_models_dir / "tiny-dspark-bonus.gguf", dspark=True,
                        sample_from_anchor=False, confidence=False)


@pytest.fixture(scope="session")
def dflash_bad_layers_path(hidden_models_dir) -> Path:
    """A DFlash drafter whose layer ids do not exist in the 4-layer target."""
    return write_dflash(hidden_models_dir / "tiny-dflash-bad-layers.gguf", target_layers=(1, 9, 17))


@pytest.fixture(scope="session")
def dspark_bad_hidden_path(hidden_models_dir) -> Path:
    """A DSpark drafter made for a target with hidden size 48."""
    return write_dflash(hidden_models_dir / "tiny-dspark-bad-hidden.gguf", target_hidden=48, dspark=True)
