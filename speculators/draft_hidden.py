"""Hidden-state drafters: draft-mtp, draft-eagle3, draft-dflash, draft-dspark.

These read the target model's hidden states after every target decode, as
``common_speculative_impl_draft_mtp`` (and its EAGLE3 / DFlash siblings) of
llama.cpp do. What llama-cpp-python does not bind is looked up in the same
shared library by :mod:`speculators.ext`.

How the target's hidden states reach the drafter
------------------------------------------------
The reference's ``process(batch)`` runs after every ``llama_decode`` of the
target, while that call's outputs are readable. The engine decodes long
prompts in ``n_batch`` chunks and calls ``chain.process`` once afterwards,
when only the last chunk's outputs are left. So these drafters register a
hook on the target :class:`~speculators.llama.Context` (``decode_hooks``)
that runs after each chunk; their ``process()`` then has nothing left to do.
The engine's checkpoint rollback re-decodes the accepted tokens, which runs
the hook again with the same hidden states -- harmless and consistent.

draft-mtp (``common_speculative_impl_draft_mtp``)
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
keeps the verify row ``n`` as the next ``pending_h``.

draft-dflash and draft-dspark (``common_speculative_impl_draft_dflash``)
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
import time
from typing import Sequence

import numpy as np

import llama_cpp as lc

from . import ext
from .base import DraftRequest, Speculator
from .chain import Unavailable, register
from .llama import Context, ContextFull, DecodeError, Model, ModelError
from .params import SpecParams
from .types import SpecType

log = logging.getLogger(__name__)

#: the reference drafts from a top-k 10 sampler and takes the first candidate
DRAFT_TOP_K = 10

LLAMA_CONTEXT_TYPE_MTP = 1

MTP_SYMBOLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn",
               "llama_get_embeddings_nextn_ith", "llama_set_nextn_layer_offset",
               "llama_get_ctx_other", "llama_model_n_layer_nextn", "llama_model_n_embd_out")


def _require(*names: str) -> None:
    """Raise Unavailable naming the first symbol this llama.cpp build lacks."""
    for n in names:
        try:
            ext.require(n)
        except ext.MissingSymbolError as e:
            raise Unavailable(str(e)) from None


def pick_top_k(logits: np.ndarray, p_min: float) -> tuple[int, float]:
    """The reference's draft token: top-k 10, first candidate, its probability.

    >>> pick_top_k(np.array([0.0, 2.0, 1.0], dtype=np.float32), 0.5)[0]
    1
    """
    tok = int(np.argmax(logits))
    if p_min <= 0.0:
        return tok, 1.0
    k = min(DRAFT_TOP_K, logits.shape[0])
    top = np.partition(logits, logits.shape[0] - k)[-k:].astype(np.float64)
    return tok, 1.0 / float(np.exp(top - top.max()).sum())


class _TokEmbdBatch:
    """A ``llama_batch`` carrying both token ids and one embedding row per token.

    ``llama_batch_init`` allocates only one of the two; like the reference we
    add the token array ourselves (a ctypes buffer, detached before freeing).
    """

    def __init__(self, n_tokens: int, n_embd: int):
        self.n_max = n_tokens
        self.n_embd = n_embd
        self.b = lc.llama_batch_init(n_tokens, n_embd, 1)
        self._tok = (lc.llama_token * n_tokens)()
        self.b.token = ctypes.cast(self._tok, ctypes.POINTER(lc.llama_token))
        self.embd = np.ctypeslib.as_array(self.b.embd, shape=(n_tokens, n_embd))
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.b.n_tokens = 0

    def add(self, token: int, pos: int, output: bool, h: np.ndarray | None) -> int:
        i = self.n
        if i >= self.n_max:
            raise ContextFull("draft batch is full")
        b = self.b
        self._tok[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = 0
        b.logits[i] = output
        if h is not None:
            self.embd[i, :] = h
        self.n = i + 1
        b.n_tokens = self.n
        return i

    def free(self) -> None:
        if self.b is not None:
            self.b.token = ctypes.POINTER(lc.llama_token)()  # ours, not malloc'd
            lc.llama_batch_free(self.b)
            self.b = None


def _enable_output(ctx: Context, key, on: bool) -> None:
    """Reference-counted switch of a target-context output (``"nextn"`` or
    ``("layer", lid)``): the engine builds a new chain before closing the old
    one, so the old speculator must not turn off what the new one needs."""
    users: dict = ctx.__dict__.setdefault("_hidden_output_users", {})
    n = users.get(key, 0)
    n = n + 1 if on else max(0, n - 1)
    users[key] = n
    if on and n != 1 or not on and n != 0:
        return
    if key == "nextn":
        ext.require("llama_set_embeddings_nextn")(ctx.ptr, on, False)
    else:
        ext.require("llama_set_embeddings_layer_inp")(ctx.ptr, int(key[1]), on)


def _rows(ptr, n_rows: int, n_embd: int) -> np.ndarray:
    if not ptr:
        raise DecodeError("the context returned no embeddings")
    return np.ctypeslib.as_array(ptr, shape=(n_rows, n_embd))


class _TargetFed(Speculator):
    """A drafter fed every target batch by a decode hook on the target's context.

    Subclasses implement ``_process(tokens, pos0)``; its time is counted in
    ``stats.t_process_us`` (what it costs to mirror the target).
    """

    _hook = None

    def _attach(self, target_ctx) -> None:
        self._hook = self._on_target_decode
        target_ctx.decode_hooks.append(self._hook)

    def _detach(self, target_ctx) -> None:
        if self._hook is not None:
            try:
                target_ctx.decode_hooks.remove(self._hook)
            except ValueError:
                pass

    def _on_target_decode(self, tokens: Sequence[int], pos0: int) -> None:
        t0 = time.perf_counter()
        try:
            self._process(list(tokens), pos0)
        finally:
            self.stats.t_process_us += (time.perf_counter() - t0) * 1e6

    def _process(self, tokens: list[int], pos0: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    #: the target outputs this drafter switched on (switched off again on close)
    def _output_keys(self) -> list:
        return list(getattr(self, "_keys", []))

    def _release_target(self) -> None:
        """Unhook from the target and switch off the outputs this drafter asked for."""
        tgt = getattr(self, "tgt", None)
        if tgt is not None:
            self._detach(tgt)
            if getattr(tgt, "ptr", None):
                for k in self._output_keys():
                    _enable_output(tgt, k, False)
            self.tgt = None  # type: ignore[assignment]

    def _release_draft(self) -> None:
        """Close the draft context and give back (or free) the draft model."""
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
            self.ctx = None  # type: ignore[assignment]
        model = getattr(self, "model", None)
        if model is not None:
            if getattr(self, "_owns_model", False):
                from .draft_simple import release_draft_model
                release_draft_model(model)
            elif getattr(self, "_frees_model", False):
                model.close()
        self.model = None  # type: ignore[assignment]


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
        #: target batches that were replays of an accepted prefix and needed no MTP decode
        self.n_replays_skipped = 0
        #: (pos0, tokens, row before pos0) of the last target batch mirrored on the MTP context
        self._last_batch: tuple[int, list[int], np.ndarray] | None = None
        self._attach(target_ctx)

    # -- the target's batches ------------------------------------------------------------
    def _process(self, tokens: list[int], pos0: int) -> None:
        n = len(tokens)
        if n == 0:
            return
        self.n_process_calls += 1
        h_tgt = _rows(self._get_nextn(self.tgt.ptr), n, self.n_embd)
        last = self._last_batch
        replay = (last is not None and pos0 != self.pending_pos and pos0 == last[0]
                  and n <= len(last[1]) and tokens == last[1][:n])
        if replay and self.pending_pos == pos0 + n and (
                self.is_mem_shared or self.ctx.pos_max() == pos0 + n - 1):
            # The engine's checkpoint rollback re-decodes the accepted part of the last verify
            # batch. The MTP cells of those positions were written by the verify with these very
            # inputs and kept by accept(), which also took the pending row: nothing to redo, and
            # the state is exactly what a target that drops a partial sequence would leave.
            self.n_replays_skipped += 1
            return
        if not self.is_mem_shared:
            if replay:
                first_h = last[2]  # the row before the batch, as the verify had it
            elif pos0 == self.pending_pos:
                first_h = self.pending_h
            else:
                first_h = np.zeros(self.n_embd, np.float32)
                if pos0 != 0:
                    log.debug("draft-mtp: no hidden state for position %d; using zeros", pos0 - 1)
            self._last_batch = (pos0, list(tokens), first_h.copy())
            ctx = self.ctx
            ctx.seq_rm(pos0, -1)  # drop the drafts (and anything past pos0) of the last round
            b = self.batch
            start = 0
            while start < n:  # the target's chunk never exceeds n_batch, but be safe
                m = min(n - start, b.n_max)
                b.clear()
                for k in range(m):
                    j = start + k
                    b.add(tokens[j], pos0 + j, False, first_h if j == 0 else h_tgt[j - 1])
                for head in range(self.n_mtp_layers):
                    if self.chain_heads:
                        ctx.seq_rm(pos0 + start, -1)
                        self._set_offset(ctx.ptr, head)
                    rc = lc.llama_decode(ctx.ptr, b.b)
                    if rc != 0:
                        if self.chain_heads:
                            self._set_offset(ctx.ptr, 0)
                        ctx.seq_rm(pos0, -1)
                        log.warning("draft-mtp: llama_decode on the MTP context failed (%d)", rc)
                        self.pending_pos = -1
                        return
                    if not self.chain_heads:
                        break
                if self.chain_heads:
                    self._set_offset(ctx.ptr, 0)
                start += m
        self.verify_h = np.array(h_tgt, dtype=np.float32, copy=True)
        self.verify_pos0 = pos0
        self.pending_h = self.verify_h[-1].copy()
        self.pending_pos = pos0 + n

    # -- the speculator hooks ----------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        n = len(prompt)
        if n and not self.is_mem_shared and self.ctx.pos_max() < n - 1:
            log.warning("draft-mtp: the MTP context holds positions up to %d of a %d-token prompt; "
                        "drafts may degrade", self.ctx.pos_max(), n)

    def draft(self, req: DraftRequest) -> list[int]:
        pos0 = req.pos0
        if pos0 != self.pending_pos:
            return []  # not in step with the target (should not happen)
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
                tok, p = pick_top_k(logits, self.p_min)
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

    def _output_keys(self) -> list:
        return ["nextn"]

    def close(self) -> None:
        self._release_target()
        if getattr(self, "batch", None) is not None:
            self.batch.free()
            self.batch = None  # type: ignore[assignment]
        self._release_draft()


def _engine_parts(resources: dict):
    target: Model | None = resources.get("model")
    engine = resources.get("engine")
    if target is None or engine is None or getattr(engine, "ctx", None) is None:
        raise Unavailable("no target model and context are loaded")
    return target, engine


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
        from .draft_simple import acquire_draft_model
        try:
            draft_model = acquire_draft_model(d.model, d.n_gpu_layers)
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
                draft_model = Model(target.path, n_gpu_layers=engine.config.n_gpu_layers, load_mtp=True)
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


# -- EAGLE3 -------------------------------------------------------------------------------

#: architectures whose graph records every layer's input (``res->t_layer_inp``) in the
#: bundled llama.cpp -- the only targets ``llama_set_embeddings_layer_inp`` works on
#: (on others llama.cpp aborts with "layer input tensor is null")
LAYER_INPUT_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4",
    "gpt-oss", "lfm2", "mimo2", "minimax-01", "minimax-m2", "nemotron_h", "bailingmoe3",
    "deepseek4", "nanbeige", "muse-glimmer", "hunyuan-vl",
})

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
        self._attach(target_ctx)

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
        try:
            g = self._encode(self._features(n))
        except DecodeError as e:
            log.warning("draft-eagle3: %s", e)
            self.pending_pos = -1
            return
        ctx.seq_rm(pos0, -1)  # the last round's drafts (and anything past pos0)
        b = self.batch
        b.clear()
        pp = self.pending_pos
        if pp >= 0 and pp + 1 == pos0 and pp > ctx.pos_max():
            b.add(tokens[0], pp, False, self.pending_g)  # cross-ubatch bridge
        for k in range(n - 1):
            b.add(tokens[k + 1], pos0 + k, False, g[k])
        if b.n > 0:
            rc = lc.llama_decode(ctx.ptr, b.b)
            if rc != 0:
                log.warning("draft-eagle3: llama_decode on the draft context failed (%d)", rc)
                ctx.seq_rm(min(pos0, pp if pp >= 0 else pos0), -1)
        self.verify_pos_first = pos0
        self.verify_g = g
        self.pending_pos = pos0 + n - 1
        self.pending_g = g[n - 1].copy()

    def begin(self, prompt: Sequence[int]) -> None:
        n = len(prompt)
        if n and self.ctx.pos_max() < n - 2:
            log.warning("draft-eagle3: the draft context holds positions up to %d of a %d-token "
                        "prompt; drafts may degrade", self.ctx.pos_max(), n)

    def draft(self, req: DraftRequest) -> list[int]:
        pp = self.pending_pos
        if pp < 0:
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
            tok, p = pick_top_k(ctx.logits(0), self.p_min)
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
        self.pending_g = self.verify_g[i_g].copy()

    # the deferred boundary only needs stashing for recurrent/hybrid targets: their
    # single-position checkpoints drop it on restore (as in the reference)
    def get_state(self) -> bytes | None:
        return self.get_state_raw() if self._stash else None

    def set_state(self, data: bytes) -> None:
        if self._stash:
            self.set_state_raw(data)

    def get_state_raw(self) -> bytes | None:
        if self.pending_pos < 0:
            return None
        import struct
        return struct.pack("<i", self.pending_pos) + self.pending_g.astype("<f4").tobytes()

    def set_state_raw(self, data: bytes) -> None:
        import struct
        if len(data) != 4 + 4 * self.n_embd_dec:
            return
        self.pending_pos = struct.unpack("<i", data[:4])[0]
        self.pending_g = np.frombuffer(data[4:], dtype="<f4").astype(np.float32)

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
        from .draft_simple import acquire_draft_model
        try:
            draft_model = acquire_draft_model(d.model, d.n_gpu_layers)
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


# -- DFlash / DSpark ------------------------------------------------------------------------

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

        # the block is [id_last, <mask> * n]: in-place denoising gives at most block_size - 1
        # drafts; anchor-first DSpark reads every slot, so a full block_size
        self.anchor_first = self.is_dspark and self.sample_from_anchor
        n_draft_max = self.block_size if self.anchor_first else self.block_size - 1
        if self.n_max_param > n_draft_max or self.n_min > n_draft_max:
            log.warning("draft-%s: requested draft size (n_max=%d, n_min=%d) exceeds the trained block "
                        "size %d -- clamping to %d", kind.lower(), self.n_max_param, self.n_min,
                        self.block_size, n_draft_max)
            self.n_max_param = min(self.n_max_param, n_draft_max)
            self.n_min = min(self.n_min, n_draft_max)
        self.n_max = self.n_max_param

        # common_speculative_init_result + common_base_params_to_speculative for a block drafter
        per_seq = max(1, int(d.n_max) + 1)
        overrides = {
            "ctx_other": target_ctx.ptr,
            "n_rs_seq": 0,
            "n_outputs_max": per_seq,
            "n_outputs_max_per_seq": 1,
        }
        try:
            self.ctx = Context(draft_model, n_ctx=target_ctx.n_ctx, n_batch=target_ctx.n_batch,
                               n_threads=n_threads or target_ctx.n_threads, overrides=overrides)
        except ModelError as e:
            raise Unavailable(f"cannot create the {kind} draft context: {e}") from None
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
        log.info("draft-%s: n_max=%d n_min=%d p_min=%.2f block_size=%d mask=%d n_extract=%d "
                 "sample_from_anchor=%s dflash2=%s", kind.lower(), self.n_max_param, self.n_min,
                 self.p_min, self.block_size, self.mask_token, len(self.layer_ids),
                 self.sample_from_anchor, self.is_dflash2)
        self._attach(target_ctx)

    # -- KV injection of the target's features ---------------------------------------------
    def _process(self, tokens: list[int], pos0: int) -> None:
        self._inject(len(tokens), pos0)

    def _inject(self, n: int, pos0: int) -> None:
        if n <= 0:
            return
        ctx = self.ctx
        ctx.seq_rm(pos0, -1)  # the rejected tail of the last verify batch, if any
        pm = ctx.pos_max()
        if 0 <= pm < pos0 - 1:
            # a hole (a failed injection): the cache must stay contiguous, start afresh
            log.debug("draft-%s: draft cache ends at %d, target batch starts at %d; clearing",
                      self.kind.lower(), pm, pos0)
            ctx.clear()
        layers = [_rows(self._get_layer(self.tgt.ptr, lid), n, self.n_embd_tgt) for lid in self.layer_ids]
        w = self.n_embd_tgt
        for off in range(0, n, self.n_ubatch):
            m = min(self.n_ubatch, n - off)
            feats = np.empty((m, self.n_embd_enc), dtype=np.float32)
            for k, rows in enumerate(layers):
                feats[:, k * w:(k + 1) * w] = rows[off:off + m]
            self.inject.fill(feats, pos0 + off)
            rc = lc.llama_decode(ctx.ptr, self.inject.b)
            if rc != 0:
                log.warning("draft-%s: KV injection failed (llama_decode %d, %d rows at %d)",
                            self.kind.lower(), rc, m, pos0 + off)
                ctx.seq_rm(pos0, -1)
                return
            self.n_injected += m

    def begin(self, prompt: Sequence[int]) -> None:
        n = len(prompt)
        if n and self.ctx.pos_max() < n - 1:
            log.warning("draft-%s: the draft cache holds positions up to %d of a %d-token prompt; "
                        "drafts may degrade", self.kind.lower(), self.ctx.pos_max(), n)

    # -- drafting -----------------------------------------------------------------------------
    def draft(self, req: DraftRequest) -> list[int]:
        ctx = self.ctx
        pos0 = req.pos0
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
                    tok, p = pick_top_k(ctx.logits(i), self.p_min)
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
        return [pick_top_k(self.ctx.logits(i), 0.0)[0] for i in range(first, n)]

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
        from .draft_simple import acquire_draft_model
        try:
            draft_model = acquire_draft_model(d.model, d.n_gpu_layers)
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
