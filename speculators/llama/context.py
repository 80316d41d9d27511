"""One llama.cpp context of a :class:`~.model.Model`, sequence 0 only: decoding in batches,
logits as numpy views, stopping a decode, and the memory's operations (remove a tail, clear,
save and restore a sequence checkpoint)."""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

import llama_cpp as lc

from .abort import AbortFlag
from .errors import ContextFull, DecodeAborted, DecodeError, ModelError
from .handle import NativeHandle
from .log import _last_errors
from .model import Model
from .threads import physical_cores


class Context(NativeHandle):
    """One llama context with a reusable batch; sequence 0 only."""

    def __init__(self, model: Model, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_ubatch: int | None = None, embeddings: bool = False, seed: int | None = None,
                 overrides: dict | None = None):
        """``overrides``: extra ``llama_context_params`` fields (e.g. ``ctx_type``,
        ``ctx_other``, ``n_outputs_max``) set after the defaults above."""
        self.model = model
        p = lc.llama_context_default_params()
        if n_ctx <= 0:
            n_ctx = model.n_ctx_train
        p.n_ctx = int(n_ctx)
        p.n_batch = int(n_batch)
        p.n_ubatch = int(n_ubatch or n_batch)
        threads = n_threads or physical_cores()
        p.n_threads = threads
        p.n_threads_batch = threads
        p.embeddings = embeddings
        p.no_perf = True
        for k, v in (overrides or {}).items():
            setattr(p, k, v)
        ptr = lc.llama_init_from_model(model.ptr, p)
        if not ptr:
            raise ModelError(f"cannot create a context of {n_ctx} tokens for {model.path}: {_last_errors()}")
        self.ptr = ptr
        self.n_ctx = lc.llama_n_ctx(ptr)
        self.n_batch = lc.llama_n_batch(ptr)
        self.n_ubatch = lc.llama_n_ubatch(ptr)
        #: recurrent-state snapshots kept per sequence for rollback (0: none)
        self.n_rs_seq = int(lc.llama_n_rs_seq(ptr))
        self.n_threads = threads
        self.mem = lc.llama_get_memory(ptr)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self.n_vocab = model.n_vocab
        self._logits_cache: dict[int, np.ndarray] = {}
        #: called as hook(tokens, pos0) after every successful llama_decode of
        #: :meth:`decode` (one call per n_batch chunk), while that chunk's outputs
        #: (logits, embeddings) are still readable; used by hidden-state drafters
        self.decode_hooks: list = []
        #: output rows of the last llama_decode call (its logits are readable while > 0)
        self.n_outputs = 0
        self._abort: AbortFlag | None = None

    # -- stopping a decode -----------------------------------------------------
    def enable_abort(self) -> bool:
        """Let :meth:`request_abort` stop a decode in progress (between two nodes of its graph,
        on the CPU backend): :meth:`decode` then raises :class:`DecodeAborted`. False where
        libc's ``strlen`` cannot be had (nothing is installed then)."""
        cb = AbortFlag.callback()
        if cb is None:
            return False
        if self._abort is None:
            self._abort = AbortFlag()
            lc.llama_set_abort_callback(self.ptr, cb, ctypes.c_void_p(self._abort.address))
        return True

    def request_abort(self) -> None:
        """Stop the decode in progress, and every later one until :meth:`clear_abort` (any thread)."""
        if self._abort is not None:
            self._abort.set()

    def clear_abort(self) -> None:
        if self._abort is not None:
            self._abort.clear()

    # -- decoding ------------------------------------------------------------
    def decode(self, tokens: Sequence[int], pos0: int, logits: str = "last") -> None:
        """Decode ``tokens`` at positions pos0.. in chunks of n_batch.

        logits: "last" (only the last token), "all", or "none".
        """
        n = len(tokens)
        if n == 0:
            return
        if pos0 + n > self.n_ctx:
            raise ContextFull(f"context full ({pos0 + n} > {self.n_ctx} tokens)")
        b = self._batch
        start = 0
        while start < n:
            chunk = tokens[start:start + self.n_batch]
            m = len(chunk)
            last_chunk = start + m == n
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = pos0 + start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = logits == "all"
            if logits == "last" and last_chunk:
                b.logits[m - 1] = True
            b.n_tokens = m
            rc = lc.llama_decode(self.ptr, b)
            if rc != 0:
                if rc == 2 and self._abort is not None:
                    raise DecodeAborted(start)
                if rc == 1:
                    raise ContextFull("no KV-cache slot for the batch (context full)")
                raise DecodeError(f"llama_decode failed with code {rc}: {_last_errors()}")
            self.n_outputs = m if logits == "all" else int(logits == "last" and last_chunk)
            for hook in self.decode_hooks:
                hook(chunk, pos0 + start)
            start += m
        self._logits_cache.clear()

    def put_last_logits(self, values: np.ndarray) -> bool:
        """Write ``values`` into the last output row, as if the last decode had made them.

        For a state restored with :meth:`state_set`: llama.cpp's sequence state holds the
        memory, not the outputs, so the logits the restored decode ended with are kept beside
        it and written back here (into the row the last decode left; False where it left none).
        """
        if self.n_outputs <= 0:
            return False
        ptr = lc.llama_get_logits_ith(self.ptr, -1)
        if not ptr:
            return False
        src = np.ascontiguousarray(values, dtype=np.float32)
        if src.shape != (self.n_vocab,):
            raise ValueError(f"expected {self.n_vocab} logits, not {src.shape}")
        ctypes.memmove(ptr, src.ctypes.data, src.nbytes)
        self._logits_cache.clear()
        return True

    def logits(self, i: int) -> np.ndarray:
        """Logits of output row ``i`` (-1: the last), as a read-only numpy view."""
        ptr = lc.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise DecodeError(f"no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    # -- memory ----------------------------------------------------------------
    def seq_rm(self, p0: int, p1: int = -1) -> bool:
        return bool(lc.llama_memory_seq_rm(self.mem, 0, p0, p1))

    def clear(self) -> None:
        lc.llama_memory_clear(self.mem, True)

    def pos_min(self) -> int:
        return int(lc.llama_memory_seq_pos_min(self.mem, 0))

    def pos_max(self) -> int:
        return int(lc.llama_memory_seq_pos_max(self.mem, 0))

    def can_seq_rm(self) -> str:
        """'part', 'rs', 'full' or 'no', as common_context_can_seq_rm decides.

        Clears the memory: call it before decoding anything.
        """
        if not self.mem:
            return "no"
        if self.n_rs_seq > 0:
            return "rs"  # bounded partial removal: up to n_rs_seq tokens back
        self.clear()
        try:
            self.decode([0, 0], 0, logits="last")
        except Exception:
            self.clear()
            return "no"
        ok = self.seq_rm(1, -1)
        self.clear()
        lc.llama_synchronize(self.ptr)
        return "part" if ok else "full"

    def state_get(self, partial: bool, into: bytearray | None = None) -> bytearray:
        """A checkpoint of sequence 0 (``partial``: only the recurrent part).

        llama.cpp writes the state straight into the returned ``bytearray``: no
        copy is made afterwards (a per-byte Python copy of a 20 MB state took
        0.33 s, on every drafted step of a checkpointed target). ``into``: a
        buffer from an earlier call, reused when the size still fits (a fresh
        20 MB buffer costs ~4 ms of page faults; llama-server reuses its own too).
        """
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        size = lc.llama_state_seq_get_size_ext(self.ptr, 0, flags)
        data = into if into is not None and len(into) == size else bytearray(size)
        if size == 0:
            return data
        buf = (ctypes.c_uint8 * size).from_buffer(data)
        n = lc.llama_state_seq_get_data_ext(self.ptr, buf, size, 0, flags)
        del buf
        return data if n == size else data[:n]  # (n < size: never seen; a copy then)

    def state_set(self, data: bytes | bytearray | memoryview, partial: bool) -> None:
        """Restore what :meth:`state_get` returned; a writable buffer is passed as is."""
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        n_data = len(data)
        if n_data == 0:
            raise DecodeError("failed to restore the sequence checkpoint (empty state)")
        try:
            buf = (ctypes.c_uint8 * n_data).from_buffer(data)
        except TypeError:  # read-only (bytes): one copy
            buf = (ctypes.c_uint8 * n_data).from_buffer_copy(data)
        n = lc.llama_state_seq_set_data_ext(self.ptr, buf, n_data, 0, flags)
        del buf
        if n == 0:
            raise DecodeError("failed to restore the sequence checkpoint")

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ptr", None):
            lc.llama_free(self.ptr)
            self.ptr = None
