#!/usr/bin/env python3
"""What a context shift costs: time to the next token after a shift vs after a re-decode.

    python tools/bench_shift.py [-m MODEL] [-c 512,1024,2048] [--keep 32] [--reps 3] [-t THREADS] [--json]

For each context size, a raw-text prompt fills the context but for a few
tokens; the reply (greedy, no speculation) reaches the end of the context,
the engine cuts it (keep ``--keep`` tokens, drop half of the rest) and goes
on. The same generation runs twice per repetition, interleaved:

* ``shift``: positions moved in place (``llama_memory_seq_rm`` +
  ``llama_memory_seq_add``; llama.cpp re-rotates the cached keys at the
  next decode);
* ``redecode``: memory cleared and the kept tokens decoded again (what
  recurrent, hybrid and small sliding-window caches need).

"next token" is the wall time between the step event before the cut and
the first one after it (the cut plus one decode step); "step" is the
median of the other steps of the same run. The figures are medians over
the repetitions; the ratio is redecode / shift. Nothing here is asserted:
it is a measurement, and on a shared machine its spread is part of the
result (reported as min..max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _default_model() -> str:
    from app.models import ensure_default_model
    return str(ensure_default_model())


def _text() -> str:
    return (ROOT / "bench" / "copy-raw.txt").read_text(encoding="utf-8")


def _fill(model, n: int) -> list[int]:
    """``n`` prompt tokens of raw text (BOS first)."""
    text = _text()
    toks = model.tokenize(text, add_special=True)
    body = model.tokenize("\n\n" + text, add_special=False)
    while len(toks) < n:
        toks += body
    return toks[:n]


def one_run(engine, prompt: list[int], n_keep: int, max_tokens: int) -> dict:
    from speculators.events import FinishEvent, StepEvent
    from speculators.sampling import SamplingParams
    times: list[float] = []
    n_tokens: list[int] = []
    t0 = time.perf_counter()
    result = None
    for ev in engine.generate(prompt, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
                              context_shift=True, n_keep=n_keep):
        if isinstance(ev, StepEvent) and ev.tokens:
            times.append(time.perf_counter())
            n_tokens.append(len(ev.tokens))
        elif isinstance(ev, FinishEvent):
            result = ev.result
    shifts = list(engine.last_shifts)
    if len(shifts) != 1:
        raise RuntimeError(f"expected one context shift, saw {len(shifts)}")
    sh = shifts[0]
    # the step event whose tokens end at reply index n_reply - 1 is the last before the cut
    produced = 0
    before = None
    for i, n in enumerate(n_tokens):
        produced += n
        if produced == sh.n_reply:
            before = i
            break
    if before is None or before + 1 >= len(times):
        raise RuntimeError("no step after the shift to time")
    gaps = [b - a for a, b in zip(times, times[1:])]
    next_s = gaps[before]
    others = [g for j, g in enumerate(gaps) if j != before]
    return {"mode": sh.mode, "next_token_s": next_s, "step_s": statistics.median(others),
            "shift_op_s": sh.seconds, "n_keep": sh.n_keep, "n_discard": sh.n_discard,
            "n_kept": sh.n_after, "tokens": result.tokens if result is not None else [],
            "t_total_s": time.perf_counter() - t0}


def bench(model_path: str, sizes: list[int], n_keep: int, reps: int, threads: int | None,
          lead: int = 6, tail: int = 10) -> list[dict]:
    from speculators.engine import Engine, EngineConfig
    from app.cpu_check import apply
    apply("auto")   # without the CPU extra buffer types where they crash here
    from speculators.llama import Model
    model = Model(model_path)
    rows = []
    try:
        for n_ctx in sizes:
            eng = Engine(model_path, EngineConfig(n_ctx=n_ctx, n_threads=threads, reuse_prefix=False), model=model)
            try:
                prompt = _fill(model, eng.ctx.n_ctx - lead)
                per: dict[str, list[dict]] = {"shift": [], "redecode": []}
                for _ in range(reps):
                    for mode in ("shift", "redecode"):
                        eng.config.force_shift_redecode = mode == "redecode"
                        r = one_run(eng, prompt, n_keep, lead + tail)
                        if r["mode"] != mode:
                            raise RuntimeError(f"asked for {mode}, the engine used {r['mode']}")
                        per[mode].append(r)
                row = {"n_ctx": eng.ctx.n_ctx, "n_keep": per["shift"][0]["n_keep"],
                       "n_discard": per["shift"][0]["n_discard"], "n_kept": per["shift"][0]["n_kept"],
                       "reps": reps, "threads": eng.ctx.n_threads}
                for mode, runs in per.items():
                    nx = [r["next_token_s"] for r in runs]
                    row[mode] = {"next_token_s": statistics.median(nx), "min_s": min(nx), "max_s": max(nx),
                                 "step_s": statistics.median(r["step_s"] for r in runs),
                                 "shift_op_s": statistics.median(r["shift_op_s"] for r in runs)}
                row["ratio"] = row["redecode"]["next_token_s"] / row["shift"]["next_token_s"]
                # the two modes continue differently (not the same numbers): report, do not compare
                row["same_tokens"] = per["shift"][0]["tokens"] == per["redecode"][0]["tokens"]
                rows.append(row)
            finally:
                eng.model = None  # the shared model is freed below, once
                eng.chain.close()
                eng.ctx.close()
    finally:
        model.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="time to the next token after a context shift vs a re-decode")
    ap.add_argument("-m", "--model", help="GGUF model (default: the app's default model)")
    ap.add_argument("-c", "--ctx-sizes", default="512,1024,2048", help="comma-separated context sizes")
    ap.add_argument("--keep", type=int, default=32, help="tokens kept at the start (n_keep)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in a.ctx_sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: --ctx-sizes wants numbers separated by commas, got {a.ctx_sizes!r}", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 64 or a.keep < 0 or a.reps < 1:
        print("error: context sizes must be at least 64, --keep 0 or more, --reps 1 or more", file=sys.stderr)
        return 2
    from speculators.llama import ModelError
    try:
        path = a.model or _default_model()
        rows = bench(path, sizes, a.keep, a.reps, a.threads)
    except (ModelError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps({"model": path, "rows": rows}, indent=2))
        return 0
    print(f"model {path}")
    print(f"{'n_ctx':>6} {'kept':>5} {'dropped':>7} | {'shift next':>10} {'redecode next':>13} {'ratio':>6} | "
          f"{'step':>6} | {'spread shift / redecode':>24}")
    for r in rows:
        s, d = r["shift"], r["redecode"]
        print(f"{r['n_ctx']:>6} {r['n_kept']:>5} {r['n_discard']:>7} | {s['next_token_s'] * 1000:>8.1f}ms "
              f"{d['next_token_s'] * 1000:>11.1f}ms {r['ratio']:>6.1f} | {s['step_s'] * 1000:>4.1f}ms | "
              f"{s['min_s'] * 1000:.0f}..{s['max_s'] * 1000:.0f} / {d['min_s'] * 1000:.0f}..{d['max_s'] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
