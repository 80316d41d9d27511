"""Does this llama.cpp build's CPU extra buffer types work on this CPU? Found out, not crashed into.

llama.cpp moves a model's weights into the CPU's *extra buffer types* when it
can: AMX tiles on Xeons that report AMX, repacked blocks elsewhere. On some
machines (virtual machines that report AMX but do not let a process use it)
the first matrix multiply in those kernels kills the process with a
segmentation fault. So, once per llama.cpp build and CPU, a throwaway child
process loads the default model with them and decodes a few tokens; its exit
tells whether they work. The answer is kept in the cache folder and every
later model is loaded without them where they failed (llama.cpp's
``--no-repack``).

The choice, ``[model] extra_bufts`` in config.toml or ``--extra-bufts``:

- ``auto`` (default): as the probe found (it runs when no answer is kept);
- ``on``: always with them (llama.cpp's default);
- ``off``: never (``--no-repack``).

>>> decide("off").use, decide("off").source
(False, 'forced off')
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

MODES = ("auto", "on", "off")

#: "on" or "off": the answer for this process and its children, no probe (a parent that probed
#: already, e.g. the test suite, passes it on)
ENV = "DRAFTLIGHT_EXTRA_BUFTS"
#: tests: the probe child kills itself with this signal instead of decoding ("segv", "abrt")
SIMULATE_ENV = "DRAFTLIGHT_PROBE_SIMULATE"


@dataclass
class ProbeResult:
    ok: bool
    #: exit status of the probe (negative: killed by that signal), None: it did not finish
    returncode: int | None
    detail: str
    seconds: float
    #: the last lines llama.cpp or Python printed in the probe
    log_tail: list[str]


@dataclass
class Decision:
    use: bool
    #: "forced on", "forced off", "probed now", "cached", or "probe failed"
    source: str
    detail: str = ""
    probe: ProbeResult | None = None

    def line(self) -> str:
        state = "on" if self.use else "off (as llama.cpp's --no-repack)"
        return f"CPU extra buffer types (AMX, repacked weights): {state} — {self.source}" + \
            (f": {self.detail}" if self.detail else "")


def signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "did not finish"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _cpu_id() -> str:
    """The CPU's model name and feature flags (what the kernels depend on)."""
    parts = [platform.machine(), platform.processor()]
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            seen = set()
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features") and key not in seen:
                    seen.add(key)
                    parts.append(line.strip())
    if sys.platform == "darwin":  # pragma: no cover - macOS
        with contextlib.suppress(Exception):
            parts.append(subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                        text=True, timeout=5).stdout.strip())
    return "\n".join(parts)


def build_id() -> str:
    """llama-cpp-python's version and its shared library's size and time: one llama.cpp build."""
    import llama_cpp
    parts = [getattr(llama_cpp, "__version__", "?")]
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for p in sorted(lib_dir.glob("*")) if lib_dir.is_dir() else []:
        with contextlib.suppress(OSError):
            st = p.stat()
            parts.append(f"{p.name}:{st.st_size}:{int(st.st_mtime)}")
    return "\n".join(parts)


def key() -> str:
    return hashlib.sha256((build_id() + "\n--\n" + _cpu_id()).encode()).hexdigest()[:24]


def cache_file() -> Path:
    from . import paths
    return paths.cache_dir() / "cpu-check.json"


def _read_cache() -> dict:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}   # a damaged file is as good as none: the probe runs again and rewrites it
    return data if isinstance(data, dict) else {}


def cached(k: str | None = None) -> dict | None:
    """The kept answer for this build and CPU: {"ok": bool, "detail": str, ...}, or None."""
    entry = _read_cache().get(k or key())
    return entry if isinstance(entry, dict) and isinstance(entry.get("ok"), bool) else None


def _write_cache(k: str, result: ProbeResult) -> None:
    from .fileutil import atomic_write_text
    data = _read_cache()
    data[k] = {"ok": result.ok, "detail": result.detail, "returncode": result.returncode,
               "when": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(result.seconds, 2)}
    with contextlib.suppress(OSError):
        atomic_write_text(cache_file(), json.dumps(data, indent=1, sort_keys=True))


