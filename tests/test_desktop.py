"""``draftlight install-desktop`` / ``uninstall-desktop`` and the launchers they install.

Everything is installed into the per-test XDG dirs of ``conftest.private_dirs``
(and a temp HOME for the macOS bundle). The launcher is run for real, with a
fake terminal emulator on PATH that records its arguments and then runs the
command it was given, so the whole chain desktop entry -> launcher ->
terminal -> draftlight is exercised.
"""

from __future__ import annotations

import hashlib
import os
import plistlib
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from app import __version__, cmd_desktop
from app.cli import main

DFV = shutil.which("desktop-file-validate")
DRAFTLIGHT = Path(sys.executable).parent / "draftlight"


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a content hash (folders: 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def read_entry(path: Path) -> dict[str, str]:
    group, out = None, {}
    for line in path.read_text().splitlines():
        if line.startswith("["):
            group = line.strip("[]")
        elif "=" in line and group == "Desktop Entry":
            k, v = line.split("=", 1)
            out[k] = v
    return out


def data_home() -> Path:
    return Path(os.environ["XDG_DATA_HOME"])


def entry_path() -> Path:
    return data_home() / "applications" / "draftlight.desktop"


def install_quiet(*extra: str) -> None:
    assert main(["install-desktop", "-q", *extra]) == 0


def fake_terminal(bindir: Path, name: str, n_prefix: int, log: Path) -> Path:
    """A terminal emulator that records its argv, drops ``n_prefix`` option words and runs the rest."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / name
    exe.write_text(
        "#!/bin/sh\n"
        f"for a in \"$@\"; do printf '%s\\n' \"$a\" >> '{log}'; done\n"
        f"shift {n_prefix}\n"
        "exec \"$@\"\n")
    exe.chmod(0o755)
    return exe


def launcher_env(bindir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TERMINAL", "XDG_CURRENT_DESKTOP", "DISPLAY", "WAYLAND_DISPLAY")}
    env["PATH"] = str(bindir)  # only the fake terminals: never a real one
    env.update(extra)
    return env


# --------------------------------------------------------------------------- install / uninstall

def test_install_writes_entry_icons_and_launcher(private_dirs):
    install_quiet()
    e = read_entry(entry_path())
    assert e["Type"] == "Application" and e["Name"] == "draftlight"
    assert e["Terminal"] == "false" and e["Icon"] == "draftlight"
    argv = cmd_desktop.parse_exec(e["Exec"])
    launcher = Path(argv[0])
    assert launcher.is_absolute() and launcher.is_file() and os.access(launcher, os.X_OK)
    assert e["TryExec"] == str(launcher)
    # the launcher lives in draftlight's own data dir, inside the temp XDG dirs
    assert launcher.is_relative_to(data_home() / "draftlight")
    # and runs this draftlight by absolute path
    assert f"set -- {DRAFTLIGHT} \"$@\"" in launcher.read_text()
    icons = data_home() / "icons" / "hicolor"
    assert (icons / "scalable" / "apps" / "draftlight.svg").read_bytes().lstrip().startswith(b"<?xml")
    for s in cmd_desktop.PNG_SIZES:
        png = (icons / f"{s}x{s}" / "apps" / "draftlight.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (s, s)  # IHDR width, height


@pytest.mark.skipif(DFV is None, reason="desktop-file-validate (Debian: desktop-file-utils) is not installed; "
                                        ".ci/run installs it")
def test_entry_is_valid(private_dirs):
    # the shipped template as it is, and the installed entry
    shipped = private_dirs / "shipped.desktop"
    shipped.write_bytes(cmd_desktop.data_file("draftlight.desktop"))
    install_quiet()
    for path in (shipped, entry_path()):
        r = subprocess.run([DFV, str(path)], capture_output=True, text=True)
        assert r.returncode == 0 and not r.stdout.strip(), (path, r.stdout, r.stderr)


def test_paths_with_spaces_and_dollars_are_quoted(private_dirs, monkeypatch, tmp_path):
    odd = tmp_path / "my data $HOME 'q' \"dq\" `x` 100%"
    odd.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(odd))
    install_quiet()
    e = read_entry(entry_path())
    launcher = odd / "draftlight" / "desktop" / "draftlight-terminal"
    assert cmd_desktop.parse_exec(e["Exec"]) == [str(launcher)]
    if DFV:
        r = subprocess.run([DFV, str(entry_path())], capture_output=True, text=True)
        assert r.returncode == 0 and not r.stdout.strip(), r.stdout
    # and that launcher runs
    log = tmp_path / "args.log"
    bindir = tmp_path / "bin"
    fake_terminal(bindir, "xterm", 1, log)
    r = subprocess.run([*cmd_desktop.parse_exec(e["Exec"]), "--version"], env=launcher_env(bindir),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"draftlight {__version__}"


def test_uninstall_leaves_nothing_behind(private_dirs):
    before = snapshot(private_dirs)
    install_quiet()
    assert snapshot(private_dirs) != before
    assert main(["uninstall-desktop", "-q"]) == 0
    assert snapshot(private_dirs) == before


def test_uninstall_never_touches_other_files(private_dirs):
    apps = data_home() / "applications"
    apps.mkdir()
    other = apps / "other.desktop"
    other.write_text("[Desktop Entry]\nType=Application\nName=Other\nExec=other\n")
    other_icon = data_home() / "icons" / "hicolor" / "48x48" / "apps" / "other.png"
    other_icon.parent.mkdir(parents=True)
    other_icon.write_bytes(b"not ours")
    models = data_home() / "draftlight" / "models"
    models.mkdir(parents=True)
    (models / "mine.gguf").write_bytes(b"GGUF")
    before = snapshot(private_dirs)
    install_quiet()
    install_quiet()  # a second install changes nothing about what uninstall removes
    assert main(["uninstall-desktop", "-q"]) == 0
    assert snapshot(private_dirs) == before
    # nothing recorded, nothing installed: uninstall is a no-op
    assert main(["uninstall-desktop"]) == 0
    assert snapshot(private_dirs) == before


def test_uninstall_without_a_record_removes_only_recognisable_files(private_dirs):
    before = snapshot(private_dirs)
    install_quiet()
    cmd_desktop.manifest_path().unlink()
    assert main(["uninstall-desktop", "-q"]) == 0
    left = {k for k in snapshot(private_dirs) if k not in before}
    # the files are gone; only the (empty) folders install created may stay, and the
    # desktop database's cache (with no record, whether install made it is unknown)
    files = {k for k in left if not (private_dirs / k).is_dir()}
    assert files <= {"xdg_data_home/applications/mimeinfo.cache"}, files


def test_a_foreign_entry_is_not_replaced_without_force(private_dirs):
    entry_path().parent.mkdir(parents=True)
    entry_path().write_text("[Desktop Entry]\nType=Application\nName=mine\nExec=mine\n")
    assert main(["install-desktop", "-q"]) == 1
    assert "Name=mine" in entry_path().read_text()
    assert main(["install-desktop", "-q", "--force"]) == 0
    assert read_entry(entry_path())["Name"] == "draftlight"


def test_dry_run_changes_nothing(private_dirs, capsys):
    before = snapshot(private_dirs)
    assert main(["install-desktop", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would write" in out and "draftlight.desktop" in out
    assert snapshot(private_dirs) == before


def test_command_option_is_what_the_launcher_runs(private_dirs, tmp_path):
    fake = tmp_path / "tools" / "my-draftlight"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho fake \"$@\"\n")
    fake.chmod(0o755)
    install_quiet("--command", str(fake))
    bindir = tmp_path / "bin"
    fake_terminal(bindir, "xterm", 1, tmp_path / "log")
    exec_argv = cmd_desktop.parse_exec(read_entry(entry_path())["Exec"])
    r = subprocess.run([*exec_argv, "a b", "c"], env=launcher_env(bindir), capture_output=True, text=True,
                       timeout=30)
    assert r.stdout == "fake a b c\n"
    assert main(["install-desktop", "--command", str(tmp_path / "nope")]) == 1


def test_cli_resolves_its_own_absolute_path(private_dirs, tmp_path):
    """Run as ``draftlight install-desktop`` from another folder: the launcher gets that draftlight."""
    r = subprocess.run([str(DRAFTLIGHT), "install-desktop"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "draftlight.desktop" in r.stdout
    launcher = Path(cmd_desktop.parse_exec(read_entry(entry_path())["Exec"])[0])
    assert f"set -- {DRAFTLIGHT} \"$@\"" in launcher.read_text()
    r = subprocess.run([str(DRAFTLIGHT), "uninstall-desktop"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "removed" in r.stdout


# --------------------------------------------------------------------------- the launcher

TERMINALS = [  # name, option words before the command
    ("x-terminal-emulator", ["-e"]),
    ("gnome-terminal", ["--"]),
    ("kgx", ["--"]),
    ("konsole", ["-e"]),
    ("xfce4-terminal", ["-x"]),
    ("kitty", []),
    ("alacritty", ["-e"]),
    ("wezterm", ["start", "--"]),
    ("foot", []),
    ("ghostty", ["-e"]),
    ("xterm", ["-e"]),
]


@pytest.mark.parametrize("term,prefix", TERMINALS, ids=[t for t, _ in TERMINALS])
def test_exec_line_opens_draftlight_in_a_terminal(private_dirs, tmp_path, term, prefix):
    install_quiet()
    log = tmp_path / "args.log"
    bindir = tmp_path / "bin"
    fake_terminal(bindir, term, len(prefix), log)
    argv = cmd_desktop.parse_exec(read_entry(entry_path())["Exec"])
    r = subprocess.run([*argv, "--version"], env=launcher_env(bindir), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"draftlight {__version__}"
    recorded = log.read_text().splitlines()
    assert recorded[:len(prefix)] == prefix
    assert recorded[len(prefix):len(prefix) + 2] == ["/bin/sh", "-c"]
    assert recorded[-2:] == [str(DRAFTLIGHT), "--version"]


SHELLS = [s for s in (["dash"], ["bash", "--posix"], ["bash"], ["zsh", "--emulate", "sh"], ["busybox", "sh"])
          if shutil.which(s[0])]


@pytest.mark.parametrize("shell", SHELLS, ids=[" ".join(s) for s in SHELLS])
def test_launcher_is_portable_sh(private_dirs, tmp_path, shell):
    """/bin/sh is dash on Debian, bash on Fedora/Arch/macOS: the launcher must work in each."""
    install_quiet()
    launcher = cmd_desktop.parse_exec(read_entry(entry_path())["Exec"])[0]
    log = tmp_path / "args.log"
    bindir = tmp_path / "bin"
    fake_terminal(bindir, "xterm", 1, log)
    r = subprocess.run([shutil.which(shell[0]), *shell[1:], launcher, "--version"], env=launcher_env(bindir),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"draftlight {__version__}"
    assert log.read_text().splitlines()[:3] == ["-e", "/bin/sh", "-c"]


def test_terminal_variable_and_desktop_preference(private_dirs, tmp_path):
    install_quiet()
    argv = [*cmd_desktop.parse_exec(read_entry(entry_path())["Exec"]), "--version"]
    bindir = tmp_path / "bin"
    logs = {t: tmp_path / f"{t}.log" for t in ("xterm", "kitty", "konsole", "x-terminal-emulator")}
    fake_terminal(bindir, "xterm", 1, logs["xterm"])
    fake_terminal(bindir, "kitty", 1, logs["kitty"])  # drops the --single-instance option below
    fake_terminal(bindir, "konsole", 1, logs["konsole"])
    fake_terminal(bindir, "x-terminal-emulator", 1, logs["x-terminal-emulator"])

    def used(**env) -> str:
        for lg in logs.values():
            lg.unlink(missing_ok=True)
        r = subprocess.run(argv, env=launcher_env(bindir, **env), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return next(t for t, lg in logs.items() if lg.exists())

    assert used() == "x-terminal-emulator"
    assert used(XDG_CURRENT_DESKTOP="KDE") == "konsole"
    assert used(TERMINAL="kitty --single-instance") == "kitty"
    assert logs["kitty"].read_text().splitlines()[:2] == ["--single-instance", "/bin/sh"]
    assert used(TERMINAL="no-such-terminal") == "x-terminal-emulator"


def test_no_terminal_found_says_so(private_dirs, tmp_path):
    install_quiet()
    argv = cmd_desktop.parse_exec(read_entry(entry_path())["Exec"])
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run(argv, env=launcher_env(empty), capture_output=True, text=True, timeout=30)
    assert r.returncode == 127
    assert "No terminal emulator found" in r.stderr


def test_window_stays_open_when_draftlight_fails(private_dirs, tmp_path):
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'draftlight: error: boom' >&2\nexit 3\n")
    failing.chmod(0o755)
    install_quiet("--command", str(failing))
    bindir = tmp_path / "bin"
    fake_terminal(bindir, "xterm", 1, tmp_path / "log")
    argv = cmd_desktop.parse_exec(read_entry(entry_path())["Exec"])
    r = subprocess.run(argv, env=launcher_env(bindir), input="\n", capture_output=True, text=True, timeout=30)
    assert r.returncode == 3
    assert "boom" in r.stderr and "exited with status 3" in r.stdout and "press Enter" in r.stdout


# --------------------------------------------------------------------------- macOS bundle (laid out here)

def test_macos_bundle(private_dirs, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    before = snapshot(data_home())
    assert main(["install-desktop", "-q", "--target", "macos"]) == 0
    app = home / "Applications" / "draftlight.app" / "Contents"
    info = plistlib.loads((app / "Info.plist").read_bytes())
    assert info["CFBundleExecutable"] == "draftlight" and info["CFBundlePackageType"] == "APPL"
    assert info["CFBundleShortVersionString"] == __version__
    exe, command = app / "MacOS" / "draftlight", app / "Resources" / "draftlight.command"
    for script in (exe, command):
        assert script.stat().st_mode & stat.S_IXUSR
        assert subprocess.run(["/bin/sh", "-n", str(script)]).returncode == 0
    icns = (app / "Resources" / f"{info['CFBundleIconFile']}.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    assert icns[8:12] in (b"ic07", b"ic08", b"ic09")
    # the .command runs draftlight (it is plain sh: it runs here too)
    r = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"draftlight {__version__}"
    # the app's executable asks `open` to run that .command in Terminal
    bindir = tmp_path / "bin"
    log = tmp_path / "open.log"
    fake_terminal(bindir, "open", 0, log).write_text(
        f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\" >> '{log}'; done\n")
    r = subprocess.run([str(exe)], env=launcher_env(bindir), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert log.read_text().splitlines() == ["-a", "Terminal", str(command)]
    # uninstall removes the bundle, ~/Applications that install created, and its record
    assert main(["uninstall-desktop", "-q", "--target", "macos"]) == 0
    assert list(home.iterdir()) == []
    assert snapshot(data_home()) == before


def test_macos_refuses_to_replace_a_foreign_bundle(private_dirs, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "Applications" / "draftlight.app" / "Contents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert main(["install-desktop", "-q", "--target", "macos"]) == 1
    assert (home / "Applications" / "draftlight.app" / "Contents").is_dir()
    assert not (home / "Applications" / "draftlight.app" / "Contents" / "Info.plist").exists()


# --------------------------------------------------------------------------- pieces

@pytest.mark.parametrize("arg", ["/usr/bin/draftlight", "/a b/c", "/x/$HOME/`y`", '/q/"x"/\\z', "/p/100%", "/t/'s'",
                                 "/é/ü"])
def test_exec_quote_round_trips(arg):
    assert cmd_desktop.parse_exec(cmd_desktop.exec_quote(arg)) == [arg]


def test_draftlight_command_is_absolute(monkeypatch, tmp_path):
    # run as the console script: that script, by absolute path
    script = tmp_path / "bin" / "draftlight"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["bin/draftlight", "install-desktop"])
    assert cmd_desktop.draftlight_command() == [str(script)]
    # run some other way (pytest here): the draftlight beside this Python
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert cmd_desktop.draftlight_command() == [str(DRAFTLIGHT)]
