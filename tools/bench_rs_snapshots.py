#!/usr/bin/env python3
"""What a recurrent/hybrid target's load plan costs plain decoding: the same greedy reply with no
drafting, from a context without recurrent-state snapshots and one with them (and the MTP block).

    python tools/bench_rs_snapshots.py MODEL N_RS_SEQ LOAD_MTP(0|1)   # e.g. DIR/hybrid-mtp.gguf 3 1

8 rounds in ABBA order; prints each side's tokens/s and the paired median of plan ÷ plain.
"""
import statistics as S
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from speculators.engine import Engine, EngineConfig  # noqa: E402
from speculators.params import SpecParams  # noqa: E402

PROMPT = "How do vaccines train the immune system?"


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    path, n_rs, mtp = argv[1], int(argv[2]), argv[3] == "1"
    engs = {name: Engine(path, EngineConfig(n_ctx=1024, n_threads=2, n_rs_seq=r, load_mtp=m), SpecParams())
            for name, r, m in (("plain", 0, False), ("plan", n_rs, mtp))}
    for name, e in engs.items():
        print(f"{name}: n_rs_seq {e.n_rs_seq}, MTP block {'loaded' if e.model.load_mtp else 'not loaded'}")
    prompt = engs["plain"].prompt_tokens(text=PROMPT)
    res: dict[str, list[float]] = {k: [] for k in engs}
    order = list(engs)
    for r in range(8):
        for name in (order if r % 2 == 0 else order[::-1]):
            res[name].append(engs[name].run(prompt, max_tokens=128).stats.tokens_per_s)
    for k, v in res.items():
        print(f"{k}: best {max(v):.1f} tok/s, median {S.median(v):.1f}", [round(x, 1) for x in v])
    pr = [b / a for a, b in zip(res["plain"], res["plan"])]
    print(f"plan / plain, paired median {S.median(pr):.3f}", [round(x, 3) for x in pr])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
