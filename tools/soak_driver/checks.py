"""The checks after every step: the UI answers a key, every message sent is in the history, the
database and lookup files are sound, no orphan or extra runner, a dead runner is said and replaced.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from .harness import Harness
from .limits import EXTRA_RUNNER_GRACE_S, LOST_GRACE_S, ORPHAN_GRACE_S, RUNNER_BACK_S
from .screen import PROBE, prompt_text, where


class Checks(Harness):
    """What is checked after every step (``check``) and at the end: the parts of ``Soak`` that judge."""

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
