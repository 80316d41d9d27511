"""The chat history when SQLite fails after it opened, from another thread, and its files' modes.

Real SQLite databases throughout: a second connection that holds ``BEGIN EXCLUSIVE`` stands for
another program holding the lock too long (the history's busy timeout is made short, so each
refused write takes a few tens of milliseconds), and ``PRAGMA max_page_count`` on the history's
own connection makes the database "full" as a full disk does (SQLITE_FULL).
"""

from __future__ import annotations

import os
import queue
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from app import config as config_mod
from app import paths
from app import session as sess
from app.errors import UserError
from app.session import ChatSession
from app.storage import STREAMING, History, HistoryError
from app.ui.scripted import ScriptedEngine
from speculators.params import SpecParams

from .test_session import drain
from .test_ui_app import until

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = [("ngram-mod", [" Hello", " world", "!"]), (None, [" How"]), ("ngram-simple", [" are", " you", "?"])]
SCRIPT_TEXT = "Hello world! How are you?"

#: the history's busy timeout here: a locked write is refused after this long
TIMEOUT_S = 0.05


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another connection holds the database's write lock for the block."""
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def make_full(h: History) -> None:
    """The history's database cannot grow by a page: its next write that needs one fails as on a full disk."""
    n = h.db.execute("PRAGMA page_count").fetchone()[0]
    h.db.execute(f"PRAGMA max_page_count={n}")


def make_roomy(h: History) -> None:
    h.db.execute("PRAGMA max_page_count=1000000")


def stored(path: Path) -> list[tuple[str, str, str]]:
    """(role, content, status) of every message, read over a connection of its own."""
    db = sqlite3.connect(str(path))
    try:
        return db.execute("SELECT role, content, status FROM messages ORDER BY chat_id, seq").fetchall()
    finally:
        db.close()


def session(tmp_path: Path, engine: ScriptedEngine) -> tuple[ChatSession, queue.Queue, Path]:
    """A session on ``engine`` with its model loaded, its history in ``tmp_path``."""
    cfg = config_mod.Config()
    cfg.spec = SpecParams.from_types("ngram-mod,ngram-simple")
    q: queue.Queue = queue.Queue()
    path = tmp_path / "history.sqlite3"
    s = ChatSession(cfg, post=q.put, engine_factory=lambda m, sp, p: engine,
                    history=History(path, timeout=TIMEOUT_S), persist_config=False)
    s.load()
    drain(s, q, lambda: s.engine is not None)
    return s, q, path


def notices(events: list) -> list[str | None]:
    return [e.error for e in events if isinstance(e, sess.HistoryNotice)]


def long_reply(n: int = 60) -> list:
    """A reply of ``n`` long tokens, paced: it streams for a while, and saving it needs new pages."""
    return [(None, [f" w{i}:" + "x" * 200]) for i in range(n)]


# -- Item 7: a write that fails is a HistoryError, and the chat goes on --------------------------

def test_a_write_that_fails_is_a_history_error_saying_why_and_where(tmp_path):
    path = tmp_path / "h.sqlite3"
    h = History(path, timeout=TIMEOUT_S)
    cid = h.create_chat()
    h.add_message(cid, "user", "kept")
    make_full(h)
    with pytest.raises(HistoryError) as full:
        h.add_message(cid, "assistant", "y" * 20000)
    assert isinstance(full.value, UserError)
    assert str(full.value) == f"the chat history could not be saved: database or disk is full ({path})"
    make_roomy(h)
    with locked(path), pytest.raises(HistoryError, match=r"could not be saved: database is locked \("):
        h.rename_chat(cid, "Renamed")
    # nothing half-written, the connection usable: the last committed state, and writes go on
    assert [(m.role, m.content) for m in h.load_chat(cid).messages] == [("user", "kept")]
    h.add_message(cid, "assistant", "later")
    assert h.load_chat(cid).title == "kept" and len(h.load_chat(cid).messages) == 2
    h.close()


