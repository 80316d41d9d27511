#!/usr/bin/env python3
"""Tokens/s with the target split over two local RPC servers (loopback) against all-local.

Side by side in one run, interleaved in rounds (every configuration once per round), each
run a fresh ``draftlight generate`` process (RPC devices stay in a process once added):

- ``none``, ``auto`` and ``ngram-mod``: all-local, and the target's layers split over two
  ``draftlight rpc-server`` processes on 127.0.0.1 (``--rpc A,B -ngl 99``);
- ``draft-simple``: the drafter local with the target on one server, against both local.

Prints the median tokens/s of each configuration and the ratio of the RPC one to its
all-local twin (the generation's own tokens/s: the prompt and the load are left out).
The figures measure the protocol's cost on this machine; over a real network each step
also waits for the wire.

    python tools/bench_rpc.py [--model M.gguf] [--draft-model D.gguf] [--rounds 3] [-n 128]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
          "Rewrite the function above with the same names, adding a docstring:\n\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int) -> tuple[subprocess.Popen, str]:
    from speculators import devices as dv
    port = free_port()
    ep = f"127.0.0.1:{port}"
    p = subprocess.Popen([sys.executable, "-m", "app", "rpc-server", "-p", str(port), "-t", str(threads), "-c"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            dv.probe_rpc_server(ep, timeout=2)
            return p, ep
        except dv.RpcError:
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"rpc-server on {ep} did not start")
            time.sleep(0.2)


def run(model: str, spec: str, extra: list[str], n: int, threads: int) -> dict:
    cmd = [sys.executable, "-m", "app", "generate", "--no-config", "-m", model, "-p", PROMPT, "-n", str(n),
           "--temp", "0", "-t", str(threads), "--spec-type", spec, "--json", "--no-lookup-store", *extra]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target GGUF (default: the embedded default model)")
    ap.add_argument("--draft-model", help="draft model for draft-simple (default: the target itself)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads of the client (default: physical cores)")
    ap.add_argument("--server-threads", type=int, default=1)
    args = ap.parse_args(argv)

    from speculators.llama import backend_init, physical_cores
    from speculators import devices as dv
    backend_init()
    if not dv.has_rpc():
        raise SystemExit("this llama-cpp-python has no RPC backend; install as the README says: " + dv.RPC_INSTALL)
    if args.model:
        model = args.model
    else:
        from app.models import ensure_default_model
        model = str(ensure_default_model())
    draft = args.draft_model or model
    threads = args.threads or physical_cores()
    servers = [start_server(args.server_threads), start_server(args.server_threads)]
    eps = [ep for _, ep in servers]
    dm = ["-md", draft, "-ngld", "0", "--spec-draft-device", "none"]
    configs = {
        ("none", "local"): ("none", []),
        ("none", "rpc x2"): ("none", ["--rpc", ",".join(eps), "-ngl", "99"]),
        ("auto", "local"): ("auto", []),
        ("auto", "rpc x2"): ("auto", ["--rpc", ",".join(eps), "-ngl", "99"]),
        ("ngram-mod", "local"): ("ngram-mod", []),
        ("ngram-mod", "rpc x2"): ("ngram-mod", ["--rpc", ",".join(eps), "-ngl", "99"]),
        ("draft-simple", "both local"): ("draft-simple", dm),
        ("draft-simple", "target remote"): ("draft-simple", ["--rpc", eps[0], "-ngl", "99", *dm]),
    }
    speeds: dict[tuple, list[float]] = {k: [] for k in configs}
    texts: dict[tuple, str] = {}
    try:
        for r in range(args.rounds):
            for key, (spec, extra) in configs.items():
                out = run(model, spec, extra, args.n, threads)
                speeds[key].append(out["stats"]["tokens_per_s"])
                texts[key] = out["text"]
                print(f"round {r + 1}: {key[0]:<13} {key[1]:<14} {out['stats']['tokens_per_s']:7.1f} tok/s",
                      file=sys.stderr, flush=True)
    finally:
        for p, _ in servers:
            p.kill()
    print(f"\n{'type':<13} {'placement':<14} {'tok/s (median)':>15} {'ratio':>7}  same text")
    for spec in ("none", "auto", "ngram-mod", "draft-simple"):
        keys = [k for k in configs if k[0] == spec]
        base = statistics.median(speeds[keys[0]])
        for k in keys:
            med = statistics.median(speeds[k])
            same = "" if k == keys[0] else ("yes" if texts[k] == texts[keys[0]] else "NO")
            print(f"{k[0]:<13} {k[1]:<14} {med:15.1f} {med / base:7.2f}  {same}")
    print(f"\n{args.rounds} rounds, -n {args.n}, client threads {threads}, server threads {args.server_threads}, "
          f"model {Path(model).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
