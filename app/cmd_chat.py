"""``draftlight`` / ``draftlight chat``: the chat app (Textual).

Flags given here win over ``config.toml``; what the app saves (theme,
settings applied in the settings pane) goes back to ``config.toml``.
Textual is imported only when the app runs, so ``draftlight --help`` and
the headless commands stay quick.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

from . import config as config_mod
from .options import (add_model_args, add_sampling_args, add_spec_args, model_options_from_args,
                      sampling_from_args, spec_from_args)


def add_arguments(p: argparse.ArgumentParser, name: str = "chat") -> None:
    if name == "lab":
        p.description = ("Open the Lab straight away: which speculation pays on a prompt, on this model and "
                         "machine. The prompt is a file (-f) or a message of the latest saved chat.")
        p.add_argument("-f", "--prompt-file", dest="lab_prompt_file", metavar="FILE",
                       help="a text file to use as the prompt")
    p.add_argument("--system", help="system prompt for new chats (default: the one saved in config.toml)")
    p.add_argument("-n", "--max-tokens", type=int, dest="max_tokens",
                   help="maximum tokens per reply (default 1024)")
    p.add_argument("--theme", help="theme name (dark, light, high-contrast, or a user theme)")
    p.add_argument("--no-config", action="store_true",
                   help="ignore config.toml (and do not write it)")
    add_model_args(p)
    add_sampling_args(p)
    add_spec_args(p)


def build_config(args: argparse.Namespace) -> config_mod.Config:
    """config.toml with the command-line flags on top."""
    return _configs(args)[0]


def _configs(args: argparse.Namespace) -> tuple[config_mod.Config, config_mod.Config]:
    """(the settings to use: file + flags, the file's own settings)."""
    cfg, saved, _ = _settings(args)
    return cfg, saved


def _settings(args: argparse.Namespace) -> tuple[config_mod.Config, config_mod.Config, config_mod.Loaded]:
    """:func:`_configs`, and config.toml as far as it could be read (it never stops the app;
    ``--no-config``: the defaults)."""
    from .cli import CliError
    loaded = (config_mod.Loaded(config_mod.Config()) if getattr(args, "no_config", False)
              else config_mod.load_lenient())
    saved = loaded.config
    cfg = config_mod.Config.from_toml_dict(saved.to_toml_dict())
    cfg.spec = spec_from_args(args, cfg.spec)
    cfg.sampling = sampling_from_args(args, cfg.sampling)
    cfg.model = model_options_from_args(args, cfg.model)
    if getattr(args, "max_tokens", None) is not None:
        if args.max_tokens < 1:
            raise CliError("--max-tokens must be at least 1")
        cfg.max_tokens = args.max_tokens
    if getattr(args, "system", None) is not None:
        cfg.system_prompt = args.system
    if getattr(args, "theme", None):
        cfg.ui["theme"] = args.theme
    return cfg, saved, loaded


def _debug_dump_on_signal() -> None:
    """With DRAFTLIGHT_DEBUG_DUMP=FILE, ``kill -USR1`` writes every thread's stack there."""
    import os
    path = os.environ.get("DRAFTLIGHT_DEBUG_DUMP")
    if not path:
        return
    import faulthandler
    import signal
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=open(path, "w", encoding="utf-8"), all_threads=True)  # noqa: SIM115


def run(args: argparse.Namespace) -> int:
    from .cli import CliError
    settings = _settings(args)   # a bad flag is said before the terminal is taken over
    lab_file = getattr(args, "lab_prompt_file", None)
    if lab_file and not os.path.isfile(os.path.expanduser(lab_file)):
        raise CliError(f"file not found: {lab_file}")
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        raise CliError("the chat app needs a terminal; for scripts use 'draftlight generate'")
    _debug_dump_on_signal()
    kw = {"open_lab": True, "lab_prompt_file": lab_file} if getattr(args, "command", "chat") == "lab" else {}
    app = make_app(args, settings, **kw)
    _quit_on_signals(app)
    code = app.run()
    # an exception that ended the app is exit status 1 (Textual's return_code), not 0
    return int(code or app.return_code or 0)


def make_app(args: argparse.Namespace, settings=None, **kw):
    """The chat app for these flags and config.toml (``settings``: :func:`_settings`'s, when
    already read; ``kw``: more for :class:`DraftlightApp`)."""
    from .ui.app import DraftlightApp
    cfg, saved, loaded = settings or _settings(args)
    # a damaged file is never written over: the person's own text stays until they fix it
    return DraftlightApp(cfg, persist_config=not args.no_config and not loaded.damaged, saved_config=saved,
                         notices=[loaded.notice()] if loaded.damaged else [], **kw)


def _close_from_watchdog(session) -> None:
    """Close the session from the exit watchdog's thread while the UI thread is stuck: the
    history may be used from any thread (one lock over its connection), so the reply being
    written is saved as stopped. Where closing fails part-way, the engine is still closed:
    no runner process outlives the app."""
    try:
        session.close()
    except Exception:
        engine = getattr(session, "engine", None)
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.close()
        raise


#: how long a SIGTERM/SIGHUP waits for the app's own shutdown before the process ends anyway
EXIT_GRACE_S = 10.0


def _quit_on_signals(app, grace_s: float | None = None) -> None:
    """SIGTERM or SIGHUP (a closed terminal window, ``kill``) end the app as Ctrl+Q does: the
    reply is saved as stopped, the runner ends, and the terminal is restored.

    Where the terminal is gone (SIGHUP), Textual's shutdown can wait forever to write the
    codes that restore it (seen: its writer thread's queue full, nobody to take the output).
    So the signal also starts a watchdog: if the process is still here ``grace_s`` later, the
    session is closed from the watchdog's thread (:func:`_close_from_watchdog`: the reply
    saved as stopped, the runner ended) and the process exits with the signal's code."""
    import signal
    import threading
    grace = EXIT_GRACE_S if grace_s is None else grace_s
    fired: list[int] = []

    def watchdog(code: int) -> None:
        time.sleep(grace)
        with contextlib.suppress(Exception):
            _close_from_watchdog(app.session)
        os._exit(code)

    def handler(signum, _frame) -> None:
        app.exit(result=128 + signum)
        if not fired:
            fired.append(signum)
            threading.Thread(target=watchdog, args=(128 + signum,), name="draftlight-exit-watchdog",
                             daemon=True).start()

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, handler)
