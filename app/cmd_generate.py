"""``draftlight generate``: one prompt, streamed to stdout (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from speculators.events import FinishEvent, StepEvent
from speculators.ngram_cache import LookupCacheError
from speculators.params import SpecParams
from speculators.auto import uses_type
from speculators.types import SpecType

from . import config as config_mod
from .options import (add_model_args, add_sampling_args, add_spec_args, default_spec, model_options_from_args,
                      sampling_from_args, spec_types_configured)
from .lookup_store import DEFAULT_MAX_BYTES, LookupStore, LookupStoreError
from .runtime import auto_warnings, open_engine, stderr_progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--prompt", help="the prompt text")
    p.add_argument("-f", "--prompt-file", help="read the prompt from a file ('-' for stdin)")
    p.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    p.add_argument("--system", help="system prompt (chat mode)")
    p.add_argument("-n", "--max-tokens", type=int, dest="max_tokens", help="maximum tokens to generate (default 512)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--stats", action="store_true", help="print speculation statistics to stderr at the end")
    p.add_argument("--no-config", action="store_true", help="ignore config.toml")
    add_model_args(p)
    add_sampling_args(p)
    add_spec_args(p)
    g = p.add_argument_group("lookup caches (ngram-cache)")
    g.add_argument("--no-lookup-store", action="store_true", dest="no_lookup_store",
                   help="with ngram-cache, neither load nor update the model's lookup caches in the "
                        "user data dir (only -lcs/-lcd are read, as by llama.cpp's server)")
    g.add_argument("--lookup-max-mib", type=float, dest="lookup_max_mib", metavar="MIB",
                   help=f"size cap of the dynamic lookup cache (default {DEFAULT_MAX_BYTES >> 20} MiB)")


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise ValueError("give either --prompt or --prompt-file, not both")
    if args.prompt_file is not None:
        if args.prompt_file == "-":
            text = sys.stdin.read()
        else:
            with open(args.prompt_file, encoding="utf-8") as f:
                text = f.read()
    elif args.prompt is not None:
        text = args.prompt
    else:
        from .cli import CliError
        raise CliError("no prompt: pass --prompt TEXT or --prompt-file FILE")
    if not text.strip():
        from .cli import CliError
        raise CliError("the prompt is empty")
    return text


def run(args: argparse.Namespace) -> int:
    cfg = config_mod.load_for_command(args.no_config)
    text = read_prompt(args)
    # no --spec-type and no types in config.toml: auto
    spec = default_spec(args, cfg.spec, from_file=not args.no_config and spec_types_configured())
    sampling = sampling_from_args(args, cfg.sampling)
    mopts = model_options_from_args(args, cfg.model)
    max_tokens, use_store, max_mib = _limits(args, spec)
    try:
        # with the lookup store, the chain is built once the store has loaded the caches
        engine = open_engine(mopts, spec, progress=stderr_progress, build_chain=not use_store)
    except LookupCacheError as e:
        from .cli import CliError
        raise CliError(str(e)) from None
    store = None
    try:
        if use_store:
            store = _open_store(engine, spec, max_mib)
        for name, why in engine.chain.skipped.items():
            print(f"draftlight: warning: {name} is off: {why}", file=sys.stderr)
        for warning in auto_warnings(spec, engine.auto_plan):
            print(f"draftlight: warning: {warning}", file=sys.stderr)
        prompt = _prompt_tokens(engine, args, cfg, text)
        out = sys.stdout
        stop = list(args.stop) + ([] if args.raw else list(engine.template.stop_strings))
        result = _stream(engine, prompt, out, max_tokens=max_tokens, sampling=sampling, stop=stop, quiet=args.json)
        lookup = None
        if store is not None:
            lookup = _learn_and_save(store, engine, prompt, result)
        if args.json:
            d = result.to_dict()
            if lookup is not None:
                d["lookup"] = lookup
            json.dump(d, out, ensure_ascii=False)
        out.write("\n")
        if result.stats.synthetic:
            print("draftlight: warning: synthetic acceptance is on: the output is not valid", file=sys.stderr)
        if args.stats:
            _print_stats(engine, result, lookup)
    finally:
        engine.close()
    return 0


def _limits(args: argparse.Namespace, spec: SpecParams) -> tuple[int, bool, float | None]:
    """``(max_tokens, use the lookup store, its cap in MiB)``, checked before the model loads (a
    static lookup cache that cannot be opened is refused here, as llama.cpp would refuse it)."""
    from .cli import CliError
    max_tokens = args.max_tokens if args.max_tokens is not None else 512
    if max_tokens <= 0:
        raise CliError("--max-tokens must be at least 1")
    use_store = uses_type(spec, SpecType.NGRAM_CACHE) and not getattr(args, "no_lookup_store", False)
    max_mib = getattr(args, "lookup_max_mib", None)
    if max_mib is not None and max_mib <= 0:
        raise CliError("--lookup-max-mib must be positive")
    sta = spec.ngram_cache.lookup_cache_static
    if uses_type(spec, SpecType.NGRAM_CACHE) and sta and not os.path.isfile(sta):
        raise CliError(str(LookupCacheError(sta, "static", "No such file or directory")))
    return max_tokens, use_store, max_mib


def _prompt_tokens(engine, args: argparse.Namespace, cfg, text: str) -> list[int]:
    """The prompt's tokens: ``text`` as it is (``--raw``), else as the user's turn after the system
    prompt (``--system``, else config.toml's), through the chat template."""
    if args.raw:
        return engine.prompt_tokens(text=text, raw=True)
    messages = []
    system = args.system if args.system is not None else cfg.system_prompt
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return engine.prompt_tokens(messages=messages)


def _stream(engine, prompt, out, *, max_tokens: int, sampling, stop: list[str], quiet: bool):
    """Generate, writing each step's text to ``out`` as it comes (not when ``quiet``); the result."""
    result = None
    for ev in engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop):
        if isinstance(ev, StepEvent) and not quiet:
            piece = "".join(t.text for t in ev.tokens)
            if piece:
                out.write(piece)
                out.flush()
        elif isinstance(ev, FinishEvent):
            result = ev.result
    assert result is not None
    return result


