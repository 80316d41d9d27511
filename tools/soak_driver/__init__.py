"""The fault-injection soak's driver, in rooms of one job each (``tools/soak.py`` is its entry point
and its docstring lists every action, fault and check):

- ``limits``: the time limits and sizes (a key paints within 1 s, ...);
- ``plan``: the seeded sequence of actions and faults (pure);
- ``screen``: reading the app's screen from its text (pure);
- ``figures``: the options, the messages, failures and faults recorded, the result and its report;
- ``harness``: the run's folders and state, tmux, starting and stopping the app, its processes;
- ``actions``, ``faults``, ``checks``: what is done at each step and what is checked after it;
- ``run``: ``Soak`` (the parts together), walking the plan, the final checks; ``run(opts)``;
- ``cli``: the command line.

Imports flow downward: ``limits``/``plan``/``screen`` → ``figures`` → ``harness`` → ``actions``,
``faults``, ``checks`` → ``run`` → ``cli``. Nothing here imports the app's modules at import time
(the harness reads ``app.cpu_check`` when a run starts); the tmux driver is the e2e tests'.
"""

from __future__ import annotations

from .faults import LOCKER
from .figures import Failure, FaultRecord, Options, Result, Sent
from .harness import ROOT
from .limits import (DATA_MB, DUMP_AFTER_S, EXTRA_RUNNER_GRACE_S, FREEZE_S, GIVE_UP_S, LOST_GRACE_S,
                     ORPHAN_GRACE_S, POLL_S, RUNNER_BACK_S)
from .plan import ACTIONS, FAULTS, WORDS, Step, make_plan
from .run import Soak, default_model, run
from .screen import (BUSY, PLACEHOLDER, PROBE, WELCOME, busy, prompt_text, ready, squeeze, stats_shown,
                     toasts, top_line, where)

__all__ = [
    "ACTIONS", "BUSY", "DATA_MB", "DUMP_AFTER_S", "EXTRA_RUNNER_GRACE_S", "FAULTS", "FREEZE_S", "Failure",
    "FaultRecord", "GIVE_UP_S", "LOCKER", "LOST_GRACE_S", "ORPHAN_GRACE_S", "Options", "PLACEHOLDER",
    "POLL_S", "PROBE", "ROOT", "RUNNER_BACK_S", "Result", "Sent", "Soak", "Step", "WELCOME", "WORDS",
    "busy", "default_model", "make_plan", "prompt_text", "ready", "run", "squeeze", "stats_shown",
    "toasts", "top_line", "where",
]
