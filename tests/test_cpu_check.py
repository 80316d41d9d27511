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
    assert (cpu_check.decide("repack").mode, cpu_check.decide("repack").use) == ("repack", False)
    monkeypatch.setenv(cpu_check.ENV, "off")
    assert (cpu_check.decide("auto").use, cpu_check.decide("auto").source) == (False, f"set by {cpu_check.ENV}")
    assert cpu_check.decide("on").use is True        # the flag wins over the environment
    with pytest.raises(ValueError):
        cpu_check.decide("maybe")


_LOAD_ON = """
import sys
from app.options import ModelOptions
from app.runtime import open_engine
eng = open_engine(ModelOptions(model=sys.argv[1], ctx_size=256, threads=2, extra_bufts="on"))
print("use_extra_bufts", eng.model.use_extra_bufts, flush=True)
"""


@pytest.mark.slow
def test_a_probe_that_crashes_chooses_the_fallback_keeps_it_and_the_engine_uses_it(
        monkeypatch, default_model_path, cpu_extra_bufts):
    from speculators import llama as native
    prev = native.extra_bufts_mode()
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
    finally:
        native.set_extra_bufts(prev)
    # the flag wins over what was probed (the answer kept in this test's cache folder): the model is
    # loaded with all of the CPU's extra buffer types. In a child: where they really crash on this
    # CPU (the suite's own probe, unsimulated, died), the load dies as that probe did.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _LOAD_ON, str(default_model_path)], capture_output=True,
                       text=True, timeout=300)
    if cpu_extra_bufts.ok:
        assert r.returncode == 0 and "use_extra_bufts True" in r.stdout, r.stderr[-2000:]
    else:
        assert r.returncode == cpu_extra_bufts.returncode, (r.returncode, r.stderr[-2000:])


@pytest.mark.slow
def test_where_only_the_other_extra_types_crash_the_repacked_weights_are_kept(monkeypatch, default_model_path):
    """A CPU whose AMX kernels crash (simulated: the probe with every extra type dies, the one with the
    repacked weights alone does not) keeps the repacked weights: the answer is kept, and the engine
    loads with them and nothing else."""
    from speculators import llama as native
    from speculators import repack
    real = repack.cpu_extra_bufts()
    if repack.REPACK_NAME not in real:
        pytest.skip("this llama.cpp build has no repacked-weight kernels for this CPU")
    # as on a Xeon that reports AMX: another extra type before the repacked one
    monkeypatch.setattr(repack, "cpu_extra_bufts", lambda: {"AMX": 1, **real})
    monkeypatch.setenv(cpu_check.SIMULATE_ENV, "segv:on")
    prev = native.extra_bufts_mode()
    d = cpu_check.decide("auto", str(default_model_path))
    assert (d.mode, d.use, d.source) == ("repack", False, "probed now"), d
    assert d.probe.returncode == -11 and d.probe_repack.ok and "AMX" in d.detail
    kept = json.loads(cpu_check.cache_file().read_text())[cpu_check.key()]
    assert (kept["ok"], kept["mode"]) == (False, "repack")
    monkeypatch.delenv(cpu_check.SIMULATE_ENV)
    monkeypatch.setattr(cpu_check, "probe", lambda *a, **k: pytest.fail("probed again"))
    assert (cpu_check.decide("auto").mode, cpu_check.decide("auto").source) == ("repack", "cached")
    from app.runtime import open_engine
    try:
        eng = open_engine(ModelOptions(model=str(default_model_path), ctx_size=256, threads=2))
        assert eng.model.extra_bufts_mode == "repack" and eng.model.use_extra_bufts is False
        assert eng.model.n_repack_overrides > 0
        assert eng.run(eng.prompt_tokens(text="Hello"), max_tokens=4).tokens
        eng.close()
    finally:
        native.set_extra_bufts(prev)


_LOAD = """
import sys
import numpy as np
from speculators.llama import Context, Model
m = Model(sys.argv[1], use_extra_bufts=sys.argv[2])
ctx = Context(m, n_ctx=256, n_batch=64, n_threads=2)
toks = m.tokenize("The quick brown fox jumps over the lazy dog. Once upon a time", add_special=True,
                  parse_special=False)
ctx.decode(toks, 0, logits="last")
out = []
for i in range(12):
    t = int(np.argmax(ctx.logits(-1)))
    out.append(t)
    ctx.decode([t], len(toks) + i, logits="last")
print("tokens", out, m.n_repack_overrides)
"""


