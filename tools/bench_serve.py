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

``--conversation FILE`` (default off; ``bench/serve-code-edit.txt`` is one of this project's
own) runs instead a multi-turn conversation (turns between lines of ``---``) as a client of a
chat would: on one server per round, each turn's prompt is the transcript so far (``User:`` /
``Assistant:``, the server's own replies in it) with ``cache_prompt`` on, and per side it sums
the turns' generated tokens and times (tok/s over the conversation) and their prompt times
(``prompt_ms``: the time to the first token). ``auto`` is compared there with native ``none``
and with native's fastest type over the rounds (what a person would have picked by hand for
llama-server).

For single prompts each row also gives the median time to the first token (``prompt_ms``, the
server's own figure) of both sides and their ratio.

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


def _start_serve(model: str, spec_type: str, threads: int, data_dir: str) -> tuple[subprocess.Popen, int]:
    from app.child import module_argv
    port = _free_port()
    cmd = [*module_argv("app"), "serve", "--no-config", "--no-lookup-store", "-m", model, "-t", str(threads),
           "-c", "4096", "--port", str(port), "--spec-type", spec_type]
    env = dict(os.environ, XDG_DATA_HOME=data_dir, XDG_CONFIG_HOME=data_dir, XDG_CACHE_HOME=data_dir)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=data_dir)
    _wait_healthy(port, proc, "draftlight serve")
    return proc, port


