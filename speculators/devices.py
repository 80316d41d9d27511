"""ggml's devices: list them, join RPC servers' devices to them, and pick them by name.

llama.cpp places a model's offloaded layers on *devices* (a GPU, an RPC
server's device, ...); the CPU holds the rest. This module is the Python side
of llama.cpp's ``--rpc``, ``--device``, ``--list-devices``, ``--tensor-split``
and ``--split-mode``, over the ggml backend API of the loaded llama.cpp:

- :func:`list_devices` lists every device llama.cpp sees, with its memory;
- :func:`add_rpc_servers` joins the devices of ``rpc-server`` processes
  (``host:port``) to them, as ``common/arg.cpp``'s ``add_rpc_devices`` does;
  each server is first asked, from Python, whether it is there and speaks this
  build's protocol, because ggml aborts the process when it is not;
- :func:`resolve_devices` turns ``--device`` names into the NULL-terminated
  list that ``llama_model_params.devices`` takes;
- :func:`start_rpc_server` runs ggml's own RPC server in this process.

The RPC protocol has no authentication; llama.cpp says never to expose a
server to an open network.

>>> parse_endpoints("127.0.0.1:50052, host.lan:50053")
['127.0.0.1:50052', 'host.lan:50053']
>>> parse_endpoints("nohost")
Traceback (most recent call last):
...
speculators.devices.RpcError: invalid RPC server 'nohost': expected HOST:PORT, e.g. 192.168.1.20:50052
>>> parse_split_mode("row")
2
>>> parse_tensor_split("3,1")
[3.0, 1.0]
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Sequence

#: ggml's device types (``enum ggml_backend_dev_type``)
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL, DEV_META = range(5)
_TYPE_NAMES = {DEV_CPU: "CPU", DEV_GPU: "GPU", DEV_IGPU: "iGPU", DEV_ACCEL: "accelerator", DEV_META: "meta"}

#: llama.cpp's ``--split-mode`` names (``enum llama_split_mode``)
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}

#: the protocol version of ``ggml/include/ggml-rpc.h`` this module speaks for its probe
RPC_PROTO_MAJOR = 7
RPC_CMD_HELLO = 14
RPC_CMD_DEVICE_COUNT = 15
RPC_CMD_GET_DEVICE_MEMORY = 11
_CAPS_SIZE = 24
#: llama.cpp's ``rpc-server`` port
DEFAULT_RPC_PORT = 50052
#: the install line that builds llama.cpp with its RPC backend (the README's install carries it)
RPC_INSTALL = 'CMAKE_ARGS="-DGGML_RPC=on" pipx install . --force --pip-args="--no-cache-dir"'

RPC_WARNING = ("WARNING: the RPC protocol has no authentication and is not encrypted: anyone who can "
               "reach {endpoint} can run code on this machine's devices and read what it computes. "
               "Never expose the RPC server to an open network.")


class DeviceError(ValueError):
    """A device name, split or RPC server cannot be used; the message says why, in one line."""


class RpcError(DeviceError):
    """An RPC server cannot be used (no RPC in this build, unreachable, another protocol)."""


class RpcUnavailable(RpcError):
    """The server could not be reached or did not answer (the chat may go on locally)."""


# -- the ggml library ------------------------------------------------------------------

_lib = None
_lock = threading.RLock()
#: endpoints whose devices were registered in this process (registering twice would list them twice)
_added: dict[str, list[str]] = {}


def _ggml():
    global _lib
    if _lib is not None:
        return _lib
    # the ggml that libllama itself links (looked up through libllama's handle): a wheel holds
    # libggml.so and libggml.so.0 as two files, and llama_cpp._ggml loads the other one, whose
    # device registry llama.cpp never sees
    from llama_cpp import llama_cpp as low
    lib = low._lib
    vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        "ggml_backend_load_all": ([], None),
        "ggml_backend_dev_count": ([], sz),
        "ggml_backend_dev_get": ([sz], vp),
        "ggml_backend_dev_by_name": ([cp], vp),
        "ggml_backend_dev_name": ([vp], cp),
        "ggml_backend_dev_description": ([vp], cp),
        "ggml_backend_dev_memory": ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
        "ggml_backend_dev_type": ([vp], ctypes.c_int),
        "ggml_backend_dev_backend_reg": ([vp], vp),
        "ggml_backend_reg_name": ([vp], cp),
        "ggml_backend_reg_count": ([], sz),
        "ggml_backend_reg_by_name": ([cp], vp),
        "ggml_backend_reg_get_proc_address": ([vp, cp], vp),
        "ggml_backend_register": ([vp], None),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    if not lib.ggml_backend_reg_count():
        lib.ggml_backend_load_all()
    _lib = lib
    return lib


def has_rpc() -> bool:
    """Whether this llama.cpp build has ggml's RPC backend (``-DGGML_RPC=on``)."""
    try:
        return bool(_ggml().ggml_backend_reg_by_name(b"RPC"))
    except (OSError, AttributeError):  # pragma: no cover - a llama.cpp without the backend API
        return False


