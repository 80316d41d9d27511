"""Where a model's weights go: the CPU's extra buffer types (all, the repacked-weight one only,
or none; a process-wide choice a load may override) and the offload devices, split mode and
tensor split of a ``llama_model_params``. Fills parameters only; loads nothing."""

from __future__ import annotations

import ctypes

import llama_cpp as lc

from .errors import ModelError

#: how models are loaded with the CPU's extra buffer types: "on" (all of them: AMX, repacked
#: weights; llama.cpp's default), "repack" (the repacked weights only, see speculators.repack) or
#: "off" (none: llama.cpp's ``--no-repack``); see :func:`set_extra_bufts`
EXTRA_BUFT_MODES = ("on", "repack", "off")
_extra_bufts = "on"


def _mode(on: bool | str) -> str:
    """``on`` as one of :data:`EXTRA_BUFT_MODES` (True: "on", False: "off"); ValueError otherwise."""
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
    """The process-wide mode: "on", "repack" or "off" (see :func:`set_extra_bufts`)."""
    return _extra_bufts


def llama_server_mode(mode: str) -> str:
    """The extra-buffer-type mode llama-server can match: all of them, or none with its
    ``--no-repack``; it has no repacked-weights-only choice, so a comparison with it that would
    run "repack" runs "off" on both sides, the same kernels.

    >>> [llama_server_mode(m) for m in ("on", "repack", "off")]
    ['on', 'off', 'off']
    """
    return "on" if _mode(mode) == "on" else "off"


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
    from ..devices import offload_devices, resolve_devices
    from ..repack import overrides
    named = resolve_devices(devices)
    offload = bool(named) if named is not None else bool(offload_devices())
    arr, n = overrides(path, int(n_gpu_layers), offload)
    if arr is not None:
        params.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)
    return arr, n


def place_on_devices(params, devices, split_mode, tensor_split, main_gpu) -> tuple:
    """Fill the device list, split mode and tensor split of ``params`` (llama.cpp's ``-dev``,
    ``-sm``, ``-ts``, ``-mg``); returns the ctypes arrays that must outlive the load."""
    from .. import devices as dv
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
