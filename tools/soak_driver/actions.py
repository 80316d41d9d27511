"""The actions: what people do (send, Esc, Ctrl+N, F2/F3/F4/..., the Lab, a static build, quit and
restart), and the sending of messages they rest on.
"""

from __future__ import annotations

import re
import time

from .figures import Sent
from .harness import Harness
from .limits import GIVE_UP_S
from .screen import PLACEHOLDER, PROBE, WELCOME, busy, prompt_text, stats_shown, toasts, top_line, where


class Actions(Harness):
    """What people do: one ``act_<kind>`` per action of the plan, and the sending they rest on."""

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
