"""Does this llama.cpp build's CPU extra buffer types work on this CPU? Found out, not crashed into.

llama.cpp moves a model's weights into the CPU's *extra buffer types* when it
can: AMX tiles on Xeons that report AMX, repacked blocks elsewhere. On some
machines (virtual machines that report AMX but do not let a process use it)
the first matrix multiply in those kernels kills the process with a
segmentation fault. So, once per llama.cpp build and CPU, a throwaway child
process loads the default model with them and decodes a few tokens; its exit
tells whether they work. Where it dies, a second child tries the repacked
weights alone (speculators.repack: AMX and any other extra type left out,
the weights ``CPU_REPACK`` can hold sent to it by name); where that dies too,
models load without any (llama.cpp's ``--no-repack``). The answer is kept in
the cache folder and every later model is loaded accordingly.

The choice, ``[model] extra_bufts`` in config.toml or ``--extra-bufts``:

- ``auto`` (default): as the probe found (it runs when no answer is kept);
- ``on``: always with all of them (llama.cpp's default);
- ``repack``: the repacked weights only;
- ``off``: never (``--no-repack``).

>>> decide("off").use, decide("off").source
(False, 'forced off')
>>> decide("repack").mode, decide("repack").use
('repack', False)
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

from .child import die_with_parent, module_argv

MODES = ("auto", "on", "repack", "off")

#: "on", "repack" or "off": the answer for this process and its children, no probe (a parent
#: that probed already, e.g. the test suite, passes it on)
ENV = "DRAFTLIGHT_EXTRA_BUFTS"
#: tests: the probe child kills itself with this signal instead of decoding ("segv", "abrt"); with
#: a mode after a colon ("segv:on") only the probe of that mode does (a CPU whose AMX kernels crash).
#: "wait": it waits, loading nothing, until it is stopped (a probe stuck in a load)
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
    #: "on" (all the extra buffer types), "repack" (the repacked weights only) or "off"
    mode: str
    #: "forced on", "forced off", "forced repack", "probed now", "cached", or "probe failed"
    source: str
    detail: str = ""
    probe: ProbeResult | None = None
    #: the probe of the repacked weights alone, where the first one died
    probe_repack: ProbeResult | None = None

    @property
    def use(self) -> bool:
        """Whether models load with all of the CPU's extra buffer types (llama.cpp's default)."""
        return self.mode == "on"

    def line(self) -> str:
        return f"CPU extra buffer types (AMX, repacked weights): {STATES[self.mode]} — {self.source}" + \
            (f": {self.detail}" if self.detail else "")


#: what each mode means, in a few words
STATES = {"on": "on", "repack": "the repacked weights only (AMX and other extra types off)",
          "off": "off (as llama.cpp's --no-repack)"}


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
    """The kept answer for this build and CPU: {"ok": bool, "mode": str, "detail": str, ...}, or None
    ("ok": all the extra buffer types work; "mode": how models load, see :class:`Decision`)."""
    entry = _read_cache().get(k or key())
    if not (isinstance(entry, dict) and isinstance(entry.get("ok"), bool)):
        return None
    if entry.get("mode") not in MODES[1:]:
        entry["mode"] = "on" if entry["ok"] else "off"     # kept by a version that had no "repack"
    return entry


def _write_cache(k: str, result: ProbeResult, mode: str, detail: str) -> None:
    from .fileutil import atomic_write_text
    data = _read_cache()
    data[k] = {"ok": result.ok, "mode": mode, "detail": detail, "returncode": result.returncode,
               "when": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(result.seconds, 2)}
    with contextlib.suppress(OSError):
        atomic_write_text(cache_file(), json.dumps(data, indent=1, sort_keys=True))


def probe(model_path: str, timeout: float = 180.0, mode: str = "on") -> ProbeResult:
    """Load ``model_path`` with the extra buffer types (``mode`` "on": all of them, "repack": the
    repacked weights only) in a child process and decode a few tokens."""
    t0 = time.perf_counter()
    env = dict(os.environ)
    env.pop("DRAFTLIGHT_LOG_FD", None)
    env["DRAFTLIGHT_LLAMA_LOG"] = "1"   # the child's llama.cpp log goes to its stderr, which we keep
    # our app.cpu_check, whatever the current folder holds (app.child)
    cmd = module_argv("app.cpu_check", "--probe", os.path.abspath(model_path), mode)
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


def _why(r: ProbeResult) -> str:
    """Why a probe could not run: its detail and the last line it printed."""
    return r.detail + (f" ({r.log_tail[-1].strip()})" if r.log_tail else "")


def decide(mode: str = "auto", model_path: str | None = None,
           progress: Callable[[int, int, str], None] | None = None) -> Decision:
    """Whether to load models with the CPU's extra buffer types, and why.

    ``model_path``: the model to probe with (None: the default model, assembled
    if needed). The answer of a probe whose child died by a signal, or
    succeeded, is kept for this build and CPU.
    """
    if mode not in MODES:
        raise ValueError(f"extra_bufts must be one of {', '.join(MODES)}, not {mode!r}")
    if mode != "auto":
        return Decision(mode, f"forced {mode}")
    env = os.environ.get(ENV, "").strip().lower()
    if env in MODES[1:]:
        return Decision(env, f"set by {ENV}")
    k = key()
    entry = cached(k)
    if entry is not None:
        return Decision(entry["mode"], "cached", str(entry.get("detail", "")))
    if model_path is None:
        from .models import ensure_default_model
        model_path = str(ensure_default_model(progress))
    if progress is not None:
        progress(0, 0, "probe")
    d = probe_decision(model_path)
    if d.source == "probed now":
        _write_cache(k, d.probe, d.mode, d.detail)
    return d


def probe_decision(model_path: str) -> Decision:
    """What :func:`decide` decides by probing now, kept nowhere (the tests' own answer for this CPU)."""
    r = probe(model_path)
    if r.ok:
        return Decision("on", "probed now", r.detail, r)
    if not _crashed(r):
        # the probe could not run (a Python error, a time-out): say so, play safe, probe again next time
        return Decision("off", "probe failed", _why(r), r)
    # all of them crash: do the repacked weights alone work? (only worth asking where there is
    # another extra type than the repacked one, e.g. AMX: else it is the same load again)
    from speculators.repack import REPACK_NAME, cpu_extra_bufts
    extras = cpu_extra_bufts()
    others = [n for n in extras if n != REPACK_NAME]
    if REPACK_NAME in extras and others:
        rr = probe(model_path, mode="repack")
        if rr.ok:
            detail = f"with {', '.join(others)} the probe was {signal_name(r.returncode)}; the repacked weights alone work"
            return Decision("repack", "probed now", detail, r, rr)
        if _crashed(rr):
            detail = f"the probe was {signal_name(r.returncode)}, and with the repacked weights alone " \
                     f"{signal_name(rr.returncode)}"
            return Decision("off", "probed now", detail, r, rr)
        return Decision("off", "probe failed", f"{r.detail}; then {_why(rr)}", r, rr)
    return Decision("off", "probed now", r.detail, r)


def apply(mode: str = "auto", model_path: str | None = None,
          progress: Callable[[int, int, str], None] | None = None) -> Decision:
    """:func:`decide`, then make every later model of this process load accordingly."""
    from speculators.llama import set_extra_bufts
    d = decide(mode, model_path, progress)
    set_extra_bufts(d.mode)
    if progress is not None and d.source in ("probed now", "probe failed"):
        progress(0, 0, "load")      # the probe is over: what follows is the model's own load
    return d


def _probe_main(model_path: str, mode: str = "on") -> int:
    """The child: load with the extra buffer types (``mode``), decode a batch and single tokens.
    It stops when the process that started it dies (:func:`app.child.die_with_parent`): a probe
    stuck in a load does not outlive the runner that waits for it."""
    die_with_parent()
    sim, _, sim_mode = os.environ.get(SIMULATE_ENV, "").partition(":")
    if sim == "wait":
        print("probe: waiting", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)
    from speculators.llama import Context, Model
    m = Model(model_path, use_extra_bufts=mode)
    ctx = Context(m, n_ctx=128, n_batch=64, n_threads=None)
    if sim and sim_mode in ("", mode):
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
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--probe":
        sys.exit(_probe_main(sys.argv[2], *sys.argv[3:]))
    print(json.dumps(asdict(decide()), default=str, indent=1))
