"""A thin, safe layer over llama-cpp-python's low-level API.

Only what the generation loop needs: load a model (with a clear error for
a missing, truncated or non-GGUF file), tokenize, turn tokens into bytes,
one context with a reusable batch, logits as numpy views, and the KV-cache
operations (remove a tail, save/restore a sequence checkpoint).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import llama_cpp as lc

GGUF_MAGIC = b"GGUF"


class ModelError(RuntimeError):
    """A model file cannot be used; the message says why, in one line."""


class DecodeError(RuntimeError):
    pass


class ContextFull(RuntimeError):
    pass


class DecodeAborted(DecodeError):
    """A decode stopped by :meth:`Context.request_abort` (llama.cpp's abort callback).

    llama.cpp drops the aborted batch's positions from the memory; ``n_done`` tokens of
    the call (whole ``n_batch`` chunks decoded before it) are in the context."""

    def __init__(self, n_done: int = 0):
        super().__init__("the decode was stopped")
        self.n_done = n_done


class AbortFlag:
    """A flag that llama.cpp's abort callback reads between the nodes of a graph, with no
    Python in the loop: the callback is libc's ``strlen`` over two bytes ``[flag, 0]``, so
    it returns 1 (abort) once the flag byte is set and 0 otherwise. ggml's CPU backend asks
    it after every node; a Python callback there would cost a lock and a call per node.
    Backends that do not take an abort callback (CUDA, Metal) finish their batch first.

    >>> f = AbortFlag()
    >>> f.is_set(), f.set(), f.is_set(), f.clear(), f.is_set()
    (False, None, True, None, False)
    >>> AbortFlag.callback() is None or bool(AbortFlag.callback())
    True
    """

    _callback: object = None
    _looked = False

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)

    @classmethod
    def callback(cls):
        """libc's ``strlen`` as a ``ggml_abort_callback`` (None where libc cannot be found)."""
        if not cls._looked:
            cls._looked = True
            with contextlib.suppress(Exception):
                import ctypes.util
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
                addr = ctypes.cast(libc.strlen, ctypes.c_void_p).value
                if addr:
                    cls._callback = lc.ggml_abort_callback(addr)
        return cls._callback

    @property
    def address(self) -> int:
        return ctypes.addressof(self._buf)

    def set(self) -> None:
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._buf[0] != b"\x00"


# -- logging: keep llama.cpp quiet, but remember the last errors ------------
_log_lock = threading.Lock()
_recent_log: list[str] = []
_verbose = bool(os.environ.get("DRAFTLIGHT_LLAMA_LOG"))
#: a file descriptor that every line llama.cpp logs is also written to (a runner's parent reads
#: it, so that the last lines before a crash of native code can be shown)
_log_fd: int | None = None
with contextlib.suppress(ValueError):
    _log_fd = int(os.environ["DRAFTLIGHT_LOG_FD"]) if os.environ.get("DRAFTLIGHT_LOG_FD") else None

#: how models are loaded with the CPU's extra buffer types: "on" (all of them: AMX, repacked
#: weights; llama.cpp's default), "repack" (the repacked weights only, see speculators.repack) or
#: "off" (none: llama.cpp's ``--no-repack``); see :func:`set_extra_bufts`
EXTRA_BUFT_MODES = ("on", "repack", "off")
_extra_bufts = "on"


def _mode(on: bool | str) -> str:
    if isinstance(on, str):
        if on not in EXTRA_BUFT_MODES:
            raise ValueError(f"extra buffer types must be one of {', '.join(EXTRA_BUFT_MODES)}, not {on!r}")
        return on
    return "on" if on else "off"


def set_extra_bufts(on: bool | str) -> None:
    """Load every later model with the CPU's extra buffer types (True or "on"), with the
    repacked-weight one only ("repack"), or without any (False or "off": llama.cpp's
    ``--no-repack``, weights in plain CPU buffers)."""
    global _extra_bufts
    _extra_bufts = _mode(on)


def extra_bufts() -> bool:
    """Whether models load with all of the CPU's extra buffer types, as llama.cpp does by default."""
    return _extra_bufts == "on"


def extra_bufts_mode() -> str:
    return _extra_bufts


def llama_server_mode(mode: str) -> str:
    """The extra-buffer-type mode llama-server can match: all of them, or none with its
    ``--no-repack``; it has no repacked-weights-only choice, so a comparison with it that would
    run "repack" runs "off" on both sides, the same kernels.

    >>> [llama_server_mode(m) for m in ("on", "repack", "off")]
    ['on', 'off', 'off']
    """
    return "on" if _mode(mode) == "on" else "off"


@lc.llama_log_callback
def _log_cb(level, text, _user):  # pragma: no cover - called from C
    try:
        msg = text.decode("utf-8", "replace") if text else ""
    except Exception:
        return
    if _verbose:
        import sys
        sys.stderr.write(msg)
    global _last_level
    if level != 5:   # GGML_LOG_LEVEL_CONT continues the line before
        _last_level = level
    if _log_fd is not None and _last_level != 1:   # not GGML_LOG_LEVEL_DEBUG
        with contextlib.suppress(OSError):
            os.write(_log_fd, msg.encode("utf-8", "replace"))
    # keep the last lines: a failed load is explained from them (see _last_errors)
    with _log_lock:
        _recent_log.append(msg)
        del _recent_log[:-40]


_backend_ready = False
_last_level = 0


def backend_init() -> None:
    global _backend_ready
    if not _backend_ready:
        lc.llama_log_set(_log_cb, ctypes.c_void_p(0))
        lc.llama_backend_init()
        _backend_ready = True


def _last_errors() -> str:
    """The most telling line llama.cpp logged during the last failed call."""
    with _log_lock:
        lines = [l.strip() for l in _recent_log if l.strip()]
    for line in reversed(lines):
        low = line.lower()
        if "error loading model:" in low:
            return line[low.index("error loading model:") + len("error loading model:"):].strip()
    errs = [l for l in lines if ("error" in l.lower() or "invalid" in l.lower())
            and "failed to load model" not in l]
    return (errs or lines or [""])[-1]


def check_gguf_file(path: str | os.PathLike) -> None:
    """Refuse files that are missing, empty, truncated or not GGUF, cheaply."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ModelError(f"model file not found: {p}")
    if os.path.isdir(p):
        raise ModelError(f"model path is a directory, not a GGUF file: {p}")
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise ModelError(f"not a GGUF model file: {p}")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3) or n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise ModelError(f"unsupported or damaged GGUF header in {p}")
    if size < 1024:
        raise ModelError(f"model file is truncated or incomplete: {p} has only {size} bytes")
    _check_extent(p, size)


def _check_extent(p: str, size: int) -> None:
    """Refuse a file cut short, saying where it ends and where its header says it should.

    llama.cpp reports a file cut inside its metadata only as "failed to load
    model"; reading the header ourselves tells the two truncations apart. Only
    truncation is judged here: any other oddity is left to llama.cpp.
    """
    from .gguf_detect import GGUFError, read_gguf, tensor_data_end
    try:
        info = read_gguf(p, tensors=True)
    except GGUFError as e:
        msg = str(e)
        if "past the end" in msg or msg.startswith("truncated"):
            raise ModelError(f"model file is truncated or incomplete: {p} ends at byte {size:,}, "
                             f"inside its GGUF header (metadata and tensor list)") from None
        return
    except OSError:
        return  # llama.cpp says why it cannot read it
    end = tensor_data_end(info)
    if end is not None and end > size:
        raise ModelError(f"model file is truncated or incomplete: {p}: its header declares tensor data "
                         f"up to byte {end:,} but the file has {size:,} bytes")


@dataclass
class VocabInfo:
    n_vocab: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    add_eos: bool
    vocab_type: int


def place_on_cpu(params, path: str, mode: str | None = None, n_gpu_layers: int = 0,
                 devices: str | None = None) -> tuple[object, int]:
    """Set a ``llama_model_params``' use of the CPU's extra buffer types for ``mode`` ("on",
    "repack", "off"; None: the process-wide choice, :func:`set_extra_bufts`), for the model at
    ``path``: returns (what must stay alive until the model is loaded, how many weights were
    sent to the repacked-weight type by name). :class:`Model` loads through it, and so does
    anything else that loads a model in this process (``bench``'s llama-cpp-python row): a load
    that does not go through it gets llama.cpp's default, every extra type, and on a CPU whose AMX
    kernels crash it dies at its first matrix multiply."""
    mode = _extra_bufts if mode is None else _mode(mode)
    if hasattr(params, "use_extra_bufts"):
        params.use_extra_bufts = mode == "on"
    if mode != "repack":
        return None, 0
    from .devices import offload_devices, resolve_devices
    from .repack import overrides
    named = resolve_devices(devices)
    offload = bool(named) if named is not None else bool(offload_devices())
    arr, n = overrides(path, int(n_gpu_layers), offload)
    if arr is not None:
        params.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)
    return arr, n


class Model:
    """A loaded GGUF model (weights only; contexts are made from it)."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = 0, use_mmap: bool = True,
                 load_mtp: bool = False, use_extra_bufts: bool | None = None,
                 devices: str | None = None, split_mode: str | int | None = None,
                 tensor_split: str | Sequence[float] | None = None, main_gpu: int = 0):
        backend_init()
        self.path = os.fspath(path)
        check_gguf_file(self.path)
        params = lc.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.use_mmap = use_mmap
        #: where the offloaded layers go: ``--device`` names (None: every device, "none": the CPU only)
        self.devices = devices
        #: the layers asked to go to the GPUs (-1: all)
        self.n_gpu_layers = int(n_gpu_layers)
        keep = self._place(params, devices, split_mode, tensor_split, main_gpu)
        #: "on", "repack" or "off": the CPU's extra buffer types (None: the process-wide choice)
        self.extra_bufts_mode = _extra_bufts if use_extra_bufts is None else _mode(use_extra_bufts)
        #: whether all of them were allowed (llama.cpp's ``use_extra_bufts``)
        self.use_extra_bufts = self.extra_bufts_mode == "on"
        arr, n_over = place_on_cpu(params, self.path, self.extra_bufts_mode, n_gpu_layers, devices)
        keep += (arr,)
        #: how many weights were sent to the repacked-weight buffer type by name ("repack" mode)
        self.n_repack_overrides = n_over
        #: whether the NextN/MTP layers were loaded (llama.cpp skips them by default)
        self.load_mtp = bool(load_mtp)
        if load_mtp:
            params.load_mtp = True
        with _log_lock:
            _recent_log.clear()
        ptr = lc.llama_model_load_from_file(self.path.encode(), params)
        del keep
        if not ptr:
            why = _last_errors()
            raise ModelError(f"cannot load model {self.path}" + (f": {why}" if why else ""))
        self.ptr = ptr
        self.vocab = lc.llama_model_get_vocab(ptr)
        v = self.vocab
        self.info = VocabInfo(
            n_vocab=lc.llama_vocab_n_tokens(v),
            bos=lc.llama_vocab_bos(v),
            eos=lc.llama_vocab_eos(v),
            eot=lc.llama_vocab_eot(v),
            add_bos=bool(lc.llama_vocab_get_add_bos(v)),
            add_eos=bool(lc.llama_vocab_get_add_eos(v)),
            vocab_type=int(lc.llama_vocab_type(v)),
        )
        self.n_vocab = self.info.n_vocab
        self.n_ctx_train = lc.llama_model_n_ctx_train(ptr)
        self.n_embd = lc.llama_model_n_embd(ptr)
        self.n_layer = lc.llama_model_n_layer(ptr)
        self.is_recurrent = bool(lc.llama_model_is_recurrent(ptr))
        self.is_hybrid = bool(lc.llama_model_is_hybrid(ptr))
        self._piece_cache: dict[int, bytes] = {}
        self._eog = np.zeros(self.n_vocab, dtype=bool)
        # EOG flags are looked up lazily (262k calls would slow loading).
        self._eog_known: dict[int, bool] = {}

    @staticmethod
    def _place(params, devices, split_mode, tensor_split, main_gpu) -> tuple:
        """Fill the device list, split mode and tensor split of ``params`` (llama.cpp's ``-dev``,
        ``-sm``, ``-ts``, ``-mg``); returns the ctypes arrays that must outlive the load."""
        from . import devices as dv
        keep: tuple = ()
        try:
            ptrs = dv.resolve_devices(devices)
            params.split_mode = dv.parse_split_mode(split_mode)
            ts = dv.parse_tensor_split(tensor_split)
        except dv.DeviceError as e:
            raise ModelError(str(e)) from None
        if ptrs is not None:
            arr = dv.device_array(ptrs)
            params.devices = ctypes.cast(arr, ctypes.c_void_p)
            keep += (arr,)
        if ts:
            n_max = int(lc.llama_max_devices())
            if len(ts) > n_max:
                raise ModelError(f"tensor split {ts} names {len(ts)} devices; this build has at most {n_max}")
            arr_ts = (ctypes.c_float * n_max)(*ts)
            params.tensor_split = ctypes.cast(arr_ts, ctypes.POINTER(ctypes.c_float))
            keep += (arr_ts,)
        params.main_gpu = int(main_gpu or 0)
        return keep

    # -- metadata ------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        t = lc.llama_model_chat_template(self.ptr, None)
        return t.decode("utf-8", "replace") if t else None

    @property
    def size_bytes(self) -> int:
        return int(lc.llama_model_size(self.ptr))

    @property
    def placement(self) -> str:
        """"cpu" (no layer offloaded), "offloaded" (every layer asked onto the devices) or
        "split": what decides whether two models' sizes say which one decodes faster."""
        if self.n_gpu_layers == 0 or self.devices == "none":
            return "cpu"
        from .devices import offload_devices
        if not offload_devices():
            return "cpu"
        return "offloaded" if self.n_gpu_layers < 0 or self.n_gpu_layers > self.n_layer else "split"

    @property
    def suppress_tokens(self) -> np.ndarray | None:
        """Token ids the model's GGUF says never to sample (``tokenizer.ggml.suppress_tokens``):
        llama.cpp's sampler gives them a bias of -inf, for the target and every drafter."""
        cached = getattr(self, "_suppress_tokens", False)
        if cached is not False:
            return cached
        out = None
        fn = getattr(lc, "llama_vocab_get_suppress_tokens", None)
        if fn is not None:
            n = ctypes.c_int(0)
            ptr = fn(self.vocab, ctypes.byref(n))
            if ptr and n.value > 0:
                out = np.array(ptr[:n.value], dtype=np.int64)
        self._suppress_tokens = out
        return out

    # -- tokens --------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (lc.llama_token * n_max)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
            if n < 0:
                raise ValueError("tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        key = token if not special else -token - 1
        b = self._piece_cache.get(key)
        if b is None:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            b = buf.raw[:n]
            self._piece_cache[key] = b
        return b

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special) for t in tokens).decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        t = lc.llama_vocab_get_text(self.vocab, token)
        return t.decode("utf-8", "replace") if t else ""

    def is_eog(self, token: int) -> bool:
        r = self._eog_known.get(token)
        if r is None:
            r = bool(lc.llama_vocab_is_eog(self.vocab, token))
            self._eog_known[token] = r
        return r

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


def physical_cores() -> int:
    try:
        import platform
        if platform.system() == "Linux":
            cores = set()
            phys = core = None
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("physical id"):
                        phys = line.split(":")[1].strip()
                    elif line.startswith("core id"):
                        core = line.split(":")[1].strip()
                    elif not line.strip():
                        if core is not None:
                            cores.add((phys, core))
                        phys = core = None
            if cores:
                return max(1, min(len(cores), os.cpu_count() or 1))
    except Exception:
        pass
    n = os.cpu_count() or 2
    return max(1, n // 2 if n > 4 else n)


class Context:
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

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