def test_a_message_that_cannot_be_saved_is_not_sent_and_can_be_sent_again(tmp_path):
    engine = ScriptedEngine(SCRIPT)
    s, q, path = session(tmp_path, engine)
    with locked(path), pytest.raises(HistoryError, match="could not be saved: database is locked"):
        s.send("first")             # a new chat's first message
    assert s.turns == [] and s.job is None
    s.send("first")
    drain(s, q, lambda: s.job is None)
    with locked(path), pytest.raises(HistoryError, match="could not be saved: database is locked"):
        s.send("hello")             # a message in a chat under way
    assert [t.text for t in s.turns] == ["first", SCRIPT_TEXT] and s.job is None
    reply = s.send("hello")
    drain(s, q, lambda: s.job is None)
    assert reply.text == SCRIPT_TEXT
    # the model saw the message once, and so does the history
    assert [m["content"] for m in engine.requests[-1]] == ["first", SCRIPT_TEXT, "hello"]
    assert stored(path) == [("user", "first", "done"), ("assistant", SCRIPT_TEXT, "done"),
                            ("user", "hello", "done"), ("assistant", SCRIPT_TEXT, "done")]
    s.close()


def test_a_reply_record_that_cannot_be_added_takes_the_message_back(tmp_path):
    s, q, path = session(tmp_path, ScriptedEngine(SCRIPT))
    s.send("first")
    drain(s, q, lambda: s.job is None)
    real = s.history.add_message

    def full_for_replies(chat_id, role, content, **kw):
        if role == "assistant":
            make_full(s.history)     # the person's message was saved; the reply's record is refused
            try:
                return real(chat_id, role, "z" * 20000, **kw)
            finally:
                make_roomy(s.history)
        return real(chat_id, role, content, **kw)
    s.history.add_message = full_for_replies
    with pytest.raises(HistoryError, match="database or disk is full"):
        s.send("second")
    s.history.add_message = real
    assert [t.text for t in s.turns] == ["first", SCRIPT_TEXT] and s.job is None
    # sent again: saved once, the record of the first try gone
    s.send("second")
    drain(s, q, lambda: s.job is None)
    assert [m[:2] for m in stored(path)] == [("user", "first"), ("assistant", SCRIPT_TEXT),
                                             ("user", "second"), ("assistant", SCRIPT_TEXT)]
    s.close()


def test_a_reply_whose_saves_fail_streams_on_is_said_once_and_saved_at_its_end(tmp_path):
    s, q, path = session(tmp_path, ScriptedEngine(long_reply(), tokens_per_s=120))
    s.SAVE_EVERY_S = s.SAVE_RETRY_S = 0.0     # every progress tries a save
    tries: list[bool] = []
    real = s.history.update_message

    def counted(*a, **kw):
        try:
            real(*a, **kw)
        except HistoryError:
            tries.append(False)
            raise
        tries.append(True)
    s.history.update_message = counted
    reply = s.send("go")
    applied = []
    with locked(path):
        while True:          # everything up to the reply's end, applied while the lock is held
            ev = q.get(timeout=10)
            if isinstance(ev, sess.ReplyDone):
                break
            s.apply(ev)
            applied.append(ev)
        failed = tries.count(False)
    assert failed >= 3 and True not in tries
    assert notices(applied) == [f"the chat history could not be saved: database is locked ({path})"]
    assert s.history_failing is not None
    # the lock is gone by the reply's end: its end is saved, and that is said
    s.apply(ev)
    applied += drain(s, q, lambda: s.job is None and q.empty())
    assert notices(applied)[1:] == [None] and s.history_failing is None
    assert reply.text == "".join(t for _, ts in long_reply() for t in ts).strip()
    assert stored(path)[-1] == ("assistant", reply.text, "done")
    s.close()


