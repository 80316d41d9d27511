"""The CPU extra-buffer-type probe: broken kernels are found in a throwaway process, not crashed into."""

from __future__ import annotations

import json

import pytest

from app import cpu_check
from app.options import ModelOptions


@pytest.fixture(autouse=True)
def probe_for_real(monkeypatch):
    """These tests look at the probe itself, not at the suite's shared answer."""
    monkeypatch.delenv(cpu_check.ENV, raising=False)


def test_forced_modes_need_no_probe(monkeypatch):
    monkeypatch.setattr(cpu_check, "probe", lambda *a, **k: pytest.fail("probed"))
    assert cpu_check.decide("on").use is True
    assert cpu_check.decide("off").use is False
    monkeypatch.setenv(cpu_check.ENV, "off")
    assert (cpu_check.decide("auto").use, cpu_check.decide("auto").source) == (False, f"set by {cpu_check.ENV}")
    assert cpu_check.decide("on").use is True        # the flag wins over the environment
    with pytest.raises(ValueError):
        cpu_check.decide("maybe")


@pytest.mark.slow
def test_a_probe_that_crashes_chooses_the_fallback_keeps_it_and_the_engine_uses_it(
        monkeypatch, default_model_path):
    from speculators import llama as native
    prev = native.extra_bufts()
    monkeypatch.setenv(cpu_check.SIMULATE_ENV, "segv")
    d = cpu_check.decide("auto", str(default_model_path))
    assert d.use is False and d.source == "probed now" and "SIGSEGV" in d.detail
    assert d.probe.returncode == -11 and d.probe.log_tail
    kept = json.loads(cpu_check.cache_file().read_text())
    assert kept[cpu_check.key()]["ok"] is False
    # the answer is kept: no second probe (even with the simulation gone)
    monkeypatch.delenv(cpu_check.SIMULATE_ENV)
    monkeypatch.setattr(cpu_check, "probe", lambda *a, **k: pytest.fail("probed again"))
    d2 = cpu_check.decide("auto", str(default_model_path))
    assert (d2.use, d2.source) == (False, "cached")
    # and a model loaded through the app's runtime is loaded without them, and decodes
    from app.runtime import open_engine
    try:
        eng = open_engine(ModelOptions(model=str(default_model_path), ctx_size=256, threads=2))
        assert eng.model.use_extra_bufts is False
        res = eng.run(eng.prompt_tokens(text="Hello"), max_tokens=4)
        assert res.tokens
        eng.close()
        # the flag wins over what was probed
        eng = open_engine(ModelOptions(model=str(default_model_path), ctx_size=256, threads=2, extra_bufts="on"))
        assert eng.model.use_extra_bufts is True
        eng.close()
    finally:
        native.set_extra_bufts(prev)


@pytest.mark.slow
def test_a_real_probe_on_this_machine_passes_and_is_cached(default_model_path):
    d = cpu_check.decide("auto", str(default_model_path))
    assert d.source == "probed now" and d.probe is not None
    # on this build and CPU the kernels either work or the probe died by a signal: never a Python error
    assert d.use or (d.probe.returncode or 0) < 0, d.probe
    assert cpu_check.cached()["ok"] is d.use


@pytest.mark.slow
def test_a_damaged_answer_file_is_probed_again(default_model_path):
    f = cpu_check.cache_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(b"\xff not json")
    d = cpu_check.decide("auto", str(default_model_path))
    assert d.source == "probed now"
    assert isinstance(json.loads(f.read_text()), dict)


def _has_amx() -> bool:
    import llama_cpp as lc
    return "AMX_INT8 = 1" in lc.llama_print_system_info().decode()


@pytest.mark.slow
@pytest.mark.skipif(not _has_amx(), reason="this llama.cpp build has no AMX kernels (the CPU reports no AMX)")
def test_on_an_amx_build_the_probe_decides_and_the_chat_engine_decodes(default_model_path):
    from app.runtime import open_engine
    from speculators import llama as native
    prev = native.extra_bufts()
    d = cpu_check.decide("auto", str(default_model_path))
    try:
        eng = open_engine(ModelOptions(model=str(default_model_path), ctx_size=256, threads=2))
        assert eng.model.use_extra_bufts is d.use
        assert eng.run(eng.prompt_tokens(text="Hello"), max_tokens=4).tokens
        eng.close()
    finally:
        native.set_extra_bufts(prev)


def test_the_flag_and_the_config_key(tmp_path):
    from app import config as config_mod
    from app.cli import build_parser
    from app.options import model_options_from_args
    p = build_parser()
    assert model_options_from_args(p.parse_args(["generate", "--no-repack"])).extra_bufts == "off"
    assert model_options_from_args(p.parse_args(["generate", "--extra-bufts", "on"])).extra_bufts == "on"
    assert model_options_from_args(p.parse_args(["generate"])).extra_bufts == "auto"
    c = config_mod.Config.from_toml_dict({"model": {"extra_bufts": "off"}})
    assert c.model.extra_bufts == "off" and c.to_toml_dict()["model"]["extra_bufts"] == "off"
    with pytest.raises(config_mod.ConfigError, match="extra_bufts"):
        config_mod.Config.from_toml_dict({"model": {"extra_bufts": "sometimes"}})
