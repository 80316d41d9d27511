"""A history locked by another program never stops the screen: the chat's own history waits
:attr:`ChatSession.HISTORY_WAIT_S` for the lock on the UI thread, not SQLite's usual 5 s, and its
last saves at the exit wait a little longer (HISTORY_WAIT_CLOSING_S). (The soak test's "database locked by another
process" froze the screen for 5 s a save before.)"""

from __future__ import annotations

import queue
import time

import pytest

from app import config as config_mod
from app.session import ChatSession
from app.storage import HistoryError
from app.ui.scripted import ScriptedEngine
from speculators.params import SpecParams

from .test_history_faults import drain, locked, stored


def test_a_locked_history_fails_a_send_quickly_on_the_ui_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    engine = ScriptedEngine([(None, [" Hi", " there"])])
    q: queue.Queue = queue.Queue()
    cfg = config_mod.Config()
    cfg.spec = SpecParams()
    s = ChatSession(cfg, post=q.put, engine_factory=lambda m, sp, p: engine, persist_config=False)
    assert s.history is not None
    path = s.history.path
    s.load()
    drain(s, q, lambda: s.engine is not None)
    s.send("first")
    drain(s, q, lambda: s.job is None)
    with locked(path):
        t0 = time.monotonic()
        with pytest.raises(HistoryError):
            s.send("second")
        took = time.monotonic() - t0
    assert took < 0.2 + ChatSession.HISTORY_WAIT_S, f"the send waited {took:.2f} s on the UI thread"
    assert s.send("second") is not None            # once the lock is gone, it goes
    drain(s, q, lambda: s.job is None)
    s.close()
    assert [(r, c) for r, c, _ in stored(path)] == [("user", "first"), ("assistant", "Hi there"),
                                                   ("user", "second"), ("assistant", "Hi there")]
