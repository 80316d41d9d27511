"""Tiny GGUF models whose hidden-state drafters *predict* their target.

With random weights (:mod:`tests.hidden_models`) a drafter's tokens are never
accepted, so a drafter fed the wrong rows, positions or tokens passes every
test. These models are built so that a correctly fed drafter is accepted
almost always, and a wrongly fed one almost never.

The target (:func:`write_bigram_target`, a ``llama`` GGUF)
------------------------------------------------------------
A deterministic bigram machine on the cycle ``CYCLE = "abc...z "``: after the
symbol ``c`` it always says ``next(c)`` (``z`` -> space -> ``a``). Its token
embeddings are one-hot: ``e(c) = e_0 + e_T(c)`` (``e_0`` a constant
dimension, ``e_T`` the symbol's own dimension of the T channel); tokens
outside the cycle share one dimension ``X``. Every layer's attention output
and FFN down projection are zero, so every layer input -- the hidden states
EAGLE3/DFlash read -- is exactly ``e(token)``. The output matrix reads the T
channel (and the S2 channel, which only drafters fill): row ``next(c)``
reads dimension ``c``. One more row, the *junk* token ``?``, reads every
cycle dimension with weight ``JUNK_W`` and the constant one with ``JUNK_C``:
it loses to a one-hot state as high as the constant (the target's own), but
wins on a state split between two symbols or one of 2/3 of that height or
less. The drafters below *cross-check* two or three sources (the input token,
the target's row, the previous position), each contributing an equal share of
the height: when a source disagrees (the state splits) or is missing (the
state is too low), the drafter drafts ``?``, which the target never accepts.
After a token outside the cycle the target itself says ``?``.

Attention that selects by position
----------------------------------
Queries and keys are built from the constant dimension only, so they are the
same vector at every position before RoPE; each head's query is pre-rotated
so that ``q . k`` peaks where the key sits exactly ``d`` positions before the
query (``d = 0``: itself). With large scales the softmax is one-hot on that
position, so a head *copies* a linear map of one chosen position's input:
what a drafter computes then depends on which rows, tokens and positions the
runtime feeds it -- the thing under test.

The drafters
------------
* :func:`write_eagle3_predictor` (``eagle3``): the decoder at position ``P``
  reads ``(token t, g)``; its new state is the average of ``e_T(t)``,
  ``M g_T`` (``g`` is the target's row at ``P`` through ``fc``, or the
  previous step's pre-norm state) and ``M e_T(t_prev)`` (the token of the pair
  one position back), minus ``g`` (the raw residual), where ``M`` is the
  drafter's own copy of the bigram map. Fed right, the three agree and the
  drafter predicts ``next(t)``.
* :func:`write_dflash_predictor` (``dflash``, DFlash or DSpark): two layers.
  Layer 0 copies ``M`` (the fused context row one position back) into the S2
  channel of the block's anchor slot (which holds ``e_T(id_last)``), and one
  more ``e_0`` into every block slot (so that one source alone is too low); layer 1's
  head ``d`` copies ``M^k`` of the anchor slot's T + S2 into the slot ``d``
  positions later. Slot ``j`` ends up holding ``next^j(id_last)`` (DSpark,
  anchor-first) or ``next^(j-1)(id_last)`` (DFlash), split whenever the anchor
  disagrees with the injected context row.
* :func:`write_bigram_qwen35_mtp` (``qwen35`` with one MTP block, for
  draft-mtp): ``eh_proj`` averages ``e_T(t)`` and ``M h_T``.

``wrong`` (a string of cycle symbols) makes the drafter's map ``M`` say
``next(next(c))`` for those symbols: drafts through them are rejected, which
gives partial acceptance. ``wrong=CYCLE`` is a drafter that never agrees with
the target (a negative control).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.hidden_models import _add_spm_vocab, _finish, tiny_vocab

#: the symbols of the bigram cycle, in order (space is SPM's "\u2581" piece)
CYCLE = "abcdefghijklmnopqrstuvwxyz "
N_SYM = len(CYCLE)
#: the token the drafters emit when their sources disagree (never accepted)
JUNK = "?"
#: the junk row's weights on every cycle dimension and on the constant one: with the
#: constant at 1, a one-hot state of height 1 (the target's own) scores 1 > 0.2 + 2/3,
#: but a state split between two symbols (0.5 + 0.5, or 1/3 + 2/3) or of height 2/3 or
#: less (a source missing) loses to junk
JUNK_W = 0.2
JUNK_C = 2.0 / 3.0

N_EMBD = 96
N_HEAD = 3
HEAD_DIM = 32
ROPE_BASE = 10000.0
#: layers of the target; EAGLE3 reads (1, 2, 3), DFlash (0, 2, 3)
N_LAYER_TGT = 4
#: logit scale of the target's output matrix
OUT_SCALE = 6.0

# channel layout of the 96-wide hidden state
C0 = 0                       # constant
T0 = 1                       # T: the token's symbol (1..27)
X = 28                       # every token outside the cycle
S0 = 32                      # S: DFlash's fused context rows (32..58)
S20 = 64                     # S2: DFlash's anchor check (64..90)


def _piece(c: str) -> str:
    return "\u2581" if c == " " else c


def token_id(vocab: list[str], c: str) -> int:
    return vocab.index(_piece(c))


def next_sym(c: str, k: int = 1) -> str:
    return CYCLE[(CYCLE.index(c) + k) % N_SYM]


def expected_text(prompt: str, n: int, eos_after: str = "") -> str:
    """What the target says after ``prompt`` (which must end in a cycle symbol)."""
    c = prompt[-1]
    out = []
    for _ in range(n):
        if c in eos_after:
            break
        c = next_sym(c)
        out.append(c)
    return "".join(out)


def _map(wrong: str, power: int = 1) -> np.ndarray:
    """The drafter's bigram map as an (N_SYM, N_SYM) matrix ``M[i(next(c)), i(c)] = 1``,
    raised to ``power``; symbols in ``wrong`` map to ``next(next(c))``."""
    m = np.zeros((N_SYM, N_SYM), np.float32)
    for i, c in enumerate(CYCLE):
        j = CYCLE.index(next_sym(c, 2 if c in wrong else 1))
        m[j, i] = 1.0
    out = np.eye(N_SYM, dtype=np.float32)
    for _ in range(power):
        out = m @ out
    return out


def _rope_pattern(d: int, *, neox: bool, hd: int = HEAD_DIM, base: float = ROPE_BASE) -> np.ndarray:
    """A head vector which, as a query, scores highest against the key pattern
    ``_rope_pattern(0)`` sitting exactly ``d`` positions earlier (after RoPE)."""
    half = hd // 2
    v = np.zeros(hd, np.float64)
    for i in range(half):
        theta = base ** (-2.0 * i / hd)
        c, s = np.cos(d * theta), -np.sin(d * theta)
        if neox:  # pairs (i, i + hd/2)
            v[i], v[i + half] = c, s
        else:     # pairs (2i, 2i + 1)
            v[2 * i], v[2 * i + 1] = c, s
    return v


def _writer(path: Path, arch: str, name: str, n_embd: int = N_EMBD):
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)
    return w


def _zeros(*shape) -> np.ndarray:
    return np.zeros(shape, np.float32)


def _ones(n) -> np.ndarray:
    return np.ones(n, np.float32)


# -- the target ------------------------------------------------------------------------------

EOS = 2  # </s> of tiny_vocab()


def _next_id(vocab: list[str], c: str, eos_after: str) -> int:
    """The target's token after the symbol ``c``: the next symbol, or EOS after ``eos_after``."""
    return EOS if c in eos_after else token_id(vocab, next_sym(c))


