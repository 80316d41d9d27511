"""Only llama.cpp's repacked-weight CPU kernels, without the CPU's other extra buffer types.

llama.cpp puts a model's weights in the CPU's *extra buffer types* where it can:
AMX tiles first (on a Xeon that reports AMX), then ``CPU_REPACK`` (weights
re-laid in interleaved blocks for faster matrix multiplies). It has one switch for
all of them (``use_extra_bufts``, ``--no-repack``). Where AMX crashes (virtual
machines that report AMX but do not let a process use it: upstream
ggml-org/llama.cpp#20824) turning them all off also loses the repacked kernels,
which cost nothing and speed up prompt processing.

This module keeps the repacking alone: the model is loaded with the extra buffer
types off, and a *tensor buffer-type override* (llama.cpp's ``-ot``) sends each
weight that ``CPU_REPACK`` can hold to it. Which weights it can hold is asked of
ggml itself, the way llama.cpp's loader asks (``weight_buft_supported``): a
zero-size ``CPU_REPACK`` buffer is given to a metadata-only tensor of the
weight's type and shape, and the CPU device is asked whether it supports the
matrix multiply that reads it. So the answer follows this build's kernels and
this CPU's features, never a table of our own.

Weights read by row look-up (the token embeddings) and 3-D expert weights stay
in plain buffers: the override is by name, and a repacked embedding table
would be read by ``GET_ROWS``, which the repacked layout does not support.

>>> group_patterns(["blk.0.ffn_down.weight", "blk.3.ffn_down.weight", "output.weight"])
['^blk\\\\.(0|3)\\\\.ffn_down\\\\.weight$', '^output\\\\.weight$']
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Iterable, Sequence

#: the CPU's repacked-weight buffer type, as ggml names it
REPACK_NAME = "CPU_REPACK"
#: GGML_OP_MUL_MAT's src0 must be 2-D for CPU_REPACK; these weights are read by row instead
_ROW_LOOKUP = re.compile(r"(^|\.)(token_embd|per_layer_token_embd|pos_embd|token_types|tok_embd)\.")

_lock = threading.Lock()
_bound = False


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class BuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override``: a regex and the buffer type it sends tensors to."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _lib():
    global _bound
    from .devices import _ggml
    lib = _ggml()
    with _lock:
        if not _bound:
            vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
            for name, args, res in [
                ("ggml_init", [_InitParams], vp), ("ggml_free", [vp], None),
                ("ggml_new_tensor", [vp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)], vp),
                ("ggml_mul_mat", [vp, vp, vp], vp),
                ("ggml_backend_dev_supports_op", [vp, vp], ctypes.c_bool),
                ("ggml_backend_buft_alloc_buffer", [vp, sz], vp), ("ggml_backend_buffer_free", [vp], None),
                ("ggml_backend_buft_name", [vp], cp), ("ggml_backend_dev_by_type", [ctypes.c_int], vp),
            ]:
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            _bound = True
    return lib


def cpu_extra_bufts() -> dict[str, int]:
    """The CPU device's extra buffer types in llama.cpp's order of preference: name -> handle.

    >>> "CPU_REPACK" in cpu_extra_bufts() or cpu_extra_bufts() == {}
    True
    """
    lib = _lib()
    cpu = lib.ggml_backend_dev_by_type(0)
    if not cpu:
        return {}
    reg = lib.ggml_backend_dev_backend_reg(cpu)
    addr = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not addr:
        return {}
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(addr)(cpu)
    out: dict[str, int] = {}
    i = 0
    while arr and arr[i]:
        out[lib.ggml_backend_buft_name(arr[i]).decode("utf-8", "replace")] = int(arr[i])
        i += 1
    return out


def eligible(tensors: Iterable[tuple[str, int, Sequence[int]]]) -> list[str]:
    """Names of the weights ``CPU_REPACK`` can hold, of ``(name, ggml type, shape)``, as ggml says."""
    buft = cpu_extra_bufts().get(REPACK_NAME)
    if not buft:
        return []
    lib = _lib()
    cpu = lib.ggml_backend_dev_by_type(0)
    buf = lib.ggml_backend_buft_alloc_buffer(buft, 0)
    if not buf:
        return []
    ctx = lib.ggml_init(_InitParams(16 << 20, None, True))
    out: list[str] = []
    try:
        # struct ggml_tensor begins with its type (an enum) and then its buffer pointer
        buffer_offset = ctypes.sizeof(ctypes.c_void_p)
        for name, ggml_type, shape in tensors:
            if len(shape) != 2 or _ROW_LOOKUP.search(name):
                continue
            ne = (ctypes.c_int64 * 4)(int(shape[0]), int(shape[1]), 1, 1)
            w = lib.ggml_new_tensor(ctx, int(ggml_type), 2, ne)
            if not w:
                continue
            ctypes.c_void_p.from_address(w + buffer_offset).value = buf
            x = lib.ggml_new_tensor(ctx, 0, 2, (ctypes.c_int64 * 4)(int(shape[0]), 512, 1, 1))   # F32 input
            op = lib.ggml_mul_mat(ctx, w, x)
            if op and lib.ggml_backend_dev_supports_op(cpu, op):
                out.append(name)
    finally:
        lib.ggml_free(ctx)
        lib.ggml_backend_buffer_free(buf)
    return out


def group_patterns(names: Sequence[str]) -> list[str]:
    """Anchored regexes (ECMAScript, as llama.cpp's ``std::regex``) that match exactly ``names``,
    one per tensor kind with its layer numbers as an alternation (few patterns, short ones)."""
    groups: dict[str, list[str]] = {}
    plain: list[str] = []
    for n in names:
        m = re.match(r"blk\.(\d+)\.(.+)$", n)
        if m:
            groups.setdefault(m.group(2), []).append(m.group(1))
        else:
            plain.append(n)
    pats = [rf"^blk\.({'|'.join(layers)})\.{re.escape(rest)}$" for rest, layers in groups.items()]
    pats += [f"^{re.escape(n)}$" for n in plain]
    return pats


def cpu_layers(n_layer: int, n_gpu_layers: int, offload: bool) -> tuple[int, bool]:
    """Which of a model's weights stay on the CPU as llama.cpp places them: ``(first offloaded
    block, whether the output layer stays)``. llama.cpp offloads the last ``n_gpu_layers`` of
    the ``n_layer`` blocks plus the output layer (counted as one more), where there is a device
    to offload to.

    >>> cpu_layers(18, 0, True), cpu_layers(18, 999, True), cpu_layers(18, 10, True), cpu_layers(18, 999, False)
    ((18, True), (0, False), (9, True), (18, True))
    """
    if not offload or n_gpu_layers <= 0:
        return n_layer, True
    return max(n_layer + 1 - n_gpu_layers, 0), n_gpu_layers <= n_layer


def overrides(model_path: str, n_gpu_layers: int = 0, offload: bool = False) -> tuple[ctypes.Array | None, int]:
    """The NULL-terminated override list for ``llama_model_params.tensor_buft_overrides`` that
    sends every weight of ``model_path`` that stays on the CPU and that ``CPU_REPACK`` can hold to
    it, and how many weights that is. ``(None, 0)`` where there is nothing to repack (the caller
    keeps the array alive). ``offload``: whether a device takes the last ``n_gpu_layers`` layers
    (an override wins over the layer placement, so offloaded weights are never named)."""
    from .gguf_detect import read_gguf
    info = read_gguf(model_path, tensors=True)
    n_layer = info.get_int(f"{info.architecture}.block_count")
    if n_layer is None:
        n_layer = 1 + max((int(m.group(1)) for m in (re.match(r"blk\.(\d+)\.", n) for n in info.tensors or {})
                           if m), default=-1)
    first_gpu, output_on_cpu = cpu_layers(n_layer, n_gpu_layers, offload)

    def on_cpu(name: str) -> bool:
        m = re.match(r"blk\.(\d+)\.", name)
        return int(m.group(1)) < first_gpu if m else output_on_cpu

    names = eligible((t.name, t.ggml_type, t.shape) for t in (info.tensors or {}).values() if on_cpu(t.name))
    buft = cpu_extra_bufts().get(REPACK_NAME)
    if not names or not buft:
        return None, 0
    pats = group_patterns(names)
    arr = (BuftOverride * (len(pats) + 1))()
    for i, p in enumerate(pats):
        arr[i].pattern = p.encode()
        arr[i].buft = buft
    arr[len(pats)].pattern = None
    arr[len(pats)].buft = None
    return arr, len(names)
