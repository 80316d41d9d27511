"""The native llama.cpp tier is rebuilt where its binaries would not be what this machine's build
gives: other CMAKE_ARGS, or another CPU (llama.cpp builds its kernels for the CPU it is built on,
so binaries from a machine without AMX would never run the AMX kernels of one that has them)."""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTLIGHT_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_RPC=on")
    spec = importlib.util.spec_from_file_location("draftlight_native_tool_t", ROOT / "tools" / "native.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_build(tool, info: str) -> None:
    b = tool.bin_dir()
    b.mkdir(parents=True, exist_ok=True)
    for t in tool.TARGETS:
        (b / t).write_text("#!/bin/sh\n")
        (b / t).chmod(0o755)
    (b / "BUILD_INFO").write_text(info)


def test_binaries_built_on_another_cpu_or_with_other_flags_are_stale(monkeypatch, tmp_path):
    tool = _tool(monkeypatch, tmp_path)
    assert tool.stale() == "not built"
    cpu = tool.cpu_isa()
    # RPC changes no kernel: the README's build reuses binaries built without it
    _fake_build(tool, f"llama-cpp-python {tool.VERSION}\ncmake_args \ncpu {cpu}\n")
    assert tool.stale() is None
    _fake_build(tool, f"cmake_args -DGGML_NATIVE=OFF\ncpu {cpu}\n")
    assert "CMAKE_ARGS" in tool.stale()
    other = cpu.replace("amx_int8", "x") if "amx_int8" in cpu else cpu + "+amx_int8"
    _fake_build(tool, f"cmake_args \ncpu {other}\n")
    assert "another CPU" in tool.stale() and other in tool.stale()
    # a build from before the CPU was recorded: not known to be this CPU's
    _fake_build(tool, "cmake_args \n")
    assert "not recorded" in tool.stale()


def test_the_cpu_key_names_the_extensions_kernels_are_built_for(monkeypatch, tmp_path):
    tool = _tool(monkeypatch, tmp_path)
    flags = {w for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
             for w in line.split(":", 1)[1].split()} if Path("/proc/cpuinfo").exists() else set()
    key = tool.cpu_isa()
    assert key == tool.cpu_isa()
    assert ("amx_int8" in key) == ("amx_int8" in flags)
    assert ("avx2" in key) == ("avx2" in flags)
    # its docstring's example too (tools/ is outside the doctest collection)
    assert doctest.testmod(tool, verbose=False).failed == 0
