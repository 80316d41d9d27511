"""``draftlight generate``: one prompt, streamed to stdout (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys

from speculators.events import FinishEvent, StepEvent

from . import config as config_mod
from .options import (add_model_args, add_sampling_args, add_spec_args, model_options_from_args,
                      sampling_from_args, spec_from_args)
from .runtime import open_engine, stderr_progress


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
    from .cli import CliError
    try:
        cfg = config_mod.Config() if args.no_config else config_mod.load()
    except config_mod.ConfigError as e:
        raise CliError(str(e)) from None
    text = read_prompt(args)
    spec = spec_from_args(args, cfg.spec)
    sampling = sampling_from_args(args, cfg.sampling)
    mopts = model_options_from_args(args, cfg.model)
    max_tokens = args.max_tokens if args.max_tokens is not None else 512
    if max_tokens <= 0:
        raise CliError("--max-tokens must be at least 1")
    engine = open_engine(mopts, spec, progress=stderr_progress)
    try:
        for name, why in engine.chain.skipped.items():
            print(f"draftlight: warning: {name} is off: {why}", file=sys.stderr)
        if args.raw:
            prompt = engine.prompt_tokens(text=text, raw=True)
        else:
            messages = []
            system = args.system if args.system is not None else cfg.system_prompt
            if system:
                messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": text})
            prompt = engine.prompt_tokens(messages=messages)
        result = None
        out = sys.stdout
        for ev in engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=args.stop):
            if isinstance(ev, StepEvent) and not args.json:
                piece = "".join(t.text for t in ev.tokens)
                if piece:
                    out.write(piece)
                    out.flush()
            elif isinstance(ev, FinishEvent):
                result = ev.result
        assert result is not None
        if args.json:
            json.dump(result.to_dict(), out, ensure_ascii=False)
            out.write("\n")
        else:
            out.write("\n")
        if result.stats.synthetic:
            print("draftlight: warning: synthetic acceptance is on: the output is not valid", file=sys.stderr)
        if args.stats:
            s = result.stats
            print(f"{s.n_generated} tokens, {s.tokens_per_s:.1f} tokens/s, drafted {s.n_drafted}, "
                  f"accepted {s.n_accepted} ({(s.acceptance_rate or 0) * 100:.1f}%), finish: {result.finish_reason}",
                  file=sys.stderr)
            for line in engine.chain.print_stats():
                print(line, file=sys.stderr)
    finally:
        engine.close()
    return 0
