"""``draftlight bench``: speculative types side by side, in one process.

For the same prompts it runs llama-cpp-python's own plain generation (the
reference speed), ``none`` through draftlight's loop, and every listed
type, then reports per type: tokens/s, speedup over ``none``, drafted and
accepted tokens, mean acceptance length, drafting cost per call, whether
the output equals ``none``'s, and the *ceiling*: the tokens/s of one
batched verify at full acceptance for the same draft length, measured on
this machine — so a speedup can be read against what is possible here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import parse_types

from . import config as config_mod
from .options import add_model_args, add_spec_args, model_options_from_args, spec_from_args
from .runtime import engine_config, resolve_model_path, stderr_progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--prompt-file", action="append", default=[],
                   help="prompts, separated by lines of '---' (repeatable)")
    p.add_argument("-p", "--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("-n", "--max-tokens", type=int, default=128, dest="max_tokens",
                   help="tokens to generate per prompt (default 128)")
    p.add_argument("--raw", action="store_true", help="plain prompts, without the chat template")
    p.add_argument("--repeat", type=int, default=1, help="repeat the prompt list this many times (default 1)")
    p.add_argument("--rounds", type=int, default=3,
                   help="time each prompt this many times and keep the fastest (default 3)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip llama-cpp-python's own generation as a reference")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--lookup-learn", action="append", default=[], metavar="FILE", dest="lookup_learn",
                   help="measure what a learned dynamic lookup cache brings: first answer the prompts of "
                        "FILE (separated by lines of '---'; repeatable) to fill a fresh dynamic cache, then "
                        "run the bench prompts with ngram-cache without and with it")
    p.add_argument("--lookup-learn-prompt", action="append", default=[], metavar="TEXT",
                   dest="lookup_learn_prompt", help="a prompt to learn from (repeatable; see --lookup-learn)")
    add_model_args(p)
    add_spec_args(p)


def load_prompts(args: argparse.Namespace) -> list[str]:
    prompts = _read_prompts(args.prompt, args.prompt_file)
    if not prompts:
        from .cli import CliError
        raise CliError("no prompts: pass --prompt-file FILE or --prompt TEXT")
    return prompts


def _read_prompts(texts: list[str], files: list[str]) -> list[str]:
    prompts = [p for p in texts if p.strip()]
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        parts = [part.strip("\n") for part in _split(text)]
        prompts.extend(p for p in parts if p.strip())
    return prompts


def _split(text: str) -> list[str]:
    parts, cur = [], []
    for line in text.splitlines():
        if line.strip() == "---":
            parts.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    parts.append("\n".join(cur))
    return parts


@dataclass
class Row:
    name: str
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    draft_calls: int = 0
    draft_us: float = 0.0
    equal_to_none: bool | None = None
    mean_draft_len: float = 0.0
    ceiling_tps: float | None = None
    outputs: list[list[int]] = field(default_factory=list)
    per_speculator: dict = field(default_factory=dict)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self, base_tps: float | None) -> dict:
        return {
            "name": self.name,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tps, 2),
            "speedup_vs_none": round(self.tps / base_tps, 3) if base_tps else None,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "mean_acceptance_length": round(self.tokens / self.steps, 3) if self.steps else None,
            "draft_ms_per_call": round(self.draft_us / self.draft_calls / 1000, 4) if self.draft_calls else None,
            "mean_draft_len": round(self.mean_draft_len, 2),
            "ceiling_tokens_per_s": round(self.ceiling_tps, 2) if self.ceiling_tps else None,
            "fraction_of_ceiling": round(self.tps / self.ceiling_tps, 3) if self.ceiling_tps else None,
            "equal_to_none": self.equal_to_none,
            "speculators": self.per_speculator,
        }


def _timed_generation(engine, prompts, max_tokens, rounds: int = 1) -> Row:
    """Run every prompt; time only token generation (prompt decoding excluded).

    With ``rounds`` > 1 each prompt runs that many times and the fastest
    run counts, which keeps a busy machine's stalls out of the figures.
    """
    row = Row(engine.chain.speculators and ",".join(s.name for s in engine.chain.speculators) or "none")
    greedy = SamplingParams(temperature=0.0)
    per: dict[str, dict] = {}
    for prompt in prompts:
        res = min((engine.run(prompt, max_tokens=max_tokens, sampling=greedy) for _ in range(max(1, rounds))),
                  key=lambda r: r.stats.t_gen_s)
        s = res.stats
        # time from the first token on (as llama-cpp-python's loop below)
        row.tokens += max(0, s.n_generated - 1)
        row.seconds += s.t_gen_s
        row.drafted += s.n_drafted
        row.accepted += s.n_accepted
        row.steps += s.n_steps
        row.outputs.append(res.tokens)
        for name, st in s.speculators.items():
            d = per.setdefault(name, {"drafts": 0, "drafted": 0, "accepted": 0, "calls": 0, "draft_us": 0.0,
                                      "process_us": 0.0})
            d["process_us"] += st.t_process_us
            d["drafts"] += st.n_gen_drafts
            d["drafted"] += st.n_gen_tokens
            d["accepted"] += st.n_acc_tokens
            d["calls"] += st.n_call_draft
            d["draft_us"] += st.t_draft_us
            row.draft_calls += st.n_call_draft
            row.draft_us += st.t_draft_us
    row.per_speculator = {
        n: {**d, "draft_ms_per_call": round(d["draft_us"] / d["calls"] / 1000, 4) if d["calls"] else None,
            "draft_ms_per_token": round(d["draft_us"] / d["drafted"] / 1000, 4) if d["drafted"] else None,
            # the drafter's whole cost per drafted token: drafting plus mirroring the target's batches
            "cost_ms_per_drafted_token": round((d["draft_us"] + d["process_us"]) / d["drafted"] / 1000, 4)
            if d["drafted"] else None}
        for n, d in per.items()}
    drafts = sum(d["drafts"] for d in per.values())
    row.mean_draft_len = row.drafted / drafts if drafts else 0.0
    return row


def lookup_learn_effect(engine, learn_prompts: list[list[int]], prompts: list[list[int]], max_tokens: int,
                        spec: SpecParams | None = None) -> tuple[Row, Row, dict]:
    """What a learned dynamic cache brings to ngram-cache: (without, with, details).

    First the ``learn_prompts`` are answered (greedy) with ngram-cache and a
    fresh, in-memory dynamic cache that learns after each reply as the app's
    lookup store does (:class:`app.lookup_store.Learner`); the user's cache
    folder is not touched. Then ``prompts`` are run twice with ngram-cache:
    with an empty dynamic cache, and with the learned one (frozen). Both
    runs use the same static cache (``spec``'s -lcs, if any), so the only
    difference is the dynamic cache.
    """
    from speculators.ngram_cache import NgramCache
    from speculators.types import SpecType

    from .lookup_store import Learner, LookupStore, learn_tokens

    sp = (spec or SpecParams()).copy()
    sp.types = [SpecType.NGRAM_CACHE]
    sp.ngram_cache.lookup_cache_dynamic = None
    static = None
    if sp.ngram_cache.lookup_cache_static:
        from speculators.ngram_cache import load_lookup_cache
        static = load_lookup_cache(sp.ngram_cache.lookup_cache_static, "static")
    greedy = SamplingParams(temperature=0.0)
    learned = NgramCache()
    learner = Learner()
    engine.set_spec(sp, resources={"lookup_static": static or NgramCache(), "lookup_dynamic": learned})
    n_learn_tokens = 0
    for p in learn_prompts:
        res = engine.run(p, max_tokens=max_tokens, sampling=greedy)
        seq = list(p) + list(res.tokens)
        learn_tokens(learned, seq, learner.new_from(seq))
        n_learn_tokens += len(res.tokens)
    rows = []
    sources = {}
    for name, dyn in (("ngram-cache, no dynamic", NgramCache()), ("ngram-cache, learned dyn", learned)):
        engine.set_spec(sp, resources={"lookup_static": static or NgramCache(), "lookup_dynamic": dyn})
        row = _timed_generation(engine, prompts, max_tokens)
        row.name = name
        rows.append(row)
        sources[name] = LookupStore.contribution(engine)
    details = {
        "learn_prompts": len(learn_prompts),
        "learn_tokens": n_learn_tokens,
        "dynamic_ngrams": len(learned),
        "dynamic_entries": learned.n_entries,
        "without": {"drafted": rows[0].drafted, "accepted": rows[0].accepted,
                    "sources": sources[rows[0].name]},
        "with": {"drafted": rows[1].drafted, "accepted": rows[1].accepted,
                 "sources": sources[rows[1].name]},
    }
    return rows[0], rows[1], details


def measure_ceiling(engine, prompt: list[int], draft_len: int, reps: int = 8) -> float:
    """Tokens/s if every draft of ``draft_len`` tokens were accepted.

    Decodes batches of ``draft_len + 1`` tokens after the prompt and samples
    every row, as a verify step does (the fastest of ``reps`` batches).
    """
    import numpy as np
    ctx = engine.ctx
    engine.kv_tokens = []
    ctx.clear()
    ctx.decode(prompt, 0, logits="last")
    n = draft_len + 1
    pos = len(prompt)
    if pos + n * reps >= ctx.n_ctx:
        reps = max(1, (ctx.n_ctx - pos - 1) // n)
    batch = [int(np.argmax(ctx.logits(-1)))] * n
    best = float("inf")
    for r in range(reps):
        t0 = time.perf_counter()
        ctx.decode(batch, pos + r * n, logits="all")
        for i in range(n):
            int(np.argmax(ctx.logits(i)))
        best = min(best, time.perf_counter() - t0)
    ctx.clear()
    return n / best if best > 0 else 0.0


def _llama_cpp_python_once(llm, prompt: list[int], max_tokens: int) -> tuple[float, list[int]]:
    """llama-cpp-python's own greedy generation; (seconds after the first token, tokens)."""
    llm.reset()
    out: list[int] = []
    t_first = None
    for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        if llm._model.token_is_eog(tok) if hasattr(llm._model, "token_is_eog") else tok == llm.token_eos():
            break
        out.append(tok)
        if len(out) >= max_tokens:
            break
    return (time.perf_counter() - t_first if t_first is not None else 0.0), out


def compare_with_llama_cpp_python(engine, model_path: str, cfg, prompts: list[list[int]], max_tokens: int,
                                  rounds: int) -> tuple[Row, Row]:
    """``none`` through draftlight's loop and llama-cpp-python's own loop, interleaved.

    Both generate the same prompts greedily in this process, alternating
    run by run, and each prompt counts its fastest of ``rounds`` runs, so a
    busy machine slows both alike. Returns (llama-cpp-python row, none row).
    """
    from llama_cpp import Llama
    llm = Llama(model_path=model_path, n_ctx=cfg.n_ctx, n_threads=cfg.n_threads or None,
                n_threads_batch=cfg.n_threads or None, n_gpu_layers=cfg.n_gpu_layers,
                n_batch=cfg.n_batch, verbose=False)
    base = Row("llama-cpp-python")
    none = Row("none")
    greedy = SamplingParams(temperature=0.0)
    engine.set_spec(SpecParams())
    try:
        for prompt in prompts:
            best_b, best_n = None, None
            for _ in range(max(1, rounds)):
                t, out = _llama_cpp_python_once(llm, prompt, max_tokens)
                if best_b is None or t < best_b[0]:
                    best_b = (t, out)
                res = engine.run(prompt, max_tokens=max_tokens, sampling=greedy)
                if best_n is None or res.stats.t_gen_s < best_n.stats.t_gen_s:
                    best_n = res
            base.seconds += best_b[0]
            base.tokens += max(0, len(best_b[1]) - 1)
            base.outputs.append(best_b[1])
            none.seconds += best_n.stats.t_gen_s
            none.tokens += max(0, best_n.stats.n_generated - 1)
            none.steps += best_n.stats.n_steps
            none.outputs.append(best_n.tokens)
    finally:
        llm.close() if hasattr(llm, "close") else None
    return base, none


def run(args: argparse.Namespace) -> int:
    from speculators.engine import Engine
    from speculators.ngram_cache import LookupCacheError
    from .cli import CliError

    cfg = config_mod.Config()
    mopts = model_options_from_args(args, cfg.model)
    base_spec = spec_from_args(args, SpecParams())
    spec_types = list(base_spec.types)
    learn_texts = _read_prompts(getattr(args, "lookup_learn_prompt", []) or [],
                                getattr(args, "lookup_learn", []) or [])
    learning = bool(getattr(args, "lookup_learn", None) or getattr(args, "lookup_learn_prompt", None))
    if learning and not learn_texts:
        raise CliError("--lookup-learn: no prompts to learn from")
    if not spec_types and getattr(args, "spec_type", None) is None and not learning:
        raise CliError("pass --spec-type LIST with the types to compare with none")
    if args.max_tokens <= 0:
        raise CliError("--max-tokens must be at least 1")
    texts = load_prompts(args) * max(1, args.repeat)
    model_path = resolve_model_path(mopts, stderr_progress)
    ecfg = engine_config(mopts)
    ecfg.reuse_prefix = False
    engine = Engine(model_path, ecfg, SpecParams())
    report: dict = {"model": model_path, "n_ctx": engine.ctx.n_ctx, "threads": engine.ctx.n_threads,
                    "max_tokens": args.max_tokens, "prompts": len(texts), "rounds": max(1, args.rounds),
                    "rows": []}
    try:
        prompts = [engine.prompt_tokens(text=t, raw=True) if args.raw else engine.prompt_tokens(text=t)
                   for t in texts]
        too_long = [len(p) for p in prompts if len(p) + args.max_tokens >= engine.ctx.n_ctx]
        if too_long:
            raise CliError(f"a prompt of {too_long[0]} tokens plus {args.max_tokens} to generate "
                           f"does not fit the context of {engine.ctx.n_ctx}; raise -c")
        _progress("warming up")
        engine.run(prompts[0], max_tokens=8, sampling=SamplingParams(temperature=0.0))

        rows: list[Row] = []
        rounds = max(1, args.rounds)
        if not args.no_baseline:
            _progress("none and llama-cpp-python, interleaved")
            base_row, none_row = compare_with_llama_cpp_python(engine, model_path, ecfg, prompts,
                                                              args.max_tokens, rounds)
            rows.append(base_row)
        else:
            _progress("none")
            engine.set_spec(SpecParams())
            none_row = _timed_generation(engine, prompts, args.max_tokens, rounds)
            none_row.name = "none"
        rows.append(none_row)
        configs = [[t] for t in spec_types]
        if len(spec_types) > 1:
            configs.append(spec_types)
        for types in configs:
            name = ",".join(t.value for t in types)
            _progress(name)
            sp = base_spec.copy()
            sp.types = parse_types([t.value for t in types])
            engine.set_spec(sp)
            for skipped, why in engine.chain.skipped.items():
                print(f"draftlight: warning: {skipped} is off: {why}", file=sys.stderr)
            row = _timed_generation(engine, prompts, args.max_tokens, rounds)
            row.name = name
            row.equal_to_none = row.outputs == none_row.outputs
            if row.mean_draft_len >= 1:
                row.ceiling_tps = measure_ceiling(engine, prompts[0], round(row.mean_draft_len))
            rows.append(row)
        if learning:
            _progress("lookup: learning")
            learn_prompts = [engine.prompt_tokens(text=t, raw=True) if args.raw else engine.prompt_tokens(text=t)
                             for t in learn_texts]
            too_long = [len(p) for p in learn_prompts if len(p) + args.max_tokens >= engine.ctx.n_ctx]
            if too_long:
                raise CliError(f"a prompt to learn from of {too_long[0]} tokens plus {args.max_tokens} to "
                               f"generate does not fit the context of {engine.ctx.n_ctx}; raise -c")
            without, with_, details = lookup_learn_effect(engine, learn_prompts, prompts, args.max_tokens,
                                                          base_spec)
            for row in (without, with_):
                row.equal_to_none = row.outputs == none_row.outputs
                if row.mean_draft_len >= 1:
                    row.ceiling_tps = measure_ceiling(engine, prompts[0], round(row.mean_draft_len))
                rows.append(row)
            report["lookup_learn"] = details
        base_tps = none_row.tps
        for r in rows:
            if r.name == "llama-cpp-python":
                r.equal_to_none = [o[:len(n)] for o, n in zip(r.outputs, none_row.outputs)] == \
                    [n[:len(o)] for o, n in zip(r.outputs, none_row.outputs)]
        report["rows"] = [r.to_dict(base_tps) for r in rows]
        if rows[0].name == "llama-cpp-python" and rows[0].tps > 0:
            report["none_vs_llama_cpp_python"] = round(base_tps / rows[0].tps, 3)
        report["synthetic"] = bool(base_spec.synth_len is not None or base_spec.synth_rates)
    except LookupCacheError as e:
        raise CliError(str(e)) from None
    finally:
        engine.close()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(report)
    return 0


def _progress(name: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rbench: {name:<60}")
        sys.stderr.flush()


def print_table(report: dict) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 70 + "\r")
    print(f"model: {report['model']}  ctx {report['n_ctx']}  threads {report['threads']}  "
          f"prompts {report['prompts']} × {report['max_tokens']} tokens")
    hdr = f"{'type':<28}{'tok/s':>8}{'speedup':>9}{'drafted':>9}{'accepted':>9}{'acc%':>7}" \
          f"{'mal':>6}{'ms/draft':>9}{'ceiling':>9}{'of ceil':>8}  same"
    print(hdr)
    print("-" * len(hdr))
    for r in report["rows"]:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        acc = r["acceptance_rate"]
        print(f"{r['name'][:27]:<28}{r['tokens_per_s']:>8.1f}{f(r['speedup_vs_none'], '.2f'):>9}"
              f"{r['drafted']:>9}{r['accepted']:>9}{f(acc * 100 if acc is not None else None, '.1f'):>7}"
              f"{f(r['mean_acceptance_length'], '.2f'):>6}{f(r['draft_ms_per_call'], '.3f'):>9}"
              f"{f(r['ceiling_tokens_per_s'], '.1f'):>9}{f(r['fraction_of_ceiling'], '.2f'):>8}  "
              f"{'yes' if r['equal_to_none'] else ('-' if r['equal_to_none'] is None else 'NO')}")
    for r in report["rows"]:
        for name, sp in (r.get("speculators") or {}).items():
            if name.startswith("draft-") and sp.get("cost_ms_per_drafted_token") is not None:
                print(f"{r['name']}: {name} costs {sp['cost_ms_per_drafted_token']:.2f} ms per drafted token "
                      f"(drafting and mirroring the target's batches)")
    if "none_vs_llama_cpp_python" in report:
        print(f"none through draftlight's loop runs at {report['none_vs_llama_cpp_python']:.3f}× "
              f"llama-cpp-python's own generation")
    if report.get("synthetic"):
        print("synthetic acceptance was on: outputs are not valid")
    lk = report.get("lookup_learn")
    if lk:
        w, wo = lk["with"], lk["without"]
        print(f"lookup learning: {lk['learn_prompts']} prompts answered first ({lk['learn_tokens']} tokens) "
              f"filled a dynamic cache of {lk['dynamic_ngrams']} n-grams, {lk['dynamic_entries']} entries")
        print(f"  ngram-cache without it: drafted {wo['drafted']:>6}  accepted {wo['accepted']:>6}")
        print(f"  ngram-cache with it:    drafted {w['drafted']:>6}  accepted {w['accepted']:>6}  "
              f"(from the dynamic cache: {w['sources']['dynamic']['accepted']} accepted of "
              f"{w['sources']['dynamic']['drafted']} drafted)")
