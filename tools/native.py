#!/usr/bin/env python3
"""Native llama.cpp as a test tier: fetch the pinned llama-cpp-python sdist and build
llama-server and llama-lookup-create from its vendored llama.cpp, once, outside the checkout.

    python tools/native.py fetch     # download + unpack the sdist (prints the llama.cpp source dir)
    python tools/native.py build     # fetch, then build both binaries (prints the bin dir); reused when present
                                     # (--pip-tools: pip-install cmake/ninja when they are missing)
    python tools/native.py where     # print the bin dir, exit 1 when it is not built

Everything lives under $DRAFTLIGHT_NATIVE_DIR, default ~/.cache/draftlight-native/<version>:
    sdist/llama_cpp_python-<version>.tar.gz, src/llama_cpp_python-<version>/vendor/llama.cpp,
    build/ (cmake), bin/llama-server, bin/llama-lookup-create, bin/BUILD_INFO.
CPU build, Release, only those two targets, -j$DRAFTLIGHT_NATIVE_JOBS (default 2), plus
$CMAKE_ARGS (as pip's llama-cpp-python build reads it; a change of it rebuilds, and so does another
CPU: llama.cpp builds its kernels for the CPU it is built on, ``python tools/native.py cpu``).
Tests import this file (tests/test_native_llama_cpp.py loads it by path) to find the binaries and the source.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

# The llama-cpp-python release pyproject.toml pins (>=0.3.36,<0.4): its vendored llama.cpp is the
# C++ this project ports and links against.
VERSION = "0.3.36"
TARGETS = ("llama-server", "llama-lookup-create")


def root() -> Path:
    env = os.environ.get("DRAFTLIGHT_NATIVE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "draftlight-native" / VERSION


def src_dir() -> Path:
    return root() / "src" / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def bin_dir() -> Path:
    return root() / "bin"


def built() -> bool:
    return all((bin_dir() / t).is_file() and os.access(bin_dir() / t, os.X_OK) for t in TARGETS)


def _log(msg: str) -> None:
    print(f"[native] {msg}", file=sys.stderr, flush=True)


def fetch() -> Path:
    """Download (pip, the project's ordinary client) and unpack the sdist; reused when present."""
    src = src_dir()
    if (src / "CMakeLists.txt").is_file() and (src / "examples" / "lookup" / "lookup-create.cpp").is_file():
        return src
    sd = root() / "sdist"
    sd.mkdir(parents=True, exist_ok=True)
    tgz = sd / f"llama_cpp_python-{VERSION}.tar.gz"
    if not tgz.is_file():
        _log(f"downloading llama-cpp-python=={VERSION} sdist")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(sd)], check=True)
        if not tgz.is_file():
            raise SystemExit(f"pip download did not produce {tgz}")
    # unpack into a temporary folder next to the target, then rename: a killed unpack leaves no half tree
    dest = root() / "src"
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
    try:
        with tarfile.open(tgz) as tf:
            if sys.version_info >= (3, 12):
                tf.extractall(tmp, filter="data")
            else:
                tf.extractall(tmp)
        final = dest / f"llama_cpp_python-{VERSION}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp / f"llama_cpp_python-{VERSION}", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return src


def _ensure_tools(pip_tools: bool) -> None:
    """cmake (and ninja, if it can be had) on PATH; with ``pip_tools`` they come from PyPI
    wheels into the running environment (a fresh CI machine may have neither)."""
    missing = [t for t in ("cmake", "ninja") if shutil.which(t) is None]
    if missing and pip_tools:
        _log(f"installing {' '.join(missing)} with pip")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=False)
        bindir = os.path.dirname(sys.executable)  # the venv's scripts folder
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"native build needs `{tool}` on PATH")


def _extra_cmake_args() -> list[str]:
    """``CMAKE_ARGS``, as pip's build of llama-cpp-python reads it: the native binaries must be
    built like the Python bindings' library (e.g. ``-DGGML_NATIVE=OFF``), or their CPU kernels,
    and so their numbers, differ. ``-DGGML_RPC=...`` is left out: the RPC backend changes no
    kernel, and no native comparison uses it (so the README's RPC build reuses these binaries)."""
    return [a for a in shlex.split(os.environ.get("CMAKE_ARGS", "")) if not a.upper().startswith("-DGGML_RPC=")]


