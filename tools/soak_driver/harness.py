"""The soak's base: the run's folders and state, output, tmux keys and timed paints, starting and
stopping the app, its processes. Every other part of the driver builds on ``Harness``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from tests.test_ui_e2e_tmux import Tmux, draftlight_command  # (the e2e tests' tmux driver)

from .figures import Failure, FaultRecord, Options, Sent
from .limits import DUMP_AFTER_S, FREEZE_S, GIVE_UP_S, POLL_S
from .plan import Step, make_plan
from .screen import ready, where

ROOT = Path(__file__).resolve().parents[2]


class Harness:
    """The run's folders and state, its output, tmux keys and timed paints, the app and its
    processes: what the actions, faults and checks are built on."""

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
