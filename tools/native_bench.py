#!/usr/bin/env python3
"""Tokens/s side by side: the engine against native llama-server, as a ratio.

    python tools/native_bench.py MODEL SPEC_TYPE[,..] [--draft-model F] [--prompt-file F]
                                 [-n 64] [--reps 3] [-t 2]

For each type, runs are interleaved (native, ours, native, ours, ...), a fresh
llama-server for every native run (its caches never carry over), greedy; prints
best-of-reps generation tokens/s of each side, ours/native, the drafted/accepted
counts of both and whether the texts are equal. The native binaries are the ones
``tools/native.py build`` made. Run it on an otherwise idle machine: on a shared one
the ratio says little.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _tool():
    spec = importlib.util.spec_from_file_location("draftlight_native_tool", ROOT / "tools" / "native.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def native_run(bin_dir: Path, model: str, spec_type: str, prompt: str, n: int, threads: int,
               draft_model: str | None) -> tuple[float, int, int, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(bin_dir / "llama-server"), "-m", model, "-t", str(threads), "-tb", str(threads), "-c", "4096",
           "--port", str(port), "--host", "127.0.0.1", "-np", "1", "--no-webui"]
    if spec_type != "none":
        cmd += ["--spec-type", spec_type]
    if draft_model:
        cmd += ["-md", draft_model]
    from speculators.llama import extra_bufts
    if not extra_bufts():
        cmd += ["--no-repack"]   # as draftlight loads its models on this CPU (see app.cpu_check)
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if b"ok" in urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read():
                    break
            except Exception:
                if srv.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"llama-server did not start ({' '.join(cmd)})")
                time.sleep(0.3)
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
        r = json.load(urllib.request.urlopen(req, timeout=1200))
    finally:
        srv.terminate()
        srv.wait()
    t = r["timings"]
    return t["predicted_per_second"], t.get("draft_n", 0), t.get("draft_n_accepted", 0), r["content"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("types", help="comma-separated speculative types (none for plain decoding)")
    ap.add_argument("--draft-model")
    ap.add_argument("--prompt-file")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    tool = _tool()
    if not tool.built():
        raise SystemExit(f"native llama.cpp not built ({tool.bin_dir()}): python tools/native.py build")
    from app.cpu_check import apply
    from speculators.engine import Engine, EngineConfig
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    # both sides load without the CPU's extra buffer types where they crash here: llama-server's
    # --no-repack has no repacked-weights-only choice (the app's on an AMX CPU whose AMX kernels
    # crash), so the engine then loads without any too, the same kernels as the server's
    from speculators.llama import llama_server_mode, set_extra_bufts
    d = apply("auto")
    if llama_server_mode(d.mode) != d.mode:
        set_extra_bufts(llama_server_mode(d.mode))
        print("native_bench: both sides without the CPU's extra buffer types (llama-server cannot keep "
              "the repacked weights alone)", file=sys.stderr)
    prompt = Path(a.prompt_file).read_text() if a.prompt_file else (
        "The lighthouse keeper climbed the hundred and twelve steps every evening at dusk. "
        "Repeat the sentence above exactly.\n\n")
    prompt_toks = None
    for t in a.types.split(","):
        spec = SpecParams.from_types(t) if t != "none" else SpecParams()
        if a.draft_model:
            spec.draft.model = a.draft_model
        # one engine per type, made with its spec as llama-server is started with its types
        # (a hybrid target then keeps recurrent-state snapshots for the hidden-state drafters)
        eng = Engine(a.model, EngineConfig(n_ctx=4096, n_threads=a.threads, reuse_prefix=False), spec)
        try:
            toks = prompt_toks = prompt_toks or eng.prompt_tokens(text=prompt, raw=True)
            nat, ours = [], []
            for _ in range(a.reps):
                nat.append(native_run(tool.bin_dir(), a.model, t, prompt, a.n, a.threads, a.draft_model))
                r = eng.run(toks, max_tokens=a.n, sampling=SamplingParams(temperature=0.0))
                ours.append((r.stats.n_generated / max(r.stats.t_gen_s, 1e-9), r.stats.n_drafted,
                             r.stats.n_accepted, r.text))
        finally:
            eng.close()
        bn, bo = max(nat, key=lambda x: x[0]), max(ours, key=lambda x: x[0])
        same = "same text" if nat[0][3] == ours[0][3] else "TEXT DIFFERS"
        # each rep's two runs ran back to back: the median of their ratios follows a busy
        # machine's drifts less than the ratio of the two fastest runs
        paired = statistics.median(o[0] / n[0] for n, o in zip(nat, ours))
        print(f"{t:14s} native {bn[0]:7.2f} tok/s  ours {bo[0]:7.2f} tok/s  ratio {bo[0] / bn[0]:5.2f} "
              f"(paired median {paired:4.2f})  d/a native {bn[1]}/{bn[2]} ours {bo[1]}/{bo[2]}  {same}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
