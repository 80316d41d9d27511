"""Run several speculation types on one loaded model, in a process of its own, and print JSON.

``python -m tests.rpc_runs MODEL PROMPT N TYPES [--rpc A,B -ngl K]``: the model is opened as
``draftlight generate`` opens it (app.runtime.open_engine: flags, RPC servers, GPU layers), each
type runs greedy from a fresh chain, and each run's text, tokens, drafters and counts are printed as
one JSON object keyed by type. tests/test_rpc.py compares all-local runs with split ones this way
(one model load per placement, not one per type; RPC devices stay in the process that added them).
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompt")
    ap.add_argument("n", type=int)
    ap.add_argument("types")
    ap.add_argument("--rpc")
    ap.add_argument("-ngl", type=int)
    a = ap.parse_args(argv)
    from app.options import ModelOptions
    from app.runtime import open_engine
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams
    opts = ModelOptions(model=a.model, ctx_size=1024, threads=1, rpc=a.rpc, n_gpu_layers=a.ngl)
    eng = open_engine(opts, SpecParams())
    out = {}
    try:
        prompt = eng.prompt_tokens(text=a.prompt, raw=True)
        for t in a.types.split(","):
            eng.set_spec(SpecParams.from_types(t) if t != "none" else SpecParams())
            res = eng.run(prompt, max_tokens=a.n, sampling=SamplingParams(temperature=0.0))
            d = res.to_dict()
            out[t] = {k: d[k] for k in ("text", "tokens", "drafted_by", "draft_pos")}
            out[t]["stats"] = {k: d["stats"][k] for k in ("n_drafted", "n_accepted", "n_steps")}
    finally:
        eng.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
