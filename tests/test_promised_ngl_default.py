"""``-ngl`` defaults to every layer where GPU offload is available, and to none where it is not
(README, *Backends*: "whether GPU offload is on (then ``-ngl`` defaults to every layer)").

What the engine is given is decided by :func:`app.runtime.engine_config` (the chat's runner,
``generate`` and ``bench`` all load through it), from the flags as the command's parser reads
them; whether offload is available is mocked here (a device to offload to, or none)."""

from __future__ import annotations

import pytest

from app import cpu_check, runtime
from app.cli import build_parser
from app.options import ModelOptions, model_options_from_args
from speculators import devices

EVERY_LAYER = 999


def _options(*flags: str) -> ModelOptions:
    args = build_parser().parse_args(["generate", "-p", "x", *flags])
    return model_options_from_args(args, ModelOptions())


@pytest.fixture
def offload(monkeypatch):
    """Call with True (a GPU to offload to) or False (the CPU only)."""
    # the CPU kernel decision is not what is tested here (and must not change this process's loads)
    monkeypatch.setattr(cpu_check, "apply", lambda *a, **k: None)

    def set_(available: bool) -> None:
        gpu = devices.Device("CUDA0", "a test GPU", "GPU", 20 << 30, 24 << 30)
        monkeypatch.setattr(devices, "offload_devices", lambda: [gpu] if available else [])
    return set_


@pytest.mark.parametrize("available, default", [(True, EVERY_LAYER), (False, 0)], ids=["offload", "cpu-only"])
def test_ngl_defaults_to_every_layer_where_offload_is_available(offload, available, default):
    offload(available)
    assert runtime.gpu_offload_available() is available
    # no -ngl, and -ngl auto: the default
    for flags in ((), ("-ngl", "auto"), ("--n-gpu-layers", "auto")):
        opts = _options(*flags)
        assert runtime.engine_config(opts).n_gpu_layers == default, flags
    # a config.toml without n_gpu_layers is the same as no flag
    assert runtime.engine_config(ModelOptions()).n_gpu_layers == default
    # what is given is kept, whatever offload there is
    for flags, n in ((("-ngl", "all"), EVERY_LAYER), (("-ngl", "0"), 0), (("-ngl", "12"), 12),
                     (("--gpu-layers", "7"), 7)):
        assert runtime.engine_config(_options(*flags)).n_gpu_layers == n, flags
