"""SIGTERM/SIGHUP end the chat even when Textual's own shutdown never returns."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

STUCK_APP = textwrap.dedent("""
    import os, signal, sys, time
    from app.cmd_chat import _quit_on_signals

    class Session:
        def close(self):
            with open(sys.argv[1], "w") as f:
                f.write("closed")

    class StuckApp:
        # an app whose exit() is asked for but never happens (a shutdown that hangs writing
        # to a terminal that is gone)
        session = Session()
        def exit(self, result=None):
            self.asked = result

    _quit_on_signals(StuckApp(), grace_s=0.5)
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    time.sleep(60)
    sys.exit(0)
""")


@pytest.mark.parametrize("sig,code", [("SIGHUP", 129), ("SIGTERM", 143)])
def test_a_signal_ends_the_chat_even_if_its_shutdown_hangs(tmp_path, sig, code):
    marker = tmp_path / "closed"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STUCK_APP, str(marker), sig], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == code, out.stderr
    assert time.monotonic() - t0 < 20          # the watchdog, not the 60 s sleep, ended it
    assert marker.read_text() == "closed"      # the session was closed first (reply saved, runner ended)