def test_a_reply_that_could_not_be_saved_at_all_is_saved_with_the_next_message(tmp_path):
    s, q, path = session(tmp_path, ScriptedEngine(long_reply(30), tokens_per_s=300))
    s.SAVE_EVERY_S = 0.0
    reply = s.send("go")
    make_full(s.history)            # a full disk from the reply's first save to its end
    events = drain(s, q, lambda: s.job is None)
    assert len(notices(events)) == 1 and "database or disk is full" in notices(events)[0]
    assert stored(path)[-1][2] == STREAMING and len(reply.text) > 6000     # kept here, not there
    make_roomy(s.history)
    s.send("next")
    events = drain(s, q, lambda: s.job is None and q.empty())
    assert notices(events) == [None]
    assert [m[:2] for m in stored(path)][:2] == [("user", "go"), ("assistant", reply.text)]
    assert stored(path)[1][2] == "done" and [m[0] for m in stored(path)] == ["user", "assistant"] * 2
    s.close()


# -- Item 7 in the app: the message typed stays, the app goes on ----------------------------------

def make_app(engine: ScriptedEngine, history: History):
    from app.ui.app import DraftlightApp
    cfg = config_mod.Config()
    cfg.spec = SpecParams.from_types("ngram-mod,ngram-simple")
    return DraftlightApp(cfg, engine_factory=lambda m, sp, p: engine, history=history, persist_config=False)


def said(app, text: str) -> list[str]:
    return [n.message for n in app._notifications if text in n.message]


async def test_a_message_that_cannot_be_saved_stays_in_the_prompt_and_the_app_goes_on(tmp_path):
    from app.ui.widgets import PromptInput
    path = tmp_path / "history.sqlite3"
    engine = ScriptedEngine(SCRIPT)
    app = make_app(engine, History(path, timeout=TIMEOUT_S))
    async with app.run_test() as pilot:
        await until(pilot, lambda: app.engine is not None)
        assert app.send("first")
        await until(pilot, lambda: app.job is None)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"hello")
        with locked(path):
            await pilot.press("enter")
            await pilot.pause()
        assert app.is_running and prompt.text == "hello" and len(app._views()) == 2
        assert said(app, "could not be saved: database is locked") and said(app, "it is in the prompt")
        await pilot.press("enter")          # once it can be saved, the same text goes
        await until(pilot, lambda: app.job is None and len(app._views()) == 4)
        assert prompt.text == "" and app._views()[3].text == SCRIPT_TEXT
        assert [m["content"] for m in engine.requests[-1]] == ["first", SCRIPT_TEXT, "hello"]
    assert [m[:2] for m in stored(path)] == [("user", "first"), ("assistant", SCRIPT_TEXT),
                                             ("user", "hello"), ("assistant", SCRIPT_TEXT)]


async def test_a_reply_whose_saves_fail_is_shown_whole_and_said_once_in_the_app(tmp_path):
    path = tmp_path / "history.sqlite3"
    app = make_app(ScriptedEngine(long_reply(40), tokens_per_s=200), History(path, timeout=TIMEOUT_S))
    async with app.run_test() as pilot:
        await until(pilot, lambda: app.engine is not None)
        app.session.SAVE_EVERY_S = app.session.SAVE_RETRY_S = 0.0
        assert app.send("go")
        make_full(app.history)
        await until(pilot, lambda: app.job is None)
        await pilot.pause()
        assert app.is_running and len(said(app, "could not be saved: database or disk is full")) == 1
        text = app._views()[-1].text
        assert len(text) > 8000 and stored(path)[-1][2] == STREAMING
        make_roomy(app.history)
        assert app.send("next")
        await until(pilot, lambda: app.job is None)
        await pilot.pause()
        assert said(app, "saved again")
    assert stored(path)[1] == ("assistant", text, "done")


# -- Item 8: closing from another thread (the exit watchdog) ------------------------------------

def test_closing_from_another_thread_saves_the_reply_as_stopped_and_closes_the_engine(tmp_path):
    gate = threading.Event()            # never set: the reply is held after its first step
    engine = ScriptedEngine(SCRIPT, gate=gate)
    s, q, path = session(tmp_path, engine)
    reply = s.send("hi")
    drain(s, q, lambda: reply.text == "Hello world!")
    errors: list[BaseException] = []

    def close() -> None:
        try:
            s.close()
        except BaseException as e:   # noqa: BLE001 - the test reports it
            errors.append(e)
    t = threading.Thread(target=close)
    t.start()
    t.join(20)
    assert not errors and not t.is_alive()
    assert engine.closed
    assert stored(path)[-1] == ("assistant", "Hello world!", "cancelled")


