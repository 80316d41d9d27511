"""The faults: the runner killed (SIGSEGV/SIGKILL) or stopped (SIGSTOP), the data folder full (tmpfs or
RLIMIT_FSIZE), the history database locked by another process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time

from .figures import FaultRecord
from .harness import Harness
from .limits import RUNNER_BACK_S
from .screen import top_line


LOCKER = ("import sqlite3, sys, time\n"
          "c = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)\n"
          "c.execute('BEGIN EXCLUSIVE')\n"
          "print('locked', flush=True)\n"
          "time.sleep(float(sys.argv[2]))\n"
          "c.execute('ROLLBACK')\n"
          "print('released', flush=True)\n")


class Faults(Harness):
    """The faults: one ``fault_<kind>`` per fault of the plan, and the undoing of each (the disk
    released, the locker reaped)."""

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
