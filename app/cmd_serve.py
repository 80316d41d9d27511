"""``draftlight serve``: the model over HTTP, as llama.cpp's ``llama-server`` serves it.

OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``, llama.cpp's
``/completion`` (with its ``timings``) and ``/health``; see :mod:`app.serve`. The model
runs in a runner process of its own (:class:`app.runner.RunnerEngine`, as in the chat), so
a crash of native code costs the request in progress, not the server.

It listens on 127.0.0.1:8080 (llama-server's defaults); any other address needs
``--api-key`` (or ``DRAFTLIGHT_API_KEY``). With ``ngram-cache`` the model's lookup caches
are read, and taught only with ``--lookup-learn``: then the dynamic cache learns each finished
conversation, as the chat's learns its replies (saved after each), so what one client sent
drafts for the next; without it, as llama-server (which reads ``-lcs``/``-lcd`` only), what one
client sends never drafts for another through them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from speculators.auto import uses_type
from speculators.types import SpecType

from . import config as config_mod
from .options import (add_model_args, add_sampling_args, add_spec_args, default_spec, model_options_from_args,
                      sampling_from_args, spec_types_configured)
from .runtime import auto_warnings, stderr_progress

API_KEY_ENV = "DRAFTLIGHT_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server (llama-server's flags)")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    g.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: any free port)")
    g.add_argument("--api-key", dest="api_key", metavar="KEY",
                   help=f"the key clients must send (Authorization: Bearer KEY); default: ${API_KEY_ENV}. "
                        f"Needed to listen on any address other than loopback")
    g.add_argument("-a", "--alias", help="the model's name in the API (default: the GGUF file's name)")
    g.add_argument("-n", "--n-predict", type=int, dest="n_predict", default=-1,
                   help="tokens a reply may have where a request sets no max_tokens (default -1: until the "
                        "context is full)")
    p.add_argument("--no-config", action="store_true", help="ignore config.toml")
    p.add_argument("--no-lookup-store", action="store_true", dest="no_lookup_store",
                   help="with ngram-cache, do not read the model's lookup caches in the user data dir")
    p.add_argument("--lookup-learn", action="store_true", dest="lookup_learn",
                   help="with ngram-cache, the dynamic lookup cache learns each served conversation (saved "
                        "after each; what one client sends then drafts for the others)")
    add_model_args(p)
    add_sampling_args(p)
    add_spec_args(p)


def run(args: argparse.Namespace) -> int:
    from .cli import CliError
    import importlib.util
    if importlib.util.find_spec("aiohttp") is None:
        raise CliError("`draftlight serve` needs aiohttp: python -m pip install aiohttp")
    from .runner import RunnerEngine, RunnerError
    from .serve import ServeError, start_server

    api_key, warnings, spec, sampling, mopts = _settings(args)
    try:
        engine = RunnerEngine(mopts, spec, stderr_progress)
    except RunnerError as e:
        raise CliError(str(e)) from None
    store = None
    handle = None
    try:
        resources = None
        if uses_type(spec, SpecType.NGRAM_CACHE) and not args.no_lookup_store:
            store, resources = _open_store(engine, spec, args.lookup_learn)
        engine.set_spec(spec, resources=resources)
        _warn([*engine.load_warnings, *(f"{name} is off: {why}" for name, why in engine.chain.skipped.items()),
               *auto_warnings(spec, engine.auto_plan), *warnings])
        logging.basicConfig(level=logging.WARNING, format="draftlight: %(message)s")
        logging.getLogger("draftlight.serve").setLevel(logging.INFO)
        try:
            handle = start_server(engine, args.host, args.port, api_key=api_key, model_id=args.alias,
                                  sampling=sampling, max_tokens=None if args.n_predict == -1 else args.n_predict,
                                  learn=_learner(store) if args.lookup_learn and store is not None else None)
        except ServeError as e:
            raise CliError(str(e)) from None
        names = ", ".join(s.name for s in engine.chain.speculators) or "none"
        print(f"draftlight: serving {engine.model.path} as {handle.model_id} on "
              f"{handle.url} (OpenAI's API under {handle.url}/v1; speculation: {names}"
              f"{'; the lookup caches learn what is served' if handle.worker.learn else ''}); Ctrl+C stops",
              file=sys.stderr, flush=True)
        _wait_until_stopped(handle)
        print("draftlight: stopping", file=sys.stderr)
    finally:
        if handle is not None:
            handle.close()
        if store is not None:
            store.close()
        engine.close()
    return 0


def _settings(args: argparse.Namespace):
    """``(api_key, the bind's warnings, spec, sampling, model options)``, every flag checked before
    the model loads (the address and key, the port free, ``--n-predict``, ``--lookup-learn``)."""
    from .cli import CliError
    from .serve import ServeError, check_bind
    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    try:
        warnings = check_bind(args.host, api_key)
    except ServeError as e:
        raise CliError(str(e)) from None
    if not 0 <= args.port < 65536:
        raise CliError(f"invalid port {args.port}")
    if args.n_predict == 0 or args.n_predict < -1:
        raise CliError("--n-predict must be -1 (until the context is full) or at least 1")
    cfg = config_mod.load_for_command(args.no_config)
    spec = default_spec(args, cfg.spec, from_file=not args.no_config and spec_types_configured())
    sampling = sampling_from_args(args, cfg.sampling)
    mopts = model_options_from_args(args, cfg.model)
    if args.lookup_learn and (args.no_lookup_store or not uses_type(spec, SpecType.NGRAM_CACHE)):
        raise CliError("--lookup-learn teaches ngram-cache's lookup caches: it needs ngram-cache (or auto) "
                       "in --spec-type, without --no-lookup-store")
    from .cmd_rpc import check_port_free
    check_port_free(args.host, args.port)
    return api_key, warnings, spec, sampling, mopts


def _open_store(engine, spec, learn: bool):
    """The model's lookup caches in the runner: ``(store or None, their resources or None)``; what
    went wrong is a warning (the server runs without them)."""
    store, store_warnings = engine.open_store(spec)
    _warn(store_warnings)
    if learn and store is None:
        _warn(["--lookup-learn: the lookup caches could not be opened; served conversations are not learned"])
    return store, (store.resources() if store is not None else None)


def _warn(warnings) -> None:
    for w in warnings:
        print(f"draftlight: warning: {w}", file=sys.stderr)


def _wait_until_stopped(handle) -> None:
    """Block until the server ends, Ctrl+C or SIGTERM (its handler put back after)."""
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        stop.set()
    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM,) if threading.current_thread()
           is threading.main_thread()}
    try:
        while not stop.is_set() and not handle.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _learner(store):
    """Teach ``store`` (a :class:`~app.runner_store.RunnerStore`) a conversation's tokens and save
    the caches where it learned something (as the chat does after each reply)."""
    def learn(tokens: list[int]) -> None:
        if store.learn(tokens):
            store.save()
    return learn
