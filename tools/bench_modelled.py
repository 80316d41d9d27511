#!/usr/bin/env python3
"""Speed-ups as the verify-cost curve prices each run's steps: a figure the machine's drift does not move.

    python tools/bench_modelled.py [-m MODEL] [-f PROMPTS] [-n 256] [--spec-type T ...]

For each prompt (chat template, greedy) and configuration, the run's *modelled time* is the sum
over its steps of ``c(k) * t1`` -- the engine's verify-cost curve, read once at the start, at
the step's batch of ``k`` draft tokens -- plus the speculators' own measured begin/draft/accept
time. ``none``'s modelled time over a configuration's is its modelled speed-up: it follows only
the decisions (how many steps, how long their drafts), so two controllers can be compared on a
machine whose speed drifts by more than their difference. It leaves out what the curve does not
price (sampling, the controller's own bookkeeping): the wall-clock figures stay ``draftlight
bench``'s. Only meaningful where the texts are equal: use a lossless (F16) copy of the model;
rows whose text differs from ``none``'s are marked.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("-f", "--prompt-file", action="append", default=None)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--spec-type", action="append", default=None,
                    help="configurations besides none (default: auto, ngram-simple, ngram-mod)")
    a = ap.parse_args()

    from app.options import ModelOptions
    from app.runtime import open_engine
    from speculators.llama import Context
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    eng = open_engine(ModelOptions(model=a.model, threads=a.threads), SpecParams.auto())
    cost = eng.shared_cost_model()
    t1, rel = cost.t1_s, [cost.rel(k) for k in range(eng.ctx.n_batch + 1)]
    texts: list[str] = []
    for f in a.prompt_file or ["bench/copy.txt"]:
        texts += [t.strip() for t in Path(f).read_text().split("\n---\n") if t.strip()]
    configs = ["none"] + (a.spec_type or ["auto", "ngram-simple", "ngram-mod"])
    stop = tuple(eng.template.stop_strings)
    batches: list[int] = []
    decode = Context.decode

    def recording(self, tokens, pos0, logits="last"):
        batches.append(len(tokens))
        return decode(self, tokens, pos0, logits)

    Context.decode = recording
    total = {c: 0.0 for c in configs}
    for i, text in enumerate(texts):
        prompt = eng.prompt_tokens(text=text)
        secs, out = {}, {}
        for c in configs:
            eng.set_spec(SpecParams() if c == "none" else SpecParams.auto() if c == "auto" else
                         SpecParams.from_types(c))
            batches.clear()
            r = eng.run(prompt, max_tokens=a.n, sampling=SamplingParams(temperature=0.0), stop=stop)
            steps = batches[1:]                     # the first decode is the prompt's
            spec_s = sum(s.t_begin_us + s.t_draft_us + s.t_accept_us for s in r.stats.speculators.values()) * 1e-6
            secs[c] = sum(rel[min(k - 1, len(rel) - 1)] for k in steps) * t1 + spec_s
            out[c] = r.tokens
            total[c] += secs[c]
        same = all(out[c] == out["none"] for c in configs)
        print(f"{i:2d} {len(out['none']):4d} tok {'same' if same else 'DIFF'}  "
              + "  ".join(f"{c} {secs['none'] / secs[c]:.2f}" for c in configs[1:]), flush=True)
    print("overall  " + "  ".join(f"{c} {total['none'] / total[c]:.3f}" for c in configs[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
