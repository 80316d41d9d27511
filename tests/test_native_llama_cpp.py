"""Held against native llama.cpp: the binaries ``tools/native.py`` builds from the pinned
llama-cpp-python sdist (kept outside the checkout; ``.ci/run`` builds them).

* ``draftlight lookup create`` writes the same bytes as ``llama-lookup-create``.
* ``llama-server`` (a fresh server per prompt, greedy) and the engine give the same text
  and the same drafted and accepted counts for every n-gram speculator type, on the F16
  copy of the default model.

Skipped where the binaries are not built; ``DRAFTLIGHT_NATIVE_DIR`` says where to look
(default ``~/.cache/draftlight-native/<version>``).
"""

from __future__ import annotations

import contextlib
import functools

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _native_tool():
    path = ROOT / "tools" / "native.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("draftlight_native_tool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# resolved at import, before the tests' private XDG dirs are set
_TOOL = _native_tool()
BIN = _TOOL.bin_dir() if _TOOL is not None else None
HAVE = _TOOL is not None and _TOOL.built()

pytestmark = pytest.mark.skipif(
    not HAVE, reason=f"native llama.cpp not built ({BIN}); run python tools/native.py build")


def _corpus(path: Path) -> Path:
    """About 28 KB of English (the README and the test prompts), ending in a newline."""
    from tests.prompts import BACKGROUND, CODE, TEXT
    parts = []
    readme = ROOT / "README.md"
    if readme.is_file():
        parts.append(readme.read_text(encoding="utf-8"))
    parts += [TEXT, BACKGROUND, CODE] * 3
    text = "\n\n".join(parts)
    while len(text.encode()) < 28_000:
        text += "\n" + TEXT
    path.write_bytes(text.encode("utf-8").rstrip(b"\n") + b"\n")
    return path