#: the CPU features a build for this CPU (llama.cpp's default, ``GGML_NATIVE``) compiles kernels for
_ISA_PREFIXES = ("sse", "ssse", "avx", "amx", "fma", "f16c", "bmi", "vnni", "asimd", "sve", "sme", "i8mm",
                 "bf16", "fp16", "dotprod", "fphp")


def cpu_isa() -> str:
    """This CPU's instruction-set extensions, as a short stable string: with llama.cpp's default
    ``GGML_NATIVE`` a build has kernels for the CPU it was built on (AMX, AVX-512, …), so a build
    (or a cached wheel) made on another CPU is not what a user of this one gets.

        >>> isa = cpu_isa()
        >>> isa == cpu_isa() and " " not in isa
        True
    """
    import hashlib
    import platform
    feats: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    feats = {w for w in val.split() if w.startswith(_ISA_PREFIXES)}
                    break
    except OSError:
        pass
    if not feats:   # macOS, or no /proc: the machine and the processor's name
        feats = {platform.machine(), platform.processor()}
    named = [f for f in ("amx_int8", "avx512f", "avx2") if f in feats]
    digest = hashlib.sha256(" ".join(sorted(feats)).encode()).hexdigest()[:12]
    return f"{platform.machine()}-{'+'.join(named) or 'base'}-{digest}"


def _build_info(key: str) -> str | None:
    info = bin_dir() / "BUILD_INFO"
    if not info.is_file():
        return None
    for line in info.read_text().splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1:]
    return ""


def stale() -> str | None:
    """Why the built binaries cannot be reused (None: they can): none built, built with other
    ``CMAKE_ARGS``, or on another CPU (or one not recorded)."""
    if not built():
        return "not built"
    want = " ".join(_extra_cmake_args())
    have, have_cpu, cpu = _build_info("cmake_args"), _build_info("cpu"), cpu_isa()
    if have is not None and have != want:
        return f"built with CMAKE_ARGS={have!r}, now {want!r}"
    if have_cpu != cpu:
        return f"built on another CPU ({have_cpu or 'not recorded'}), this one is {cpu}"
    return None


def build(jobs: int | None = None, pip_tools: bool = False) -> Path:
    want, cpu = " ".join(_extra_cmake_args()), cpu_isa()
    why = stale()
    if why is None:
        _log(f"reusing {bin_dir()}")
        return bin_dir()
    if built():
        _log(f"rebuilding: {why}")
    _ensure_tools(pip_tools)
    src = fetch()
    jobs = jobs or int(os.environ.get("DRAFTLIGHT_NATIVE_JOBS", "2"))
    bld = root() / "build"
    t0 = time.monotonic()
    cfg = [
        "cmake", "-S", str(src), "-B", str(bld),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # no web UI, no network during the build
        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
        "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
        *_extra_cmake_args(),
    ]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    _log("configuring: " + " ".join(cfg))
    subprocess.run(cfg, check=True)
    cmd = ["cmake", "--build", str(bld), "--config", "Release", "-j", str(jobs), "--target", *TARGETS]
    _log("building: " + " ".join(cmd))
    subprocess.run(cmd, check=True)
    out = bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    for t in TARGETS:
        cands = [p for p in (bld / "bin" / t, bld / "bin" / "Release" / t) if p.is_file()]
        if not cands:
            raise SystemExit(f"build finished but {t} is missing under {bld}/bin")
        tmp = out / f".{t}.tmp"
        shutil.copy2(cands[0], tmp)
        os.replace(tmp, out / t)
    minutes = (time.monotonic() - t0) / 60
    (out / "BUILD_INFO").write_text(f"llama-cpp-python {VERSION}\njobs {jobs}\nminutes {minutes:.1f}\n"
                                    f"cmake_args {want}\ncpu {cpu}\n")
    _log(f"built {', '.join(TARGETS)} in {minutes:.1f} min -> {out}")
    # the build tree is large and not needed once the binaries are copied
    if os.environ.get("DRAFTLIGHT_NATIVE_KEEP_BUILD") != "1":
        shutil.rmtree(bld, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    args = argv[1:]
    pip_tools = "--pip-tools" in args
    args = [a for a in args if a != "--pip-tools"]
    cmd = args[0] if args else "build"
    if cmd == "fetch":
        print(fetch())
    elif cmd == "build":
        print(build(pip_tools=pip_tools))
    elif cmd == "cpu":
        print(cpu_isa())
    elif cmd == "where":
        if not built():
            print(f"not built: {bin_dir()}", file=sys.stderr)
            return 1
        print(bin_dir())
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