def target_tensors(vocab: list[str], eos_after: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(token_embd, output) of the bigram target, numpy (n_vocab, N_EMBD)."""
    n_vocab = len(vocab)
    emb = _zeros(n_vocab, N_EMBD)
    emb[:, C0] = 1.0
    emb[:, X] = 1.0
    out = _zeros(n_vocab, N_EMBD)
    for i, c in enumerate(CYCLE):
        t = token_id(vocab, c)
        emb[t, X] = 0.0
        emb[t, T0 + i] = 1.0
        n = _next_id(vocab, c, eos_after)
        out[n, T0 + i] = OUT_SCALE
        out[n, S20 + i] = OUT_SCALE
    junk = token_id(vocab, JUNK)
    out[junk, T0:T0 + N_SYM] = JUNK_W * OUT_SCALE
    out[junk, S20:S20 + N_SYM] = JUNK_W * OUT_SCALE
    out[junk, C0] = JUNK_C * OUT_SCALE
    return emb, out


def write_bigram_target(path: Path, *, eos_after: str = "") -> Path:
    """The ``llama`` bigram target (4 layers whose outputs are zero); it ends its reply
    (EOS) after the symbols in ``eos_after``."""
    vocab = tiny_vocab()
    w = _writer(path, "llama", "bigram-target")
    w.add_block_count(N_LAYER_TGT)
    w.add_feed_forward_length(32)
    _add_spm_vocab(w, vocab)
    emb, out = target_tensors(vocab, eos_after)
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", _ones(N_EMBD))
    w.add_tensor("output.weight", out)
    for il in range(N_LAYER_TGT):
        w.add_tensor(f"blk.{il}.attn_norm.weight", _ones(N_EMBD))
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{il}.{n}.weight", _zeros(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{il}.ffn_norm.weight", _ones(N_EMBD))
        w.add_tensor(f"blk.{il}.ffn_gate.weight", _zeros(32, N_EMBD))
        w.add_tensor(f"blk.{il}.ffn_up.weight", _zeros(32, N_EMBD))
        w.add_tensor(f"blk.{il}.ffn_down.weight", _zeros(N_EMBD, 32))
    _finish(w)
    return path


# -- EAGLE3 ----------------------------------------------------------------------------------

#: EAGLE3 has no q/k norms: the query/key amplitude sets how sharp the positional heads are
EAGLE3_QK = 24.0


def write_eagle3_predictor(path: Path, *, wrong: str = "", target_layers=(1, 2, 3),
                           n_embd: int = N_EMBD, fc_from: int = 0, fc_normed: bool = False) -> Path:
    """An ``eagle3`` drafter for :func:`write_bigram_target` (see the module doc), or,
    with ``n_embd=32``, for :func:`write_bigram_qwen35_mtp` (a hybrid target).

    ``g`` is the row of the ``fc_from``-th extracted layer; ``fc_normed``: that row is
    RMS-normed (a layer id equal to the target's layer count: its final, normed state)."""
    vocab = tiny_vocab()
    arch = "eagle3"
    w = _writer(path, arch, "eagle3-predictor", n_embd)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_block_count(1)
    w.add_feed_forward_length(32)
    w.add_array(f"{arch}.target_layers", [int(x) for x in target_layers])
    w.add_uint32(f"{arch}.target_hidden_size", n_embd)
    _add_spm_vocab(w, vocab)
    d, hd = n_embd, HEAD_DIM
    r = float(np.sqrt(2.0 / d))   # RMS of e_0 + e_T(c)
    en0 = 1.0 / r                 # the normalized embedding's constant entry

    fc = _zeros(d, 3 * d)
    fc[:, fc_from * d:(fc_from + 1) * d] = (r if fc_normed else 1.0) * np.eye(d)  # g = e(x) of that row
    w.add_tensor("fc.weight", fc)
    w.add_tensor("output_norm.weight", _ones(d))
    w.add_tensor("blk.0.attn_norm.weight", _ones(d))
    w.add_tensor("blk.0.attn_norm_2.weight", _ones(d))

    # concat = [embd_norm (d) | g_norm (d)]; heads: 0 = self (token), 1 = self (g), 2 = one back
    dist = (0, 0, 1)
    wq, wk = _zeros(N_HEAD * hd, 2 * d), _zeros(N_HEAD * hd, 2 * d)
    k0 = _rope_pattern(0, neox=False)
    for h, dd in enumerate(dist):
        wq[h * hd:(h + 1) * hd, C0] = EAGLE3_QK * _rope_pattern(dd, neox=False) / en0
        wk[h * hd:(h + 1) * hd, C0] = EAGLE3_QK * k0 / en0
    wv = _zeros(N_HEAD * hd, 2 * d)
    wo = _zeros(d, N_HEAD * hd)
    m = _map(wrong)
    for i in range(N_SYM):
        wv[0 * hd + i, T0 + i] = 1.0        # e_T(t)
        wv[1 * hd + i, d + T0 + i] = 1.0    # g_T
        wv[2 * hd + i, T0 + i] = 1.0        # e_T(t_prev)
    t = slice(T0, T0 + N_SYM)
    wo[t, 0 * hd:0 * hd + N_SYM] = (r / 3.0) * np.eye(N_SYM)
    wo[t, 1 * hd:1 * hd + N_SYM] = r * (m / 3.0 - np.eye(N_SYM))  # ... minus the raw residual g
    wo[t, 2 * hd:2 * hd + N_SYM] = (r / 3.0) * m
    w.add_tensor("blk.0.attn_q.weight", wq)
    w.add_tensor("blk.0.attn_k.weight", wk)
    w.add_tensor("blk.0.attn_v.weight", wv)
    w.add_tensor("blk.0.attn_output.weight", wo)
    w.add_tensor("blk.0.ffn_norm.weight", _ones(d))
    w.add_tensor("blk.0.ffn_gate.weight", _zeros(32, d))
    w.add_tensor("blk.0.ffn_up.weight", _zeros(32, d))
    w.add_tensor("blk.0.ffn_down.weight", _zeros(d, 32))
    _finish(w)
    return path


# -- DFlash / DSpark -------------------------------------------------------------------------

#: DFlash RMS-normalizes q and k per head; their norm weights set the sharpness
DFLASH_QK = 10.0
DFLASH_BLOCK = 4


def write_dflash_predictor(path: Path, *, dspark: bool = False, wrong: str = "",
                           target_layers=(0, 2, 3), block_size: int = DFLASH_BLOCK,
                           selector_top_k: int = 0, selector_boost: float = 10.0,
                           conf_stop: str = "") -> Path:
    """A two-layer ``dflash`` drafter (DSpark with ``dspark``: anchor-first, a zero Markov
    bias and a confident confidence head) for :func:`write_bigram_target`.

    ``selector_top_k > 0`` makes it a DFlash2 drafter: identity block convolutions, and a
    selector whose transition score adds ``selector_boost`` to the candidate that is the
    *target's* successor of the chosen predecessor (it knows the true bigram map even
    where ``wrong`` misleads the logits), so the lattice walk depends on its predecessor.

    DSpark's confidence head says 0.0025 for a slot whose predecessor (the anchor, or the
    slot before's argmax) is one of ``conf_stop``, 0.9975 otherwise: with ``p_min`` set,
    its drafts end there."""
    vocab = tiny_vocab()
    n_vocab = len(vocab)
    arch = "dflash"
    assert block_size - 1 <= N_HEAD
    w = _writer(path, arch, "dspark-predictor" if dspark else "dflash-predictor")
    w.add_block_count(2)
    w.add_feed_forward_length(32)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_array(f"{arch}.target_layers", [int(x) for x in target_layers])
    w.add_uint32(f"{arch}.target_hidden_size", N_EMBD)
    w.add_uint32(f"{arch}.block_size", block_size)
    if dspark:
        w.add_bool(f"{arch}.has_confidence_head", True)
    _add_spm_vocab(w, vocab)
    w.add_mask_token_id(0)  # <unk>: outside the cycle (the X dimension)
    conv_kernel, conv_group = 2, 8
    if selector_top_k:
        w.add_uint32(f"{arch}.conv_kernel_size", conv_kernel)
        w.add_uint32(f"{arch}.conv_group_size", conv_group)
        w.add_uint32(f"{arch}.selector_rank", N_SYM)
        w.add_uint32(f"{arch}.selector_top_k", selector_top_k)
    d, hd = N_EMBD, HEAD_DIM
    n_ctx_row = float(np.sqrt(d / 2.0))   # normalized e_0 + e_S(x) (or e_0 + e_T(t)): its entries
    n_anchor = float(np.sqrt(d / 6.0))    # normalized 2 e_0 + e_T(a) + e_S2(b): the T/S2 entries

    fc = _zeros(d, len(target_layers) * d)
    fc[C0, C0] = 1.0
    for i in range(N_SYM):
        fc[S0 + i, T0 + i] = 1.0          # the context row's symbol, in the S channel
    w.add_tensor("fc.weight", fc)
    w.add_tensor("enc.output_norm.weight", _ones(d))
    w.add_tensor("output_norm.weight", _ones(d))

    k0 = _rope_pattern(0, neox=True)
    for il in range(2):
        wq, wk = _zeros(N_HEAD * hd, d), _zeros(N_HEAD * hd, d)
        wv, wo = _zeros(N_HEAD * hd, d), _zeros(d, N_HEAD * hd)
        for h in range(N_HEAD):
            wq[h * hd:(h + 1) * hd, C0] = _rope_pattern(h + 1, neox=True)  # head h: h+1 back
            wk[h * hd:(h + 1) * hd, C0] = k0
        if il == 0:
            # head 0: the row one back (for the anchor: the last context row), M of its S
            # into S2, and its constant into the constant (every block slot gets e_0 = 2,
            # so that the anchor's own token alone is a state of height 1/2)
            m = _map(wrong)
            wv[0:N_SYM, S0:S0 + N_SYM] = m
            wo[S20:S20 + N_SYM, 0:N_SYM] = np.eye(N_SYM) / n_ctx_row
            wv[N_SYM, C0] = 1.0
            wo[C0, N_SYM] = 1.0 / n_ctx_row
        else:
            # head h: the anchor slot h+1 back, M^k of its T + S2, into T
            for h in range(block_size - 1):
                k = h + 1 if dspark else h
                m = _map(wrong, k)
                wv[h * hd:h * hd + N_SYM, T0:T0 + N_SYM] = m
                wv[h * hd:h * hd + N_SYM, S20:S20 + N_SYM] = m
                wo[T0:T0 + N_SYM, h * hd:h * hd + N_SYM] = np.eye(N_SYM) / n_anchor
        w.add_tensor(f"blk.{il}.attn_norm.weight", _ones(d))
        w.add_tensor(f"blk.{il}.attn_q.weight", wq)
        w.add_tensor(f"blk.{il}.attn_k.weight", wk)
        w.add_tensor(f"blk.{il}.attn_v.weight", wv)
        w.add_tensor(f"blk.{il}.attn_output.weight", wo)
        w.add_tensor(f"blk.{il}.attn_q_norm.weight", np.full(hd, DFLASH_QK, np.float32))
        w.add_tensor(f"blk.{il}.attn_k_norm.weight", np.full(hd, DFLASH_QK, np.float32))
        w.add_tensor(f"blk.{il}.ffn_norm.weight", _ones(d))
        w.add_tensor(f"blk.{il}.ffn_gate.weight", _zeros(32, d))
        w.add_tensor(f"blk.{il}.ffn_up.weight", _zeros(32, d))
        w.add_tensor(f"blk.{il}.ffn_down.weight", _zeros(d, 32))
        if selector_top_k:
            for kind in ("attn", "ffn"):  # numpy (side, tap, n_embd): tap 0 (this slot) weight 1
                base = _zeros(2, conv_kernel, d)
                base[:, 0, :] = 1.0
                w.add_tensor(f"blk.{il}.{kind}_conv_base", base)
                w.add_tensor(f"blk.{il}.{kind}_conv_proj.weight", _zeros(2 * conv_kernel * (d // conv_group), d))
    if selector_top_k:
        # score(p, s) = sum_r next[s, r] * prev[p, r] * gate_r, gate = hidden . t_embd ~ 1
        sel_prev, sel_next = _zeros(n_vocab, N_SYM), _zeros(n_vocab, N_SYM)
        for i, c in enumerate(CYCLE):
            sel_prev[token_id(vocab, c), i] = 1.0
            sel_next[token_id(vocab, next_sym(c)), i] = selector_boost
        hidden = _zeros(N_SYM, d)
        hidden[:, C0] = 1.0 / float(np.sqrt(d / 9.0)) / 2.0  # t_embd's constant: 2 sqrt(d/9)
        w.add_tensor("selector_hidden.weight", hidden)
        w.add_tensor("selector_predecessor.weight", sel_prev)
        w.add_tensor("selector_successor.weight", sel_next)
    if dspark:
        rank = 8
        w1 = _zeros(n_vocab, rank)  # the Markov head's predecessor features: [stop?, 0, ...]
        for c in conf_stop:
            w1[token_id(vocab, c), 0] = 1.0
        w.add_tensor("markov_w1.weight", w1)
        w.add_tensor("markov_w2.weight", _zeros(n_vocab, rank))     # no Markov bias
        conf = _zeros(1, d + rank)
        conf[0, d] = -12.0                                           # unsure after a stop symbol
        w.add_tensor("conf_proj.weight", conf)
        w.add_tensor("conf_proj.bias", np.array([6.0], np.float32))
    _finish(w)
    return path


# -- qwen35 with an MTP block ----------------------------------------------------------------

def write_bigram_qwen35_mtp(path: Path, *, wrong: str = "", n_embd: int = 32, n_ff: int = 32,
                            n_head: int = 2, n_head_kv: int = 1, head_dim: int = 16, d_state: int = 8,
                            n_group: int = 2, dt_rank: int = 2, d_conv: int = 4, seed: int = 5,
                            eos_after: str = "") -> Path:
    """The bigram target as a hybrid ``qwen35`` ([delta-net, attention] + one MTP block,
    the layout of :func:`tests.hidden_models.write_qwen35_mtp`). Every trunk layer's
    output projection (``ssm_out``, ``attn_output``, ``ffn_down``) is zero, so the final
    hidden state is the token's one-hot embedding. The MTP block reads
    ``concat(enorm(e(t)), hnorm(h))`` at position ``P`` (``t`` the token at ``P + 1``,
    ``h`` the target's -- or, chained, the MTP block's own -- normed state at ``P``);
    its ``eh_proj`` averages ``e_T(t)`` and ``M h_T`` and its attention and FFN add
    nothing, so it predicts ``next(t)`` when the two agree and the junk token when not."""
    import gguf

    assert n_embd > X
    arch = "qwen35"
    vocab = tiny_vocab()
    n_vocab = len(vocab)
    key_dim, value_dim = d_state * n_group, d_state * dt_rank
    conv_dim = key_dim * 2 + value_dim
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("bigram-qwen35-mtp")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(3)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_array(f"{arch}.rope.dimension_sections", [4, 2, 2, 0])
    w.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    w.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    w.add_uint32(f"{arch}.ssm.state_size", d_state)
    w.add_uint32(f"{arch}.ssm.time_step_rank", dt_rank)
    w.add_uint32(f"{arch}.ssm.group_count", n_group)
    w.add_uint32(f"{arch}.full_attention_interval", 2)
    w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    w.add_file_type(0)
    _add_spm_vocab(w, vocab)
    rng = np.random.default_rng(seed)

    def mat(rows, cols):  # small random internals (their outputs are projected to zero)
        return (rng.standard_normal((rows, cols)) * 0.3 / np.sqrt(cols)).astype(np.float32)

    emb = _zeros(n_vocab, n_embd)
    emb[:, C0] = 1.0
    emb[:, X] = 1.0
    out = _zeros(n_vocab, n_embd)
    for i, c in enumerate(CYCLE):
        t = token_id(vocab, c)
        emb[t, X] = 0.0
        emb[t, T0 + i] = 1.0
        out[_next_id(vocab, c, eos_after), T0 + i] = OUT_SCALE
    out[token_id(vocab, JUNK), T0:T0 + N_SYM] = JUNK_W * OUT_SCALE
    out[token_id(vocab, JUNK), C0] = JUNK_C * OUT_SCALE
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", _ones(n_embd))
    w.add_tensor("output.weight", out)

    def attn_block(il):
        q = n_head * head_dim
        w.add_tensor(f"blk.{il}.attn_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{il}.post_attention_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{il}.attn_q.weight", mat(2 * q, n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", _zeros(n_embd, q))
        w.add_tensor(f"blk.{il}.attn_q_norm.weight", _ones(head_dim))
        w.add_tensor(f"blk.{il}.attn_k_norm.weight", _ones(head_dim))

    def ffn(il):
        w.add_tensor(f"blk.{il}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{il}.ffn_down.weight", _zeros(n_embd, n_ff))

    # layer 0: gated delta net, layer 1: attention, layer 2: the MTP block
    w.add_tensor("blk.0.attn_norm.weight", _ones(n_embd))
    w.add_tensor("blk.0.post_attention_norm.weight", _ones(n_embd))
    w.add_tensor("blk.0.attn_qkv.weight", mat(conv_dim, n_embd))
    w.add_tensor("blk.0.attn_gate.weight", mat(value_dim, n_embd))
    w.add_tensor("blk.0.ssm_conv1d.weight", mat(conv_dim, d_conv))
    w.add_tensor("blk.0.ssm_dt.bias", _zeros(dt_rank))
    w.add_tensor("blk.0.ssm_a", -_ones(dt_rank))
    w.add_tensor("blk.0.ssm_beta.weight", mat(dt_rank, n_embd))
    w.add_tensor("blk.0.ssm_alpha.weight", mat(dt_rank, n_embd))
    w.add_tensor("blk.0.ssm_norm.weight", _ones(d_state))
    w.add_tensor("blk.0.ssm_out.weight", _zeros(n_embd, value_dim))
    ffn(0)
    attn_block(1)
    ffn(1)
    attn_block(2)
    ffn(2)
    eh = _zeros(n_embd, 2 * n_embd)
    eh[C0, C0] = 1.0
    eh[T0:T0 + N_SYM, T0:T0 + N_SYM] = 0.5 * np.eye(N_SYM)
    eh[T0:T0 + N_SYM, n_embd + T0:n_embd + T0 + N_SYM] = 0.5 * _map(wrong)
    w.add_tensor("blk.2.nextn.eh_proj.weight", eh)
    w.add_tensor("blk.2.nextn.enorm.weight", _ones(n_embd))
    w.add_tensor("blk.2.nextn.hnorm.weight", _ones(n_embd))
    w.add_tensor("blk.2.nextn.shared_head_norm.weight", _ones(n_embd))
    _finish(w)
    return path
