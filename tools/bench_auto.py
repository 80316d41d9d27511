#!/usr/bin/env python3
"""Automatic against every choice a person could make by hand, at three model speeds.

    python tools/bench_auto.py [--quick] [--rounds 5] [-n 256] [--models fast,slow,default]
                               [--sets tune,heldout] [--base DIR] [--no-native] [--json FILE]

Models: two seeded random-weight llamas built with the tests' own builder
(:func:`tests.hidden_models.write_tiny_llama_target` over
:func:`tests.hidden_models.realistic_vocab`, F16; cached under ~/.cache/draftlight-bench/):
``fast`` (hidden 256 x 4 layers, ~0.7 ms a one-token decode on a 2-core CPU: what a 1-8B
model takes on a GPU) and ``slow`` (hidden 512 x 8, ~2.7 ms); and ``default``, the embedded
default model.

Prompts: ``bench/auto-tune.txt`` (the set tuned on) and ``bench/auto-heldout.txt`` (held
out). Each entry (entries between lines of ``---``) is a ``# kind: KIND`` line (copy,
retrieval, code, ordinary), the prompt, a line ``===`` and the reply every row writes
(teacher-forced, :class:`speculators.sampling.Sampler`'s ``forced``: each position is still
sampled and verified as usual; the scripted token is then taken, so every row does the same
work on the same text, and a random-weight model "copies" as a real one would). Prompts are
raw (no chat template); a run ends at the reply's end or after ``-n`` tokens.

Each prompt runs every mode (``none``, ``auto``, every fixed n-gram type; with ``--base DIR``
also ``auto-base``: the controller of another checkout, e.g. ``git worktree add /tmp/auto-base
HEAD``, on this engine) back to back, once per round, the order rotated each round; each run
from a fresh chain. Per model, prompt set and kind it prints the median tokens/s of each mode
and the *paired* ratios: per prompt the median over rounds of the two modes' ratio in the same
round, then the geometric mean over the prompts. ``fixed*`` is the fixed type with the best
paired ratio to ``none`` over the group (what a person would pick by hand for such prompts).
``dec ms`` is the controller's (or the fixed chain's) time per step: deciding and asking the
drafters (``auto``: ``Controller.decide`` and ``observe``; a fixed type: ``chain.draft``);
``cpu ms`` the same in the calling thread's CPU time (what a busy machine moves least).
``ceil`` is, on copy prompts, the median tokens/s over the verify ceiling (one batch of the
mode's mean draft length + 1, every row sampled, as ``draftlight bench`` measures it) at the
mode's acceptance (``acc%``). The native column: llama-server's ``none`` (``tools/native.py``'s
build, a fresh server per run) against ours on the group's first prompt, own text, paired.

Every figure is printed with the load average (``uptime``): on a shared machine they move.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CACHE = Path(os.path.expanduser("~/.cache/draftlight-bench"))
FIXED = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
KINDS = ("copy", "retrieval", "code", "ordinary")
#: the two random-weight llamas: name -> (hidden, layers, ffn, heads)
TINY = {"fast": (256, 4, 1024, 4), "slow": (512, 8, 2048, 8)}


@dataclass
class Prompt:
    kind: str
    text: str
    reply: str
    toks: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)


def read_set(path: Path) -> list[Prompt]:
    """The entries of a prompt file (see the module docstring)."""
    out: list[Prompt] = []
    for part in path.read_text(encoding="utf-8").split("\n---\n"):
        lines = part.strip("\n").splitlines()
        if not lines:
            continue
        kind = "ordinary"
        if lines[0].startswith("# kind:"):
            kind = lines[0].split(":", 1)[1].strip()
            lines = lines[1:]
        if "===" not in lines:
            raise SystemExit(f"{path}: an entry without its '===' reply line")
        i = lines.index("===")
        out.append(Prompt(kind, "\n".join(lines[:i]).strip("\n") + "\n", "\n".join(lines[i + 1:]).strip("\n")))
    return out


def tiny_model(name: str) -> Path:
    """The random-weight llama ``name`` (built once, then cached)."""
    from tests.hidden_models import realistic_vocab, write_tiny_llama_target
    h, layers, ff, heads = TINY[name]
    path = CACHE / f"llama-h{h}-l{layers}.gguf"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        write_tiny_llama_target(tmp, n_embd=h, n_layer=layers, n_ff=ff, n_head=heads, vocab=realistic_vocab(),
                                half=True, seed=7, name=f"bench-{name}")
        os.replace(tmp, path)
    return path


def load_base_controller(base: Path):
    """The controller of another checkout (``speculators/controller.py``, or the package
    ``speculators/controller/`` of later ones), loaded as a module of this package (its imports
    of other modules resolve to this checkout's)."""
    folder = base / "speculators" / "controller"
    if folder.is_dir():
        spec = importlib.util.spec_from_file_location("speculators._bench_base_controller", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
    else:
        spec = importlib.util.spec_from_file_location("speculators._bench_base_controller",
                                                      base / "speculators" / "controller.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def uptime() -> str:
    try:
        return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load ?"


def gmean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


class Timed:
    """Wraps a bound method; sums the seconds spent in it."""

    def __init__(self, fn):
        self.fn, self.s, self.cpu = fn, 0.0, 0.0

    def __call__(self, *a, **kw):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.fn(*a, **kw)
        finally:
            self.s += time.perf_counter() - t0
            self.cpu += time.thread_time() - c0


def run_mode(engine, mode: str, sp, prompt: Prompt, n: int, base_mod, own_text: bool = False) -> dict:
    from speculators.sampling import SamplingParams
    engine.set_spec(sp)
    timers = []
    if mode == "auto-base":
        ctl = base_mod.Controller(engine.chain, engine._cost_curve(), base_mod.ControllerParams())
        engine.controller = ctl
    ctl = engine.controller
    if ctl is not None:
        ctl.decide = Timed(ctl.decide)
        ctl.observe = Timed(ctl.observe)
        timers = [ctl.decide, ctl.observe]
    elif engine.chain.speculators:
        engine.chain.draft = Timed(engine.chain.draft)
        timers = [engine.chain.draft]
    forced = None if own_text else prompt.forced
    n_max = n if own_text else min(n, len(prompt.forced))
    res = engine.run(prompt.toks, max_tokens=n_max, sampling=SamplingParams(temperature=0.0), forced=forced)
    st = res.stats
    tps = max(0, st.n_generated - 1) / st.t_gen_s if st.t_gen_s else 0.0
    n_calls = sum(s.n_call_accept for s in st.speculators.values()) if st.speculators else 0
    return {"tps": tps, "steps": st.n_steps, "drafted": st.n_drafted, "accepted": st.n_accepted,
            "dec_s": sum(t.s for t in timers), "dec_cpu_s": sum(t.cpu for t in timers),
            "verifies": n_calls, "tokens": list(res.tokens)}


def bench_model(name: str, path: str, sets: dict[str, list[Prompt]], args, base_mod, modes: list[str]) -> dict:
    from app.cmd_bench import measure_ceiling
    from speculators.engine import Engine, EngineConfig
    from speculators.params import SpecParams
    from speculators.types import parse_types

    cfg = EngineConfig(n_ctx=4096, n_threads=args.threads, reuse_prefix=False, prompt_states=2,
                       cost_cache_dir=str(CACHE / "costcurves"))
    engine = Engine(path, cfg, SpecParams())
    specs = {}
    for m in modes:
        sp = SpecParams()
        sp.types = parse_types("auto" if m == "auto-base" else m) if m != "none" else []
        specs[m] = sp
    out: dict = {"model": name, "path": path, "sets": {}}
    try:
        engine.set_spec(specs["auto"])       # the verify-cost curve: measured (or read) before timing
        for ps in sets.values():
            for p in ps:
                p.toks = engine.prompt_tokens(text=p.text, raw=True)
                p.forced = engine.model.tokenize(p.reply, add_special=False, parse_special=False)
        engine.set_spec(SpecParams())
        first = next(iter(sets.values()))[0]
        engine.run(first.toks, max_tokens=8)
        # a one-token decode, for the record
        ctx = engine.ctx
        engine.prefill(first.toks)
        ts = []
        for i in range(30):
            t0 = time.perf_counter()
            ctx.decode([first.toks[-1]], len(first.toks) + i, logits="last")
            ts.append(time.perf_counter() - t0)
        ctx.clear()
        engine.kv_tokens = []
        out["t1_ms"] = round(statistics.median(ts) * 1e3, 3)
        out["t1_min_ms"] = round(min(ts) * 1e3, 3)
        print(f"\n== {name}: {Path(path).name}, one-token decode {out['t1_ms']} ms (min {out['t1_min_ms']}), "
              f"{uptime()}", flush=True)
        n = args.n if name != "default" else args.n_default
        rounds = args.rounds if name != "default" else args.rounds_default
        for set_name, ps in sets.items():
            recs: list[dict[str, list[dict]]] = []
            for pi, p in enumerate(ps):
                per: dict[str, list[dict]] = {m: [] for m in modes}
                for r in range(rounds):
                    order = modes[r % len(modes):] + modes[:r % len(modes)]
                    for m in order:
                        per[m].append(run_mode(engine, m, specs[m], p, n, base_mod))
                recs.append(per)
                sys.stderr.write(f"\r{name} {set_name}: prompt {pi + 1}/{len(ps)} {uptime()}   ")
                sys.stderr.flush()
            sys.stderr.write("\n")
            out["sets"][set_name] = summarise(name, set_name, ps, recs, modes, engine, measure_ceiling)
            print_set(out["sets"][set_name], modes)
        if not args.no_native:
            out["native"] = native_none(engine, path, sets, args)
    finally:
        engine.close()
    return out


def summarise(model: str, set_name: str, ps: list[Prompt], recs, modes, engine, measure_ceiling) -> dict:
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(ps):
        groups.setdefault(p.kind, []).append(i)
    groups["all"] = list(range(len(ps)))
    res = {"set": set_name, "load": uptime(), "groups": {}}
    for g, ix in groups.items():
        row: dict = {"prompts": len(ix), "modes": {}}
        pr_none = {m: [statistics.median([a["tps"] / b["tps"] for a, b in zip(recs[i][m], recs[i]["none"])
                                          if b["tps"] > 0]) for i in ix] for m in modes}
        for m in modes:
            runs = [x for i in ix for x in recs[i][m]]
            steps = sum(x["steps"] for x in runs)
            drafted = sum(x["drafted"] for x in runs)
            acc = sum(x["accepted"] for x in runs)
            verifies = sum(x["verifies"] for x in runs)
            row["modes"][m] = {
                "tps": round(statistics.median(x["tps"] for x in runs), 1),
                "vs_none": round(gmean(pr_none[m]) or 0.0, 3),
                "dec_ms": round(sum(x["dec_s"] for x in runs) / steps * 1e3, 4) if steps else None,
                "dec_cpu_ms": round(sum(x["dec_cpu_s"] for x in runs) / steps * 1e3, 4) if steps else None,
                "acc": round(acc / drafted, 3) if drafted else None,
                "mean_draft": round(drafted / verifies, 2) if verifies else None,
                "same_text": all(x["tokens"] == recs[i]["none"][0]["tokens"] for i in ix for x in recs[i][m]),
            }
        fixed = [m for m in modes if m in FIXED]
        best = max(fixed, key=lambda m: row["modes"][m]["vs_none"]) if fixed else None
        row["fastest_fixed"] = best
        for a in [m for m in ("auto", "auto-base") if m in modes]:
            if best:
                per_prompt = [statistics.median([x["tps"] / y["tps"] for x, y in zip(recs[i][a], recs[i][best])
                                                 if y["tps"] > 0]) for i in ix]
                row["modes"][a]["vs_fastest_fixed"] = round(gmean(per_prompt) or 0.0, 3)
                row["modes"][a]["vs_fastest_fixed_min"] = round(min(per_prompt), 3)
                # against each prompt's own fastest fixed type (picked by hand per prompt)
                per_best = []
                for i in ix:
                    b = max(fixed, key=lambda m: statistics.median(x["tps"] for x in recs[i][m]))
                    per_best.append(statistics.median([x["tps"] / y["tps"] for x, y in zip(recs[i][a], recs[i][b])
                                                       if y["tps"] > 0]))
                row["modes"][a]["vs_each_prompts_fastest"] = round(gmean(per_best) or 0.0, 3)
        if g == "copy":
            p0 = ps[ix[0]]
            for m in modes:
                md = row["modes"][m]["mean_draft"]
                if md and md >= 1:
                    ceil = measure_ceiling(engine, p0.toks, round(md))
                    row["modes"][m]["ceiling_tps"] = round(ceil, 1)
                    row["modes"][m]["of_ceiling"] = round(row["modes"][m]["tps"] / ceil, 3) if ceil else None
        res["groups"][g] = row
    return res


def print_set(res: dict, modes: list[str]) -> None:
    print(f"-- set {res['set']} ({res['load']})")
    hdr = f"{'group':<10}{'mode':<15}{'tok/s':>8}{'xnone':>7}{'xfixed*':>8}{'xeach':>7}{'dec ms':>8}{'cpu ms':>8}" \
          f"{'acc%':>6}{'draft':>6}{'ceil':>6}  same"
    print(hdr)
    for g, row in res["groups"].items():
        for m in modes:
            d = row["modes"][m]
            f = lambda v, fmt: format(v, fmt) if v is not None else "-"   # noqa: E731
            tag = "*" if m == row.get("fastest_fixed") else ""
            print(f"{g:<10}{(m + tag):<15}{d['tps']:>8.1f}{d['vs_none']:>7.3f}"
                  f"{f(d.get('vs_fastest_fixed'), '.3f'):>8}{f(d.get('vs_each_prompts_fastest'), '.3f'):>7}"
                  f"{f(d['dec_ms'], '.4f'):>8}{f(d['dec_cpu_ms'], '.4f'):>8}{f(d['acc'] * 100 if d['acc'] is not None else None, '.0f'):>6}"
                  f"{f(d['mean_draft'], '.1f'):>6}{f(d.get('of_ceiling'), '.2f'):>6}  "
                  f"{'yes' if d['same_text'] else 'NO'}")
        print()
    sys.stdout.flush()


def native_none(engine, path: str, sets, args) -> dict | None:
    spec = importlib.util.spec_from_file_location("draftlight_native_tool", ROOT / "tools" / "native.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    if not tool.built():
        print("native: llama-server not built (python tools/native.py build): column skipped")
        return None
    nb_spec = importlib.util.spec_from_file_location("draftlight_native_bench", ROOT / "tools" / "native_bench.py")
    nb = importlib.util.module_from_spec(nb_spec)
    nb_spec.loader.exec_module(nb)
    from speculators.params import SpecParams
    p = next(iter(sets.values()))[0]
    n = args.n if Path(path).name.startswith("llama-h") else args.n_default
    ratios, ours_l, nat_l = [], [], []
    for r in range(args.native_rounds):
        nat = nb.native_run(tool.bin_dir(), path, "none", p.text, n, args.threads, None)[0]
        ours = run_mode(engine, "none", SpecParams(), p, n, None, own_text=True)["tps"]
        nat_l.append(nat)
        ours_l.append(ours)
        if nat > 0:
            ratios.append(ours / nat)
    d = {"ours_tps": round(statistics.median(ours_l), 1), "native_tps": round(statistics.median(nat_l), 1),
         "paired": round(statistics.median(ratios), 3) if ratios else None, "load": uptime()}
    print(f"native llama-server none: {d['native_tps']} tok/s, ours {d['ours_tps']}: ours/native paired "
          f"{d['paired']} ({d['load']})")
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few minutes: 3 rounds, 128 tokens, fast model and "
                                                         "default model's held-out set only")
    ap.add_argument("--models", default=None, help="comma list of fast, slow, default (default: all)")
    ap.add_argument("--sets", default="tune,heldout", help="comma list of prompt sets (bench/auto-SET.txt)")
    ap.add_argument("-n", type=int, default=None, help="tokens per run, small models (default 256)")
    ap.add_argument("--n-default", type=int, default=None, help="tokens per run, default model (default 128)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, small models (default 5)")
    ap.add_argument("--rounds-default", type=int, default=None, help="rounds, default model (default 3)")
    ap.add_argument("--native-rounds", type=int, default=3)
    ap.add_argument("--kinds", default=None, help="comma list of prompt kinds to keep (default: all)")
    ap.add_argument("--modes", default=None, help="comma list (default: none, auto, every fixed n-gram type)")
    ap.add_argument("--base", help="another checkout whose controller runs as the row auto-base")
    ap.add_argument("--no-native", action="store_true")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the figures as JSON here")
    a = ap.parse_args(argv)
    q = a.quick
    a.n = a.n or (128 if q else 256)
    a.n_default = a.n_default or (64 if q else 128)
    a.rounds = a.rounds or (3 if q else 5)
    a.rounds_default = a.rounds_default or (2 if q else 3)
    if q:
        a.native_rounds = min(a.native_rounds, 2)
    models = (a.models or ("fast,default" if q else "fast,slow,default")).split(",")
    sets = {s: read_set(ROOT / "bench" / f"auto-{s}.txt") for s in a.sets.split(",")}
    if a.kinds:
        sets = {k: [p for p in v if p.kind in a.kinds.split(",")] for k, v in sets.items()}
        sets = {k: v for k, v in sets.items() if v}
    modes = a.modes.split(",") if a.modes else ["none", "auto"] + list(FIXED)
    base_mod = None
    if a.base:
        base_mod = load_base_controller(Path(a.base))
        modes.insert(2, "auto-base")
    from app.cpu_check import apply
    apply("auto")
    report = {"argv": sys.argv[1:], "load_start": uptime(), "models": []}
    print(f"bench_auto: models {','.join(models)}, sets {','.join(sets)}, modes {','.join(modes)}, "
          f"{a.rounds} rounds x {a.n} tokens (default model {a.rounds_default} x {a.n_default}); {uptime()}")
    for m in models:
        if m == "default":
            from app.models import ensure_default_model
            path = str(ensure_default_model())
            msets = {k: v for k, v in sets.items() if not q or k == "heldout"} or sets
        else:
            path = str(tiny_model(m))
            msets = sets
        report["models"].append(bench_model(m, path, msets, a, base_mod, modes))
    report["load_end"] = uptime()
    if a.json:
        for mdl in report["models"]:
            for s in mdl["sets"].values():
                for g in s["groups"].values():
                    for d in g["modes"].values():
                        d.pop("tokens", None)
        Path(a.json).write_text(json.dumps(report, indent=2))
    print(f"\ndone; {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
