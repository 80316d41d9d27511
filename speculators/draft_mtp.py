"""draft-mtp (``common_speculative_impl_draft_mtp``)
-------------------------------------------------
The draft context is an MTP context (``ctx_type = LLAMA_CONTEXT_TYPE_MTP``)
against the target model itself (or a separate MTP-only GGUF given with
``--spec-draft-model``), as ``common_speculative_init_result`` makes it:
same ``n_ctx`` as the target, ``n_rs_seq = 0``, ``ctx_other`` = the
target's context, one output per sequence. The target outputs its NextN
embedding ``h`` for every token (``llama_set_embeddings_nextn(tgt, true,
false)``); the MTP head at position ``p`` reads ``(x_p, h_{p-1})``. So
``process`` decodes the target's batch on the MTP context with the target's
rows shifted right by one and the last row of the previous batch
(``pending_h``) in front; ``draft`` decodes ``id_last`` with ``pending_h``,
then each drafted token with the MTP head's own ``h`` output (single head),
re-decodes the whole draft under each head (chained heads, Step-3.5), or
stays at ``pos0`` (shared-memory heads, Gemma 4 assistants); ``accept(n)``
keeps the verify row ``n`` as the next ``pending_h``. A batch that starts again where
the last one started (the engine restored its step checkpoint and replays the accepted
tokens and the target's own, before ``accept``) pairs its first token with the row
before the last batch, not with ``pending_h`` (the undone verify's last row), and keeps
the MTP cells of the tokens the two batches share.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

import llama_cpp as lc

from . import ext
from .base import DraftRequest, common_prefix
from .chain import Unavailable, register
from .hidden_base import _TargetFed, _TokEmbdBatch, _enable_output, _engine_parts, _require, _rows, pick_top_k
from .llama import Context, Model, ModelError
from .params import SpecParams
from .types import SpecType

log = logging.getLogger("speculators.draft_hidden")


LLAMA_CONTEXT_TYPE_MTP = 1

MTP_SYMBOLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn",
               "llama_get_embeddings_nextn_ith", "llama_set_nextn_layer_offset",
               "llama_get_ctx_other", "llama_model_n_layer_nextn", "llama_model_n_embd_out")


class DraftMTP(_TargetFed):
    """Multi-token-prediction heads of the target; see the module docstring."""

    type = SpecType.DRAFT_MTP

    def __init__(self, params: SpecParams, target_ctx: Context, draft_model: Model, *,
                 n_threads: int | None = None, owns_model: bool = False,
                 frees_model: bool = False):
        """``owns_model``: release ``draft_model`` to the draft-model cache on close;
        ``frees_model``: free it on close (a private reload of the target)."""
        d = params.draft
        super().__init__(n_max=d.n_max)
        self.p_min = float(d.p_min)
        self.n_min = int(d.n_min)
        self.n_max_param = int(d.n_max)
        self.tgt = target_ctx
        self.model = draft_model
        self._owns_model = owns_model
        self._frees_model = frees_model
        tgt_model = target_ctx.model
        n_embd_out = ext.require("llama_model_n_embd_out")
        self.n_embd = int(n_embd_out(draft_model.ptr))
        n_embd_tgt = int(n_embd_out(tgt_model.ptr))
        if self.n_embd != n_embd_tgt:
            raise Unavailable(
                f"the MTP head's hidden size {self.n_embd} does not match the target's {n_embd_tgt}")
        self.n_mtp_layers = max(1, int(ext.require("llama_model_n_layer_nextn")(draft_model.ptr)))
        overrides = {
            "ctx_type": LLAMA_CONTEXT_TYPE_MTP,
            "n_rs_seq": 0,
            "ctx_other": target_ctx.ptr,
            "n_outputs_max": 1,
            "n_outputs_max_per_seq": 1,
        }
        try:
            self.ctx = Context(draft_model, n_ctx=target_ctx.n_ctx, n_batch=target_ctx.n_batch,
                               n_threads=n_threads or target_ctx.n_threads, overrides=overrides)
        except ModelError as e:
            raise Unavailable(f"cannot create the MTP draft context: {e}") from None
        self._set_nextn = ext.require("llama_set_embeddings_nextn")
        self._get_nextn = ext.require("llama_get_embeddings_nextn")
        self._get_nextn_ith = ext.require("llama_get_embeddings_nextn_ith")
        self._set_offset = ext.require("llama_set_nextn_layer_offset")
        _enable_output(target_ctx, "nextn", True)
        self._set_nextn(self.ctx.ptr, True, True)
        other = ext.require("llama_get_ctx_other")(self.ctx.ptr)
        self.is_mem_shared = bool(other) and other == target_ctx.ptr
        self.chain_heads = self.n_mtp_layers > 1 and not self.is_mem_shared
        if self.chain_heads:
            self.n_max_param = min(self.n_max_param, self.n_mtp_layers)
        self.n_max = self.n_max_param
        self.batch = _TokEmbdBatch(self.ctx.n_batch, self.n_embd)
        self.pending_h = np.zeros(self.n_embd, dtype=np.float32)
        #: position the pending_h row pairs with (-1: unknown)
        self.pending_pos = 0
        self.verify_h = np.zeros((0, self.n_embd), dtype=np.float32)
        self.verify_pos0 = 0
        self.n_process_calls = 0
        self.n_draft_decodes = 0
        #: target batches that went back to the last batch's start (a restored step checkpoint's
        #: replay) and kept the MTP cells of the tokens they share with it, decoding only the rest
        self.n_replays_skipped = 0
        #: (pos0, tokens, row before pos0) of the last target batch mirrored on the MTP context
        self._last_batch: tuple[int, list[int], np.ndarray] | None = None
        #: mirror every target batch on the MTP context (False: paused, see :meth:`set_upkeep`)
        self.upkeep = True
        #: while paused: the MTP inputs (token, row before it) of the positions from
        #: ``_deferred_pos0`` on, which the MTP context does not hold yet
        self._deferred: list[tuple[int, np.ndarray]] = []
        self._deferred_pos0 = 0
        #: catch-ups after a pause: how many, and the positions they decoded
        self.n_catchups = 0
        self.n_catchup_tokens = 0
        self._attach(target_ctx)

    #: shared-memory heads keep no cells of their own: there is no mirroring to pause
    @property
    def can_pause(self) -> bool:
        return not self.is_mem_shared

    def set_upkeep(self, on: bool) -> None:
        """Mirror the target's batches on the MTP context (True), or only keep what they would
        decode (each position's token and the target's row before it) until the next draft or
        until resumed, which decodes it in one batch: the same inputs, so the same MTP cells."""
        on = bool(on) or self.is_mem_shared
        if not on and self.upkeep:
            self._deferred.clear()
            self._deferred_pos0 = self.ctx.pos_max() + 1
        self.upkeep = on

    def _defer(self, tokens: list[int], pos0: int, first_h: np.ndarray, h_tgt: np.ndarray) -> None:
        """Note a target batch's MTP inputs instead of decoding them."""
        end = self._deferred_pos0 + len(self._deferred)
        if pos0 < self._deferred_pos0:
            # back into what the MTP context holds (a rejected draft, a restored checkpoint)
            self.ctx.seq_rm(pos0, -1)
            self._deferred.clear()
            self._deferred_pos0 = pos0
        elif pos0 > end:
            # positions nobody told us about: the MTP context goes on without them
            self._deferred.clear()
            self._deferred_pos0 = pos0
        else:
            del self._deferred[pos0 - self._deferred_pos0:]
        self._deferred.append((int(tokens[0]), first_h.copy()))
        self._deferred.extend((int(t), h_tgt[j].copy()) for j, t in enumerate(tokens[1:]))

    def _catch_up(self) -> bool:
        """Decode what the pause deferred, in one batch (chunked at n_batch)."""
        items, p0 = self._deferred, self._deferred_pos0
        if not items:
            return True
        self._deferred = []
        self._deferred_pos0 = p0 + len(items)
        self.ctx.seq_rm(p0, -1)
        self.n_catchups += 1
        self.n_catchup_tokens += len(items)
        return self._decode_inputs(items, p0)

    def _decode_inputs(self, items: Sequence[tuple[int, np.ndarray]], p0: int) -> bool:
        """Decode (token, row before it) pairs at positions p0.. on the MTP context (under
        each head in turn where the heads are chained); False where a decode failed."""
        ctx, b = self.ctx, self.batch
        n = len(items)
        start = 0
        while start < n:
            m = min(n - start, b.n_max)
            b.clear()
            for j in range(start, start + m):
                b.add(items[j][0], p0 + j, False, items[j][1])
            for head in range(self.n_mtp_layers):
                if self.chain_heads:
                    ctx.seq_rm(p0 + start, -1)
                    self._set_offset(ctx.ptr, head)
                rc = lc.llama_decode(ctx.ptr, b.b)
                if rc != 0:
                    if self.chain_heads:
                        self._set_offset(ctx.ptr, 0)
                    ctx.seq_rm(p0, -1)
                    log.warning("draft-mtp: llama_decode on the MTP context failed (%d)", rc)
                    return False
                if not self.chain_heads:
                    break
            if self.chain_heads:
                self._set_offset(ctx.ptr, 0)
            start += m
        return True

    # -- the target's batches ------------------------------------------------------------
    def _process(self, tokens: list[int], pos0: int) -> None:
        n = len(tokens)
        if n == 0:
            return
        self.n_process_calls += 1
        h_tgt = _rows(self._get_nextn(self.tgt.ptr), n, self.n_embd)
        last = self._last_batch
        # The target went back to the start of the last batch: the engine restored the step's
        # checkpoint after a partial rejection and now replays the accepted tokens and the
        # target's own ([id_last] + accepted drafts + its token), before accept() is called. The
        # history before pos0 is unchanged, so the row before the batch is the one the last batch
        # had (not pending_h: that is the last row of the undone verify, at a rejected position).
        rewound = last is not None and pos0 == last[0] and pos0 != self.pending_pos
        if not self.is_mem_shared:
            if rewound:
                first_h = last[2]
            elif pos0 == self.pending_pos:
                first_h = self.pending_h
            else:
                first_h = np.zeros(self.n_embd, np.float32)
                if pos0 != 0:
                    log.debug("draft-mtp: no hidden state for position %d; using zeros", pos0 - 1)
            self._last_batch = (pos0, list(tokens), first_h.copy())
            if not self.upkeep or self._deferred:
                # paused: only note what these positions would decode; resumed with a backlog:
                # decode it and this batch together
                self._defer(tokens, pos0, first_h, h_tgt)
                if self.upkeep and not self._catch_up():
                    self.pending_pos = -1
                    self._last_batch = None
                    return
            else:
                # MTP cells the last batch wrote with these very inputs (the same tokens after
                # the same history, the same rows before them) are kept: only the rest is decoded
                k = 0
                if rewound:
                    k = common_prefix(tokens, last[1], self.ctx.pos_max() - pos0 + 1)
                    if k > 0:
                        self.n_replays_skipped += 1
                self.ctx.seq_rm(pos0 + k, -1)  # drop the drafts (and anything past the kept cells)
                items = [(tokens[j], first_h if j == 0 else h_tgt[j - 1]) for j in range(k, n)]
                if not self._decode_inputs(items, pos0 + k):
                    self.pending_pos = -1
                    self._last_batch = None
                    return
        else:
            if rewound:
                self.n_replays_skipped += 1  # nothing of the MTP context to redo
            self._last_batch = (pos0, list(tokens), np.zeros(0, np.float32))
        self.verify_h = np.array(h_tgt, dtype=np.float32, copy=True)
        self.verify_pos0 = pos0
        self.pending_h = self.verify_h[-1].copy()
        self.pending_pos = pos0 + n

    # -- the speculator hooks ----------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        n = len(prompt)
        if not n or self.is_mem_shared:
            return
        # paused: what the MTP context lacks is kept to be caught up on
        held = self._deferred_pos0 + len(self._deferred) if not self.upkeep or self._deferred \
            else self.ctx.pos_max() + 1
        if held < n:
            log.warning("draft-mtp: the MTP context holds positions up to %d of a %d-token prompt; "
                        "drafts may degrade", held - 1, n)

    def draft(self, req: DraftRequest) -> list[int]:
        pos0 = req.pos0
        if pos0 != self.pending_pos:
            return []  # not in step with the target (should not happen)
        # asked while paused (a probe): decode what the pause deferred first
        if self._deferred and not self._as_upkeep(self._catch_up):
            return []
        ctx = self.ctx
        b = self.batch
        n_max = self.n_max_param if req.n_max < 0 else min(self.n_max_param, req.n_max)
        if n_max <= 0:
            return []
        result: list[int] = []
        chain_h = [self.pending_h.copy()] if self.chain_heads else None
        if not self.is_mem_shared:
            ctx.seq_rm(pos0, -1)  # cells at pos0.. would make the MTP decode fail
        b.clear()
        i_last = b.add(req.id_last, pos0, True, self.pending_h)
        i = 0
        try:
            while True:
                if self.chain_heads:
                    ctx.seq_rm(pos0, -1)
                    self._set_offset(ctx.ptr, i)
                rc = lc.llama_decode(ctx.ptr, b.b)
                self.n_draft_decodes += 1
                if rc != 0:
                    break
                logits = ctx.logits(i_last)
                tok, p = pick_top_k(logits, self.p_min, self.model.suppress_tokens)
                h_row = _rows(self._get_nextn_ith(ctx.ptr, i_last), 1, self.n_embd)[0]
                if p < self.p_min:
                    break
                result.append(tok)
                if n_max <= len(result):
                    break
                b.clear()
                if self.chain_heads:
                    chain_h.append(h_row.copy())
                    rows = [req.id_last] + result
                    for t, tk in enumerate(rows):
                        i_last = b.add(tk, pos0 + t, t == len(rows) - 1, chain_h[t])
                elif self.is_mem_shared:
                    i_last = b.add(tok, pos0, True, h_row)
                else:
                    i_last = b.add(tok, pos0 + i + 1, True, h_row)
                i += 1
        finally:
            if self.chain_heads:
                self._set_offset(ctx.ptr, 0)
            if not self.is_mem_shared:
                ctx.seq_rm(pos0, -1)  # the target's verify batch brings back what it keeps
        if len(result) < self.n_min:
            return []
        return result

    def accept(self, n_accepted: int, is_other: bool) -> None:
        n_rows = self.verify_h.shape[0]
        if n_rows <= 0:
            return
        i_h = min(n_accepted, n_rows - 1)
        self.pending_h = self.verify_h[i_h].copy()
        self.pending_pos = self.verify_pos0 + i_h + 1
        if not self.is_mem_shared:
            # drop the MTP cells of the rejected drafts, as EAGLE3 and DFlash drop theirs: the
            # next draft decodes at pending_pos, which must be the first free position
            self.ctx.seq_rm(self.pending_pos, -1)
            if self._deferred:
                del self._deferred[max(0, self.pending_pos - self._deferred_pos0):]

    def _output_keys(self) -> list:
        return ["nextn"]

    def close(self) -> None:
        self._release_target()
        if getattr(self, "batch", None) is not None:
            self.batch.free()
            self.batch = None  # type: ignore[assignment]
        self._release_draft()