def _load_in_child(model, mode):
    """Load ``model`` in a child with llama.cpp's log on: (greedy tokens, repacked tensor names, log)."""
    import os
    import re
    import subprocess
    import sys
    env = {**os.environ, "DRAFTLIGHT_LLAMA_LOG": "1"}
    env.pop("DRAFTLIGHT_LOG_FD", None)
    p = subprocess.run([sys.executable, "-c", _LOAD, str(model), mode], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    tokens = re.search(r"^tokens (\[.*\]) (\d+)$", p.stdout, re.M)
    repacked = sorted(re.findall(r"repack: repack tensor (\S+) with", p.stderr))
    return tokens.group(1), repacked, p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default", "q2k"])
def test_the_repacked_weights_alone_are_placed_as_llama_cpp_places_them(which, default_model_path, request):
    """On a CPU with no extra type but the repacked one, llama.cpp's own choice (all extra types on)
    and ours (the repacked one alone, by name) repack the very same weights and give the same text;
    with none, nothing is repacked."""
    from speculators import repack
    if set(repack.cpu_extra_bufts()) != {repack.REPACK_NAME}:
        pytest.skip("this CPU has other extra buffer types than the repacked one: 'on' is not 'repack' here")
    model = default_model_path if which == "default" else request.getfixturevalue("q2k_model_path")
    on_tokens, on_repacked, _ = _load_in_child(model, "on")
    rp_tokens, rp_repacked, log = _load_in_child(model, "repack")
    off_tokens, off_repacked, _ = _load_in_child(model, "off")
    if not on_repacked:
        pytest.skip(f"llama.cpp repacks none of {model.name}'s weights on this CPU")
    assert rp_repacked == on_repacked and "CPU_REPACK model buffer size" in log
    assert rp_tokens == on_tokens
    assert off_repacked == [] and off_tokens   # the plain kernels decode too (their text may part at a near-tie)


def test_offloaded_layers_are_never_sent_to_the_cpu(default_model_path):
    """An override wins over llama.cpp's layer placement: with every layer offloaded nothing is
    named; with some, only the blocks that stay on the CPU."""
    from speculators import repack
    if repack.REPACK_NAME not in repack.cpu_extra_bufts():
        pytest.skip("this llama.cpp build has no repacked-weight kernels for this CPU")
    arr, n_all = repack.overrides(str(default_model_path))
    assert arr is not None and n_all > 0
    assert repack.overrides(str(default_model_path), n_gpu_layers=999, offload=True) == (None, 0)
    arr, n_some = repack.overrides(str(default_model_path), n_gpu_layers=10, offload=True)
    assert 0 < n_some < n_all
    pats = [arr[i].pattern.decode() for i in range(len(arr) - 1)]
    assert not any(f"|{k}|" in p or f"({k}|" in p or f"|{k})" in p or f"({k})" in p
                   for p in pats for k in range(9, 18)), pats


@pytest.mark.slow
def test_a_real_probe_on_this_machine_passes_and_is_cached(default_model_path):
    from speculators import llama as native
    prev, phases = native.extra_bufts_mode(), []
    try:
        d = cpu_check.apply("auto", str(default_model_path), lambda done, total, phase: phases.append(phase))
    finally:
        native.set_extra_bufts(prev)
    # the panel says what happens: the probe, then the model's own load (not "checking…" while it loads)
    assert phases == ["probe", "load"], phases
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
    prev = native.extra_bufts_mode()
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
    assert model_options_from_args(p.parse_args(["generate", "--extra-bufts", "repack"])).extra_bufts == "repack"
    assert model_options_from_args(p.parse_args(["generate"])).extra_bufts == "auto"
    c = config_mod.Config.from_toml_dict({"model": {"extra_bufts": "off"}})
    assert c.model.extra_bufts == "off" and c.to_toml_dict()["model"]["extra_bufts"] == "off"
    with pytest.raises(config_mod.ConfigError, match="extra_bufts"):
        config_mod.Config.from_toml_dict({"model": {"extra_bufts": "sometimes"}})


def test_benchs_llama_cpp_python_row_loads_its_model_as_the_engine_does(default_model_path):
    """llama-cpp-python's ``Llama`` has no argument for the CPU's extra buffer types and would load
    with all of them: on a CPU whose AMX kernels crash (a Xeon VM that reports AMX), ``bench`` died
    by SIGILL in its reference row while the engine itself ran. While it loads, its model
    parameters take the engine's placement; afterwards llama.cpp's default is back."""
    from types import SimpleNamespace

    import llama_cpp.llama_cpp as raw

    from app.cmd_bench import _placed_like
    from speculators import repack
    has_repack = repack.REPACK_NAME in repack.cpu_extra_bufts()
    for mode in ("off", "repack", "on"):
        model = SimpleNamespace(path=str(default_model_path), extra_bufts_mode=mode, n_gpu_layers=0, devices=None)
        with _placed_like(model):
            p = raw.llama_model_default_params()
        assert p.use_extra_bufts is (mode == "on"), mode
        assert bool(p.tensor_buft_overrides) is (mode == "repack" and has_repack), mode
    assert raw.llama_model_default_params().use_extra_bufts is True


@pytest.mark.slow
def test_bench_with_its_llama_cpp_python_row_runs_where_the_extra_kernels_crash(default_model_path):
    """``draftlight bench`` with its reference row, in the suite's placement (on a CPU whose extra
    kernels crash: without them), runs to its end and reports the row."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "app", "bench", "-m", str(default_model_path), "-p", "Why do cats purr?",
                        "-n", "8", "-t", "2", "--spec-type", "ngram-mod", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["name"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["llama-cpp-python"]["tokens"] > 0 and rows["none"]["tokens"] > 0
