"""``draftlight bench``: speculative types side by side, in one process.

For the same prompts it runs llama-cpp-python's own plain generation (the
reference speed), ``none`` through draftlight's loop, and one row per
``--spec-type`` (default ``auto``), interleaved prompt by prompt and round
by round, each run from a fresh chain, and reports per row (and in the
JSON per prompt, with the adaptive controller's decisions): tokens/s,
speedup over ``none``, drafted and accepted tokens, mean acceptance
length, drafting cost per call, whether the output equals ``none``'s, and
the *ceiling*: the tokens/s of one
batched verify at full acceptance for the same draft length, measured on
this machine — so a speedup can be read against what is possible here.

With ``--same-text`` every draftlight row writes ``none``'s reply to each
prompt (teacher-forced: each position is still sampled, then ``none``'s
token is taken, through the token or stop string that ended it, so every
row ends where ``none`` ended). On quantized weights a batched verify can flip a
near-tie, after which two types write different replies and their speeds
measure different work; forced, they are compared on the same text, and
the *same* column says whether the model's own picks matched ``none``'s at
every position (where not, the JSON lists each flip with its logit margin).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from typing import Sequence

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import parse_types

from . import config as config_mod
from .measure import Row, add_result, finish_row, gen_tps, interleave, new_row, paired_ratios
from .options import add_model_args, add_spec_args, model_options_from_args, spec_from_args
from .runtime import auto_warnings, engine_config, resolve_model_path, stderr_progress


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
    p.add_argument("--same-text", action="store_true", dest="same_text",
                   help="every row writes none's reply to each prompt (teacher-forced), so that types are "
                        "compared on the same text where a quantized model's batched verify flips a near-tie")
    p.add_argument("--lookup-learn", action="append", default=[], metavar="FILE", dest="lookup_learn",
                   help="measure what a learned dynamic lookup cache brings: first answer the prompts of "
                        "FILE (separated by lines of '---'; repeatable) to fill a fresh dynamic cache, then "
                        "run the bench prompts with ngram-cache without and with it")
    p.add_argument("--lookup-learn-prompt", action="append", default=[], metavar="TEXT",
                   dest="lookup_learn_prompt", help="a prompt to learn from (repeatable; see --lookup-learn)")
    add_model_args(p)
    add_spec_args(p, repeatable=True)


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


def _timed_generation(engine, prompts, max_tokens, rounds: int = 1, stop=()) -> Row:
    """Run every prompt; time only token generation (prompt decoding excluded).

    With ``rounds`` > 1 each prompt runs that many times and the fastest
    run counts, which keeps a busy machine's stalls out of the figures.
    """
    row = new_row(engine.chain.speculators and ",".join(s.name for s in engine.chain.speculators) or "none",
                  len(prompts))
    greedy = SamplingParams(temperature=0.0)
    for pi, prompt in enumerate(prompts):
        best, _ = interleave([(row.name, None)], rounds,
                             lambda _n, _p: _one(engine.run(prompt, max_tokens=max_tokens, sampling=greedy, stop=stop)))
        row.outputs[pi] = best[row.name].tokens
        add_result(row, best[row.name])
    finish_row(row)
    return row


def round_counts(stats) -> list:
    """One run's work, for the JSON report: [drafted, accepted, steps, ms spent in drafters
    (drafting and their per-batch upkeep)].

        >>> from speculators.events import GenerationStats
        >>> st = GenerationStats(n_drafted=12, n_accepted=9, n_steps=20)
        >>> round_counts(st)
        [12, 9, 20, 0.0]
    """
    us = sum(s.t_draft_us + s.t_process_us for s in stats.speculators.values())
    return [stats.n_drafted, stats.n_accepted, stats.n_steps, round(us / 1000, 2)]


def same_work(a: dict, b: dict) -> list[int]:
    """The prompts on which two report rows did the same work in every round: as many
    drafted and accepted tokens and as many steps (the time spent in drafters aside). There
    the two rows' ratio is the machine's timing alone, not a difference between them.

        >>> a = {"per_prompt": [{"rounds_work": [[4, 3, 9, 1.5], [4, 3, 9, 1.2]]},
        ...                     {"rounds_work": [[0, 0, 12, 0.0]]}]}
        >>> b = {"per_prompt": [{"rounds_work": [[4, 3, 9, 0.9], [4, 3, 9, 1.0]]},
        ...                     {"rounds_work": [[2, 0, 12, 0.4]]}]}
        >>> same_work(a, b)
        [0]
    """
    out = []
    for i, (da, db) in enumerate(zip(a.get("per_prompt") or [], b.get("per_prompt") or [])):
        wa, wb = da.get("rounds_work"), db.get("rounds_work")
        if wa and wb and len(wa) == len(wb) and all(x[:3] == y[:3] for x, y in zip(wa, wb)):
            out.append(i)
    return out


def _one(res) -> tuple[float, object]:
    return gen_tps(res.stats), res


def flips_of(runs: list[list]) -> list[dict]:
    """The distinct flips of a prompt's forced runs (each run's ``forced_flips``), by
    position: where the model's own pick was not the forced text's, the largest logit
    margin seen there, and in how many runs.

        >>> from speculators.sampling import Flip
        >>> flips_of([[Flip(7, 10, 11, 0.25)], [], [Flip(7, 10, 11, 0.5), Flip(2, 3, 4, 0.0)]])
        [{'index': 2, 'forced': 3, 'own': 4, 'margin': 0.0, 'runs': 1}, {'index': 7, 'forced': 10, 'own': 11, 'margin': 0.5, 'runs': 2}]
    """
    seen: dict[int, dict] = {}
    for flips in runs:
        for f in flips or ():
            d = seen.setdefault(f.index, {"index": f.index, "forced": f.forced, "own": f.own,
                                         "margin": f.margin, "runs": 0})
            d["runs"] += 1
            if f.margin > d["margin"]:
                d["margin"] = f.margin
    return [seen[i] for i in sorted(seen)]


def lookup_learn_effect(engine, learn_prompts: list[list[int]], prompts: list[list[int]], max_tokens: int,
                        spec: SpecParams | None = None, stop=()) -> tuple[Row, Row, dict]:
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
        static = load_lookup_cache(sp.ngram_cache.lookup_cache_static, "static", n_vocab=engine.model.n_vocab)
    greedy = SamplingParams(temperature=0.0)
    learned = NgramCache()
    learner = Learner()
    engine.set_spec(sp, resources={"lookup_static": static or NgramCache(), "lookup_dynamic": learned})
    n_learn_tokens = 0
    for p in learn_prompts:
        res = engine.run(p, max_tokens=max_tokens, sampling=greedy, stop=stop)
        seq = list(p) + list(res.tokens)
        learn_tokens(learned, seq, learner.new_from(seq))
        n_learn_tokens += len(res.tokens)
    rows = []
    sources = {}
    for name, dyn in (("ngram-cache, no dynamic", NgramCache()), ("ngram-cache, learned dyn", learned)):
        engine.set_spec(sp, resources={"lookup_static": static or NgramCache(), "lookup_dynamic": dyn})
        row = _timed_generation(engine, prompts, max_tokens, stop=stop)
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
    engine.prefill(prompt)      # (a prompt state the engine kept is restored)
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
    engine.kv_tokens = []
    return n / best if best > 0 else 0.0


@contextlib.contextmanager
def _placed_like(model):
    """While llama-cpp-python's ``Llama`` loads a model, its model parameters use the CPU's extra
    buffer types as ``model`` (the engine's) does. ``Llama`` has no argument for them and leaves
    llama.cpp's default (all of them), which on a CPU whose AMX kernels crash kills the process at
    its first matrix multiply, and elsewhere would time other kernels than the engine's."""
    import llama_cpp.llama_cpp as raw
    from speculators.llama import place_on_cpu
    default_params, keep = raw.llama_model_default_params, []

    def params():
        p = default_params()
        keep.append(place_on_cpu(p, model.path, model.extra_bufts_mode, model.n_gpu_layers, model.devices))
        return p

    raw.llama_model_default_params = params
    try:
        yield
    finally:
        raw.llama_model_default_params = default_params
        keep.clear()


def _llama_cpp_python_once(llm, prompt: list[int], max_tokens: int,
                           stop: Sequence[str] = ()) -> tuple[float, list[int], int]:
    """llama-cpp-python's own greedy generation, ending where the engine's does (an end-of-
    generation token, a stop string, ``max_tokens``); (seconds after the first token, the
    reply's tokens, the tokens generated: as the engine, those of a stop string count)."""
    llm.reset()
    out: list[int] = []
    t_first = None
    text = b""
    stops = [x.encode() for x in stop]
    longest = max((len(x) for x in stops), default=0)
    for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        if llm._model.token_is_eog(tok) if hasattr(llm._model, "token_is_eog") else tok == llm.token_eos():
            break
        out.append(tok)
        if stop:
            piece = llm.detokenize([tok])
            text += piece
            start = max(0, len(text) - len(piece) - longest)   # only where this token can end one
            hits = [i for i in (text.find(x, start) for x in stops) if i >= 0]
            if hits:
                # as the engine: the reply ends before the stop string; tokens from there go
                t_end, n_generated = time.perf_counter(), len(out)
                while out and len(llm.detokenize(out[:-1])) >= min(hits):
                    out.pop()
                return t_end - t_first, out, n_generated
        if len(out) >= max_tokens:
            break
    return (time.perf_counter() - t_first if t_first is not None else 0.0), out, len(out)


def bench_rows(args: argparse.Namespace, base_spec: SpecParams) -> list[tuple[str, SpecParams]]:
    """(row name, params) for every ``--spec-type`` (none is always measured, first).

    Each ``--spec-type`` gives one row named exactly as given; a single
    comma list also gets one row per type, then the whole list (as before).
    Without ``--spec-type``: ``auto``.
    """
    values = getattr(args, "spec_type", None)
    if values is None:
        values = []
    elif isinstance(values, str):
        values = [values]
    values = [v.strip() for v in values if v.strip()]
    if not values:
        values = [] if (getattr(args, "lookup_learn", None) or getattr(args, "lookup_learn_prompt", None)) \
            else ["auto"]
    names: list[str] = []
    if len(values) == 1 and "," in values[0]:
        types = parse_types(values[0])
        names = [t.value for t in types] + ([",".join(t.value for t in types)] if len(types) > 1 else [])
    else:
        names = values
    rows: list[tuple[str, SpecParams]] = []
    for name in names:
        sp = base_spec.copy()
        sp.types = parse_types(name)
        if not sp.types or name in [n for n, _ in rows]:
            continue  # none is always measured; a repeated value is one row
        sp.validate()
        rows.append((name, sp))
    return rows


def run(args: argparse.Namespace) -> int:
    from speculators.engine import Engine, load_plan_for
    from speculators.ngram_cache import LookupCacheError
    from .cli import CliError

    cfg = config_mod.Config()
    mopts = model_options_from_args(args, cfg.model)
    flags = argparse.Namespace(**{**vars(args), "spec_type": None})
    base_spec = spec_from_args(flags, SpecParams())
    row_specs = bench_rows(args, base_spec)
    learn_texts = _read_prompts(getattr(args, "lookup_learn_prompt", []) or [],
                                getattr(args, "lookup_learn", []) or [])
    learning = bool(getattr(args, "lookup_learn", None) or getattr(args, "lookup_learn_prompt", None))
    if learning and not learn_texts:
        raise CliError("--lookup-learn: no prompts to learn from")
    if args.max_tokens <= 0:
        raise CliError("--max-tokens must be at least 1")
    same_text = bool(getattr(args, "same_text", False))
    if same_text and (base_spec.synth_len is not None or base_spec.synth_rates):
        raise CliError("--same-text cannot be used with synthetic acceptance (its output is not the model's)")
    texts = load_prompts(args) * max(1, args.repeat)
    model_path = resolve_model_path(mopts, stderr_progress)
    ecfg = engine_config(mopts, stderr_progress)
    # every run decodes its prompt from scratch, as a first message does; the prompt at hand's
    # state after that prefill is kept and restored for its other runs (the same memory and
    # logits, so the same text): a prompt is decoded once, not once a round and row (and the
    # ceilings' prompt once for all rows)
    ecfg.reuse_prefix = False
    ecfg.prompt_states = 2
    # the target loaded as the chat and generate load it for these types (its MTP layers,
    # recurrent-state snapshots): every row rolls its drafts back as it would there
    plan = load_plan_for(model_path, [sp for _, sp in row_specs])
    ecfg.load_mtp, ecfg.n_rs_seq = plan.load_mtp, plan.n_rs_seq
    engine = Engine(model_path, ecfg, SpecParams())
    report: dict = {"model": model_path, "n_ctx": engine.ctx.n_ctx, "threads": engine.ctx.n_threads,
                    "max_tokens": args.max_tokens, "prompts": len(texts), "rounds": max(1, args.rounds),
                    "rows": []}
    if engine.model.is_recurrent or engine.model.is_hybrid or plan.load_mtp:
        # how the target was loaded for these rows (as the chat loads it for each of them)
        report["load_plan"] = {"load_mtp": plan.load_mtp, "n_rs_seq": engine.n_rs_seq}
    llm = None
    try:
        prompts = [engine.prompt_tokens(text=t, raw=True) if args.raw else engine.prompt_tokens(text=t)
                   for t in texts]
        too_long = [len(p) for p in prompts if len(p) + args.max_tokens >= engine.ctx.n_ctx]
        if too_long:
            raise CliError(f"a prompt of {too_long[0]} tokens plus {args.max_tokens} to generate "
                           f"does not fit the context of {engine.ctx.n_ctx}; raise -c")
        greedy = SamplingParams(temperature=0.0)
        # a model without a chat template chats through a transcript: its replies end at the
        # stop string, as in the chat (without it the model goes on writing both sides)
        stop = () if args.raw else tuple(engine.template.stop_strings)
        # every row's chain is built once first: type errors surface before any timing,
        # and auto's verify-cost curve is measured (or read from the cache) here
        for name, sp in row_specs:
            engine.set_spec(sp)
            for skipped, why in engine.chain.skipped.items():
                print(f"draftlight: warning: {name}: {skipped} is off: {why}", file=sys.stderr)
            for warning in auto_warnings(sp, engine.auto_plan):
                print(f"draftlight: warning: {name}: {warning}", file=sys.stderr)
            if engine.auto_plan:
                report.setdefault("auto_plan", {})[name] = [list(c) for c in engine.auto_plan]
            if engine.cost_curve is not None:
                report["cost_curve"] = {"source": engine.cost_curve.source,
                                        "rel": engine.cost_curve.to_list(16),
                                        "measure_s": round(engine.cost_curve.measure_s, 3)}
        engine.set_spec(SpecParams())
        _progress("warming up")
        engine.run(prompts[0], max_tokens=8, sampling=greedy)

        rounds = max(1, args.rounds)
        configs: list[tuple[str, SpecParams | None]] = []
        if not args.no_baseline:
            from llama_cpp import Llama
            # the engine's own threads and batch (llama-cpp-python's default is half the cores)
            threads = engine.ctx.n_threads
            # and the engine's weight placement on the CPU (its extra buffer types as probed)
            with _placed_like(engine.model):
                llm = Llama(model_path=model_path, n_ctx=ecfg.n_ctx, n_threads=threads, n_threads_batch=threads,
                            n_gpu_layers=ecfg.n_gpu_layers, n_batch=ecfg.n_batch, verbose=False)
            configs.append(("llama-cpp-python", None))
        configs.append(("none", SpecParams()))
        configs.extend(row_specs)
        rows = {name: new_row(name, len(prompts)) for name, _ in configs}
        per_prompt: dict[str, list[dict]] = {name: [] for name, _ in configs}
        # interleaved: every prompt runs every row in turn, round after round, each run from a
        # fresh chain (nothing learned from an earlier run of the same prompt); the fastest counts
        # Besides the fastest run, each round's runs (back to back) give a paired ratio to none's
        # run of the same round; their median follows a busy machine's drifts less than the ratio
        # of two fastest runs does.
        paired: dict[str, list[list[float]]] = {name: [] for name, _ in configs}

        forced: list[int] | None = None
        flip_log: dict[str, list] = {}  # per row: each forced run's flips, for the prompt at hand
        round_work: dict[str, list[list]] = {}   # per row: each round's work (round_counts), the same

        def run_one(name: str, sp: SpecParams | None, prompt: list[int]) -> tuple[float, object]:
            if sp is None:
                t, out, n_gen = _llama_cpp_python_once(llm, prompt, args.max_tokens, stop)
                return (max(0, n_gen - 1) / t if t else 0.0), (t, out, n_gen)
            engine.set_spec(sp)
            res = engine.run(prompt, max_tokens=args.max_tokens, sampling=greedy, stop=stop, forced=forced)
            if forced is not None:
                flip_log.setdefault(name, []).append(res.stats.forced_flips)
            round_work.setdefault(name, []).append(round_counts(res.stats))
            return _one(res)

        for pi, prompt in enumerate(prompts):
            round_work.clear()
            if same_text:
                # none's own reply, which every row then writes
                _progress(f"prompt {pi + 1}/{len(prompts)}, none's text")
                engine.set_spec(SpecParams())
                # what it wrote through its end (the end-of-turn token, or the stop string's tokens):
                # forced to that too, every row ends its reply where none's ended
                forced = list(engine.run(prompt, max_tokens=args.max_tokens, sampling=greedy, stop=stop).written)
                flip_log.clear()
            best, per_round = interleave(
                configs, rounds, lambda name, sp: run_one(name, sp, prompt),
                progress=lambda done, total, what: _progress(f"prompt {pi + 1}/{len(prompts)}, {what}"))
            for name, _ in configs:
                paired[name].append(paired_ratios(per_round, name))
            for name, sp in configs:
                row = rows[name]
                if sp is None:
                    t, out, n_gen = best[name]
                    n = max(0, n_gen - 1)
                    row.seconds += t
                    row.tokens += n
                    row.outputs[pi] = out
                    per_prompt[name].append({"tokens": n, "seconds": round(t, 4),
                                             "tokens_per_s": round(n / t, 2) if t else 0.0})
                    continue
                res = best[name]
                row.outputs[pi] = res.tokens
                per_prompt[name].append(add_result(row, res))
                # every round's speed, so that any two rows can be paired round by round (auto
                # against a fixed type, not only against none)
                per_prompt[name][-1]["rounds_tokens_per_s"] = [round(x, 2) for x in per_round[name]]
                # and what each round did: a round slower than its row's others either did other
                # work (drafted, verified or asked its drafters for more) or the machine was slower
                per_prompt[name][-1]["rounds_work"] = round_work.get(name, [])
                if same_text:
                    per_prompt[name][-1]["flips"] = flips_of(flip_log.get(name, []))
        none_row = rows["none"]
        for name, _ in configs:
            row = rows[name]
            finish_row(row)
            for pi, d in enumerate(per_prompt[name]):
                base = per_prompt["none"][pi]["tokens_per_s"]
                d["index"] = pi
                d["speedup_vs_none"] = round(d["tokens_per_s"] / base, 3) if base else None
                d["speedup_vs_none_paired"] = round(statistics.median(paired[name][pi]), 3) \
                    if paired[name][pi] else None
                if name == "llama-cpp-python":
                    d["equal_to_none"] = row.outputs[pi] == none_row.outputs[pi]
                elif name != "none":
                    # forced, every output is none's: what counts is whether the model's own
                    # picks were none's at every position
                    d["equal_to_none"] = not d["flips"] if same_text else row.outputs[pi] == none_row.outputs[pi]
            row.per_prompt = per_prompt[name]
            if name not in ("none", "llama-cpp-python"):
                row.equal_to_none = all(d["equal_to_none"] for d in row.per_prompt)
                if row.mean_draft_len >= 1:
                    row.ceiling_tps = measure_ceiling(engine, prompts[0], round(row.mean_draft_len))
        ordered = [rows[name] for name, _ in configs]
        if learning:
            _progress("lookup: learning")
            learn_prompts = [engine.prompt_tokens(text=t, raw=True) if args.raw else engine.prompt_tokens(text=t)
                             for t in learn_texts]
            too_long = [len(p) for p in learn_prompts if len(p) + args.max_tokens >= engine.ctx.n_ctx]
            if too_long:
                raise CliError(f"a prompt to learn from of {too_long[0]} tokens plus {args.max_tokens} to "
                               f"generate does not fit the context of {engine.ctx.n_ctx}; raise -c")
            without, with_, details = lookup_learn_effect(engine, learn_prompts, prompts, args.max_tokens,
                                                          base_spec, stop=stop)
            for row in (without, with_):
                row.equal_to_none = row.outputs == none_row.outputs
                if row.mean_draft_len >= 1:
                    row.ceiling_tps = measure_ceiling(engine, prompts[0], round(row.mean_draft_len))
                ordered.append(row)
            report["lookup_learn"] = details
        base_tps = none_row.tps
        if "llama-cpp-python" in rows:
            lcp = rows["llama-cpp-python"]
            lcp.equal_to_none = all(d.get("equal_to_none") for d in lcp.per_prompt)
        report["rows"] = [r.to_dict(base_tps) for r in ordered]
        for r in report["rows"]:
            if r["name"] == "auto":
                # the prompts where Automatic did what another row did, round for round
                r["same_work_as"] = {o["name"]: same_work(r, o) for o in report["rows"]
                                     if o is not r and o["name"] != "llama-cpp-python" and o.get("per_prompt")}
        cm = engine.cost_model
        if cm is not None and "cost_curve" in report:
            # the curve as the steps of this run refined it
            report["cost_curve"]["online"] = [round(cm.rel(k), 4) for k in range(17)]
            report["cost_curve"]["t1_ms"] = round(cm.t1_s * 1000, 3)
        if ordered[0].name == "llama-cpp-python" and ordered[0].tps > 0:
            report["none_vs_llama_cpp_python"] = round(base_tps / ordered[0].tps, 3)
        report["synthetic"] = bool(base_spec.synth_len is not None or base_spec.synth_rates)
        report["same_text"] = same_text
    except LookupCacheError as e:
        raise CliError(str(e)) from None
    finally:
        if llm is not None and hasattr(llm, "close"):
            llm.close()
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
    for r in report["rows"]:
        pp = r.get("per_prompt") or []
        if r["name"] in ("none", "llama-cpp-python") or not pp:
            continue
        sp = [d.get("speedup_vs_none") for d in pp if d.get("speedup_vs_none") is not None]
        line = f"{r['name']}: per prompt × none: " + " ".join(f"{x:.2f}" for x in sp)
        if sp:
            line += f"  (min {min(sp):.2f})"
        pr = [d.get("speedup_vs_none_paired") for d in pp if d.get("speedup_vs_none_paired") is not None]
        if pr and report.get("rounds", 1) > 1:
            line += "; median of paired rounds: " + " ".join(f"{x:.2f}" for x in pr) + f"  (min {min(pr):.2f})"
        if r.get("controller") is not None:
            quiet = sum(1 for d in pp if d.get("controller") and d["controller"]["drafted"] == 0)
            c = r["controller"]
            line += (f"; controller: {c['n_drafted']} of {c['n_steps']} steps drafted ({c['n_cut']} cut), "
                     f"{c['n_skipped']} skipped, {quiet} of {len(pp)} prompts without a draft")
        print(line)
    for r in report["rows"]:
        sw = r.get("same_work_as")
        n = len(r.get("per_prompt") or [])
        if sw and n > 1:
            parts = [f"{name} on {len(ix)} of {n}" + (f" ({' '.join(str(i) for i in ix)})" if 0 < len(ix) < n else "")
                     for name, ix in sw.items()]
            print(f"{r['name']} did the same work (drafted, accepted, steps, every round) as "
                  + ", ".join(parts) + ": on those prompts the two rows' ratio is the machine's timing alone")
    if report.get("same_text"):
        print("--same-text: every row wrote none's reply to each prompt; 'same' says whether the model's "
              "own pick was none's at every position")
        for r in report["rows"]:
            flips = [f for d in r.get("per_prompt") or [] for f in d.get("flips") or ()]
            if flips:
                print(f"  {r['name']}: {len(flips)} positions where it was not (largest logit margin "
                      f"{max(f['margin'] for f in flips):.3f})")
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
