#!/usr/bin/env python3
"""A fault-injection soak: the real chat app under tmux, on a real model, driven by a seeded random
sequence of what people do, with faults thrown in between (issue 49, item 4).

    python tools/soak.py --seed 1 --actions 300 --faults 30 [--model GGUF] [-n 32] [--keep DIR]

The app is the installed ``draftlight`` (beside this Python) running this checkout's code
(``PYTHONPATH``), started in tmux with folders of the run's own (``XDG_DATA_HOME``, ``XDG_CONFIG_HOME``, ``XDG_CACHE_HOME``; the cache folder is kept
across the run's restarts, so the CPU probe and the verify-cost curve are measured once), with
``--model`` (default: the embedded Gemma 3 270M, assembled where the tests keep it), ``-n 32
--temp 0 -t 2``, and Automatic speculation (so the lookup caches learn and are saved).

The plan is drawn from the seed before anything runs: the same seed gives the same sequence of
actions and faults (what the app answers, and when, can still differ from run to run).

Actions (what people do): send a message (then wait for the reply, or not), Esc, Ctrl+N, F2 and
resume a chat (or close the list), F3 and switch Automatic off/on and apply (or cancel), F4,
F5, F6, F1, Ctrl+P, typing and erasing a draft, the Lab (F8: run, cancel, close), a static
lookup cache built from the saved chats in F3 (cancelled at once, or let finish), Ctrl+Q and
start the app again.

Faults:

- ``runner_death``: SIGSEGV or SIGKILL to the model's runner process (the app's child running
  ``app.runner_child``), between replies or while one streams. The signals alternate: the app
  gives up restarting a runner that died *the same way twice in a row* with the same settings
  (by design, for a crash that would only repeat), which an external kill would otherwise hit;
- ``runner_stop``: SIGSTOP to the runner for 1.5-3 s (SIGCONT from a timer, whatever the
  harness is waiting for), while the soak presses keys (Esc, F4, a message, F2) and checks
  that the UI still answers: the UI must never wait on the runner;
- ``disk_full``: the data folder (chats, lookup caches, the Lab's exports) is a small tmpfs of
  the run's own, filled to the last page by a file, for the next 2-4 steps, and a message is
  sent at once: real ENOSPC, nothing shared is filled. Where tmpfs cannot be mounted (not root),
  RLIMIT_FSIZE is set on the app and its runner instead (``prlimit``: a write that grows any
  file of theirs, config.toml too, fails with EFBIG, "File too large"; Python ignores SIGXFSZ):
  the figures say which was used;
- ``db_lock``: another process opens ``history.sqlite3``, takes ``BEGIN EXCLUSIVE`` and holds
  it 2-4.5 s, and a message is sent at once.

After every step:

- the app answers a key within 1 s: "~" typed into the prompt must show there, and Backspace
  must take it away, each within 1 s of the key (``tmux capture-pane`` every 20 ms); every
  dialog key (F2, F3, F8, F1, Ctrl+P, Ctrl+N, Esc closing one, Ctrl+S) is timed the same way
  (a whole message typed at once, as pasted, is not: the keys after it are). A UI that has not
  painted a key 1.5 s after it is asked for its threads' stacks (SIGUSR1 with
  ``DRAFTLIGHT_DEBUG_DUMP``), so the report says where it waited; one silent for 60 s is
  killed (``hung``) and started again. A key that never shows is a failure too (``key lost``,
  ``ignored``);
- every message sent is in the history (read from ``history.sqlite3``, every chat). The rule:
  Enter on a message, and "~" typed at once after it; the Enter has been handled once the "~"
  shows or the prompt is empty. If the message left the prompt, the app took it: it must be
  saved as a user message within 30 s (a message sent while the model loads is queued and saved
  when it is ready), and at once once the app has exited (a crash, a hang, Ctrl+Q). If it is
  still in the prompt, the app refused it (a reply being written: it says so): not sent yet,
  and the next send presses Enter on it again rather than typing a new one; a refused text
  that the app later takes is checked as above; one still refused at the end, or in the prompt
  when the app ends (Ctrl+Q is put off while a full disk or a locked history refuses it), is
  lost. A saved message that disappears from the history is lost. (A prompt emptied without
  the "~" is a ``key lost``: the app cleared the prompt after a key typed behind the Enter had
  reached it; so is a Backspace that leaves the "~" while the UI sits idle: the cursor was not
  after it);
- ``PRAGMA integrity_check`` is ``ok``;
- the lookup files load (``static.bin``/``dynamic.bin`` with the engine's own reader, each
  time they change; ``meta.json``, ``fingerprints.json``), and none was moved aside as corrupt;
- no orphan process: every process with the run's marker in its environment is the app or
  under it, and the app has at most one live runner (for more than 10 s);
- after a runner death: the app says so (the signal's name on screen within 15 s) and a fresh
  runner is up within 45 s.

At the end: a last message must get a finished reply, Ctrl+Q must exit 0, the figures are
printed (actions, faults, survived, messages lost, the worst key-to-paint lag) and every
failure with the steps that led to it, the UI thread's stack where it froze, and the screen.
Exit status 0 only when nothing failed. A fault is *survived* when no failure is recorded from
it until the next fault.

The driver lives in ``tools/soak_driver/``, one job per module: ``plan`` (the seeded steps),
``screen`` (reading the screen), ``harness`` (tmux, the app, its processes), ``actions``,
``faults``, ``checks``, ``run`` (``Soak``: the steps, the final checks), ``figures`` (the options,
the result and its report), ``cli`` (this command line). This file is the entry point and
re-exports their names.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tools.soak_driver as _driver  # noqa: E402
from tools.soak_driver.cli import main as _main  # noqa: E402


def __getattr__(name: str):
    """The driver's public names (``Options``, ``run``, ``make_plan``, ...), read from the package."""
    if name in _driver.__all__:
        return getattr(_driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    return _main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