@pytest.mark.slow
def test_lookup_create_is_byte_identical_to_llama_lookup_create(default_model_path, tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    crlf = tmp_path / "crlf.txt"  # -f keeps \r; only one trailing \n goes
    crlf.write_bytes(b"one two three\r\none two three\r\nfour five\r\n\n")
    esc = tmp_path / "escapes.txt"  # -f processes escapes: a written \n is a newline to it
    esc.write_bytes(b"say \\n and \\\"it\\\" \\x41\\x4 \\q one two\\tthree one two\\tthree\n")
    for src in (corpus, crlf, esc):
        want, got = tmp_path / f"{src.stem}.native.bin", tmp_path / f"{src.stem}.ours.bin"
        r = subprocess.run([str(BIN / "llama-lookup-create"), "-m", str(default_model_path), "-f", str(src),
                            "-lcs", str(want), "-c", "256", "-t", "2",
                            # only its tokenizer is used; the CPU repack of Q4_K crashes on some
                            # CPUs in this llama.cpp (its warm-up decode), so skip the repack
                            "--no-repack"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        r = subprocess.run([sys.executable, "-m", "app", "lookup", "create", "--model", str(default_model_path),
                            "--output", str(got), str(src)], capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        a, b = want.read_bytes(), got.read_bytes()
        assert len(a) > 0
        if a != b:  # say which entry differs
            from speculators.ngram_cache import NgramCache
            ca, cb = NgramCache.from_bytes(a).to_dict(), NgramCache.from_bytes(b).to_dict()
            diff = {k: (ca.get(k), cb.get(k)) for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)}
            pytest.fail(f"{src.name}: {len(diff)} n-grams differ, e.g. {list(diff.items())[:3]}")


# -- llama-server vs the engine ------------------------------------------------------------

NGRAM_TYPES = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
N_PREDICT = 32


def _prompt() -> str:
    from tests.prompts import TEXT
    # a text the model is asked to repeat: every n-gram type finds something to draft
    return f"{TEXT}\n\nRepeat the text above exactly.\n\n"


@functools.lru_cache(maxsize=None)
def cpu_flags(model: Path) -> tuple[str, ...]:
    """llama-server's --no-repack where llama.cpp's CPU extra buffer types crash on this machine.

    The native tools are built from the same source with the same flags as the wheel, so the
    wheel's probe (app.cpu_check, run once here) answers for them too.
    """
    from app import cpu_check
    return () if cpu_check.decide("auto", str(model)).use else ("--no-repack",)


@contextlib.contextmanager
def loaded_as_llama_server():
    """Models loaded meanwhile use the CPU's extra buffer types as llama-server does here
    (:func:`cpu_flags`: all of them, or none with --no-repack): where the app keeps the repacked
    weights alone (an AMX CPU whose AMX kernels crash), llama-server has no such choice, and the
    quantized weights of a comparison must run the same kernels on both sides."""
    from speculators.llama import extra_bufts_mode, llama_server_mode, set_extra_bufts
    prev = extra_bufts_mode()
    set_extra_bufts(llama_server_mode(prev))
    try:
        yield
    finally:
        set_extra_bufts(prev)


@pytest.fixture(autouse=True, scope="module")
def as_llama_server():
    """The module's own models load as llama-server loads them (:func:`loaded_as_llama_server`);
    modules that hold the engine against llama-server import this fixture."""
    with loaded_as_llama_server():
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(srv, port: int, log_tail, timeout: float = 120.0) -> None:
    """Until llama-server (``srv``, on ``port``) answers /health; ``log_tail()`` says why it exited."""
    deadline = time.monotonic() + timeout
    while True:
        if srv.poll() is not None:
            raise AssertionError(f"llama-server exited: {log_tail()}")
        try:
            if b"ok" in urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _native_completion(model: Path, spec_type: str, prompt: str, extra: list[str] = ()) -> dict:
    """One greedy /completion from a fresh llama-server (its caches never carry over)."""
    port = _free_port()
    srv = subprocess.Popen([str(BIN / "llama-server"), "-m", str(model), "-t", "2", "-tb", "2", "-c", "1024",
                            "--no-warmup", "--port", str(port), "--host", "127.0.0.1", "--spec-type", spec_type,
                            "-np", "1", "--no-webui", *cpu_flags(model), *extra], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        wait_healthy(srv, port, lambda: srv.stderr.read().decode()[-2000:])
        body = json.dumps({"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                           "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                     {"Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(req, timeout=300))
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


@pytest.mark.slow
@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
def test_engine_matches_llama_server(f16_engine, f16_model_path, spec_type):
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    prompt = _prompt()
    native = _native_completion(f16_model_path, spec_type, prompt)
    t = native["timings"]
    eng = f16_engine
    eng.set_spec(SpecParams.from_types(spec_type))
    try:
        r = eng.run(eng.prompt_tokens(text=prompt, raw=True), max_tokens=N_PREDICT,
                    sampling=SamplingParams(temperature=0.0))
    finally:
        eng.set_spec(SpecParams())
    ours = (r.text, r.stats.n_drafted, r.stats.n_accepted)
    theirs = (native["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
    assert ours[0] == theirs[0], spec_type
    assert ours[1:] == theirs[1:], (spec_type, "drafted/accepted", ours[1:], theirs[1:])
    assert theirs[1] > 0, f"{spec_type}: the prompt made llama-server draft nothing"


@pytest.fixture(scope="module")
def suppressed_model(f16_engine, f16_model_path, tmp_path_factory):
    """The F16 copy with ``tokenizer.ggml.suppress_tokens`` naming the token its greedy reply
    to the test prompt uses most; and that reply."""
    from collections import Counter

    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams
    from tests.gguf_factory import copy_with_int32_array

    eng = f16_engine
    eng.set_spec(SpecParams())
    plain = eng.run(eng.prompt_tokens(text=_prompt(), raw=True), max_tokens=N_PREDICT,
                    sampling=SamplingParams(temperature=0.0))
    tok = Counter(t for t in plain.tokens if not eng.model.is_eog(t)).most_common(1)[0][0]
    dst = copy_with_int32_array(f16_model_path, tmp_path_factory.mktemp("suppress") / "f16-suppress.gguf",
                                "tokenizer.ggml.suppress_tokens", [tok])
    return dst, tok, plain


@pytest.mark.slow
@pytest.mark.parametrize("spec_type", ["none", "ngram-simple"])
def test_the_models_suppress_tokens_are_never_sampled_as_in_llama_server(suppressed_model, spec_type):
    from speculators.engine import Engine, EngineConfig
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    path, tok, plain = suppressed_model
    native = _native_completion(path, spec_type, _prompt())
    eng = Engine(str(path), EngineConfig(n_ctx=1024, n_threads=2, reuse_prefix=False))
    try:
        assert list(eng.model.suppress_tokens) == [tok]
        eng.set_spec(SpecParams.from_types(spec_type) if spec_type != "none" else SpecParams())
        r = eng.run(eng.prompt_tokens(text=_prompt(), raw=True), max_tokens=N_PREDICT,
                    sampling=SamplingParams(temperature=0.0))
    finally:
        eng.close()
    assert tok in plain.tokens and tok not in r.tokens
    assert r.text != plain.text
    assert r.text == native["content"]
