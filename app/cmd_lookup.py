"""``draftlight lookup``: build, merge, inspect and clear n-gram lookup caches.

Mirrors llama.cpp's ``llama-lookup-create``, ``llama-lookup-merge`` and
``llama-lookup-stats`` (same file format, same counting), plus ``info`` and
``clear`` for the per-tokenizer cache folders of :mod:`app.lookup_store`::

    draftlight lookup create [--model M] [--output F] CORPUS...
    draftlight lookup merge OUT IN...
    draftlight lookup stats [--model M] [--static F] [--dynamic F] TEXT_FILE
    draftlight lookup info
    draftlight lookup clear [FOLDER | --model M] [--dynamic-only] [--yes]

Only the model's vocabulary is loaded (``vocab_only``), so these run in
about a second whatever the model's size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from speculators.ngram_cache import N_DRAFT, CorruptCacheError, LookupCacheError, NgramCache

from . import lookup_store as ls
from . import paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(_lookup_parser=p)
    sub = p.add_subparsers(dest="lookup_command", metavar="ACTION")

    def model_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("-m", "--model", help="GGUF model whose vocabulary to use (default: the embedded model)")

    c = sub.add_parser("create", help="build a static cache from text files (as llama-lookup-create)",
                       description="Count the 2-grams of text files into a static lookup cache and install "
                                   "it as the model's static cache (or write it to --output).")
    model_arg(c)
    c.add_argument("-o", "--output", help="write the cache here instead of installing it")
    c.add_argument("corpus", nargs="+", metavar="CORPUS", help="text files (UTF-8)")

    m = sub.add_parser("merge", help="add lookup caches together (as llama-lookup-merge)",
                       description="Add the counts of lookup caches IN... and write the sum to OUT.")
    m.add_argument("output", metavar="OUT", help="file to write")
    m.add_argument("inputs", nargs="+", metavar="IN", help="lookup cache files")

    s = sub.add_parser("stats", help="simulate drafting over a text (as llama-lookup-stats)",
                       description="Simulate ngram-cache drafting over a text file and report how many tokens "
                                   "would have been drafted and accepted. By default the model's installed "
                                   "static and dynamic caches are used. The text is simulated in chunks of "
                                   "--ctx-size tokens; unlike llama-lookup-stats, the last partial chunk "
                                   "is simulated too.")
    model_arg(s)
    s.add_argument("--static", help="static lookup cache (default: the model's, if any)")
    s.add_argument("--dynamic", help="dynamic lookup cache (default: the model's, if any)")
    s.add_argument("--no-static", action="store_true", help="use no static cache")
    s.add_argument("--no-dynamic", action="store_true", help="use no dynamic cache")
    s.add_argument("-c", "--ctx-size", type=int, default=4096, dest="ctx_size",
                   help="tokens per simulated generation (default 4096)")
    s.add_argument("--draft-max", type=int, default=N_DRAFT, dest="draft_max",
                   help=f"tokens drafted at most per step (default {N_DRAFT}, as the ngram-cache speculator)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("text", metavar="TEXT_FILE", help="the text to simulate over")

    i = sub.add_parser("info", help="list the cache folders, their models, sizes and entry counts")
    i.add_argument("--json", action="store_true", help="print JSON")

    r = sub.add_parser("clear", help="remove a cache folder (after confirmation)",
                       description="Remove one cache folder: FOLDER (a name or path listed by 'lookup info'), "
                                   "or the folder of --model's vocabulary, or else the default model's.")
    r.add_argument("folder", nargs="?", metavar="FOLDER")
    model_arg(r)
    r.add_argument("--dynamic-only", action="store_true", help="remove only the dynamic cache")
    r.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace) -> int:
    from .cli import CliError
    action = getattr(args, "lookup_command", None)
    if action is None:
        args._lookup_parser.print_help(sys.stderr)
        return 2
    try:
        return {"create": _create, "merge": _merge, "stats": _stats, "info": _info, "clear": _clear}[action](args)
    except (LookupCacheError, ls.LookupStoreError) as e:
        raise CliError(str(e)) from None
    except ls.BuildCancelled:
        raise CliError("cancelled; nothing was written") from None
    except UnicodeDecodeError as e:
        raise CliError(f"not UTF-8 text: {e}") from None


# ---------------------------------------------------------------------------


def _model_path(model: str | None) -> str:
    from .options import ModelOptions
    from .runtime import resolve_model_path, stderr_progress
    return resolve_model_path(ModelOptions(model=model), stderr_progress)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


class _Bar:
    """A one-line progress bar on stderr (drawn only on a terminal)."""

    def __init__(self, label: str):
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total else 1.0
        width = 30
        bar = "#" * int(frac * width)
        sys.stderr.write(f"\r{self.label}: [{bar:<{width}}] {frac * 100:5.1f}%  {what[:30]:<30}")
        sys.stderr.flush()
        self.drawn = True

    def done(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _create(args: argparse.Namespace) -> int:
    from .cli import CliError
    for f in args.corpus:
        if not os.path.isfile(f):
            raise CliError(f"corpus file not found: {f}")
    path = _model_path(args.model)
    bar = _Bar("building static cache")
    with ls.open_vocab(path) as model:
        t0 = time.monotonic()
        try:
            if args.output:
                cache, n_tokens = ls.build_static_cache(model, args.corpus, bar)
                bar.done()
                cache.save(args.output)
                out, n_ngrams, n_entries = args.output, len(cache), cache.n_entries
                size = os.path.getsize(args.output)
            else:
                store = ls.LookupStore.for_model(model, load=False)
                res = store.build_static(args.corpus, bar)
                bar.done()
                out, n_ngrams, n_entries, n_tokens, size = res.path, res.ngrams, res.entries, res.tokens, res.file_bytes
        except BaseException:
            bar.done()
            raise
    print(f"static cache: {n_ngrams} n-grams, {n_entries} entries ({_human(size)}) from "
          f"{len(args.corpus)} file(s), {n_tokens} tokens, in {time.monotonic() - t0:.1f} s -> {out}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    merged: NgramCache | None = None
    for f in args.inputs:
        print(f"lookup merge: loading {f}", file=sys.stderr)
        c = NgramCache.load(f)
        if merged is None:
            merged = c
        else:
            merged.merge(c)
    assert merged is not None
    merged.save(args.output)
    print(f"merged {len(args.inputs)} file(s): {len(merged)} n-grams, {merged.n_entries} entries "
          f"({_human(os.path.getsize(args.output))}) -> {args.output}")
    return 0


def _load_for_stats(explicit: str | None, off: bool, default: Path | None, kind: str,
                    notes: list[str]) -> tuple[NgramCache, str | None]:
    from .cli import CliError
    if off:
        return NgramCache(), None
    if explicit:
        try:
            return NgramCache.load(explicit), explicit
        except OSError as e:
            raise CliError(f"cannot read the {kind} cache {explicit}: {e.strerror or e}") from None
    if default is not None and default.exists():
        try:
            return NgramCache.load(default), os.fspath(default)
        except (CorruptCacheError, OSError) as e:
            notes.append(f"the model's {kind} cache is unusable ({e}); not used")
    return NgramCache(), None


def _stats(args: argparse.Namespace) -> int:
    from .cli import CliError
    if args.ctx_size < 2:
        raise CliError("--ctx-size must be at least 2")
    if args.draft_max < 1:
        raise CliError("--draft-max must be at least 1")
    text = ls.read_prompt_text(args.text)  # as llama-lookup-stats -f reads it
    path = _model_path(args.model)
    notes: list[str] = []
    with ls.open_vocab(path) as model:
        folder = None
        if not ((args.static or args.no_static) and (args.dynamic or args.no_dynamic)):
            folder = ls.folder_for_fingerprint(ls.tokenizer_fingerprint(model))
        static, static_src = _load_for_stats(args.static, args.no_static,
                                             folder / ls.STATIC_NAME if folder else None, "static", notes)
        dynamic, dynamic_src = _load_for_stats(args.dynamic, args.no_dynamic,
                                               folder / ls.DYNAMIC_NAME if folder else None, "dynamic", notes)
        tokens = model.tokenize(text, add_special=True, parse_special=True)
    for n in notes:
        print(f"draftlight: warning: {n}", file=sys.stderr)
    bar = _Bar("simulating")
    st = ls.simulate_drafting(tokens, static, dynamic, n_draft=args.draft_max, n_ctx=args.ctx_size, progress=bar)
    bar.done()
    if args.json:
        d = st.to_dict()
        d.update(static=static_src, dynamic=dynamic_src, model=path)
        json.dump(d, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"static cache : {static_src or '-'}")
    print(f"dynamic cache: {dynamic_src or '-'}")
    print(f"n_draft      = {st.n_draft}")
    print(f"n_predict    = {st.n_predict}")
    print(f"n_drafted    = {st.n_drafted}")
    print(f"t_draft      = {st.t_draft_ms:.2f} ms")
    print(f"n_accept     = {st.n_accept}")
    rate = st.accept_rate
    print(f"accept       = {rate * 100:.3f}%" if rate is not None else "accept       = -")
    return 0


def _info(args: argparse.Namespace) -> int:
    root = paths.lookup_dir()
    folders = ls.list_folders(root)
    if args.json:
        json.dump({"root": os.fspath(root), "folders": [f.__dict__ for f in folders]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not folders:
        print(f"no lookup caches yet (they live in {root})")
        return 0
    for f in folders:
        vocab = f"{f.n_vocab} tokens" if f.n_vocab else "vocabulary unknown"
        print(f"{f.path}  ({vocab}, fingerprint {(f.fingerprint or '?')[:16]})")
        if f.models:
            for m in f.models:
                desc = f" ({m['description']})" if m.get("description") else ""
                print(f"  model: {m.get('name', '?')}{desc}  {m['path']}  last used {m.get('last_seen', '?')}")
        else:
            print("  model: unknown")
        if not f.files:
            print("  no cache files")
        for name, info in f.files.items():
            if info["error"]:
                print(f"  {name:<12} {_human(info['bytes']):>10}  damaged: {info['error']}")
            else:
                print(f"  {name:<12} {_human(info['bytes']):>10}  {info['ngrams']} n-grams, {info['entries']} entries")
        if f.corrupt:
            print(f"  moved aside: {', '.join(f.corrupt)}")
    return 0


def _clear(args: argparse.Namespace) -> int:
    from .cli import CliError
    root = paths.lookup_dir()
    if args.folder and args.model:
        raise CliError("give either FOLDER or --model, not both")
    if args.folder:
        cand = Path(args.folder)
        if not cand.is_absolute() and not cand.exists():
            cand = root / args.folder
        folder = cand.resolve()
        if folder.parent != root.resolve() or not folder.is_dir():
            raise CliError(f"not a lookup cache folder: {args.folder} (see 'draftlight lookup info')")
    else:
        path = _model_path(args.model)
        with ls.open_vocab(path) as model:
            folder = ls.folder_for_fingerprint(ls.tokenizer_fingerprint(model), root)
        if not folder.is_dir():
            print(f"no lookup caches for {os.path.basename(path)} ({folder} does not exist)")
            return 0
    meta = ls.read_meta(folder)
    names = ", ".join(m.get("name", "?") for m in (meta.get("models") or {}).values()) or "unknown models"
    what = f"the dynamic cache in {folder}" if args.dynamic_only else f"{folder} ({names})"
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"refusing to remove {what} without confirmation: pass --yes")
        sys.stderr.write(f"Remove {what}? [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed")
            return 1
    if args.dynamic_only:
        with ls.FileLock(folder / ls.LOCK_NAME):
            try:
                os.unlink(folder / ls.DYNAMIC_NAME)
            except FileNotFoundError:
                pass
    else:
        ls.remove_folder(folder)
    print(f"removed {what}")
    return 0
