#!/usr/bin/env python3
"""The engine through the runner process against the engine in this process, side by side.

    python tools/bench_runner.py [-m MODEL] [-f bench/prompts.txt] [--spec-type LIST] [-n 128] [--rounds 3]

Both are loaded once, from the same model and settings; each prompt runs on one then the
other, alternating which goes first, for ``--rounds`` rounds. Timed here, in the caller, as the
chat sees them: the first token (from the call to the first token) and tokens/s after it. Prints
per configuration the ratio runner/in-process of the fastest runs and the median of the paired
(back-to-back) ratios, and the resident memory of this process and of the runner.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_PROMPTS = [
    "Name three colours of the rainbow.",
    "What is the capital of France?",
    "Copy this text exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over "
    "the lazy dog, the quick brown fox jumps over the lazy dog.",
]


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def timed(engine, prompt_tokens, n: int, stop) -> tuple[float, float, int, str]:
    """(seconds to the first token, tokens/s after it, tokens, text), timed in the caller."""
    from speculators.events import FinishEvent, StepEvent
    from speculators.sampling import SamplingParams
    t0 = time.perf_counter()
    t_first = None
    n_tok = 0
    text = ""
    for ev in engine.generate(prompt_tokens, max_tokens=n, sampling=SamplingParams(temperature=0.0), stop=stop):
        if isinstance(ev, StepEvent) and ev.tokens:
            if t_first is None:
                t_first = time.perf_counter()
            n_tok += len(ev.tokens)
        elif isinstance(ev, FinishEvent):
            text = ev.result.text
    t_end = time.perf_counter()
    t_first = t_first or t_end
    rate = (n_tok - 1) / (t_end - t_first) if n_tok > 1 and t_end > t_first else 0.0
    return t_first - t0, rate, n_tok, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="GGUF model (default: the embedded default model)")
    ap.add_argument("-f", "--prompts", help="a prompt file as bench reads it (prompts between '---' lines)")
    ap.add_argument("--spec-type", action="append", default=None,
                    help="configurations to compare (repeatable; default: none, auto, ngram-mod)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    a = ap.parse_args()

    from app.options import ModelOptions
    from app.runner import RunnerEngine
    from app.runtime import load_chat_engine
    from speculators.params import SpecParams

    from app.cmd_bench import _read_prompts
    prompts = _read_prompts([], [a.prompts]) if a.prompts else DEFAULT_PROMPTS
    opts = ModelOptions(model=a.model, ctx_size=a.ctx_size, threads=a.threads)
    configs = a.spec_type or ["none", "auto", "ngram-mod"]
    first = SpecParams.from_types(configs[0]) if configs[0] != "none" else SpecParams()
    local = load_chat_engine(opts, first)
    runner = RunnerEngine(opts, first)
    print(f"model {local.model.path} · {a.threads} threads · -n {a.n} · {a.rounds} rounds · "
          f"{len(prompts)} prompts", flush=True)
    print(f"memory (RSS): this process with the in-process engine {rss_mib(os.getpid()):.0f} MiB; "
          f"runner {rss_mib(runner.pid):.0f} MiB", flush=True)
    print(f"{'config':<12} {'tok/s in-proc':>13} {'tok/s runner':>12} {'ratio best':>10} {'ratio paired':>12} "
          f"{'ttft in-proc':>12} {'ttft runner':>11} {'Δttft ms':>9} same")
    for cfg in configs:
        spec = SpecParams.from_types(cfg) if cfg != "none" else SpecParams()
        local.set_spec(spec)
        runner.set_spec(spec)
        best = {"local": {}, "runner": {}}
        ttft = {"local": {}, "runner": {}}
        paired, same = [], True
        for r in range(a.rounds):
            for i, p in enumerate(prompts):
                toks = local.prompt_tokens(messages=[{"role": "user", "content": p}])
                stop = tuple(local.template.stop_strings or ())
                order = [("local", local), ("runner", runner)]
                if (r + i) % 2:
                    order.reverse()
                got = {}
                for name, eng in order:
                    got[name] = timed(eng, toks, a.n, stop)
                    best[name][i] = max(best[name].get(i, 0.0), got[name][1])
                    ttft[name].setdefault(i, []).append(got[name][0])
                if got["local"][1] > 0:
                    paired.append(got["runner"][1] / got["local"][1])
                same &= got["local"][3] == got["runner"][3]
        tl = statistics.fmean(best["local"].values())
        tr = statistics.fmean(best["runner"].values())
        ratio_best = statistics.fmean(best["runner"][i] / best["local"][i] for i in best["local"]
                                      if best["local"][i] > 0)
        ft_l = statistics.fmean(min(v) for v in ttft["local"].values()) * 1000
        ft_r = statistics.fmean(min(v) for v in ttft["runner"].values()) * 1000
        print(f"{cfg:<12} {tl:13.1f} {tr:12.1f} {ratio_best:10.3f} {statistics.median(paired):12.3f} "
              f"{ft_l:12.1f} {ft_r:11.1f} {ft_r - ft_l:9.1f} {'yes' if same else 'NO'}", flush=True)
    runner.close()
    local.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
