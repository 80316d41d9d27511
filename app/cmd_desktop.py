"""``draftlight install-desktop`` / ``uninstall-desktop``: start draftlight from the desktop.

Linux and other XDG desktops get, under ``$XDG_DATA_HOME`` (``~/.local/share``):

* ``applications/draftlight.desktop``, whose Exec runs
* ``draftlight/desktop/draftlight-terminal``, a launcher that opens the
  user's terminal emulator running this very ``draftlight`` (absolute path);
* ``icons/hicolor/scalable/apps/draftlight.svg`` and PNGs in
  ``icons/hicolor/NxN/apps/``.

macOS gets ``~/Applications/draftlight.app``: a minimal bundle whose
executable opens Terminal with a ``draftlight.command`` kept inside it.

What was written (and which folders were created) is recorded in
``<data dir>/desktop/installed.json``; uninstall removes exactly those
files, and those folders if they are empty, never anything else.
The templates ship in the wheel, in ``app/data/``.
"""

from __future__ import annotations

import argparse
import json
import os
import plistlib
import shlex
import shutil
import struct
import subprocess
import sys
from importlib import resources
from pathlib import Path

from . import __version__, paths
from .fileutil import atomic_write_bytes, atomic_write_text

DESKTOP_ID = "draftlight.desktop"
ICON_NAME = "draftlight"
PNG_SIZES = (48, 128, 256, 512)
BUNDLE_ID = "io.github.draftlight"
MARKER_KEY = "X-Draftlight-Version"
COMMAND_MARKER = "# @DRAFTLIGHT_COMMAND@"


class DesktopError(RuntimeError):
    pass


# --------------------------------------------------------------------------- CLI

