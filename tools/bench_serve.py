#!/usr/bin/env python3
"""``draftlight serve`` against native ``llama-server``, side by side over HTTP (issue 52).

    python tools/bench_serve.py [--model F] [--types none,ngram-simple,ngram-mod,auto]
                                [--prompt-file F ...] [-n 128] [--rounds 3] [-t 2]

Both servers answer the same ``POST /completion`` (llama.cpp's endpoint: raw prompt, greedy,
``n_predict``) and report the same ``timings`` object; this reads ``predicted_per_second``,
``draft_n`` and ``draft_n_accepted`` from each. Per speculative type and prompt it runs
``--rounds`` rounds, each a fresh llama-server and a fresh draftlight serve back to back (their
order alternating; fresh, because both keep n-gram state between requests), and prints the
median tok/s of each side, the median of the per-round ratios (ours/native: it follows a
busy machine's drifts less than a ratio of two medians), both sides' drafted/accepted counts
and whether the texts are equal. The native binaries are the ones ``tools/native.py build``
made; ``auto`` has no native counterpart (its row compares with native ``none``).

What it measures is the whole serving path a client sees (HTTP, the runner process, the
engine); ``tools/native_bench.py`` compares the engine alone. Run it on an otherwise idle
machine: on a shared one, the per-round ratios scatter (the figures say the load average).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_PROMPTS = {
    "copy": "Here is a list. Copy it exactly, line by line.\n\n" + "\n".join(
        f"{i}. The {w} keeper climbed {i * 7} steps at dusk." for i, w in
        enumerate(["lighthouse", "garden", "bridge", "station", "harbour", "museum"], 1)) + "\n\nCopy:\n1.",
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"draftlight_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post_completion(port: int, prompt: str, n: int) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=1200))


def _wait_healthy(port: int, proc: subprocess.Popen, what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200 and b"ok" in r.read():
                    return
        except Exception:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start (exit {proc.poll()})")
        time.sleep(0.3)


def serve_run(model: str, spec_type: str, prompt: str, n: int, threads: int, data_dir: str) -> tuple:
    """One request to a fresh ``draftlight serve`` (its own data folder: no lookup store carried
    over): (tok/s, drafted, accepted, text)."""
    from app.child import module_argv
    port = _free_port()
    cmd = [*module_argv("app"), "serve", "--no-config", "--no-lookup-store", "-m", model, "-t", str(threads),
           "-c", "4096", "--port", str(port), "--spec-type", spec_type]
    env = dict(os.environ, XDG_DATA_HOME=data_dir, XDG_CONFIG_HOME=data_dir, XDG_CACHE_HOME=data_dir)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=data_dir)
    try:
        _wait_healthy(port, proc, "draftlight serve")
        r = _post_completion(port, prompt, n)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    t = r["timings"]
    return t["predicted_per_second"], t.get("draft_n", 0), t.get("draft_n_accepted", 0), r["content"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF file (default: the embedded default model)")
    ap.add_argument("--types", default="none,ngram-simple,ngram-mod,auto")
    ap.add_argument("--prompt-file", action="append", default=[], help="a raw prompt (repeatable; default: "
                    "a copy prompt and a prose prompt of this script's own)")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    tool = _load("native")
    if not tool.built():
        raise SystemExit(f"native llama.cpp not built ({tool.bin_dir()}): python tools/native.py build")
    native_run = _load("native_bench").native_run
    if a.model:
        model = a.model
    else:
        from app.models import default_model_path
        model = str(default_model_path())
    prompts = {Path(f).stem: Path(f).read_text() for f in a.prompt_file} or DEFAULT_PROMPTS
    print(f"bench_serve: {Path(model).name}, -n {a.n}, {a.rounds} rounds, {a.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="draftlight-bench-serve-") as data_dir:
        for t in a.types.split(","):
            native_type = "none" if t == "auto" else t
            for name, prompt in prompts.items():
                nat, ours = [], []
                for i in range(a.rounds):
                    runs = [lambda: nat.append(native_run(tool.bin_dir(), model, native_type, prompt, a.n,
                                                          a.threads, None)),
                            lambda: ours.append(serve_run(model, t, prompt, a.n, a.threads, data_dir))]
                    for run in (runs if i % 2 == 0 else runs[::-1]):
                        run()
                paired = statistics.median(o[0] / n[0] for n, o in zip(nat, ours))
                mn, mo = statistics.median(x[0] for x in nat), statistics.median(x[0] for x in ours)
                same = "same text" if nat[0][3] == ours[0][3] else "TEXT DIFFERS"
                vs = "" if native_type == t else f" (native: {native_type})"
                print(f"{t:13s} {name:10s} native {mn:7.1f} tok/s  serve {mo:7.1f} tok/s  "
                      f"paired ratio {paired:4.2f}  d/a native {nat[0][1]}/{nat[0][2]} serve {ours[0][1]}/{ours[0][2]}  "
                      f"{same}{vs}  load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
