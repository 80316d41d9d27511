"""The ``draftlight`` command.

Each subcommand lives in its own module exposing ``add_arguments(parser)``
and ``run(args) -> int``; this file only wires them and turns expected
failures into one clear line on stderr (never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from . import __version__
from .errors import UserError, expected_errors

#: name -> (module, help). ``chat`` is what runs without a subcommand.
COMMANDS: dict[str, tuple[str, str]] = {
    "chat": ("app.cmd_chat", "open the chat app (the default)"),
    "lab": ("app.cmd_chat", "open the Lab: which speculation pays on a prompt, side by side"),
    "generate": ("app.cmd_generate", "generate text from a prompt, headless"),
    "bench": ("app.cmd_bench", "compare speculative types side by side"),
    "lookup": ("app.cmd_lookup", "build, merge and inspect n-gram lookup caches"),
    "doctor": ("app.cmd_doctor", "print what a bug report needs"),
    "serve": ("app.cmd_serve", "serve the model over HTTP: OpenAI's API and llama-server's /completion"),
    "rpc-server": ("app.cmd_rpc", "serve this machine's devices to another draftlight (llama.cpp's rpc-server)"),
    "install-desktop": ("app.cmd_desktop", "install the desktop entry and icon"),
    "uninstall-desktop": ("app.cmd_desktop", "remove the desktop entry and icon"),
}


class CliError(UserError):
    """An expected failure: printed as one line, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftlight",
        description="Chat with local GGUF models and watch speculative decoding at work.",
    )
    parser.add_argument("--version", action="version", version=f"draftlight {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, help_) in COMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        p = sub.add_parser(name, help=help_, description=help_)
        mod.add_arguments(p, name) if _takes_name(mod) else mod.add_arguments(p)
        p.set_defaults(_module=mod, command=name)
    return parser


def _takes_name(mod) -> bool:
    import inspect
    return len(inspect.signature(mod.add_arguments).parameters) > 1


#: commands that decode with llama.cpp: run in a supervised child process (see :func:`supervise`)
SUPERVISED = ("generate", "bench", "lookup")
_SUPERVISED_ENV = "DRAFTLIGHT_SUPERVISED"
#: signals the supervisor passes on to its child (not every platform has SIGHUP)
_FORWARDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def entry() -> int:
    """The ``draftlight`` command: :func:`main`, with the decoding commands supervised."""
    import os
    argv = sys.argv[1:]
    if os.environ.get(_SUPERVISED_ENV):
        from .child import die_with_parent
        die_with_parent()
    if argv and argv[0] in SUPERVISED and not os.environ.get(_SUPERVISED_ENV) \
            and not any(a in ("-h", "--help") for a in argv):
        return supervise(argv)
    return main(argv)


def supervise(argv: list[str]) -> int:
    """Run ``draftlight ARGV`` in a child process; a crash of native code becomes one clear line.

    The child shares the terminal (its output streams as usual); llama.cpp's log
    lines also reach this process through a pipe, so that the last of them can be
    shown when the child dies by a signal (a segmentation fault, an abort, the
    OOM killer), which would otherwise end the command without a word.
    """
    import collections
    import contextlib
    import os
    import subprocess
    import threading
    from .child import module_argv
    from .runner import crash_advice, rpc_lost, telling_lines
    from .cpu_check import signal_name
    r, w = os.pipe()
    env = dict(os.environ, **{_SUPERVISED_ENV: "1", "DRAFTLIGHT_LOG_FD": str(w)})
    try:
        # our ``app``, whatever the current folder holds (app.child); the folder stays: relative paths work
        proc = subprocess.Popen(module_argv("app", *argv), pass_fds=(w,), env=env)
    finally:
        os.close(w)
    tail: collections.deque[str] = collections.deque(maxlen=60)

    def read() -> None:
        with os.fdopen(r, "rb") as f:
            for raw in f:
                tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl+C reaches the child, which says so
    # a TERM or HUP meant for the command (``kill PID``, a closed terminal window) is passed on:
    # the child would otherwise go on decoding, orphaned, until its work was done
    forwarded: list[int] = []

    def forward(signum, _frame) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    olds = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
        for sig, handler in olds.items():
            signal.signal(sig, handler)
    reader.join(2)
    if rc >= 0:
        return rc
    if -rc in forwarded:
        return 128 - rc      # stopped as asked: no crash to report
    lost = rpc_lost(tail)
    last = [lost] if lost else telling_lines(list(tail), 1)
    logged = f"; llama.cpp's last log line: {last[0]}" if last else ""
    print(f"draftlight: error: `draftlight {argv[0]}` stopped: the engine was {signal_name(rc)}; "
          f"{crash_advice(rc, chat=False, lines=list(tail))}{logged}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known = {a for a in COMMANDS} | {"-h", "--help", "--version"}
    # ``draftlight [chat flags]`` opens the chat app.
    if not argv or (argv[0] not in known and argv[0].startswith("-")):
        argv = ["chat", *argv]
    args = parser.parse_args(argv)
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        print("draftlight: interrupted", file=sys.stderr)
        return 130
    except expected_errors() as e:
        msg = str(e) or e.__class__.__name__
        if isinstance(e, FileNotFoundError) and e.filename:
            msg = f"file not found: {e.filename}"
        print(f"draftlight: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(entry())
