"""Opening the engine from the app's options (default model, GPU layers)."""

from __future__ import annotations

import sys
from typing import Callable

from speculators.engine import Engine, EngineConfig
from speculators.params import SpecParams

from .models import ensure_default_model
from .options import ModelOptions


def gpu_offload_available() -> bool:
    import llama_cpp as lc
    try:
        return bool(lc.llama_supports_gpu_offload())
    except Exception:  # pragma: no cover
        return False


def default_gpu_layers() -> int:
    """Everything on the GPU when a GPU backend is built in, else none."""
    return 999 if gpu_offload_available() else 0


def resolve_model_path(opts: ModelOptions, progress: Callable[[int, int, str], None] | None = None) -> str:
    if opts.model:
        return opts.model
    return str(ensure_default_model(progress))


def cost_cache_dir() -> str:
    """Where the engine keeps the verify-cost curves the adaptive controller measures."""
    from . import paths
    return str(paths.cache_dir() / "costcurves")


def engine_config(opts: ModelOptions, progress: Callable[[int, int, str], None] | None = None) -> EngineConfig:
    """The engine's configuration for ``opts``; also settles, once per process, whether models
    load with the CPU's extra buffer types (probed once per llama.cpp build and CPU)."""
    from .cpu_check import apply
    # the probe uses the default model (small, always at hand); with --model its preparation is quiet
    apply(getattr(opts, "extra_bufts", "auto") or "auto", progress=None if opts.model else progress)
    ngl = opts.n_gpu_layers
    if ngl is None or ngl == -1:
        ngl = default_gpu_layers()
    return EngineConfig(n_ctx=opts.ctx_size if opts.ctx_size is not None else 4096,
                        n_threads=opts.threads, n_gpu_layers=ngl, cost_cache_dir=cost_cache_dir())


def open_engine(opts: ModelOptions, spec: SpecParams | None = None,
                progress: Callable[[int, int, str], None] | None = None, build_chain: bool = True) -> Engine:
    """The engine for ``opts`` with ``spec``'s chain (``build_chain=False``: the model only,
    loaded as ``spec`` needs it, e.g. with MTP layers; the caller builds the chain)."""
    path = resolve_model_path(opts, progress)
    cfg = engine_config(opts, progress)
    if build_chain:
        return Engine(path, cfg, spec)
    # the chain comes later, but the model and its context are made as ``spec`` needs them
    from speculators.engine import load_plan
    plan = load_plan(path, spec)
    cfg.load_mtp, cfg.n_rs_seq = plan.load_mtp, plan.n_rs_seq
    return Engine(path, cfg, SpecParams())


def load_chat_engine(model_options: ModelOptions, spec: SpecParams,
                     progress: Callable[[int, int, str], None] | None = None) -> Engine:
    """The chat's engine, in this process: the model loaded as ``spec`` needs it, with an
    empty chain (the session builds the chain after the model, so a bad chain never blocks it)."""
    return open_engine(model_options, spec, progress, build_chain=False)


#: the types that draft from the configured draft model (``-md``)
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")


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
    if any(choices[t].used for t in DRAFT_MODEL_TYPES if t in choices):
        return None
    why = choices["draft-simple"].reason if "draft-simple" in choices else "no drafter can use it"
    return f"the draft model {path} is not used: {why}; Automatic goes on without it"


def stderr_progress(done: int, total: int, phase: str) -> None:
    """A one-line progress bar on stderr (for the first run's model assembly)."""
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