def _start_native(bin_dir: Path, model: str, spec_type: str, threads: int) -> tuple[subprocess.Popen, int]:
    """A fresh llama-server as ``tools/native_bench.py`` starts one (one slot, this CPU's repacking)."""
    port = _free_port()
    cmd = [str(bin_dir / "llama-server"), "-m", model, "-t", str(threads), "-tb", str(threads), "-c", "4096",
           "--port", str(port), "--host", "127.0.0.1", "-np", "1", "--no-webui"]
    if spec_type != "none":
        cmd += ["--spec-type", spec_type]
    from speculators.llama import extra_bufts
    if not extra_bufts():
        cmd += ["--no-repack"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_healthy(port, proc, "llama-server")
    return proc, port


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def one_prompt(start, prompt: str, n: int) -> tuple:
    """One request to a fresh server (``start()`` -> (process, port)): (tok/s, drafted, accepted,
    text, time to the first token in ms)."""
    proc, port = start()
    try:
        r = _post_completion(port, prompt, n)
    finally:
        _stop(proc)
    t = r["timings"]
    return (t["predicted_per_second"], t.get("draft_n", 0), t.get("draft_n_accepted", 0), r["content"],
            t["prompt_ms"])


def conversation(start, turns: list[str], n: int) -> dict:
    """The turns as one client's conversation on a fresh server (each prompt the transcript so
    far, cached): tokens, seconds generating, seconds to first tokens, drafted, accepted, replies."""
    proc, port = start()
    out = {"tokens": 0, "gen_s": 0.0, "ttft_s": 0.0, "drafted": 0, "accepted": 0, "replies": []}
    transcript = ""
    try:
        for turn in turns:
            transcript += f"User: {turn.strip()}\nAssistant:"
            body = json.dumps({"prompt": transcript, "n_predict": n, "temperature": 0, "cache_prompt": True,
                               "stop": ["\nUser:"]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                         {"Content-Type": "application/json"})
            r = json.load(urllib.request.urlopen(req, timeout=1200))
            t = r["timings"]
            out["tokens"] += max(t["predicted_n"] - 1, 0)      # the first token comes with the prompt
            out["gen_s"] += t["predicted_ms"] / 1e3
            out["ttft_s"] += t["prompt_ms"] / 1e3
            out["drafted"] += t.get("draft_n", 0)
            out["accepted"] += t.get("draft_n_accepted", 0)
            out["replies"].append(r["content"])
            transcript += r["content"] + "\n"
    finally:
        _stop(proc)
    out["tok_s"] = out["tokens"] / out["gen_s"] if out["gen_s"] > 0 else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF file (default: the embedded default model)")
    ap.add_argument("--types", default="none,ngram-simple,ngram-mod,auto")
    ap.add_argument("--prompt-file", action="append", default=[], help="a raw prompt (repeatable; default: "
                    "a copy prompt and a prose prompt of this script's own)")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--conversation", help="a multi-turn conversation (turns between lines of ---) to run "
                    "instead of single prompts, e.g. bench/serve-code-edit.txt")
    ap.add_argument("--native-types", default="ngram-simple,ngram-mod,ngram-map-k,ngram-map-k4v",
                    help="with --conversation: native types auto is compared with")
    a = ap.parse_args(argv)
    tool = _load("native")
    if not tool.built():
        raise SystemExit(f"native llama.cpp not built ({tool.bin_dir()}): python tools/native.py build")
    if a.model:
        model = str(Path(a.model).resolve())        # (draftlight serve runs in a folder of its own)
    else:
        from app.models import default_model_path
        model = str(default_model_path())
    if a.conversation:
        return run_conversation(a, tool, model)
    prompts = {Path(f).stem: Path(f).read_text() for f in a.prompt_file} or DEFAULT_PROMPTS
    print(f"bench_serve: {Path(model).name}, -n {a.n}, {a.rounds} rounds, {a.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="draftlight-bench-serve-") as data_dir:
        for t in a.types.split(","):
            native_type = "none" if t == "auto" else t
            for name, prompt in prompts.items():
                nat, ours = [], []
                for i in range(a.rounds):
                    runs = [lambda: nat.append(one_prompt(lambda: _start_native(tool.bin_dir(), model, native_type,
                                                                                a.threads), prompt, a.n)),
                            lambda: ours.append(one_prompt(lambda: _start_serve(model, t, a.threads, data_dir),
                                                           prompt, a.n))]
                    for run in (runs if i % 2 == 0 else runs[::-1]):
                        run()
                paired = statistics.median(o[0] / n[0] for n, o in zip(nat, ours))
                ttft = statistics.median(o[4] / n[4] for n, o in zip(nat, ours))
                mn, mo = statistics.median(x[0] for x in nat), statistics.median(x[0] for x in ours)
                same = "same text" if nat[0][3] == ours[0][3] else "TEXT DIFFERS"
                vs = "" if native_type == t else f" (native: {native_type})"
                print(f"{t:13s} {name:10s} native {mn:7.1f} tok/s  serve {mo:7.1f} tok/s  "
                      f"paired ratio {paired:4.2f}  first token ms native {statistics.median(x[4] for x in nat):.0f} "
                      f"serve {statistics.median(x[4] for x in ours):.0f} (ratio {ttft:4.2f})  d/a native {nat[0][1]}/{nat[0][2]} serve {ours[0][1]}/{ours[0][2]}  "
                      f"{same}{vs}  load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


def run_conversation(a, tool, model: str) -> int:
    """``--conversation``: ours (each of ``--types``) against native, the whole conversation per
    round on fresh servers; ``auto`` against native ``none`` and the best native n-gram type."""
    turns = [t for t in Path(a.conversation).read_text().split("\n---\n") if t.strip()]
    native_types = ["none", *[t for t in a.native_types.split(",") if t]]
    print(f"bench_serve: {Path(model).name}, conversation {a.conversation} ({len(turns)} turns), -n {a.n} a turn, "
          f"{a.rounds} rounds, {a.threads} threads; load average {os.getloadavg()[0]:.1f}", flush=True)
    ours_types = a.types.split(",")
    with tempfile.TemporaryDirectory(prefix="draftlight-bench-serve-") as data_dir:
        rows: dict[str, list[dict]] = {f"native {t}": [] for t in native_types}
        rows.update({f"serve {t}": [] for t in ours_types})
        for i in range(a.rounds):
            runs = [(f"native {t}", lambda t=t: _start_native(tool.bin_dir(), model, t, a.threads))
                    for t in native_types]
            runs += [(f"serve {t}", lambda t=t: _start_serve(model, t, a.threads, data_dir)) for t in ours_types]
            k = i % len(runs)
            for name, start in runs[k:] + runs[:k]:          # the order rotated each round
                rows[name].append(conversation(start, turns, a.n))
        base = rows["native none"]
        for name, rs in rows.items():
            tok_s = statistics.median(r["tok_s"] for r in rs)
            vs_none = statistics.median(r["tok_s"] / b["tok_s"] for r, b in zip(rs, base))
            ttft = statistics.median(r["ttft_s"] for r in rs) * 1e3
            print(f"{name:22s} {tok_s:7.1f} tok/s  x{vs_none:4.2f} native none (paired)  first tokens "
                  f"{ttft:6.0f} ms in all  drafted/accepted {rs[0]['drafted']}/{rs[0]['accepted']}  "
                  f"tokens {rs[0]['tokens']}", flush=True)
        for t in ours_types:
            ours = rows[f"serve {t}"]
            if t in native_types:
                same = sum(o["replies"] == n["replies"] for o, n in zip(ours, rows[f"native {t}"]))
                ratio = statistics.median(o["tok_s"] / n["tok_s"] for o, n in zip(ours, rows[f"native {t}"]))
                print(f"serve {t} / native {t}: x{ratio:4.2f} paired; same replies in {same} of {a.rounds} rounds")
            else:
                # against the native type with the best median (what one would pick by hand)
                best = max(native_types, key=lambda n: statistics.median(r["tok_s"] for r in rows[f"native {n}"]))
                ratio = statistics.median(o["tok_s"] / b["tok_s"] for o, b in zip(ours, rows[f"native {best}"]))
                print(f"serve {t} / native {best} (native's fastest here): x{ratio:4.2f} paired")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
