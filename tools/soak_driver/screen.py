"""Reading the app's screen (a ``tmux capture-pane`` text): which screen is shown, the prompt's text,
the toasts, whether a reply is being written. Pure functions of the text.
"""

from __future__ import annotations

import re


PROBE = "~"
WELCOME = "Ask anything."
PLACEHOLDER = "Message the model"


def top_line(screen: str) -> str:
    return screen.split("\n", 1)[0]


def prompt_text(screen: str) -> str | None:
    """What the chat's prompt box shows (None: no prompt box on screen)."""
    lines = screen.rstrip("\n").split("\n")
    tops = [i for i, ln in enumerate(lines) if ln.startswith("▔▔▔")]
    if not tops:
        return None
    body = lines[tops[-1] + 1:-1]          # the key bar is the last line
    return "\n".join(ln.strip() for ln in body).strip()


def where(screen: str) -> str:
    """Which screen is up: main, chats, settings, lab, help, palette, exited or other."""
    if "DRAFTLIGHT-EXIT=" in screen:
        return "exited"
    if "Enter resume" in screen and "rename" in screen:
        return "chats"
    if "Apply  ^S" in screen:
        return "settings"
    if "Lab — which speculation" in screen:
        return "lab"
    if "Every action is also in the command palette" in screen or re.search(r"│\s+Keys\s+│", screen):
        return "help"
    if "Search for commands" in screen:
        return "palette"
    if prompt_text(screen) is not None:
        return "main"
    return "other"


def toasts(screen: str) -> list[str]:
    """The notifications on screen (Textual's toasts, at the right, each line after a "▌")."""
    out: list[str] = []
    cur: list[str] = []
    col = None
    for ln in screen.split("\n"):
        i = ln.rfind("▌")
        if i >= 40 and (col is None or i == col):
            col = i
            text = ln[i + 1:].strip(" ▔")
            if text:
                cur.append(text)
                continue
        if cur:
            out.append(" ".join(cur))
        cur, col = [], (i if i >= 40 else None)
    if cur:
        out.append(" ".join(cur))
    return out


def stats_shown(screen: str) -> bool:
    """Whether the statistics panel (F4) is up: its left border runs down the screen (its heading,
    and most of the border, may be under notifications stacked at the right)."""
    return sum("▊" in ln for ln in screen.split("\n")) >= 3


BUSY = ("writing…", "stopping…", "loading…", "rebuilding")


def busy(screen: str) -> bool:
    top = top_line(screen)
    return any(b in top for b in BUSY)


def ready(screen: str) -> bool:
    return re.search(r"\bready\s*$", top_line(screen)) is not None


def squeeze(screen: str) -> list[str]:
    """A screen's lines, runs of blank ones cut to one."""
    out: list[str] = []
    for ln in screen.rstrip("\n").split("\n"):
        if not ln.strip() and out and not out[-1].strip():
            continue
        out.append(ln.rstrip())
    return out
