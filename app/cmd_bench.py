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

This module is the command: its arguments, the rows it measures and the order of the work; the
parts are in :mod:`app.bench` (prompts, the llama-cpp-python reference, timed runs, the
interleaved comparison, lookup learning, the report).
"""

from __future__ import annotations

import argparse
import json
import sys

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import parse_types

from . import config as config_mod
from .bench.compare import Comparison, prepare_rows
from .bench.lookup_learn import learning_rows, lookup_learn_effect
from .bench.prompts import read_prompts as _read_prompts
from .bench.prompts import tokenize_prompts
from .bench.reference import llama_cpp_python_once as _llama_cpp_python_once
from .bench.reference import open_reference
from .bench.reference import placed_like as _placed_like
from .bench.report import flips_of, print_table, same_work, summarise
from .bench.report import progress as _progress
from .bench.runs import measure_ceiling, round_counts
from .options import add_model_args, add_spec_args, model_options_from_args, spec_from_args
from .runtime import engine_config, resolve_model_path, stderr_progress

#: the names other modules and tests import from here (the parts live in app.bench)
__all__ = [
    "add_arguments", "load_prompts", "bench_rows", "run", "print_table", "same_work", "flips_of",
    "round_counts", "measure_ceiling", "lookup_learn_effect", "_read_prompts", "_placed_like",
    "_llama_cpp_python_once",
]


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


def _options(args: argparse.Namespace) -> tuple[SpecParams, list[tuple[str, SpecParams]], list[str], bool]:
    """(the flags' params, the rows' params, the prompts to learn from, same text), checked:
    a :class:`~app.cli.CliError` for what cannot be run."""
    from .cli import CliError

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
    return base_spec, row_specs, learn_texts, same_text


def _open_engine(mopts, row_specs: list[tuple[str, SpecParams]]):
    """(the engine, the model's path, its config, the load plan): the target loaded as the chat
    and generate load it for these rows' types."""
    from speculators.engine import Engine, load_plan_for

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
    return Engine(model_path, ecfg, SpecParams()), model_path, ecfg, plan


def run(args: argparse.Namespace) -> int:
    """Measure every row on the prompts and print the report (JSON with ``--json``)."""
    from speculators.ngram_cache import LookupCacheError
    from .cli import CliError

    mopts = model_options_from_args(args, config_mod.Config().model)
    base_spec, row_specs, learn_texts, same_text = _options(args)
    texts = load_prompts(args) * max(1, args.repeat)
    engine, model_path, ecfg, plan = _open_engine(mopts, row_specs)
    report: dict = {"model": model_path, "n_ctx": engine.ctx.n_ctx, "threads": engine.ctx.n_threads,
                    "max_tokens": args.max_tokens, "prompts": len(texts), "rounds": max(1, args.rounds),
                    "rows": []}
    if engine.model.is_recurrent or engine.model.is_hybrid or plan.load_mtp:
        # how the target was loaded for these rows (as the chat loads it for each of them)
        report["load_plan"] = {"load_mtp": plan.load_mtp, "n_rs_seq": engine.n_rs_seq}
    llm = None
    try:
        prompts = tokenize_prompts(engine, texts, args.raw, args.max_tokens)
        # a model without a chat template chats through a transcript: its replies end at the
        # stop string, as in the chat (without it the model goes on writing both sides)
        stop = () if args.raw else tuple(engine.template.stop_strings)
        prepare_rows(engine, row_specs, report)
        engine.set_spec(SpecParams())
        _progress("warming up")
        engine.run(prompts[0], max_tokens=8, sampling=SamplingParams(temperature=0.0))
        if not args.no_baseline:
            llm = open_reference(engine, model_path, ecfg)
        cmp = Comparison(engine, llm, row_specs, len(prompts), args.max_tokens, stop, max(1, args.rounds), same_text)
        for pi, prompt in enumerate(prompts):
            cmp.measure_prompt(pi, prompt)
        ordered = cmp.finish(prompts[0])
        if learn_texts:
            ordered += learning_rows(engine, learn_texts, prompts, args.raw, args.max_tokens, base_spec, stop,
                                     cmp.rows["none"], report)
        summarise(report, ordered, cmp.rows["none"], engine, base_spec, same_text)
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
