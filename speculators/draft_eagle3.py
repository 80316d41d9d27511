"""draft-eagle3 (``common_speculative_impl_draft_eagle3``)
-------------------------------------------------------
The drafter is an ``eagle3`` GGUF given with ``--spec-draft-model``. The target
outputs the inputs of three of its layers (``target_layers``); the drafter's
encoder fuses each token's three rows into ``g``, its decoder reads
``(token[p+1], g[p])`` at position ``p``. See :class:`DraftEagle3`.
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
from .hidden_base import (LAYER_INPUT_ARCHS, _TargetFed, _TokEmbdBatch, _enable_output, _engine_parts,
                          _require, _rows, pick_top_k)
from .llama import Context, DecodeError, Model, ModelError
from .params import SpecParams
from .types import SpecType

log = logging.getLogger("speculators.draft_hidden")


EAGLE3_SYMBOLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn",
                  "llama_get_embeddings_nextn_ith", "llama_set_embeddings_layer_inp",
                  "llama_get_embeddings_layer_inp", "llama_model_target_layer_ids",
                  "llama_model_target_layer_ids_n")


def check_layer_ids(kind: str, draft: Model, target: Model, layer_ids: Sequence[int],
                    n_embd_tgt_expected: int | None) -> None:
    """Refuse a drafter built for another target (hidden size, layer ids, architecture)."""
    arch = target.meta("general.architecture") or "?"
    n_layer = target.n_layer
    bad = [i for i in layer_ids if i < 0 or i > n_layer]
    if bad:
        raise Unavailable(
            f"the {kind} drafter {draft.path} reads target layers {list(layer_ids)}, but the target "
            f"has {n_layer} layers (layer ids {bad} do not exist): it was made for another model")
    if n_embd_tgt_expected is not None and n_embd_tgt_expected != target.n_embd:
        raise Unavailable(
            f"the {kind} drafter {draft.path} expects a target hidden size of {n_embd_tgt_expected}, "
            f"but the target's is {target.n_embd}: it was made for another model")
    if any(i < n_layer for i in layer_ids) and arch not in LAYER_INPUT_ARCHS:
        raise Unavailable(
            f"the target architecture '{arch}' does not expose its layer inputs in this llama.cpp "
            f"build (its graph sets no t_layer_inp), so {kind} cannot read the target's hidden states")


class DraftEagle3(_TargetFed):
    """``common_speculative_impl_draft_eagle3`` for one sequence.

    The target outputs the inputs of three of its layers; the drafter's
    encoder (``llama_encode``) fuses each token's three rows into ``g``; its
    decoder reads ``(token[p+1], g[p])`` at position ``p``. The last ``g`` of
    a batch has no next token yet: it is the *deferred boundary*
    (``pending_g``/``pending_pos``), completed by the next batch (the
    cross-ubatch bridge) or by ``draft`` with ``id_last``.
    """

    type = SpecType.DRAFT_EAGLE3

    def __init__(self, params: SpecParams, target_ctx: Context, draft_model: Model, *,
                 n_threads: int | None = None, owns_model: bool = False):
        d = params.draft
        super().__init__(n_max=d.n_max)
        self.p_min = float(d.p_min)
        self.n_min = int(d.n_min)
        self.n_max_param = int(d.n_max)
        self.tgt = target_ctx
        self.model = draft_model
        self._owns_model = owns_model
        tgt_model = target_ctx.model
        self.layer_ids = ext.target_layer_ids(draft_model.ptr)
        if len(self.layer_ids) != 3:
            raise Unavailable(f"{draft_model.path} is not an EAGLE3 drafter "
                              f"(expected 3 extract layers, got {len(self.layer_ids)})")
        hidden = draft_model.meta("eagle3.target_hidden_size")
        check_layer_ids("EAGLE3", draft_model, tgt_model, self.layer_ids,
                        int(hidden) if hidden else None)
        if draft_model.n_vocab != tgt_model.n_vocab:
            raise Unavailable(f"the EAGLE3 drafter {draft_model.path} has {draft_model.n_vocab} tokens, "
                              f"the target {tgt_model.n_vocab}: it was made for another model")
        self.n_embd_tgt = tgt_model.n_embd
        self.n_layer_tgt = tgt_model.n_layer
        self.n_embd_dec = draft_model.n_embd
        self.n_embd_enc = 3 * self.n_embd_tgt
        overrides = {"ctx_other": target_ctx.ptr, "n_rs_seq": 0}
        try:
            self.ctx = Context(draft_model, n_ctx=target_ctx.n_ctx, n_batch=target_ctx.n_batch,
                               n_threads=n_threads or target_ctx.n_threads, overrides=overrides)
        except ModelError as e:
            raise Unavailable(f"cannot create the EAGLE3 draft context: {e}") from None
        self._get_nextn = ext.require("llama_get_embeddings_nextn")
        self._get_nextn_ith = ext.require("llama_get_embeddings_nextn_ith")
        self._get_layer = ext.require("llama_get_embeddings_layer_inp")
        self._keys = [("layer", i) if i < self.n_layer_tgt else "nextn" for i in self.layer_ids]
        for k in self._keys:
            _enable_output(target_ctx, k, True)
        ext.require("llama_set_embeddings_nextn")(self.ctx.ptr, True, True)
        self.batch = _TokEmbdBatch(self.ctx.n_batch, self.n_embd_dec)
        self._stash = bool(tgt_model.is_recurrent or tgt_model.is_hybrid)
        self.pending_g = np.zeros(self.n_embd_dec, dtype=np.float32)
        self.pending_pos = -1
        self.verify_g = np.zeros((0, self.n_embd_dec), dtype=np.float32)
        self.verify_pos_first = -1
        #: decode every target batch's (token, encoded row) pairs on the draft context (False:
        #: paused, see :meth:`set_upkeep`); what a pause did not decode, in position order
        self.upkeep = True
        #: (token, position, row, raw): raw rows are the target's features, not yet encoded
        self._deferred: list[tuple[int, int, np.ndarray, bool]] = []
        #: pending_g / verify_g hold raw features (a batch that arrived while paused)
        self._pending_raw = False
        self._verify_raw = False
        self.n_catchups = 0
        self.n_catchup_tokens = 0
        self._attach(target_ctx)

    @property
    def can_pause(self) -> bool:
        return True

    def set_upkeep(self, on: bool) -> None:
        """Decode the target's batches on the draft context (True), or only keep the (token,
        position, feature row) triples they would decode (the target's rows exist only while its
        batch is decoded), until the next draft or until resumed, which encodes and decodes them
        in one batch: the same inputs at the same positions."""
        self.upkeep = bool(on)

    def _held(self) -> int:
        """The last position the draft context holds, or will once caught up."""
        return self._deferred[-1][1] if self._deferred else self.ctx.pos_max()

    def _decode_items(self, items: Sequence[tuple[int, int, np.ndarray, bool]]) -> bool:
        ctx, b = self.ctx, self.batch
        raw = [i for i, it in enumerate(items) if it[3]]
        if raw:
            try:
                enc = self._encode(np.stack([items[i][2] for i in raw]))
            except DecodeError as e:
                log.warning("draft-eagle3: %s", e)
                ctx.seq_rm(items[0][1], -1)
                return False
            items = list(items)
            for j, i in enumerate(raw):
                items[i] = (items[i][0], items[i][1], enc[j], False)
        for start in range(0, len(items), b.n_max):
            b.clear()
            for tok, pos, g, _ in items[start:start + b.n_max]:
                b.add(tok, pos, False, g)
            rc = lc.llama_decode(ctx.ptr, b.b)
            if rc != 0:
                log.warning("draft-eagle3: llama_decode on the draft context failed (%d)", rc)
                ctx.seq_rm(items[0][1], -1)
                return False
        return True

    def _catch_up(self) -> bool:
        """Decode what a pause deferred (chunked at n_batch)."""
        items = self._deferred
        if not items:
            return True
        self._deferred = []
        self.ctx.seq_rm(items[0][1], -1)
        self.n_catchups += 1
        self.n_catchup_tokens += len(items)
        return self._decode_items(items)

    def _features(self, n: int) -> np.ndarray:
        feats = np.empty((n, self.n_embd_enc), dtype=np.float32)
        for k, lid in enumerate(self.layer_ids):
            ptr = (self._get_layer(self.tgt.ptr, lid) if lid < self.n_layer_tgt
                   else self._get_nextn(self.tgt.ptr))
            feats[:, k * self.n_embd_tgt:(k + 1) * self.n_embd_tgt] = _rows(ptr, n, self.n_embd_tgt)
        return feats

    def _encode(self, feats: np.ndarray) -> np.ndarray:
        n = feats.shape[0]
        g = np.empty((n, self.n_embd_dec), dtype=np.float32)
        n_ub = int(lc.llama_n_ubatch(self.ctx.ptr))
        for i in range(0, n, n_ub):
            chunk = np.ascontiguousarray(feats[i:i + n_ub])
            m = chunk.shape[0]
            b = lc.llama_batch()
            b.n_tokens = m
            b.embd = chunk.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            rc = lc.llama_encode(self.ctx.ptr, b)
            if rc != 0:
                raise DecodeError(f"llama_encode on the EAGLE3 context failed ({rc})")
            g[i:i + m] = _rows(self._get_nextn(self.ctx.ptr), m, self.n_embd_dec)
        return g

    def _process(self, tokens: list[int], pos0: int) -> None:
        n = len(tokens)
        if n == 0:
            return
        ctx = self.ctx
        raw = not self.upkeep   # paused: the features are kept, encoded when caught up
        try:
            g = self._features(n) if raw else self._encode(self._features(n))
        except DecodeError as e:
            log.warning("draft-eagle3: %s", e)
            self.pending_pos = -1
            return
        ctx.seq_rm(pos0, -1)  # the last round's drafts (and anything past pos0)
        while self._deferred and self._deferred[-1][1] >= pos0:
            self._deferred.pop()
        pp = self.pending_pos
        items: list[tuple[int, int, np.ndarray, bool]] = []
        if pp >= 0 and pp + 1 == pos0 and pp > self._held():
            items.append((tokens[0], pp, self.pending_g, self._pending_raw))  # cross-ubatch bridge
        items.extend((tokens[k + 1], pos0 + k, g[k], raw) for k in range(n - 1))
        if not self.upkeep or self._deferred:
            # paused: keep what this batch would decode; resumed with a backlog: decode both
            self._deferred.extend(items)
            if self.upkeep:
                self._catch_up()
        elif items:
            self._decode_items(items)
        self.verify_pos_first = pos0
        self.verify_g, self._verify_raw = g, raw
        self.pending_pos = pos0 + n - 1
        self.pending_g, self._pending_raw = g[n - 1].copy(), raw

    def _encode_pending(self) -> bool:
        """Encode the boundary row where it arrived while paused (False: the encode failed)."""
        if not self._pending_raw:
            return True
        try:
            self.pending_g = self._encode(self.pending_g[None, :])[0].copy()
        except DecodeError as e:
            log.warning("draft-eagle3: %s", e)
            return False
        self._pending_raw = False
        return True

    def begin(self, prompt: Sequence[int]) -> None:
        n = len(prompt)
        if n and self._held() < n - 2:
            log.warning("draft-eagle3: the draft context holds positions up to %d of a %d-token "
                        "prompt; drafts may degrade", self._held(), n)

    def draft(self, req: DraftRequest) -> list[int]:
        pp = self.pending_pos
        if pp < 0:
            return []
        # asked while paused (a probe): decode what the pause deferred first
        if self._deferred and not self._as_upkeep(self._catch_up):
            return []
        if self._pending_raw and not self._as_upkeep(self._encode_pending):
            return []
        n_max = self.n_max_param if req.n_max < 0 else min(self.n_max_param, req.n_max)
        if n_max <= 0:
            return []
        ctx, b = self.ctx, self.batch
        ctx.seq_rm(pp, -1)
        b.clear()
        b.add(req.id_last, pp, True, self.pending_g)
        result: list[int] = []
        i = 0
        while True:
            if lc.llama_decode(ctx.ptr, b.b) != 0:
                break
            tok, p = pick_top_k(ctx.logits(0), self.p_min, self.model.suppress_tokens)
            prenorm = _rows(self._get_nextn_ith(ctx.ptr, 0), 1, self.n_embd_dec)[0]
            if p < self.p_min:
                break
            result.append(tok)
            if n_max <= len(result):
                break
            b.clear()
            b.add(tok, pp + i + 1, True, prenorm)
            i += 1
        if len(result) < self.n_min:
            return []
        return result

    def accept(self, n_accepted: int, is_other: bool) -> None:
        n_rows = self.verify_g.shape[0]
        if n_rows <= 0:
            return
        i_g = min(n_accepted, n_rows - 1)
        self.pending_pos = self.verify_pos_first + i_g
        self.pending_g, self._pending_raw = self.verify_g[i_g].copy(), self._verify_raw

    # the deferred boundary only needs stashing for recurrent/hybrid targets: their
    # single-position checkpoints drop it on restore (as in the reference)
    def get_state(self) -> bytes | None:
        return self.get_state_raw() if self._stash else None

    def set_state(self, data: bytes) -> None:
        if self._stash:
            self.set_state_raw(data)

    def get_state_raw(self) -> bytes | None:
        if self.pending_pos < 0 or not self._encode_pending():
            return None
        import struct
        return struct.pack("<i", self.pending_pos) + self.pending_g.astype("<f4").tobytes()

    def set_state_raw(self, data: bytes) -> None:
        import struct
        if len(data) != 4 + 4 * self.n_embd_dec:
            return
        self.pending_pos = struct.unpack("<i", data[:4])[0]
        self.pending_g = np.frombuffer(data[4:], dtype="<f4").astype(np.float32)
        self._pending_raw = False

    def close(self) -> None:
        self._release_target()
        if getattr(self, "batch", None) is not None:
            self.batch.free()
            self.batch = None  # type: ignore[assignment]
        self._release_draft()


@register(SpecType.DRAFT_EAGLE3)
def make_draft_eagle3(params: SpecParams, resources: dict) -> DraftEagle3:
    """Load (or reuse) the EAGLE3 drafter set with ``--spec-draft-model``, check it, build it."""
    _require(*EAGLE3_SYMBOLS)
    target, engine = _engine_parts(resources)
    d = params.draft
    draft_model: Model | None = resources.get("eagle3_model")
    owned = False
    if draft_model is None:
        if not d.model:
            raise Unavailable("no EAGLE3 drafter is set (--spec-draft-model PATH)")
        from .draft_simple import acquire_draft_model, draft_devices
        try:
            draft_model = acquire_draft_model(d.model, d.n_gpu_layers, draft_devices(d, resources, shares_target="draft-eagle3"))
        except ModelError as e:
            raise Unavailable(str(e)) from None
        owned = True
    arch = draft_model.meta("general.architecture")
    try:
        if arch != "eagle3":
            raise Unavailable(f"{draft_model.path} is not an EAGLE3 drafter (architecture '{arch}')")
        return DraftEagle3(params, engine.ctx, draft_model, n_threads=engine.config.n_threads,
                           owns_model=owned)
    except Exception:
        if owned:
            from .draft_simple import release_draft_model
            release_draft_model(draft_model)
        raise
