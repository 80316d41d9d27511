#!/usr/bin/env python3
"""Time to first token of each turn of a growing chat: does it grow with the conversation?

    python tools/bench_turns.py MODEL [--turns 8] [-n 24] [-t 2] [--spec-type T] [--full]

Plays a chat of ``--turns`` user messages through the engine the way the chat
does (the whole conversation rendered with the model's template every turn,
greedy replies of ``-n`` tokens), and prints for each turn the conversation's
length in tokens, how many were reused from the previous turn's cache, how many
had to be decoded, and the time to the first token. On targets that cannot drop
a partial sequence (hybrid/recurrent), reuse goes through context checkpoints as
llama-server's ``--ctx-checkpoints`` does. ``--full`` plays the same chat again
with prefix reuse off, for comparison (every turn decodes the whole
conversation).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MESSAGES = [
    "Tell me about the lighthouse on the northern cape and the people who kept it.",
    "Why did they climb the stairs every evening, even in winter storms?",
    "What did the keeper write in the logbook after a quiet night?",
    "How was the lamp cleaned, and who taught the new keepers to do it?",
    "Which ships passed most often, and what did they carry along that coast?",
    "When was the light automated, and what happened to the keeper's house?",
    "Describe the sound of the foghorn to someone who has never heard one.",
    "What would a visitor see from the gallery at the top on a clear day?",
    "Summarise everything we talked about in three sentences.",
    "Thank you. One last question: would you have liked to be a keeper?",
]


def play(engine, turns: int, n: int) -> list[dict]:
    from speculators.sampling import SamplingParams

    msgs: list[dict] = []
    rows = []
    for k in range(turns):
        msgs.append({"role": "user", "content": MESSAGES[k % len(MESSAGES)]})
        toks = engine.prompt_tokens(messages=msgs)
        res = engine.run(toks, max_tokens=n, sampling=SamplingParams(temperature=0.0))
        s = res.stats
        rows.append({"turn": k + 1, "tokens": len(toks), "reused": s.n_prompt_reused,
                     "decoded": len(toks) - s.n_prompt_reused, "ttft_ms": s.t_prompt_s * 1000})
        msgs.append({"role": "assistant", "content": res.text})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("-n", type=int, default=24, help="tokens per reply")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--spec-type", default="none")
    ap.add_argument("--full", action="store_true", help="also play the chat with prefix reuse off")
    a = ap.parse_args()
    from speculators.engine import Engine, EngineConfig
    from app.cpu_check import apply
    apply("auto")   # without the CPU extra buffer types where they crash here
    from speculators.params import SpecParams

    runs = [("prefix reuse", True)] + ([("no reuse", False)] if a.full else [])
    for label, reuse in runs:
        spec = SpecParams.from_types(a.spec_type) if a.spec_type != "none" else SpecParams()
        eng = Engine(a.model, EngineConfig(n_ctx=4096, n_threads=a.threads, reuse_prefix=reuse), spec)
        try:
            kind = "checkpointed" if eng.use_checkpoints else "plain"
            print(f"{label} ({kind} target, {a.spec_type}):")
            print(f"{'turn':>4} {'tokens':>7} {'reused':>7} {'decoded':>8} {'ttft ms':>9}")
            for r in play(eng, a.turns, a.n):
                print(f"{r['turn']:>4} {r['tokens']:>7} {r['reused']:>7} {r['decoded']:>8} {r['ttft_ms']:>9.1f}",
                      flush=True)
        finally:
            eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