WATCHED_APP = textwrap.dedent("""
    import os, queue, signal, sys, threading, time
    sys.path.insert(0, {root!r})
    from app import config as config_mod
    from app.cmd_chat import _quit_on_signals
    from app.session import ChatSession
    from app.storage import History
    from app.ui.scripted import ScriptedEngine

    class Engine(ScriptedEngine):
        def close(self):
            super().close()
            with open(sys.argv[2], "w") as f:
                f.write("closed")

    from speculators.params import SpecParams
    engine = Engine([(None, ["Hello"]), (None, [" world"])], gate=threading.Event())
    cfg = config_mod.Config()
    cfg.spec = SpecParams.from_types("ngram-mod")
    q = queue.Queue()
    s = ChatSession(cfg, post=q.put, engine_factory=lambda m, sp, p: engine,
                    history=History(sys.argv[1]), persist_config=False)
    s.load()
    while s.engine is None:
        s.apply(q.get(timeout=10))
    reply = s.send("hi")
    while reply.text != "Hello":
        s.apply(q.get(timeout=10))

    class StuckApp:
        # an app whose exit() is asked for but never happens (a shutdown that hangs)
        session = s
        def exit(self, result=None):
            self.asked = result

    _quit_on_signals(StuckApp(), grace_s=0.3)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
""")


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTERM") or os.name == "nt", reason="POSIX signals")
def test_the_exit_watchdog_saves_the_reply_as_stopped_and_closes_the_engine(tmp_path):
    db, marker = tmp_path / "h.sqlite3", tmp_path / "engine-closed"
    out = subprocess.run([sys.executable, "-c", WATCHED_APP.format(root=str(ROOT)), str(db), str(marker)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 143, out.stderr
    assert marker.exists(), out.stderr
    assert stored(db)[-1] == ("assistant", "Hello", "cancelled")


# -- Item 9: the history's files are the person's alone --------------------------------------------

def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)       # the common one: files 0644, folders 0755 unless asked otherwise
    try:
        yield
    finally:
        os.umask(old)


def write_some(h: History) -> None:
    cid = h.create_chat()
    for i in range(5):
        h.add_message(cid, "user" if i % 2 == 0 else "assistant", f"message {i}")


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_the_history_and_its_wal_files_are_private_in_a_private_data_folder(usual_umask):
    folder = paths.data_dir()
    folder.mkdir(parents=True)              # made 0755 before (the default model's files, an older draftlight)
    assert mode(folder) == 0o755
    h = History()
    write_some(h)
    db = h.path
    wal, shm = db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")
    assert wal.exists() and shm.exists()     # WAL is active while the history is open
    assert {p.name: oct(mode(p)) for p in (db, wal, shm)} == {p.name: "0o600" for p in (db, wal, shm)}
    assert mode(folder) == 0o700
    h.close()


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_an_older_readable_history_is_made_private(usual_umask):
    folder = paths.data_dir()
    folder.mkdir(parents=True)
    old = sqlite3.connect(str(paths.history_db()))       # as an older draftlight made it: 0644
    old.execute("CREATE TABLE x (y)")
    old.close()
    assert mode(paths.history_db()) == 0o644
    h = History()
    write_some(h)
    assert mode(h.path) == 0o600 and mode(h.path.with_name(h.path.name + "-wal")) == 0o600
    assert mode(folder) == 0o700
    h.close()


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_a_folder_the_person_named_keeps_its_mode_and_a_new_one_is_private(tmp_path, usual_umask):
    theirs = tmp_path / "shared"
    theirs.mkdir(mode=0o755)
    h = History(theirs / "h.sqlite3")
    write_some(h)
    assert mode(theirs) == 0o755 and mode(h.path) == 0o600
    h.close()
    new = tmp_path / "new" / "chats"
    h = History(new / "h.sqlite3")
    write_some(h)
    assert mode(new) == 0o700 and mode(h.path) == 0o600
    h.close()
