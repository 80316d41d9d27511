"""Opening the engine from the app's options (default model, GPU layers)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Sequence

from speculators.engine import Engine, EngineConfig
from speculators.params import SpecParams

from .models import ensure_default_model
from .options import ModelOptions


def gpu_offload_available() -> bool:
    """Whether there is a device to offload layers to: a GPU, or an RPC server's device once added.

    (llama.cpp's ``llama_supports_gpu_offload`` also says yes for a build with the RPC backend
    and no server, which would be no offload at all.)
    """
    from speculators import devices
    try:
        return bool(devices.offload_devices())
    except Exception:  # pragma: no cover
        return False


def default_gpu_layers() -> int:
    """Everything on the offload devices (GPUs, RPC servers' devices) when there are any, else none."""
    return 999 if gpu_offload_available() else 0


def join_rpc_servers(opts: ModelOptions, fallback: bool = False) -> list[str]:
    """Add ``opts.rpc``'s servers' devices to this process's (llama.cpp's ``--rpc``).

    ``fallback``: a server that cannot be reached is left out with a warning
    (returned) and the model runs on this machine's devices; otherwise it is a
    :class:`~speculators.devices.RpcError`. A build without RPC, a malformed
    endpoint or another protocol version is always an error.
    """
    from speculators import devices
    warnings: list[str] = []
    for ep in devices.parse_endpoints(opts.rpc):
        try:
            devices.add_rpc_servers([ep])
        except devices.RpcUnavailable as e:
            if not fallback:
                raise
            warnings.append(f"{e}; the model runs without it, on this machine's devices")
    if warnings and opts.device and any(n.strip().startswith("RPC") for n in opts.device.split(",")):
        # the named remote devices are not there: every local device instead
        opts.device = None
    return warnings


def resolve_model_path(opts: ModelOptions, progress: Callable[[int, int, str], None] | None = None) -> str:
    if opts.model:
        return opts.model
    return str(ensure_default_model(progress))


def cost_cache_dir() -> str:
    """Where the engine keeps the verify-cost curves the adaptive controller measures."""
    from . import paths
    return str(paths.cache_dir() / "costcurves")


def engine_config(opts: ModelOptions, progress: Callable[[int, int, str], None] | None = None,
                  warnings: list[str] | None = None) -> EngineConfig:
    """The engine's configuration for ``opts``; also settles, once per process, whether models
    load with the CPU's extra buffer types (probed once per llama.cpp build and CPU), and joins
    the ``--rpc`` servers' devices (``warnings`` given: an unreachable one is left out and said there)."""
    from .cpu_check import apply
    # the probe uses the default model (small, always at hand); with --model its preparation is quiet
    apply(getattr(opts, "extra_bufts", "auto") or "auto", progress=None if opts.model else progress)
    if getattr(opts, "rpc", None):
        opts = dataclasses.replace(opts)
        got = join_rpc_servers(opts, fallback=warnings is not None)
        if warnings is not None:
            warnings.extend(got)
    ngl = opts.n_gpu_layers
    if ngl is None or ngl == -1:
        ngl = default_gpu_layers()
    from speculators.devices import parse_tensor_split
    return EngineConfig(n_ctx=opts.ctx_size if opts.ctx_size is not None else 4096,
                        n_threads=opts.threads, n_gpu_layers=ngl, cost_cache_dir=cost_cache_dir(),
                        devices=getattr(opts, "device", None), split_mode=getattr(opts, "split_mode", None),
                        tensor_split=parse_tensor_split(getattr(opts, "tensor_split", None)),
                        main_gpu=getattr(opts, "main_gpu", None) or 0)


def open_engine(opts: ModelOptions, spec: SpecParams | None = None,
                progress: Callable[[int, int, str], None] | None = None, build_chain: bool = True,
                rpc_fallback: bool = False, load_for: Sequence[SpecParams] | None = None) -> Engine:
    """The engine for ``opts`` with ``spec``'s chain (``build_chain=False``: the model only,
    loaded as ``spec`` needs it, e.g. with MTP layers, or as every spec of ``load_for`` run in
    turn on it needs it (:func:`~speculators.engine.load_plan_for`); the caller builds the chain).

    ``rpc_fallback``: an ``--rpc`` server that cannot be reached is left out (the engine's
    ``load_warnings`` say so) instead of failing the load.
    """
    path = resolve_model_path(opts, progress)
    warnings: list[str] = []
    cfg = engine_config(opts, progress, warnings if rpc_fallback else None)
    if build_chain:
        engine = Engine(path, cfg, spec)
    else:
        # the chain comes later, but the model and its context are made as ``spec`` needs them
        from speculators.engine import load_plan, load_plan_for
        plan = load_plan_for(path, load_for) if load_for is not None else load_plan(path, spec)
        cfg.load_mtp, cfg.n_rs_seq = plan.load_mtp, plan.n_rs_seq
        engine = Engine(path, cfg, SpecParams())
    engine.load_warnings = warnings
    from speculators import devices
    try:
        #: the devices at load, with their memory then (the settings pane lists them)
        engine.device_list = devices.list_devices()
    except Exception:  # pragma: no cover - a build without the backend API
        engine.device_list = []
    return engine


def load_chat_engine(model_options: ModelOptions, spec: SpecParams,
                     progress: Callable[[int, int, str], None] | None = None) -> Engine:
    """The chat's engine, in this process: the model loaded as ``spec`` needs it, with an
    empty chain (the session builds the chain after the model, so a bad chain never blocks it).
    An unreachable ``--rpc`` server is left out with a warning: the chat goes on locally."""
    return open_engine(model_options, spec, progress, build_chain=False, rpc_fallback=True)



def draft_model_warning(spec: SpecParams | None, auto_plan) -> str | None:
    """Under Automatic, why the configured draft model is not used (None: it is, or none is set).

    >>> from speculators.params import SpecParams
    >>> from speculators.auto import AutoChoice
    >>> s = SpecParams.auto(); s.draft.model = "/m/small.gguf"
    >>> draft_model_warning(s, [AutoChoice("draft-simple", False, "the draft model small.gguf cannot be read")])
    'the draft model /m/small.gguf is not used: the draft model small.gguf cannot be read; Automatic goes on without it'
    """
    path = spec.draft.model if spec is not None else None
    if not path or not spec.is_auto or not auto_plan:
        return None
    choices = {c.name: c for c in auto_plan}
    from speculators.descriptor import draft_model_types
    # the types that draft from the configured draft model (-md), from their descriptors
    if any(choices[t.value].used for t in draft_model_types() if t.value in choices):
        return None
    why = choices["draft-simple"].reason if "draft-simple" in choices else "no drafter can use it"
    return f"the draft model {path} is not used: {why}; Automatic goes on without it"


def synthetic_auto_warning(spec: SpecParams | None) -> str | None:
    """Under Automatic (or ``--spec-adaptive on``) with synthetic acceptance: that the adaptive
    controller is off (None: not so).

    Synthetic acceptance accepts drafts at the given rates whatever they say, so nothing the
    controller could learn from them is true of the model: the chain drafts as llama.cpp's
    does, the first drafter in the fixed order wins, and every drafter's upkeep runs.

    >>> from speculators.params import SpecParams
    >>> synthetic_auto_warning(SpecParams.auto(synth_len=2.5))
    'the adaptive controller is off under synthetic acceptance: every type drafts in its fixed order (the first drafter wins), and the figures are not what Automatic would do'
    >>> synthetic_auto_warning(SpecParams.auto()) is None, synthetic_auto_warning(SpecParams.from_types("ngram-mod", synth_len=2.5)) is None
    (True, True)
    """
    if spec is None or not spec.adaptive_on or not spec.has_synth:
        return None
    return ("the adaptive controller is off under synthetic acceptance: every type drafts in its fixed "
            "order (the first drafter wins), and the figures are not what Automatic would do")


def auto_warnings(spec: SpecParams | None, auto_plan) -> list[str]:
    """What a command should say about how Automatic runs with these settings: the
    configured draft model it cannot use, and a controller off under synthetic acceptance."""
    return [w for w in (draft_model_warning(spec, auto_plan), synthetic_auto_warning(spec)) if w]


def stderr_progress(done: int, total: int, phase: str) -> None:
    """A one-line progress bar on stderr (for the first run's model assembly)."""
    if phase == "load":
        return                      # loading has no steps to count
    if phase == "probe":
        if not sys.stderr.isatty():
            return
        sys.stderr.write("Checking once whether llama.cpp's extra CPU kernels (AMX, repacked weights) work "
                         "on this CPU…\n")
        sys.stderr.flush()
        return
    if not sys.stderr.isatty() and done < total:
        return
    width = 30
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width)
    label = {"assemble": "Preparing the default model", "verify": "Checking the default model"}.get(phase, phase)
    sys.stderr.write(f"\r{label}: [{bar:<{width}}] {frac * 100:5.1f}%")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()