def add_arguments(p: argparse.ArgumentParser, name: str = "install-desktop") -> None:
    p.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    if name == "install-desktop":
        p.add_argument("--force", action="store_true",
                       help="replace a draftlight.desktop or draftlight.app that draftlight did not write")
        p.add_argument("--command", dest="draftlight_command", metavar="PATH",
                       help="the draftlight executable the launcher runs (default: this one, "
                            "by absolute path)")
    # for tests and packagers: lay out the files for another platform's desktop
    p.add_argument("--target", choices=("auto", "xdg", "macos"), default="auto", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from .cli import CliError
    target = args.target if args.target != "auto" else default_target()
    if target is None:
        raise CliError("install-desktop knows Linux/BSD (XDG) desktops and macOS; on Windows, "
                       "make a shortcut to `draftlight` instead")
    say = (lambda *_: None) if args.quiet else print
    try:
        if args.command == "install-desktop":
            command = _given_command(args.draftlight_command) if args.draftlight_command else None
            install(target, command=command, dry_run=args.dry_run, force=args.force, say=say)
        else:
            uninstall(target, dry_run=args.dry_run, say=say)
    except DesktopError as e:
        raise CliError(str(e)) from None
    return 0


def _given_command(cmd: str) -> list[str]:
    from .cli import CliError
    found = shutil.which(cmd) if os.sep not in cmd else (cmd if os.access(cmd, os.X_OK) else None)
    if not found or not os.path.isfile(found):
        raise CliError(f"--command: {cmd} is not an executable file")
    return [os.path.abspath(found)]


def default_target() -> str | None:
    if sys.platform == "darwin":
        return "macos"
    if sys.platform.startswith(("win", "cygwin", "msys")):
        return None
    return "xdg"


# --------------------------------------------------------------------------- pieces

def data_file(name: str) -> bytes:
    """A file shipped in ``app/data`` (inside the wheel)."""
    return resources.files("app").joinpath("data", *name.split("/")).read_bytes()


def draftlight_command() -> list[str]:
    """The command that runs this draftlight, by absolute path (argv words): its ``draftlight``
    script, else this Python running our ``app`` (:func:`app.child.module_argv`: never
    ``-m app``, which would run an ``app`` in whatever folder the launcher starts in)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name in ("draftlight", "draftlight.exe"):
        found = argv0 if os.sep in argv0 else shutil.which(argv0)
        if found and os.access(found, os.X_OK):
            return [os.path.abspath(found)]
    beside = Path(sys.executable).parent / ("draftlight.exe" if os.name == "nt" else "draftlight")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside.absolute())]
    found = shutil.which("draftlight")
    if found:
        return [os.path.abspath(found)]
    from .child import module_argv
    return module_argv("app", now=False)


def fill_command(script: str, command: list[str]) -> str:
    """Put ``command`` (absolute) into a launcher script's ``set -- draftlight "$@"`` line."""
    out = []
    found = False
    for line in script.splitlines(keepends=True):
        if COMMAND_MARKER in line:
            line = f'set -- {shlex.join(command)} "$@"  # written by draftlight install-desktop\n'
            found = True
        out.append(line)
    if not found:  # pragma: no cover - a broken template
        raise DesktopError("the launcher template has no command line to fill in")
    return "".join(out)


_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def exec_quote(arg: str) -> str:
    """One argument for a desktop entry's Exec key (Desktop Entry spec, 'The Exec key')."""
    if any(c in "\n\r" for c in arg):
        raise DesktopError(f"a path with a line break cannot go in a desktop entry: {arg!r}")
    arg = arg.replace("%", "%%")
    if arg and not (set(arg) & _EXEC_RESERVED):
        quoted = arg
    else:
        quoted = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    # then the general string escaping of the file format
    return quoted.replace("\\", "\\\\")


def _string_value(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def parse_exec(value: str) -> list[str]:
    """Split an Exec value (as written in the file) back into argv; field codes dropped."""
    # general string unescaping
    s, i, out = value, 0, []
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append({"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}.get(s[i + 1], "\\" + s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    s = "".join(out)
    args: list[str] = []
    cur: list[str] | None = None
    i = 0
    while i < len(s):
        c = s[i]
        if c == '"':
            cur = cur if cur is not None else []
            i += 1
            while i < len(s) and s[i] != '"':
                if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in '"`$\\':
                    i += 1
                elif s[i] == "%" and i + 1 < len(s) and s[i + 1] == "%":
                    i += 1
                cur.append(s[i])
                i += 1
            i += 1
        elif c in " \t":
            if cur is not None:
                args.append("".join(cur))
                cur = None
            i += 1
        elif c == "%" and i + 1 < len(s):
            if s[i + 1] == "%":
                cur = (cur or []) + ["%"]
            i += 2
        else:
            cur = (cur or []) + [c]
            i += 1
    if cur is not None:
        args.append("".join(cur))
    return args


def desktop_entry(launcher: Path) -> str:
    """The shipped desktop entry with Exec/TryExec pointing at ``launcher``."""
    out = []
    for line in data_file("draftlight.desktop").decode().splitlines():
        if line.startswith("Exec="):
            line = "Exec=" + exec_quote(str(launcher))
        elif line.startswith("TryExec="):
            line = "TryExec=" + _string_value(str(launcher))
        out.append(line)
    out.append(f"{MARKER_KEY}={__version__}")
    return "\n".join(out) + "\n"


def icns(pngs: dict[int, bytes]) -> bytes:
    """An Apple icon file holding PNGs (128: ic07, 256: ic08, 512: ic09)."""
    kinds = {128: b"ic07", 256: b"ic08", 512: b"ic09"}
    body = b"".join(kinds[s] + struct.pack(">I", 8 + len(d)) + d for s, d in sorted(pngs.items()) if s in kinds)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def info_plist() -> bytes:
    return plistlib.dumps({
        "CFBundleName": "draftlight",
        "CFBundleDisplayName": "draftlight",
        "CFBundleIdentifier": BUNDLE_ID,
        "CFBundleExecutable": "draftlight",
        "CFBundleIconFile": "draftlight",
        "CFBundlePackageType": "APPL",
        "CFBundleShortVersionString": __version__,
        "CFBundleVersion": __version__,
        "CFBundleInfoDictionaryVersion": "6.0",
        "LSMinimumSystemVersion": "10.13",
        "NSHighResolutionCapable": True,
        MARKER_KEY: __version__,
    })


# --------------------------------------------------------------------------- where

def xdg_data_home() -> Path:
    v = os.environ.get("XDG_DATA_HOME", "")
    return Path(v) if v and os.path.isabs(v) else Path.home() / ".local" / "share"


def manifest_path() -> Path:
    return paths.data_dir() / "desktop" / "installed.json"


def mac_bundle() -> Path:
    return Path.home() / "Applications" / "draftlight.app"


def plan(target: str, command: list[str]) -> list[tuple[Path, bytes, int]]:
    """(destination, content, mode) for every file install writes."""
    if target == "xdg":
        home = xdg_data_home()
        launcher = paths.data_dir() / "desktop" / "draftlight-terminal"
        hicolor = home / "icons" / "hicolor"
        files = [
            (launcher, fill_command(data_file("draftlight-terminal").decode(), command).encode(), 0o755),
            (home / "applications" / DESKTOP_ID, desktop_entry(launcher).encode(), 0o644),
            (hicolor / "scalable" / "apps" / f"{ICON_NAME}.svg", data_file("icons/draftlight.svg"), 0o644),
        ]
        files += [(hicolor / f"{s}x{s}" / "apps" / f"{ICON_NAME}.png", data_file(f"icons/draftlight-{s}.png"), 0o644)
                  for s in PNG_SIZES]
        return files
    if target == "macos":
        c = mac_bundle() / "Contents"
        pngs = {s: data_file(f"icons/draftlight-{s}.png") for s in PNG_SIZES}
        return [
            (c / "Info.plist", info_plist(), 0o644),
            (c / "PkgInfo", b"APPL????", 0o644),
            (c / "MacOS" / "draftlight", data_file("draftlight-app-launcher"), 0o755),
            (c / "Resources" / "draftlight.command",
             fill_command(data_file("draftlight.command").decode(), command).encode(), 0o755),
            (c / "Resources" / "draftlight.icns", icns(pngs), 0o644),
        ]
    raise DesktopError(f"unknown target {target!r}")


# --------------------------------------------------------------------------- manifest

def _load_manifest() -> dict | None:
    try:
        data = json.loads(manifest_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), list) else None


def installed_status() -> dict:
    """For ``doctor``: is a launcher installed, and which files."""
    m = _load_manifest()
    if m is None:
        return {"installed": False, "manifest": str(manifest_path())}
    return {"installed": True, "manifest": str(manifest_path()), "target": m.get("target"),
            "command": m.get("command"), "files": m.get("files", []) + m.get("generated", [])}


def _missing_dirs(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, outermost first."""
    out = []
    for parent in path.parents:
        if parent.exists():
            break
        out.append(parent)
    return out[::-1]


# --------------------------------------------------------------------------- install / uninstall

def install(target: str, command: list[str] | None = None, dry_run: bool = False, force: bool = False,
            say=print) -> list[Path]:
    command = command or draftlight_command()
    files = plan(target, command)
    old = _load_manifest() or {}
    if not force:
        if target == "macos" and mac_bundle().exists() and not _is_our_bundle(mac_bundle()):
            raise DesktopError(f"{mac_bundle()} exists and was not made by draftlight; "
                               "move it away first (or pass --force to replace it)")
        entry = xdg_data_home() / "applications" / DESKTOP_ID
        if target == "xdg" and entry.exists() and MARKER_KEY not in entry.read_text(encoding="utf-8", errors="replace"):
            raise DesktopError(f"{entry} exists and was not written by draftlight; "
                               "move it away first (or pass --force to replace it)")
    if dry_run:
        for dest, _, mode in files:
            say(f"would write {dest} (mode {mode:o})")
        say(f"would record them in {manifest_path()}")
        return [f[0] for f in files]

    created = [Path(d) for d in old.get("created_dirs", [])]
    generated = list(old.get("generated", []))
    if target == "macos" and mac_bundle().exists():
        shutil.rmtree(mac_bundle())  # ours (checked above): rebuild it from scratch
    for dest, _, _ in files + [(manifest_path(), b"", 0)]:
        for d in _missing_dirs(dest):
            if d not in created:
                created.append(d)
    for dest, content, mode in files:
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dest, content)
        os.chmod(dest, mode)
        say(f"installed {dest}")

    if target == "xdg":
        apps = xdg_data_home() / "applications"
        cache = apps / "mimeinfo.cache"
        had_cache = cache.exists()
        if _update_desktop_database(apps) and not had_cache and cache.exists():
            if str(cache) not in generated:
                generated.append(str(cache))
        _touch(xdg_data_home() / "icons" / "hicolor")  # icon caches look at this folder's mtime
    else:
        _touch(mac_bundle())

    files_done = sorted({*old.get("files", []), *(str(f[0]) for f in files)})
    atomic_write_text(manifest_path(), json.dumps({
        "version": __version__, "target": target, "command": command, "files": files_done,
        "generated": generated, "created_dirs": [str(d) for d in created]}, indent=2) + "\n")
    if target == "xdg":
        say(f"draftlight is in your applications menu; it runs {shlex.join(command)} in a terminal")
    else:
        say(f"draftlight.app is in {mac_bundle().parent}; it opens Terminal with {shlex.join(command)}")
    return [f[0] for f in files]


def _is_our_bundle(bundle: Path) -> bool:
    try:
        info = plistlib.loads((bundle / "Contents" / "Info.plist").read_bytes())
    except Exception:
        return False
    return info.get("CFBundleIdentifier") == BUNDLE_ID and MARKER_KEY in info


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _update_desktop_database(apps: Path) -> bool:
    exe = shutil.which("update-desktop-database")
    if not exe or not apps.is_dir():
        return False
    try:
        subprocess.run([exe, "-q", str(apps)], check=False, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _fallback_manifest(target: str) -> dict:
    """Without a record: the files install would have written, where they are recognisably ours."""
    files = []
    for dest, _, _ in plan(target, ["draftlight"]):
        if not dest.exists():
            continue
        if dest.name == DESKTOP_ID and MARKER_KEY not in dest.read_text(encoding="utf-8", errors="replace"):
            continue  # someone else's entry with our name: not ours to remove
        files.append(str(dest))
    if target == "macos":
        files = [str(f) for f in files] if _is_our_bundle(mac_bundle()) else []
    return {"target": target, "files": files, "generated": [], "created_dirs": []}


def uninstall(target: str | None = None, dry_run: bool = False, say=print) -> list[Path]:
    m = _load_manifest()
    recorded = m is not None
    m = m or _fallback_manifest(target or default_target() or "xdg")
    removed: list[Path] = []
    files = [Path(f) for f in m.get("files", [])]
    if not files and not recorded:
        say("nothing to remove: no desktop launcher of draftlight is installed")
        return removed
    for f in files:
        if f.exists() or f.is_symlink():
            if dry_run:
                say(f"would remove {f}")
            else:
                f.unlink()
                say(f"removed {f}")
            removed.append(f)
    if dry_run:
        return removed

    if m.get("target") == "xdg":
        apps = xdg_data_home() / "applications"
        generated = {Path(g) for g in m.get("generated", [])}
        for g in generated:  # the cache update-desktop-database made at install, if there was none before
            if g.exists():
                g.unlink()
                say(f"removed {g}")
                removed.append(g)
        if (apps / "mimeinfo.cache").exists():  # one that was there before: drop our entry from it
            _update_desktop_database(apps)
        if not recorded:
            _rmdir(paths.data_dir() / "desktop")
    if m.get("target") == "macos":
        bundle = mac_bundle()
        # folders inside the bundle (Contents, MacOS, Resources): ours if the bundle was
        for d in sorted((p for p in bundle.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir(d)
        _rmdir(bundle)
    if recorded:
        manifest_path().unlink(missing_ok=True)
    for d in sorted((Path(x) for x in m.get("created_dirs", [])), key=lambda p: -len(p.parts)):
        _rmdir(d)
    return removed


def _rmdir(d: Path) -> None:
    try:
        d.rmdir()  # only ever an empty folder
    except OSError:
        pass
