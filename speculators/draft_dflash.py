"""draft-dflash and draft-dspark (``common_speculative_impl_draft_dflash``)
-----------------------------------------------------------------------
The drafter is a ``dflash`` GGUF given with ``--spec-draft-model``. Its
draft context is made as ``common_speculative_init_result`` makes it: the
target's ``n_ctx``, ``n_rs_seq = 0``, ``ctx_other`` = the target's context
(the drafter borrows the target's token embeddings and LM head), and room
for ``n_max + 1`` outputs (the whole block). The target outputs the inputs
of the layers in the drafter's ``target_layers``; after each target decode
they are concatenated per token and decoded on the draft context as an
embeddings batch, which the DFlash graph fuses and writes into the draft
KV cache at the same positions (KV injection). ``draft`` decodes one
non-causal block at ``pos0``: ``[id_last, <mask> * n_max]`` for DFlash
(slots 1.. are the draft, greedy top-k 10, stop below ``p_min``), or, for
DSpark's anchor-first layout, ``[id_last, <mask> * (n_max - 1)]`` with
every slot a draft (the graph chains the Markov head's bias through the
block) and a cut-off where the confidence head falls below ``p_min``.
DFlash2 drafters (``selector_top_k > 0``) are read through the selector
lattice (:func:`walk_lattice`). ``n_max``/``n_min`` are clamped to the
trained ``dflash.block_size`` (``block_size - 1`` drafts, ``block_size``
for anchor-first DSpark); ``n_min`` discards shorter drafts. The block's
cells are dropped after drafting; the verify batch injects what counts.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Sequence

import numpy as np

import llama_cpp as lc

from . import ext
from .base import DraftRequest
from .chain import Unavailable, register
from .hidden_base import LAYER_INPUT_ARCHS, _TargetFed, _enable_output, _engine_parts, _require, _rows, pick_top_k
from .llama import Context, Model, ModelError
from .params import SpecParams
from .types import SpecType

log = logging.getLogger("speculators.draft_hidden")


DFLASH_SYMBOLS = ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp",
                  "llama_model_target_layer_ids", "llama_model_target_layer_ids_n",
                  "llama_model_dflash_selector_top_k", "llama_set_embeddings_nextn",
                  "llama_get_embeddings_nextn")

#: architectures whose graph also records the input of the (non-existent) layer n_layer,
#: i.e. the final hidden state, in the bundled llama.cpp (``t_layer_inp[n_layer]``)
FINAL_LAYER_INPUT_ARCHS = frozenset({"deepseek4", "nemotron_h", "mimo2"})

#: the trained block size the reference assumes when ``dflash.block_size`` is missing
DFLASH_DEFAULT_BLOCK_SIZE = 16


def output_limits(n_batch: int, n_parallel: int, n_draft: int) -> tuple[int, int]:
    """``common_speculative_get_output_limits``: (total, per sequence) outputs a
    verify batch needs -- one row per drafted token plus the sampled one,
    never more than ``n_batch``.

    >>> output_limits(512, 1, 16)
    (17, 17)
    >>> output_limits(8, 2, 16)
    (8, 8)
    """
    per_seq = 1 + max(0, int(n_draft))
    total = int(n_parallel) * per_seq
    return min(n_batch, total), min(n_batch, per_seq)


def _meta_bool(model: Model, key: str) -> bool | None:
    v = model.meta(key)
    if v is None:
        return None
    return v.strip().lower() == "true"


def check_dflash_drafter(kind: str, draft: Model, target: Model, layer_ids: Sequence[int]) -> None:
    """Refuse a DFlash/DSpark drafter made for another target.

    llama.cpp's DFlash graph fuses ``len(layer_ids) * n_embd`` features with
    the *drafter's* ``n_embd`` and borrows the target's token embeddings and
    LM head, so the hidden sizes and vocabularies must be equal, and every
    layer id must be a layer input the target's graph records.
    """
    arch = target.meta("general.architecture") or "?"
    n_layer = target.n_layer
    top = n_layer if arch in FINAL_LAYER_INPUT_ARCHS else n_layer - 1
    if arch not in LAYER_INPUT_ARCHS:
        raise Unavailable(
            f"the target architecture '{arch}' does not expose its layer inputs in this llama.cpp "
            f"build (its graph sets no t_layer_inp), so {kind} cannot read the target's hidden states")
    bad = [i for i in layer_ids if i < 0 or i > top]
    if bad:
        raise Unavailable(
            f"the {kind} drafter {draft.path} reads target layers {list(layer_ids)}, but the target "
            f"has {n_layer} layers (layer ids {bad} do not exist): it was made for another model")
    hidden = draft.meta("dflash.target_hidden_size")
    if hidden is not None and hidden.strip().isdigit() and int(hidden) != target.n_embd:
        raise Unavailable(
            f"the {kind} drafter {draft.path} expects a target hidden size of {int(hidden)}, "
            f"but the target's is {target.n_embd}: it was made for another model")
    if draft.n_embd != target.n_embd:
        raise Unavailable(
            f"the {kind} drafter {draft.path} has hidden size {draft.n_embd}, but the target's is "
            f"{target.n_embd}; llama.cpp's DFlash graph needs them equal: it was made for another model")
    if draft.n_vocab != target.n_vocab:
        raise Unavailable(f"the {kind} drafter {draft.path} has {draft.n_vocab} tokens, the target "
                          f"{target.n_vocab}: it was made for another model")


def walk_lattice(lattice: np.ndarray, top_k: int, p_min: float) -> list[int]:
    """The DFlash2 selector walk over the lattice the graph packs into the NextN rows.

    Row ``i`` of a block (``i >= 1``) holds the ``top_k`` candidate ids of slot
    ``i`` (as floats), then for each candidate of slot ``i - 1`` (the
    predecessor) the ``top_k`` scores of the successors. Row 0 (the anchor) is
    empty; slot 1's predecessor is the anchor token itself, so all its score
    rows are equal and the walk starts at predecessor 0. Each step takes the
    best-scoring successor; with ``p_min > 0`` it stops where the softmax of
    that score row at its maximum falls below ``p_min``.

    >>> k = 2
    >>> lat = np.zeros((3, 8), dtype=np.float32)
    >>> lat[1, :6] = [7, 9,  0.0, 1.0,  0.0, 1.0]   # slot 1: candidates 7, 9 -> 9 wins
    >>> lat[2, :6] = [4, 5,  3.0, 0.0,  0.0, 2.0]   # after 9 (candidate 1): 5 wins
    >>> walk_lattice(lat, k, 0.0)
    [9, 5]
    >>> walk_lattice(lat, k, 0.8)  # softmax([0, 1]) at 1 is 0.73 < 0.8
    []
    """
    out: list[int] = []
    pred = 0
    for i in range(1, lattice.shape[0]):
        row = lattice[i]
        scores = row[top_k + pred * top_k: top_k + (pred + 1) * top_k]
        pred = int(np.argmax(scores))
        if p_min > 0.0:
            s = scores.astype(np.float64)
            if 1.0 / float(np.exp(s - s[pred]).sum()) < p_min:
                break
        out.append(int(row[pred]))
    return out


def dspark_cut(conf: np.ndarray | None, first: int, n_block: int, p_min: float) -> int:
    """DSpark's confidence cut-off: the block slots ``first..`` up to (not
    including) the first whose confidence is below ``p_min``; returns the end
    slot. Without confidences (``p_min == 0``) every slot is read.

    >>> dspark_cut(np.array([0.9, 0.8, 0.4, 0.9]), 0, 4, 0.5)
    2
    >>> dspark_cut(None, 1, 4, 0.0)
    4
    """
    if conf is None:
        return n_block
    for i in range(first, n_block):
        if float(conf[i]) < p_min:
            return i
    return n_block


class _InjectBatch:
    """An embeddings-only ``llama_batch`` of fused-feature rows (``n_embd_enc`` wide).

    For an M-RoPE drafter every row needs four position entries (section-major,
    ``pos[j * n_tokens + i]``), more than ``llama_batch_init`` allocates: like the
    reference we give the batch a larger position array of our own.
    """

    def __init__(self, n_tokens: int, n_embd: int, mrope: bool):
        self.n_max = n_tokens
        self.mrope = mrope
        self.b = lc.llama_batch_init(n_tokens, n_embd, 1)
        self.embd = np.ctypeslib.as_array(self.b.embd, shape=(n_tokens, n_embd))
        # the address as an int: a pointer read from a struct field shares the field's memory
        self._pos_orig = ctypes.cast(self.b.pos, ctypes.c_void_p).value
        self._pos = (lc.llama_pos * (4 * n_tokens if mrope else n_tokens))()
        self.b.pos = ctypes.cast(self._pos, ctypes.POINTER(lc.llama_pos))

    def fill(self, feats: np.ndarray, pos0: int) -> None:
        n = feats.shape[0]
        b = self.b
        self.embd[:n] = feats
        for i in range(n):
            p = pos0 + i
            self._pos[i] = p
            if self.mrope:
                self._pos[n + i] = p
                self._pos[2 * n + i] = p
                self._pos[3 * n + i] = 0
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = False
        b.n_tokens = n

    def free(self) -> None:
        if self.b is not None:
            # llama_batch_free frees the array it allocated, not ours
            self.b.pos = ctypes.cast(ctypes.c_void_p(self._pos_orig), ctypes.POINTER(lc.llama_pos))
            lc.llama_batch_free(self.b)
            self.b = None


class DraftDFlash(_TargetFed):
    """``common_speculative_impl_draft_dflash`` for one sequence (draft-dflash).

    After every target decode the target's layer inputs at the drafter's
    ``target_layers`` are concatenated per token and decoded on the draft
    context as an embeddings batch: the DFlash graph fuses them (``fc``) and
    writes K/V for those positions straight into the draft KV cache (KV
    injection). To draft, one non-causal block ``[id_last, <mask> * n_max]``
    is decoded at ``pos0..``; the mask slots attend to the injected context
    and to each other and are read greedily (top-k 10, first candidate,
    stopping below ``p_min``). DFlash2 drafters (``selector_top_k > 0``) emit
    a lattice instead of logits: per block slot the top-k candidate ids and,
    per predecessor candidate, the transition scores; the draft walks it
    from the anchor, taking the best successor each step. The block's cells
    are dropped again: the verify batch's features replace them.
    """

    type = SpecType.DRAFT_DFLASH
    is_dspark = False

    def __init__(self, params: SpecParams, target_ctx: Context, draft_model: Model, *,
                 n_threads: int | None = None, owns_model: bool = False):
        d = params.draft
        super().__init__(n_max=d.n_max)
        kind = "DSpark" if self.is_dspark else "DFlash"
        self.kind = kind
        self.p_min = float(d.p_min)
        self.n_min = int(d.n_min)
        self.n_max_param = int(d.n_max)
        self.tgt = target_ctx
        self.model = draft_model
        self._owns_model = owns_model
        self._keys: list = []
        self._hook = None
        self.batch = None
        self.inject = None
        self.ctx = None
        tgt_model = target_ctx.model
        self.layer_ids = ext.target_layer_ids(draft_model.ptr)
        if not self.layer_ids:
            raise Unavailable(f"{draft_model.path} is not a {kind} drafter (it names no target_layers)")
        check_dflash_drafter(kind, draft_model, tgt_model, self.layer_ids)
        self.n_embd_tgt = tgt_model.n_embd
        self.n_embd_dec = draft_model.n_embd
        self.n_embd_enc = len(self.layer_ids) * self.n_embd_tgt

        self._read_metadata(draft_model)
        self._clamp_draft_size()
        self.ctx = self._open_context(draft_model, target_ctx, int(d.n_max), n_threads)
        self.n_ubatch = int(lc.llama_n_ubatch(self.ctx.ptr))
        self.is_mrope = int(lc.llama_model_rope_type(draft_model.ptr)) == int(lc.LLAMA_ROPE_TYPE_MROPE)
        self.batch = lc.llama_batch_init(self.ctx.n_batch, 0, 1)
        self.inject = _InjectBatch(self.n_ubatch, self.n_embd_enc, self.is_mrope)
        self._get_layer = ext.require("llama_get_embeddings_layer_inp")
        self._get_nextn = ext.require("llama_get_embeddings_nextn")
        self._keys = [("layer", i) for i in self.layer_ids]
        for k in self._keys:
            _enable_output(target_ctx, k, True)
        # DFlash2 reads its lattice from the NextN slot for every row and never reads logits
        ext.require("llama_set_embeddings_nextn")(self.ctx.ptr, True, not self.is_dflash2)
        lc.llama_set_causal_attn(self.ctx.ptr, self.causal_attn)
        self.n_injected = 0
        self.n_blocks = 0
        #: inject every target batch's features (False: paused, see :meth:`set_upkeep`); what a
        #: pause did not inject: the first position and the feature rows from there on
        self.upkeep = True
        self._deferred_pos0 = -1
        self._deferred: list[np.ndarray] = []
        self.n_catchups = 0
        self.n_catchup_tokens = 0
        log.info("draft-%s: n_max=%d n_min=%d p_min=%.2f block_size=%d mask=%d n_extract=%d "
                 "sample_from_anchor=%s dflash2=%s", kind.lower(), self.n_max_param, self.n_min,
                 self.p_min, self.block_size, self.mask_token, len(self.layer_ids),
                 self.sample_from_anchor, self.is_dflash2)
        self._attach(target_ctx)

    def _read_metadata(self, draft_model: Model) -> None:
        """The drafter's block: its size, whether it samples from the anchor, its attention, its
        DFlash2 selector and mask token; Unavailable where it has no mask token, or (DSpark) no
        confidence head while ``p_min`` asks for one."""
        kind = self.kind
        bs = draft_model.meta("dflash.block_size")
        self.block_size = int(bs) if bs is not None and bs.strip().lstrip("-").isdigit() \
            else DFLASH_DEFAULT_BLOCK_SIZE
        anchor = _meta_bool(draft_model, "dflash.sample_from_anchor")
        self.sample_from_anchor = True if anchor is None else anchor
        self.causal_attn = bool(_meta_bool(draft_model, "dflash.attention.causal"))
        self.selector_top_k = int(ext.require("llama_model_dflash_selector_top_k")(draft_model.ptr))
        self.is_dflash2 = self.selector_top_k > 0
        self.mask_token = int(lc.llama_vocab_mask(draft_model.vocab))
        if self.mask_token < 0:
            raise Unavailable(f"the {kind} drafter {draft_model.path} has no mask token "
                              f"(tokenizer.ggml.mask_token_id)")
        if self.is_dspark and self.p_min > 0.0 and _meta_bool(draft_model, "dflash.has_confidence_head") is False:
            raise Unavailable("the DSpark drafter has no confidence head: set --spec-draft-p-min 0")

    def _clamp_draft_size(self) -> None:
        """``n_max``/``n_min`` cut to what one block can draft (with a warning): the block is
        ``[id_last, <mask> * n]``, so in-place denoising gives at most block_size - 1 drafts;
        anchor-first DSpark reads every slot, so a full block_size."""
        self.anchor_first = self.is_dspark and self.sample_from_anchor
        n_draft_max = self.block_size if self.anchor_first else self.block_size - 1
        if self.n_max_param > n_draft_max or self.n_min > n_draft_max:
            log.warning("draft-%s: requested draft size (n_max=%d, n_min=%d) exceeds the trained block "
                        "size %d -- clamping to %d", self.kind.lower(), self.n_max_param, self.n_min,
                        self.block_size, n_draft_max)
            self.n_max_param = min(self.n_max_param, n_draft_max)
            self.n_min = min(self.n_min, n_draft_max)
        self.n_max = self.n_max_param

    def _open_context(self, draft_model: Model, target_ctx: Context, n_max: int,
                      n_threads: int | None) -> Context:
        """The draft context, sharing the target's (``ctx_other``) for KV injection, with room for
        a block's outputs (common_speculative_init_result + common_base_params_to_speculative for
        a block drafter)."""
        overrides = {
            "ctx_other": target_ctx.ptr,
            "n_rs_seq": 0,
            "n_outputs_max": max(1, n_max + 1),
            "n_outputs_max_per_seq": 1,
        }
        try:
            return Context(draft_model, n_ctx=target_ctx.n_ctx, n_batch=target_ctx.n_batch,
                           n_threads=n_threads or target_ctx.n_threads, overrides=overrides)
        except ModelError as e:
            raise Unavailable(f"cannot create the {self.kind} draft context: {e}") from None

    # -- KV injection of the target's features ---------------------------------------------
    @property
    def can_pause(self) -> bool:
        return True

    def set_upkeep(self, on: bool) -> None:
        """Inject the target's batches into the draft cache (True), or only keep their feature
        rows (the target's rows exist only while its batch is decoded) until the next draft or
        until resumed, which injects them in one go: the same rows at the same positions."""
        self.upkeep = bool(on)

    def _n_deferred(self) -> int:
        return sum(len(f) for f in self._deferred)

    def _held(self) -> int:
        """The last position the draft cache holds, or will once caught up."""
        return self._deferred_pos0 + self._n_deferred() - 1 if self._deferred else self.ctx.pos_max()

    def _features(self, n: int) -> np.ndarray:
        w = self.n_embd_tgt
        feats = np.empty((n, self.n_embd_enc), dtype=np.float32)
        for k, lid in enumerate(self.layer_ids):
            feats[:, k * w:(k + 1) * w] = _rows(self._get_layer(self.tgt.ptr, lid), n, w)
        return feats

    def _process(self, tokens: list[int], pos0: int) -> None:
        n = len(tokens)
        if n <= 0:
            return
        if self.upkeep and not self._deferred:
            self._inject(self._features(n), pos0)
            return
        # paused: keep the rows; resumed with a backlog: inject both
        self.ctx.seq_rm(pos0, -1)
        if self._deferred:
            keep = pos0 - self._deferred_pos0
            if keep < 0:
                self._deferred = []
            else:
                out, total = [], 0
                for f in self._deferred:
                    if total >= keep:
                        break
                    out.append(f[:keep - total])
                    total += len(out[-1])
                self._deferred = out
        held = self._held()
        if 0 <= held < pos0 - 1:
            # a hole: as _inject, start afresh
            self.ctx.clear()
            self._deferred = []
        if not self._deferred:
            self._deferred_pos0 = pos0
        self._deferred.append(self._features(n))
        if self.upkeep:
            self._catch_up()

    def _catch_up(self) -> bool:
        """Inject what a pause kept, in one go (chunked at n_ubatch)."""
        if not self._deferred:
            return True
        feats = np.concatenate(self._deferred) if len(self._deferred) > 1 else self._deferred[0]
        p0 = self._deferred_pos0
        self._deferred = []
        self.n_catchups += 1
        self.n_catchup_tokens += len(feats)
        return self._inject(feats, p0)

    def _inject(self, all_feats: np.ndarray, pos0: int) -> bool:
        n = len(all_feats)
        if n <= 0:
            return True
        ctx = self.ctx
        ctx.seq_rm(pos0, -1)  # the rejected tail of the last verify batch, if any
        pm = ctx.pos_max()
        if 0 <= pm < pos0 - 1:
            # a hole (a failed injection): the cache must stay contiguous, start afresh
            log.debug("draft-%s: draft cache ends at %d, target batch starts at %d; clearing",
                      self.kind.lower(), pm, pos0)
            ctx.clear()
        for off in range(0, n, self.n_ubatch):
            m = min(self.n_ubatch, n - off)
            feats = np.ascontiguousarray(all_feats[off:off + m])
            self.inject.fill(feats, pos0 + off)
            rc = lc.llama_decode(ctx.ptr, self.inject.b)
            if rc != 0:
                log.warning("draft-%s: KV injection failed (llama_decode %d, %d rows at %d)",
                            self.kind.lower(), rc, m, pos0 + off)
                ctx.seq_rm(pos0, -1)
                return False
            self.n_injected += m
        return True

    def begin(self, prompt: Sequence[int]) -> None:
        n = len(prompt)
        if n and self._held() < n - 1:
            log.warning("draft-%s: the draft cache holds positions up to %d of a %d-token prompt; "
                        "drafts may degrade", self.kind.lower(), self._held(), n)

    # -- drafting -----------------------------------------------------------------------------
    def draft(self, req: DraftRequest) -> list[int]:
        ctx = self.ctx
        pos0 = req.pos0
        # asked while paused (a probe): inject what the pause kept first
        if self._deferred and not self._as_upkeep(self._catch_up):
            return []
        n_draft = self.n_max_param
        if n_draft <= 0:
            return []
        n_block = n_draft + (0 if self.anchor_first else 1)
        # the block must fit the draft context and be one ubatch (it attends to itself)
        n_block = min(n_block, ctx.n_ctx - pos0, self.n_ubatch)
        if n_block < (1 if self.anchor_first else 2):
            return []
        ctx.seq_rm(pos0, -1)
        pm = ctx.pos_max()
        if 0 <= pm < pos0 - 1:
            return []  # out of step with the target (should not happen)
        b = self.batch
        want_logits = not self.is_dflash2
        for i in range(n_block):
            b.token[i] = req.id_last if i == 0 else self.mask_token
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = want_logits
        b.n_tokens = n_block
        result: list[int] = []
        try:
            rc = lc.llama_decode(ctx.ptr, b)
            if rc != 0:
                log.warning("draft-%s: llama_decode of the block returned %d", self.kind.lower(), rc)
                return []
            self.n_blocks += 1
            if self.is_dflash2:
                result = self._walk_lattice(n_block)
            elif self.is_dspark:
                result = self._read_dspark(n_block)
            else:
                for i in range(1, n_block):
                    tok, p = pick_top_k(ctx.logits(i), self.p_min, self.model.suppress_tokens)
                    if p < self.p_min:
                        break
                    result.append(tok)
        finally:
            ctx.seq_rm(pos0, -1)  # the verify batch injects what the target keeps
        if len(result) < self.n_min:
            return []
        return result

    def _walk_lattice(self, n_block: int) -> list[int]:
        lat = _rows(self._get_nextn(self.ctx.ptr), n_block, self.n_embd_dec)
        return walk_lattice(lat, self.selector_top_k, self.p_min)

    def _read_dspark(self, n_block: int) -> list[int]:
        conf = None
        if self.p_min > 0.0:
            ptr = self._get_nextn(self.ctx.ptr)
            if ptr:
                conf = _rows(ptr, n_block, self.n_embd_dec)[:, 0]
        first = 0 if self.sample_from_anchor else 1
        n = dspark_cut(conf, first, n_block, self.p_min)
        return [pick_top_k(self.ctx.logits(i), 0.0, self.model.suppress_tokens)[0] for i in range(first, n)]

    def accept(self, n_accepted: int, is_other: bool) -> None:
        pass  # the next target batch brings the features of whatever was accepted

    def close(self) -> None:
        self._release_target()
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if self.inject is not None:
            self.inject.free()
            self.inject = None
        self._release_draft()


class DraftDSpark(DraftDFlash):
    """draft-dspark: a DFlash drafter with DSpark's Markov head (and optionally
    its confidence head), in the anchor-first block layout: the block is
    ``[id_last, <mask> * (n_max - 1)]`` and *every* slot is a draft (slot 0
    predicts the token after ``id_last``), unless the file says
    ``dflash.sample_from_anchor = false`` (slot 0 is then a bonus anchor, as
    in DFlash). With ``p_min > 0`` the draft stops at the first slot whose
    confidence is below ``p_min``."""

    type = SpecType.DRAFT_DSPARK
    is_dspark = True


def _has_markov_head(path: str) -> bool | None:
    """Whether the GGUF at ``path`` has DSpark's Markov head (None: cannot tell)."""
    try:
        from .gguf_detect import types_from_gguf
    except ImportError:  # pragma: no cover
        return None
    types = types_from_gguf(path)
    if not types:
        return None
    return SpecType.DRAFT_DSPARK in types


