"""Copying to the system clipboard where a tool for it exists (OSC 52 is done by Textual)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def system_copy_command() -> list[str] | None:
    """The command that puts stdin on the system clipboard here, if any."""
    if sys.platform == "darwin" and shutil.which("pbcopy"):
        return ["pbcopy"]
    if sys.platform.startswith("win") and shutil.which("clip"):
        return ["clip"]
    if os.environ.get("WAYLAND_DISPLAY") and shutil.which("wl-copy"):
        return ["wl-copy"]
    if os.environ.get("DISPLAY"):
        if shutil.which("xclip"):
            return ["xclip", "-selection", "clipboard"]
        if shutil.which("xsel"):
            return ["xsel", "--clipboard", "--input"]
    return None


def copy_to_system(text: str) -> bool:
    """Best effort; True when a clipboard tool accepted the text."""
    cmd = system_copy_command()
    if cmd is None:
        return False
    try:
        subprocess.run(cmd, input=text.encode("utf-8"), timeout=3, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
