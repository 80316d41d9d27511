#!/usr/bin/env python3
"""The chat's reply speed against ``draftlight generate``'s, for the same request and settings.

    python tools/bench_chat.py [-m MODEL] [-p PROMPT] [--spec-type LIST ...] [-n 200] [--rounds 2]

For each configuration and round: the real app (the installed ``draftlight``) is started in
tmux with the settings as flags and fresh folders, the prompt is typed and sent, and the reply's
figures are read from the chat history it saves (the footer's tokens/s); then ``draftlight
generate --json`` runs the same request with the same flags. Prints per configuration the best
tokens/s of each and their ratio chat/generate (target ≥ 0.95), and the median of the paired
ratios (a round's two sides run in ABBA order: chat first in even rounds, generate first in odd
ones), and the UI process's CPU time per reply token while the reply streams (the runner's is not
in it). Needs tmux.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def draftlight() -> list[str]:
    exe = Path(sys.executable).with_name("draftlight")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "app"]


def folders(base: Path) -> dict[str, str]:
    env = {}
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        d = base / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    # the cache folder is shared: the CPU probe's answer and the verify-cost curves, as on a user's machine
    env["XDG_CACHE_HOME"] = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return env


_RUNS = itertools.count()


def chat_once(args: list[str], prompt: str, env: dict[str, str], timeout: float = 300) -> dict:
    # a tmux server of its own each time: the last one may still be exiting after its kill-server
    # (a new session on its socket then fails)
    sock = f"draftlight-bench-{os.getpid()}-{next(_RUNS)}"
    tm = ["tmux", "-L", sock]
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    inner = f"exec env {envs} TERM=xterm-256color {shlex.join(args)}"
    subprocess.run([*tm, "new-session", "-d", "-s", "b", "-x", "120", "-y", "40", inner], check=True)
    db = Path(env["XDG_DATA_HOME"]) / "draftlight" / "history.sqlite3"
    try:
        deadline = time.monotonic() + timeout
        while "ready" not in subprocess.run([*tm, "capture-pane", "-p", "-t", "b"], capture_output=True,
                                            text=True).stdout:
            if time.monotonic() > deadline:
                raise SystemExit("the app did not become ready")
            time.sleep(0.2)
        pid = int(subprocess.run([*tm, "display-message", "-p", "-t", "b", "#{pane_pid}"], capture_output=True,
                                 text=True, check=True).stdout)
        cpu0 = cpu_seconds(pid)
        subprocess.run([*tm, "send-keys", "-t", "b", "-l", prompt], check=True)
        subprocess.run([*tm, "send-keys", "-t", "b", "Enter"], check=True)
        while True:
            if time.monotonic() > deadline:
                raise SystemExit("the reply did not finish")
            # seldom: what the harness takes of the CPU, the model loses too (generate has no such poll)
            time.sleep(1.0)
            if not db.exists():
                continue
            with sqlite3.connect(db) as c:
                row = c.execute("SELECT content, stats, status FROM messages WHERE role='assistant' "
                                "ORDER BY id DESC LIMIT 1").fetchone()
            if row and row[2] == "done" and row[1]:
                return {"text": row[0], "stats": json.loads(row[1]), "ui_cpu_s": cpu_seconds(pid) - cpu0}
    finally:
        subprocess.run([*tm, "kill-server"], capture_output=True)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generate_once(args: list[str], prompt: str, env: dict[str, str]) -> dict:
    out = subprocess.run([*args, "-p", prompt, "--json"], capture_output=True, text=True, env={**os.environ, **env},
                         timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"generate failed: {out.stderr}")
    return json.loads(out.stdout)


def tps(stats: dict) -> float:
    n = stats["n_generated"] - 1
    return n / stats["t_gen_s"] if stats.get("t_gen_s") and n > 0 else 0.0


def step_line(stats: dict) -> str:
    """Where a run's time went: steps, drafted/accepted, and the mean time of a step."""
    steps = stats.get("n_steps") or 0
    ms = 1000 * stats["t_gen_s"] / steps if steps else 0.0
    return (f"{tps(stats):6.1f} tok/s, {stats['n_generated']} tok in {steps} steps ({ms:.1f} ms/step), "
            f"drafted {stats.get('n_drafted', 0)} accepted {stats.get('n_accepted', 0)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("-p", "--prompt", default="Count from 1 to 100, separated by commas.")
    ap.add_argument("--spec-type", action="append", default=None, help="default: none, auto, ngram-mod")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    # below 2,048 the plain transcript leaves out its worked exchanges, after which the default
    # model answers the counting prompt in a few tokens: a reply long enough to time needs this
    ap.add_argument("-c", "--ctx-size", type=int, default=1024)
    ap.add_argument("-v", "--verbose", action="store_true", help="each round's steps, drafts and time per step")
    a = ap.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("needs tmux")
    base = draftlight()
    print(f"{'config':<12} {'chat tok/s':>10} {'generate tok/s':>14} {'ratio best':>10} {'ratio paired':>12} "
          f"{'tokens':>7} {'UI ms/token':>11} same-text")
    for cfg in a.spec_type or ["none", "auto", "ngram-mod"]:
        flags = ["--spec-type", cfg, "--temp", "0", "-n", str(a.n), "-t", str(a.threads), "-c", str(a.ctx_size)]
        if a.model:
            flags += ["--model", a.model]
        chat, gen, paired, same, ntok, ui, detail = [], [], [], True, 0, [], []
        for _ in range(a.rounds):
            # fresh folders for each side: neither learns from the other's lookup caches
            with tempfile.TemporaryDirectory(prefix="draftlight-bench-") as tmp:
                # ABBA: every other round runs generate first, so that a machine whose speed drifts
                # (a shared VM's does, by up to 1.5x over minutes) favours neither side
                if len(chat) % 2 == 0:
                    c = chat_once([*base, *flags], a.prompt, folders(Path(tmp) / "chat"))
                    g = generate_once([*base, "generate", *flags], a.prompt, folders(Path(tmp) / "generate"))
                else:
                    g = generate_once([*base, "generate", *flags], a.prompt, folders(Path(tmp) / "generate"))
                    c = chat_once([*base, *flags], a.prompt, folders(Path(tmp) / "chat"))
            chat.append(tps(c["stats"]))
            gen.append(tps(g["stats"]))
            paired.append(chat[-1] / gen[-1] if gen[-1] else 0.0)
            same &= c["text"].strip() == g["text"].strip()
            ntok = g["stats"]["n_generated"]
            ui.append(1000 * c["ui_cpu_s"] / max(1, c["stats"]["n_generated"]))
            if a.verbose:
                detail.append(f"  round {len(chat)}: chat {step_line(c['stats'])} | generate {step_line(g['stats'])}")
        print(f"{cfg:<12} {max(chat):10.1f} {max(gen):14.1f} {max(chat) / max(gen):10.3f} "
              f"{statistics.median(paired):12.3f} {ntok:7d} {statistics.median(ui):11.2f} {'yes' if same else 'NO'}", flush=True)
        for line in detail:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
