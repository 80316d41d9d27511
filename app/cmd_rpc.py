"""``draftlight rpc-server``: ggml's own RPC server, so that another machine's draftlight
(``--rpc HOST:PORT``) can place layers on this machine's devices.

The flags are llama.cpp's ``rpc-server``'s: ``-H/--host``, ``-p/--port``,
``-d/--device``, ``-t/--threads``, ``-c/--cache``. It binds 127.0.0.1 unless
told otherwise; any other address also needs ``--allow-remote``, and then
prints llama.cpp's warning: the protocol has no authentication, so anyone who
can reach the port can use the machine's devices.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from speculators import devices as dv

from .cli import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-H", "--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs --allow-remote)")
    p.add_argument("-p", "--port", type=int, default=dv.DEFAULT_RPC_PORT,
                   help=f"port to listen on (default {dv.DEFAULT_RPC_PORT})")
    p.add_argument("-d", "--device", metavar="DEV1,DEV2",
                   help="the devices to serve, as --list-devices names them (default: the GPUs, else the CPU)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads for the CPU device (default: half the cores)")
    p.add_argument("-c", "--cache", action="store_true",
                   help="keep received tensors in a local file cache, so that a model is sent only once "
                        "(in the cache folder, rpc/)")
    p.add_argument("--allow-remote", action="store_true",
                   help="listen on an address other than loopback (a trusted network only: the protocol "
                        "has no authentication)")
    p.add_argument("--list-devices", action="store_true", help="list this machine's devices and exit")


def run(args: argparse.Namespace) -> int:
    from speculators.llama import backend_init
    backend_init()
    if not dv.has_rpc():
        raise CliError("this llama.cpp build has no RPC backend; reinstall draftlight with it: " + dv.RPC_INSTALL)
    if args.list_devices:
        for d in dv.list_devices():
            print(f"{d.name}: {d.description} ({d.memory_text()})")
        return 0
    if not 0 < args.port < 65536:
        raise CliError(f"invalid port {args.port}")
    if not dv.is_loopback(args.host):
        if not args.allow_remote:
            raise CliError(f"refusing to listen on {args.host}: the RPC protocol has no authentication, so "
                           f"anyone who can reach it can use this machine's devices. On a trusted network, "
                           f"add --allow-remote")
        print("\n" + "!" * 72 + "\n" + dv.RPC_WARNING.format(endpoint=f"{args.host}:{args.port}") + "\n"
              + "!" * 72 + "\n", file=sys.stderr, flush=True)
    if args.threads is not None and args.threads <= 0:
        raise CliError(f"invalid number of threads: {args.threads}")
    check_port_free(args.host, args.port, " (is another rpc-server running?)")
    cache_dir = None
    if args.cache:
        from . import paths
        cache_dir = str(paths.cache_dir() / "rpc")
        os.makedirs(cache_dir, exist_ok=True)
    names = [n.strip() for n in args.device.split(",") if n.strip()] if args.device else None
    # the server loop is native code: Ctrl+C and SIGTERM end the process at once
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.stdout.flush()
    dv.start_rpc_server(args.host, args.port, names, args.threads, cache_dir)
    # it returns only when it could not start (it printed why)
    raise CliError(f"the RPC server on {args.host}:{args.port} could not start (above)")


def check_port_free(host: str, port: int, taken_hint: str = "") -> None:
    """Say plainly, before anything is loaded, that ``host:port`` cannot be listened on (ggml
    and aiohttp would say it later and less clearly); port 0 (any free port) always can."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise CliError(f"cannot listen on {host}: {e.strerror or e}") from None
    fam, _, _, _, addr = infos[0]
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
    except OSError as e:
        raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}{taken_hint}") from None
    finally:
        s.close()
