"""A loaded GGUF model: its weights placed as asked, its vocabulary, metadata and tokenizer.
Contexts are made from it (:mod:`.context`); it decodes nothing itself."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import llama_cpp as lc

from .errors import ModelError
from .gguf_check import check_gguf_file
from .handle import NativeHandle
from .log import _last_errors, backend_init, clear_recent_log
from .placement import _mode, extra_bufts_mode, place_on_cpu, place_on_devices


@dataclass
class VocabInfo:
    """A vocabulary's size, special tokens and tokenizer kind, as llama.cpp reports them."""

    n_vocab: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    add_eos: bool
    vocab_type: int


class Model(NativeHandle):
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
        keep = place_on_devices(params, devices, split_mode, tensor_split, main_gpu)
        #: "on", "repack" or "off": the CPU's extra buffer types (None: the process-wide choice)
        self.extra_bufts_mode = extra_bufts_mode() if use_extra_bufts is None else _mode(use_extra_bufts)
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
        clear_recent_log()
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
        from ..devices import offload_devices
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
