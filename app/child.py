"""Child processes that run draftlight's own code: never the current folder's, and never orphans.

``python -m app…`` puts the *current folder* first on the child's import path, and the wheel
installs generic top-level names (``app``, ``speculators``, ``themes``): run from any project
folder with an ``app`` package of its own (a Flask or FastAPI project), such a child ran that
project's code instead of ours. The rules:

- every child that runs our code (the runner, the CPU-kernel probe, the supervised commands,
  the desktop launcher where no ``draftlight`` script exists) is started with
  :func:`module_argv`, never with ``-m``: ``python -c BOOT MODULE ARGS…``;
- ``BOOT`` first takes off the import path every entry that stands for the current folder (the
  ``''`` that ``-c`` puts first, and any relative or empty entry of ``PYTHONPATH``, which Python
  makes absolute against the current folder), keeping :data:`ROOT`, the folder this draftlight
  was imported from; where :data:`ROOT` is then missing from the path (a checkout run in place)
  it goes first. Only then does it import anything, and run ``MODULE`` as ``-m`` would
  (:func:`runpy.run_module`, as ``__main__``, ``sys.argv[0]`` its file);
- the child keeps the current folder (no ``chdir``: a relative ``--model`` path works), the
  environment (``PYTHONFAULTHANDLER``, ``PYTHONUNBUFFERED``…: so not ``-I``) and works on
  Python 3.10 (``-P``/``PYTHONSAFEPATH`` need 3.11).

A child that must not outlive its parent (the runner, the probe, a supervised command) calls
:func:`die_with_parent` first thing. ``BOOT`` also tells it which process started it (the pid
:func:`module_argv` was called in), so that a parent that died before the child got that far
is noticed too.

>>> argv = module_argv("app.runner_child", "7")
>>> argv[0] == sys.executable, argv[1], argv[3:]
(True, '-c', ['app.runner_child', '7'])
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

#: the folder holding this draftlight's ``app`` (and ``speculators``, ``themes``): site-packages
#: for an install, the checkout for an editable install or a run in place
ROOT = str(Path(__file__).resolve().parent.parent)

#: where ``BOOT`` keeps the pid of the process that started this one (None: not known)
_SPAWNER_ATTR = "_draftlight_spawner_pid"

#: what ``python -c`` runs before the module: the import path without the current folder
#: (``{root}`` and ``{spawner}`` are filled in; ``sys.argv[1]`` is the module, the rest its arguments)
_BOOT = """\
import os, sys
sys.{attr} = {spawner!r}
def _without_cwd(root):
    env = os.environ.get("PYTHONPATH", "")
    try:
        here = {{os.path.normpath(os.path.abspath(e)) for e in env.split(os.pathsep) if not os.path.isabs(e)}} if env else set()
    except OSError:
        here = set()
    ours = lambda p: os.path.realpath(p) == root
    path = [p for p in sys.path if p and os.path.isabs(p) and (ours(p) or os.path.normpath(p) not in here)]
    return path if any(map(ours, path)) else [root, *path]
sys.path[:] = _without_cwd({root!r})
del _without_cwd
import runpy
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def boot_code(root: str = ROOT, spawner: int | None = None) -> str:
    """The ``-c`` code that runs a module of ours from ``root`` (see the module's rules);
    ``spawner``: the pid of the process that will start it, for :func:`die_with_parent`."""
    return _BOOT.format(root=root, spawner=spawner, attr=_SPAWNER_ATTR)


def module_argv(module: str, *args: str, now: bool = True) -> list[str]:
    """The command that runs ``python -m MODULE ARGS…`` with our ``MODULE``, whatever the current
    folder holds: for :class:`subprocess.Popen` (same interpreter, environment and folder).
    ``now=False``: a command kept to be run later by another process (a launcher script), which
    therefore names no parent for :func:`die_with_parent`."""
    return [sys.executable, "-c", boot_code(spawner=os.getpid() if now else None), module, *args]


def die_with_parent(every_s: float = 1.0, grace_s: float = 5.0) -> None:
    """In a child process (the runner, the CPU-kernel probe, a supervised command): stop when the
    process that started it dies, however it dies (``kill -9`` included), rather than work on as
    an orphan. A daemon thread looks every ``every_s`` seconds whether the parent changed (an
    orphan is handed to another) and then sends this process SIGTERM; where that has not ended it
    ``grace_s`` later (a SIGTERM ignored, as inherited, or handled and stuck), SIGKILL.
    (Linux's ``PR_SET_PDEATHSIG`` fires when the parent's *thread* that started the child ends,
    which for the chat's runner may be a worker thread: not used.) The parent is the process that
    built this one's :func:`module_argv` where known, so that one that died before this call
    counts too; else the present parent."""
    parent = getattr(sys, _SPAWNER_ATTR, None) or os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