@register(SpecType.DRAFT_MTP)
def make_draft_mtp(params: SpecParams, resources: dict) -> DraftMTP:
    """``common_speculative_init_result`` for draft-mtp, then the speculator.

    The MTP heads come from the target itself (its NextN layers) unless a
    separate MTP GGUF is set with ``--spec-draft-model``. When the target was
    loaded without its NextN layers (llama.cpp skips them unless asked), the
    target file is loaded once more with them, as the reference does for a
    separate draft file.
    """
    _require(*MTP_SYMBOLS)
    target, engine = _engine_parts(resources)
    n_nextn = int(ext.require("llama_model_n_layer_nextn")(target.ptr))
    d = params.draft
    draft_model: Model | None = resources.get("mtp_model")
    owned = frees = False
    if draft_model is None and d.model:
        from .draft_simple import acquire_draft_model, draft_devices
        try:
            draft_model = acquire_draft_model(d.model, d.n_gpu_layers, draft_devices(d, resources, shares_target="draft-mtp"))
        except ModelError as e:
            raise Unavailable(str(e)) from None
        owned = True
        if int(ext.require("llama_model_n_layer_nextn")(draft_model.ptr)) <= 0:
            from .draft_simple import release_draft_model
            release_draft_model(draft_model)
            raise Unavailable(f"the draft model {d.model} has no MTP (NextN) layers")
    if draft_model is None:
        if n_nextn <= 0:
            raise Unavailable(f"the target model {target.path} has no MTP (NextN) layers "
                              f"(arch {target.meta('general.architecture')})")
        if getattr(target, "load_mtp", False):
            draft_model = target
        else:
            try:
                draft_model = Model(target.path, load_mtp=True, **engine.config.placement())
            except ModelError as e:
                raise Unavailable(f"cannot load the MTP layers of {target.path}: {e}") from None
            frees = True
    try:
        return DraftMTP(params, engine.ctx, draft_model, n_threads=engine.config.n_threads,
                        owns_model=owned, frees_model=frees)
    except Exception:
        if owned:
            from .draft_simple import release_draft_model
            release_draft_model(draft_model)
        elif frees:
            draft_model.close()
        raise