def probe(model_path: str, timeout: float = 180.0) -> ProbeResult:
    """Load ``model_path`` with the extra buffer types in a child process and decode a few tokens."""
    t0 = time.perf_counter()
    env = dict(os.environ)
    env.pop("DRAFTLIGHT_LOG_FD", None)
    env["DRAFTLIGHT_LLAMA_LOG"] = "1"   # the child's llama.cpp log goes to its stderr, which we keep
    cmd = [sys.executable, "-m", "app.cpu_check", "--probe", os.path.abspath(model_path)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stderr or b"")
        tail = (out.decode("utf-8", "replace") if isinstance(out, bytes) else out).splitlines()[-8:]
        return ProbeResult(False, None, f"the probe did not finish in {timeout:.0f} s", time.perf_counter() - t0,
                           tail)
    tail = [l for l in (p.stderr or "").splitlines() if l.strip()][-8:]
    ok = p.returncode == 0 and "probe: ok" in (p.stdout or "")
    detail = "a small decode worked" if ok else f"the probe was {signal_name(p.returncode)}"
    return ProbeResult(ok, p.returncode, detail, time.perf_counter() - t0, tail)


def _crashed(r: ProbeResult) -> bool:
    """The probe died in native code (a signal), as opposed to failing to start."""
    return r.returncode is not None and r.returncode < 0


def decide(mode: str = "auto", model_path: str | None = None,
           progress: Callable[[int, int, str], None] | None = None) -> Decision:
    """Whether to load models with the CPU's extra buffer types, and why.

    ``model_path``: the model to probe with (None: the default model, assembled
    if needed). The answer of a probe whose child died by a signal, or
    succeeded, is kept for this build and CPU.
    """
    if mode not in MODES:
        raise ValueError(f"extra_bufts must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "on":
        return Decision(True, "forced on")
    if mode == "off":
        return Decision(False, "forced off")
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("on", "off"):
        return Decision(env == "on", f"set by {ENV}")
    k = key()
    entry = cached(k)
    if entry is not None:
        return Decision(entry["ok"], "cached", str(entry.get("detail", "")))
    if model_path is None:
        from .models import ensure_default_model
        model_path = str(ensure_default_model(progress))
    if progress is not None:
        progress(0, 0, "probe")
    r = probe(model_path)
    if r.ok or _crashed(r):
        _write_cache(k, r)
        return Decision(r.ok, "probed now", r.detail, r)
    # the probe could not run (a Python error, a time-out): say so, play safe, probe again next time
    why = r.detail + (f" ({r.log_tail[-1].strip()})" if r.log_tail else "")
    return Decision(False, "probe failed", why, r)


def apply(mode: str = "auto", model_path: str | None = None,
          progress: Callable[[int, int, str], None] | None = None) -> Decision:
    """:func:`decide`, then make every later model of this process load accordingly."""
    from speculators.llama import set_extra_bufts
    d = decide(mode, model_path, progress)
    set_extra_bufts(d.use)
    return d


def _probe_main(model_path: str) -> int:
    """The child: load with the extra buffer types, decode a batch and single tokens."""
    from speculators.llama import Context, Model
    sim = os.environ.get(SIMULATE_ENV, "")
    m = Model(model_path, use_extra_bufts=True)
    ctx = Context(m, n_ctx=128, n_batch=64, n_threads=None)
    if sim:
        sys.stderr.write(f"simulated crash ({sim}) before the first matrix multiply\n")
        sys.stderr.flush()
        os.kill(os.getpid(), {"segv": signal.SIGSEGV, "abrt": signal.SIGABRT}.get(sim, signal.SIGSEGV))
    toks = m.tokenize("The quick brown fox jumps over the lazy dog. " * 2, add_special=True, parse_special=False)
    ctx.decode(toks[:32], 0, logits="last")
    n = min(len(toks), 32)
    for i in range(4):
        ctx.decode([toks[i % len(toks)]], n + i, logits="last")
    ctx.close()
    m.close()
    print("probe: ok")
    return 0


def summary() -> dict:
    """For ``doctor``: the kept answer for this build and CPU (no probe is run)."""
    k = key()
    entry = cached(k)
    return {"key": k, "cache_file": str(cache_file()), "answer": entry}


if __name__ == "__main__":  # pragma: no cover - the probe child
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        sys.exit(_probe_main(sys.argv[2]))
    print(json.dumps(asdict(decide()), default=str, indent=1))
