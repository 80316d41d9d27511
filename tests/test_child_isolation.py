"""draftlight's child processes run draftlight's code, whatever folder they start in, and die
with their parent (app.child).

Each test starts a child from a project folder that has ``app``, ``speculators`` and ``themes``
packages of its own (as any Flask or FastAPI project has an ``app``): importing any of them
prints a marker and writes it to a file, which must never happen.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import cmd_desktop, cpu_check
from app.child import module_argv

ROOT = Path(__file__).resolve().parent.parent
MARK = "FOREIGN CODE RAN"
SCRIPT = Path(sys.executable).with_name("draftlight")


@pytest.fixture
def project(tmp_path) -> Path:
    """A folder whose own ``app``, ``speculators`` and ``themes`` tell when they are imported."""
    folder = tmp_path / "project"
    ran = folder / "ran.txt"
    for pkg in ("app", "speculators", "themes"):
        (folder / pkg).mkdir(parents=True)
        code = f"print({MARK!r}, {pkg!r}, flush=True)\nopen({str(ran)!r}, 'a').write({pkg!r} + '\\n')\n"
        (folder / pkg / "__init__.py").write_text(code)
        (folder / pkg / "__main__.py").write_text(code)
    return folder


@pytest.fixture
def tiny_model(project) -> str:
    """A model that loads and decodes in milliseconds, in the project folder: its relative path."""
    import string
    from tests.gguf_factory import write_tiny_llama
    (project / "models").mkdir()
    vocab = ["<unk>", "</s>", "<s>", "\u2581", *string.ascii_letters, ".", *(f"<0x{b:02X}>" for b in range(256))]
    write_tiny_llama(project / "models" / "tiny.gguf", vocab)
    return os.path.join("models", "tiny.gguf")


def foreign_code_ran(folder: Path, *outputs: str) -> bool:
    return (folder / "ran.txt").exists() or any(MARK in (o or "") for o in outputs)


@pytest.mark.parametrize("pythonpath", [None, ".", ":" + str(ROOT)])
def test_module_argv_runs_our_module_from_a_folder_with_its_own_app(project, pythonpath):
    """Also where PYTHONPATH names the current folder relatively ('.', an empty entry)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    p = subprocess.run(module_argv("app", "--version"), cwd=project, env=env, capture_output=True, text=True,
                       timeout=120)
    assert not foreign_code_ran(project, p.stdout, p.stderr), p.stdout + p.stderr
    assert p.returncode == 0 and p.stdout.startswith("draftlight "), p.stderr


def test_the_runner_child_starts_from_a_folder_with_its_own_app(project):
    """The command app.runner starts its runner with (``module_argv("app.runner_child", FD)``)."""
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(module_argv("app.runner_child", str(theirs.fileno())), cwd=project,
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    finally:
        theirs.close()
    ours.close()          # no requests: the runner finds its socket closed and ends
    out, _ = proc.communicate(timeout=120)
    assert not foreign_code_ran(project, out), out
    assert proc.returncode == 0, out


def test_the_cpu_probe_runs_ours_from_a_folder_with_its_own_app(project, tiny_model, monkeypatch):
    monkeypatch.chdir(project)
    r = cpu_check.probe(tiny_model)
    assert not foreign_code_ran(project, *r.log_tail), r.log_tail
    assert r.ok, (r.detail, r.log_tail)


@pytest.mark.skipif(not SCRIPT.exists(), reason="needs the draftlight script (pip install -e .)")
def test_a_supervised_command_runs_ours_and_keeps_relative_paths(project, tiny_model):
    """``draftlight generate`` runs in a supervised child; paths relative to the folder work."""
    (project / "prompt.txt").write_text("Hello")
    p = subprocess.run([str(SCRIPT), "generate", "--no-config", "-m", tiny_model, "-f", "prompt.txt",
                        "--raw", "-n", "3", "--temp", "0", "-c", "256", "--spec-type", "none", "--no-lookup-store",
                        "--json"], cwd=project, capture_output=True, text=True, timeout=300)
    assert not foreign_code_ran(project, p.stdout, p.stderr), p.stdout + p.stderr
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["stats"]["n_generated"] == 3


def test_the_desktop_launchers_command_without_a_script_runs_ours(project, monkeypatch, tmp_path):
    """Where no ``draftlight`` script is found, the launcher runs this Python on our ``app``;
    run as the installed launcher runs it (a shell script, from the folder it starts in)."""
    python = sys.executable
    with monkeypatch.context() as m:
        m.setattr(cmd_desktop.shutil, "which", lambda *_a, **_k: None)
        m.setattr(sys, "argv", ["pytest"])
        m.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
        command = cmd_desktop.draftlight_command()
    assert command[0] == str(tmp_path / "nowhere" / "python")
    command[0] = python
    launcher = tmp_path / "draftlight.command"
    launcher.write_text(cmd_desktop.fill_command(cmd_desktop.data_file("draftlight.command").decode(), command))
    p = subprocess.run(["/bin/sh", str(launcher), "--version"], cwd=project, capture_output=True, text=True,
                       timeout=120)
    assert not foreign_code_ran(project, p.stdout, p.stderr), p.stdout + p.stderr
    assert p.returncode == 0 and p.stdout.startswith("draftlight "), p.stderr


# --------------------------------------------------------------------------- die with the parent

def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie left to a parent that does not reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait(what, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.1)
    return bool(what())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_cpu_probe_dies_with_its_parent():
    """A probe stuck in a load (``DRAFTLIGHT_PROBE_SIMULATE=wait``) whose runner is killed with
    SIGKILL ends within a few seconds instead of living on as an orphan."""
    env = dict(os.environ, **{cpu_check.SIMULATE_ENV: "wait"})
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from app import cpu_check; cpu_check.probe('m.gguf')"
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    probe: list[int] = []
    try:
        assert _wait(lambda: probe.extend(_children(parent.pid)) or probe, 60), "the probe did not start"
        time.sleep(0.5)
        assert _alive(probe[0]), "the probe ended by itself: it should wait"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait(lambda: not _alive(probe[0]), 10), "the probe outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in probe:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