def _rpc_proc(name: str, restype, argtypes):
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("this llama.cpp build has no RPC backend; reinstall with RPC: " + RPC_INSTALL)
    addr = lib.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not addr:
        raise RpcError(f"this llama.cpp's RPC backend lacks {name}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


# -- devices --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """One device llama.cpp can place layers on (or the CPU)."""

    name: str
    description: str
    type: str
    free: int
    total: int
    #: the RPC server it lives on (``host:port``); None for a device of this machine
    endpoint: str | None = None

    @property
    def remote(self) -> bool:
        return self.endpoint is not None

    def memory_text(self) -> str:
        """``3,210 MiB free of 7,940 MiB`` (what llama.cpp's ``--list-devices`` shows)."""
        mib = 1024 * 1024
        return f"{self.free // mib:,} MiB free of {self.total // mib:,} MiB"


def _device(lib, dev) -> Device:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    name = (lib.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace")
    desc = (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace")
    reg = lib.ggml_backend_dev_backend_reg(dev)
    reg_name = (lib.ggml_backend_reg_name(reg) or b"").decode("utf-8", "replace") if reg else ""
    endpoint = None
    if reg_name == "RPC" or reg_name.startswith("RPC["):
        endpoint = next((ep for ep, names in _added.items() if name in names), desc or None)
    kind = _TYPE_NAMES.get(int(lib.ggml_backend_dev_type(dev)), "device")
    return Device(name, desc, "RPC" if endpoint else kind, int(free.value), int(total.value), endpoint)


def list_devices(include_cpu: bool = True) -> list[Device]:
    """Every device llama.cpp sees, in its order (RPC servers' devices once added)."""
    with _lock:
        lib = _ggml()
        out = [_device(lib, lib.ggml_backend_dev_get(i)) for i in range(int(lib.ggml_backend_dev_count()))]
    return [d for d in out if include_cpu or d.type not in ("CPU", "accelerator")]


def offload_devices() -> list[Device]:
    """The devices a model's offloaded layers can go to (GPUs, RPC devices; not the CPU)."""
    return [d for d in list_devices() if d.type in ("GPU", "iGPU", "RPC")]


def resolve_devices(names: str | Sequence[str] | None) -> list[int] | None:
    """``--device``'s value as device pointers, NULL-terminated by the caller.

    ``None``: every device (llama.cpp's default); ``"none"``: no offload device
    (the CPU only); else a comma list of device names as ``--list-devices`` shows
    them. A CPU device cannot be named, as in llama.cpp.
    """
    if names is None:
        return None
    parts = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not parts:
        return None
    if parts == ["none"]:
        return []
    with _lock:
        lib = _ggml()
        out = []
        for n in parts:
            dev = lib.ggml_backend_dev_by_name(n.encode())
            if not dev or int(lib.ggml_backend_dev_type(dev)) in (DEV_CPU, DEV_ACCEL):
                have = ", ".join(d.name for d in offload_devices()) or "none (this machine has no GPU; add "\
                    "remote devices with --rpc)"
                raise DeviceError(f"unknown device {n!r}: the devices are {have} (or 'none' for the CPU only)")
            out.append(int(dev))
    return out


def device_array(ptrs: Sequence[int]):
    """A NULL-terminated ``ggml_backend_dev_t[]`` for ``llama_model_params.devices``."""
    arr = (ctypes.c_void_p * (len(ptrs) + 1))(*ptrs, None)
    return arr


def parse_split_mode(v: str | int | None) -> int:
    if v is None:
        return SPLIT_MODES["layer"]
    if isinstance(v, int):
        return v
    try:
        return SPLIT_MODES[v.strip().lower()]
    except KeyError:
        raise DeviceError(f"invalid split mode {v!r}: one of {', '.join(SPLIT_MODES)}") from None


def parse_tensor_split(v: str | Sequence[float] | None) -> list[float] | None:
    """``-ts 3,1`` (or ``3/1``): the share of the offloaded layers per device, in ``--device`` order."""
    if v is None:
        return None
    if isinstance(v, str):
        bits = [b for b in v.replace("/", ",").split(",") if b.strip()]
        try:
            vals = [float(b) for b in bits]
        except ValueError:
            raise DeviceError(f"invalid tensor split {v!r}: expected proportions such as 3,1") from None
    else:
        vals = [float(x) for x in v]
    if any(x < 0 for x in vals) or (vals and sum(vals) <= 0):
        raise DeviceError(f"invalid tensor split {v!r}: proportions must be >= 0 and not all 0")
    return vals or None


# -- RPC --------------------------------------------------------------------------------------

def parse_endpoints(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for raw in items:
        ep = raw.strip()
        if not ep:
            continue
        host, sep, port = ep.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RpcError(f"invalid RPC server {ep!r}: expected HOST:PORT, e.g. 192.168.1.20:{DEFAULT_RPC_PORT}")
        out.append(f"{host}:{int(port)}")
    return out


@dataclass(frozen=True)
class RpcServerInfo:
    endpoint: str
    version: tuple[int, int, int]
    #: (free, total) bytes per device of the server
    devices: tuple[tuple[int, int], ...]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return buf


def _command(sock: socket.socket, cmd: int, payload: bytes, expect: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != expect:
        raise _Mismatch(size)
    return _recv_exact(sock, size)


class _Mismatch(Exception):
    pass


def probe_rpc_server(endpoint: str, timeout: float = 5.0) -> RpcServerInfo:
    """Ask a ``rpc-server`` for its protocol version and devices, without ggml.

    ggml's own client aborts the whole process when a server cannot be
    reached or speaks another protocol version; this asks first, over one
    short TCP connection (the server serves one client at a time, so a
    server busy with another client does not answer within ``timeout``).
    """
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except socket.gaierror as e:
        raise RpcUnavailable(f"RPC server {endpoint}: unknown host ({e.strerror or e})") from None
    except (socket.timeout, TimeoutError):
        raise RpcUnavailable(f"RPC server {endpoint} did not answer within {timeout:g} s") from None
    except OSError as e:
        raise RpcUnavailable(f"cannot reach RPC server {endpoint}: {e.strerror or e}; "
                             f"is `draftlight rpc-server` (or llama.cpp's rpc-server) running there?") from None
    try:
        with sock:
            try:
                rsp = _command(sock, RPC_CMD_HELLO, bytes(_CAPS_SIZE), 4 + _CAPS_SIZE)
            except _Mismatch:
                raise RpcError(f"RPC server {endpoint} speaks another protocol version than this llama.cpp "
                               f"({RPC_PROTO_MAJOR}.x): install the same llama-cpp-python on both machines") from None
            major, minor, patch = rsp[0], rsp[1], rsp[2]
            if major != RPC_PROTO_MAJOR:
                raise RpcError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this llama.cpp "
                               f"{RPC_PROTO_MAJOR}.x: install the same llama-cpp-python on both machines")
            (n_dev,) = struct.unpack("<I", _command(sock, RPC_CMD_DEVICE_COUNT, b"", 4))
            mems = []
            for i in range(n_dev):
                free, total = struct.unpack("<QQ", _command(sock, RPC_CMD_GET_DEVICE_MEMORY,
                                                            struct.pack("<I", i), 16))
                mems.append((free, total))
    except (socket.timeout, TimeoutError):
        raise RpcUnavailable(f"RPC server {endpoint} did not answer within {timeout:g} s (it serves one "
                             f"client at a time: is another draftlight or llama.cpp using it?)") from None
    except (ConnectionError, OSError, _Mismatch) as e:
        raise RpcUnavailable(f"RPC server {endpoint} broke off the handshake ({e}); is it an rpc-server?") from None
    return RpcServerInfo(endpoint, (major, minor, patch), tuple(mems))


def add_rpc_servers(endpoints: str | Sequence[str], timeout: float = 5.0) -> list[Device]:
    """Join the devices of these RPC servers to this process's devices (llama.cpp's ``--rpc``).

    Each server is probed first (:func:`probe_rpc_server`): an unreachable
    server or one with another protocol is a :class:`RpcError`, never ggml's
    abort. Servers already added in this process are not added again.
    Returns the devices that the servers contributed.
    """
    eps = parse_endpoints(endpoints)
    if not eps:
        return []
    if not has_rpc():
        raise RpcError("--rpc needs llama.cpp's RPC backend, which this build lacks; reinstall with it: "
                       + RPC_INSTALL)
    with _lock:
        lib = _ggml()
        add = _rpc_proc("ggml_backend_rpc_add_server", ctypes.c_void_p, [ctypes.c_char_p])
        for ep in eps:
            if ep in _added:
                continue
            info = probe_rpc_server(ep, timeout)
            if not info.devices:
                raise RpcError(f"RPC server {ep} has no devices")
            before = int(lib.ggml_backend_dev_count())
            reg = add(ep.encode())
            if not reg:
                raise RpcError(f"RPC server {ep} has no devices")
            lib.ggml_backend_register(reg)
            names = [(lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(i)) or b"").decode()
                     for i in range(before, int(lib.ggml_backend_dev_count()))]
            _added[ep] = names
    return [d for d in list_devices() if d.endpoint in eps]


def added_servers() -> dict[str, list[str]]:
    """The RPC servers added in this process, with their devices' names."""
    with _lock:
        return {k: list(v) for k, v in _added.items()}


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (a name is matched as DNS matches it: any case).

    >>> [is_loopback(h) for h in ("127.0.0.1", "localhost", "LocalHost", "::1", "[::1]", "127.0.0.2",
    ...                           "0.0.0.0", "10.0.0.5", "")]
    [True, True, True, True, True, True, False, False, False]
    """
    import ipaddress
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def start_rpc_server(host: str, port: int, devices: Sequence[str] | None = None, n_threads: int | None = None,
                     cache_dir: str | None = None) -> None:
    """Serve this machine's devices with ggml's RPC server (blocks; llama.cpp's ``rpc-server``).

    ``devices``: names as :func:`list_devices` shows them (default: the GPUs,
    else the CPU, as ``rpc-server`` picks them). ``cache_dir``: where received
    tensors are cached by hash (``rpc-server -c``), so a model is sent once.
    """
    import os
    if not has_rpc():
        raise RpcError("this llama.cpp build has no RPC backend; reinstall with it: " + RPC_INSTALL)
    lib = _ggml()
    chosen: list[int] = []
    if devices:
        for n in devices:
            dev = lib.ggml_backend_dev_by_name(n.encode())
            if not dev:
                have = ", ".join(d.name for d in list_devices())
                raise DeviceError(f"unknown device {n!r}: this machine has {have}")
            chosen.append(int(dev))
    else:
        chosen = [int(lib.ggml_backend_dev_get(i)) for i in range(int(lib.ggml_backend_dev_count()))
                  if int(lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i))) not in (DEV_CPU, DEV_ACCEL)
                  and not _is_rpc_dev(lib, lib.ggml_backend_dev_get(i))]
        if not chosen:
            cpu = next((int(lib.ggml_backend_dev_get(i)) for i in range(int(lib.ggml_backend_dev_count()))
                        if int(lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i))) == DEV_CPU), None)
            if cpu is None:
                raise DeviceError("no devices found")
            chosen = [cpu]
    threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
    start = _rpc_proc("ggml_backend_rpc_start_server", None,
                      [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p])
    arr = device_array(chosen)
    start(f"{host}:{port}".encode(), cache_dir.encode() if cache_dir else None, threads, len(chosen),
          ctypes.cast(arr, ctypes.c_void_p))


def _is_rpc_dev(lib, dev) -> bool:
    reg = lib.ggml_backend_dev_backend_reg(dev)
    name = (lib.ggml_backend_reg_name(reg) or b"").decode() if reg else ""
    return name.startswith("RPC")
