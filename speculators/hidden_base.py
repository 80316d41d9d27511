"""Shared plumbing of the hidden-state drafters (draft-mtp, draft-eagle3, draft-dflash,
draft-dspark).

How the target's hidden states reach the drafter
------------------------------------------------
The reference's ``process(batch)`` runs after every ``llama_decode`` of the
target, while that call's outputs are readable. The engine decodes long
prompts in ``n_batch`` chunks and calls ``chain.process`` once afterwards,
when only the last chunk's outputs are left. So these drafters register a
hook on the target :class:`~speculators.llama.Context` (``decode_hooks``)
that runs after each chunk; their ``process()`` then has nothing left to do.
The engine's checkpoint rollback restores the target and re-decodes the
accepted tokens (and the target's own) from the same start as the undone
verify, before ``accept``: the hook runs again for positions the drafter has
seen, so a drafter that pairs rows across batches must take the row before
that start from the batch it saw there, not from the undone verify's end
(draft-mtp's ``_last_batch``).

The drafters live one module each, as vLLM lays out its spec-decode proposers:
:mod:`speculators.draft_mtp`, :mod:`speculators.draft_eagle3` and
:mod:`speculators.draft_dflash` (DFlash and DSpark); :mod:`speculators.draft_hidden`
imports them so they register with the chain.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Sequence

import numpy as np

import llama_cpp as lc

from . import ext
from .base import Speculator
from .chain import Unavailable
from .llama import Context, ContextFull, DecodeError, Model

log = logging.getLogger("speculators.draft_hidden")


#: the reference drafts from a top-k 10 sampler and takes the first candidate
DRAFT_TOP_K = 10


def _require(*names: str) -> None:
    """Raise Unavailable naming the first symbol this llama.cpp build lacks."""
    for n in names:
        try:
            ext.require(n)
        except ext.MissingSymbolError as e:
            raise Unavailable(str(e)) from None


def pick_top_k(logits: np.ndarray, p_min: float, suppress: np.ndarray | None = None) -> tuple[int, float]:
    """The reference's draft token: top-k 10, first candidate, its probability; never one of
    the model's ``suppress`` tokens (its draft sampler's -inf bias).

    >>> pick_top_k(np.array([0.0, 2.0, 1.0], dtype=np.float32), 0.5)[0]
    1
    >>> pick_top_k(np.array([0.0, 2.0, 1.0], dtype=np.float32), 0.5, suppress=np.array([1]))[0]
    2
    """
    if suppress is not None:
        logits = logits.copy()
        logits[suppress] = -np.inf
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
    #: it learns the conversation only from the target's batches (see Engine.set_spec)
    fed_by_target = True

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
        self._as_upkeep(lambda: self._process(list(tokens), pos0))

    def _process(self, tokens: list[int], pos0: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _as_upkeep(self, work) -> bool:
        """Run ``work()`` (mirroring a target batch, or a paused drafter catching up before it
        drafts), its time counted in ``stats.t_process_us``; its result."""
        t0 = time.perf_counter()
        try:
            return bool(work())
        finally:
            self.stats.t_process_us += (time.perf_counter() - t0) * 1e6

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


def _engine_parts(resources: dict):
    target: Model | None = resources.get("model")
    engine = resources.get("engine")
    if target is None or engine is None or getattr(engine, "ctx", None) is None:
        raise Unavailable("no target model and context are loaded")
    return target, engine


#: architectures whose graph records every layer's input (``res->t_layer_inp``) in the
#: bundled llama.cpp -- the only targets ``llama_set_embeddings_layer_inp`` works on
#: (on others llama.cpp aborts with "layer input tensor is null")
LAYER_INPUT_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4",
    "gpt-oss", "lfm2", "mimo2", "minimax-01", "minimax-m2", "nemotron_h", "bailingmoe3",
    "deepseek4", "nanbeige", "muse-glimmer", "hunyuan-vl",
})