def _print_stats(engine, result, lookup: dict | None) -> None:
    """``--stats``: the speed and acceptance, each speculator's figures, Automatic's plan, the
    controller's summary and the lookup caches' share, to stderr."""
    s = result.stats
    print(f"{s.n_generated} tokens, {s.tokens_per_s:.1f} tokens/s, drafted {s.n_drafted}, "
          f"accepted {s.n_accepted} ({(s.acceptance_rate or 0) * 100:.1f}%), finish: {result.finish_reason}",
          file=sys.stderr)
    for line in engine.chain.print_stats():
        print(line, file=sys.stderr)
    if engine.auto_plan:
        print("auto: " + ", ".join(f"{c.name} {'on' if c.used else 'off'}" for c in engine.auto_plan),
              file=sys.stderr)
    if s.controller is not None:
        for line in s.controller.summary():
            print(f"controller: {line}", file=sys.stderr)
    if lookup is not None:
        src = lookup["sources"]
        print("ngram-cache drafted/accepted by cache: " + ", ".join(
            f"{k} {v['drafted']}/{v['accepted']}" for k, v in src.items()), file=sys.stderr)
        sv = lookup.get("save") or {}
        if not sv.get("error") and not sv.get("skipped"):
            print(f"lookup: dynamic cache {sv['ngrams']} n-grams, {sv['entries']} entries "
                  f"(+{sv['added_entries']}) saved to {sv['path']}", file=sys.stderr)


def _open_store(engine, spec: SpecParams, max_mib: float | None):
    """Load the model's lookup caches and build the chain with them."""
    from .cli import CliError
    nc = spec.ngram_cache
    try:
        store = LookupStore.for_model(
            engine.model, static_path=nc.lookup_cache_static or None, dynamic_path=nc.lookup_cache_dynamic or None,
            max_bytes=int(max_mib * (1 << 20)) if max_mib else DEFAULT_MAX_BYTES)
    except LookupCacheError as e:
        raise CliError(str(e)) from None
    except (LookupStoreError, OSError) as e:
        # the cache folder is unusable (locked for too long, not writable): go on without it
        print(f"draftlight: warning: lookup caches unavailable ({e}); ngram-cache runs without them",
              file=sys.stderr)
        try:
            engine.set_spec(spec)
        except LookupCacheError as e2:
            raise CliError(str(e2)) from None
        return None
    for w in store.warnings:
        print(f"draftlight: warning: {w}", file=sys.stderr)
    engine.set_spec(spec, resources=store.resources())
    return store


def _learn_and_save(store, engine, prompt, result) -> dict:
    """After the reply: learn prompt + reply into the dynamic cache and save it."""
    info: dict = {"folder": str(store.folder), "sources": LookupStore.contribution(engine)}
    store.learn(list(prompt) + list(result.tokens))
    try:
        res = store.save()
    except LookupStoreError as e:
        print(f"draftlight: warning: {e}", file=sys.stderr)
        info["save"] = {"error": str(e)}
        return info
    for w in res.warnings:
        print(f"draftlight: warning: {w}", file=sys.stderr)
    info["save"] = {"path": res.path, "skipped": res.skipped, "ngrams": res.ngrams, "entries": res.entries,
                    "added_entries": res.added_entries, "pruned_entries": res.pruned_entries,
                    "merged_other": res.merged_other}
    return info