def _make_block_drafter(cls, params: SpecParams, resources: dict):
    kind = "DSpark" if cls.is_dspark else "DFlash"
    _require(*DFLASH_SYMBOLS)
    target, engine = _engine_parts(resources)
    d = params.draft
    draft_model: Model | None = resources.get("dflash_model")
    owned = False
    if draft_model is None:
        if not d.model:
            raise Unavailable(f"no {kind} drafter is set (--spec-draft-model PATH)")
        from .draft_simple import acquire_draft_model, draft_devices
        try:
            draft_model = acquire_draft_model(d.model, d.n_gpu_layers, draft_devices(d, resources, shares_target=kind))
        except ModelError as e:
            msg = str(e)
            if "unknown model architecture" in msg and "dflash" in msg:
                raise Unavailable(f"this llama.cpp build does not know the 'dflash' architecture, "
                                  f"so it cannot load {d.model}") from None
            raise Unavailable(msg) from None
        owned = True
    try:
        arch = draft_model.meta("general.architecture")
        if arch != "dflash":
            raise Unavailable(f"{draft_model.path} is not a {kind} drafter (architecture '{arch}')")
        markov = _has_markov_head(draft_model.path)
        if cls.is_dspark and markov is False:
            raise Unavailable(f"{draft_model.path} is a DFlash drafter without DSpark's Markov head "
                              f"(markov_w1.weight); use --spec-type draft-dflash")
        if not cls.is_dspark and markov:
            log.warning("draft-dflash: %s has DSpark's Markov head; --spec-type draft-dspark reads it "
                        "the way it was trained", draft_model.path)
        return cls(params, engine.ctx, draft_model, n_threads=engine.config.n_threads, owns_model=owned)
    except Exception:
        if owned:
            from .draft_simple import release_draft_model
            release_draft_model(draft_model)
        raise


@register(SpecType.DRAFT_DFLASH)
def make_draft_dflash(params: SpecParams, resources: dict) -> DraftDFlash:
    """Load (or reuse) the DFlash drafter set with ``--spec-draft-model``, check it, build it."""
    return _make_block_drafter(DraftDFlash, params, resources)


@register(SpecType.DRAFT_DSPARK)
def make_draft_dspark(params: SpecParams, resources: dict) -> DraftDSpark:
    """Load (or reuse) the DSpark drafter set with ``--spec-draft-model``, check it, build it."""
    return _make_block_drafter(DraftDSpark, params, resources)
