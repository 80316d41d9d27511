"""The chat history pinned down where mutation testing found it loose (tools/mutation.py).

``tests/test_storage.py`` checks the history's round trips; here, on real SQLite files: every field
of a chat's summary and of its stored messages (under a fake clock, so times are exact), the
stored token record's format, the whole Markdown export of a chat, titles and slugs at their
bounds, the parts the chat app uses that had no test (the prompt's recall of sent messages, a
reply record taken back, the Lab's runs, the busy timeout), the messages of the errors, the
connection's use from another thread, and the files' modes.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
import types
from pathlib import Path

import pytest

from app import storage
from app.storage import (Chat, ChatSummary, History, HistoryError, StoredMessage, chat_to_markdown,
                         slugify, title_from, tokens_from_json, tokens_to_json, truncate_tokens)
from speculators.events import TokenEvent

posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")


class Clock:
    """``time.time`` for app.storage alone: 1000.0, then one second later at each call."""

    def __init__(self, start: float = 1000.0):
        self.t = start - 1.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(storage, "time", types.SimpleNamespace(time=c, strftime=time.strftime,
                                                               localtime=time.localtime))
    return c


@pytest.fixture
def utc(monkeypatch):
    """Local time is UTC for the test (the export's date is in local time)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def usual_umask():
    old = os.umask(0o022)       # files 0644, folders 0755 unless asked otherwise
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def raw(h: History, sql: str, *args) -> list[tuple]:
    return h.db.execute(sql, args).fetchall()


# -- chats and messages, field by field ---------------------------------------------------------------

def test_a_chats_summary_and_messages_read_back_field_by_field(tmp_path, clock):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()                                        # t = 1000
    assert h.list_chats() == [ChatSummary(cid, "Untitled chat", 1000.0, 1000.0, 0)]
    chat = h.load_chat(cid)
    assert (chat.title, chat.system_prompt, chat.model, chat.created, chat.updated) == ("", "", "", 1000.0, 1000.0)
    u = h.add_message(cid, "user", "Hi")                         # t = 1001
    a = h.add_message(cid, "assistant", "Hello", status=storage.STREAMING)   # t = 1002
    assert h.list_chats() == [ChatSummary(cid, "Hi", 1002.0, 1000.0, 2)]
    h.update_message(a, status=storage.DONE)                     # t = 1003: the chat was used
    assert h.list_chats()[0].updated == 1003.0
    msgs = h.load_chat(cid).messages
    assert msgs == [StoredMessage(u, 0, "user", "Hi", "done", None, None, [], 1001.0),
                    StoredMessage(a, 1, "assistant", "Hello", "done", None, None, [], 1002.0)]
    h.close()


def test_a_missing_chat_is_a_key_error_naming_it(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()
    with pytest.raises(KeyError) as e:
        h.load_chat(cid + 7)
    assert e.value.args == (cid + 7,)
    assert h.chat_exists(cid) is True and h.chat_exists(cid + 7) is False
    h.close()


def test_a_message_without_statistics_or_tokens_stores_none_of_them(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()
    h.add_message(cid, "user", "Hi")
    assert raw(h, "SELECT stats, tokens, finish_reason FROM messages") == [(None, None, None)]
    h.close()


def test_tokens_and_statistics_given_when_the_message_is_added_are_kept(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()
    rec = [TokenEvent(0, 7, "Hi", None, None), TokenEvent(1, 8, "!", "ngram-mod", 0)]
    h.add_message(cid, "assistant", "Hi!", tokens=rec, stats={"n_drafted": 1}, finish_reason="stop")
    m = h.load_chat(cid).messages[0]
    assert (m.tokens, m.stats, m.finish_reason) == (rec, {"n_drafted": 1}, "stop")
    h.close()


def test_a_blank_name_renames_a_chat_untitled(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat(title="Mine")
    h.rename_chat(cid, "   ")
    assert h.load_chat(cid).title == "Untitled chat"
    h.close()


def test_the_system_prompt_is_set_per_chat(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    a, b = h.create_chat(system_prompt="Be brief."), h.create_chat()
    h.set_system_prompt(b, "Answer in French.")
    assert (h.load_chat(a).system_prompt, h.load_chat(b).system_prompt) == ("Be brief.", "Answer in French.")
    h.close()


def test_messages_taken_back_are_deleted_and_no_ids_deletes_nothing(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()
    ids = [h.add_message(cid, "user", f"m{i}") for i in range(4)]
    h.delete_messages([])
    assert len(h.load_chat(cid).messages) == 4
    h.delete_messages([ids[1], ids[3]])
    assert [m.content for m in h.load_chat(cid).messages] == ["m0", "m2"]
    h.close()


def test_sent_messages_are_the_persons_latest_over_every_chat_oldest_first(tmp_path, clock):
    h = History(tmp_path / "h.sqlite3")
    a, b = h.create_chat(), h.create_chat()
    for i in range(3):
        h.add_message(a, "user", f"a{i}")
        h.add_message(a, "assistant", f"reply a{i}")
        h.add_message(b, "user", f"b{i}")
    assert h.sent_messages() == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert h.sent_messages(limit=3) == ["b1", "a2", "b2"]
    h.close()


def test_sent_messages_keeps_two_hundred_by_default(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()
    for i in range(203):
        h.db.execute("INSERT INTO messages (chat_id, seq, role, content, created) VALUES (?, ?, 'user', ?, ?)",
                     (cid, i, f"m{i}", float(i)))
    assert h.sent_messages() == [f"m{i}" for i in range(3, 203)]
    h.close()


# -- the stored token record ------------------------------------------------------------------------

def test_the_stored_token_record_is_compact_v1_json():
    t = [TokenEvent(0, 5, "Hé", None, None), TokenEvent(1, 6, " là", "ngram-mod", 0),
         TokenEvent(2, 9, "!", "ngram-mod", 1)]
    assert tokens_to_json(t) == ('{"v":1,"names":["ngram-mod"],"ids":[5,6,9],"text":["Hé"," là","!"],'
                                 '"by":[-1,0,0],"pos":[-1,0,1]}')
    assert tokens_from_json(tokens_to_json(t)) == t


def test_truncate_tokens_cuts_the_last_token_to_fit_and_keeps_empty_ones_at_the_cut():
    t = [TokenEvent(0, 1, "Hel", "ngram-mod", 0), TokenEvent(1, 2, "lo", "ngram-mod", 1),
         TokenEvent(2, 3, "", None, None), TokenEvent(3, 4, " wor", "draft", 2), TokenEvent(4, 5, "ld", None, None)]
    assert truncate_tokens(t, 5) == t[:3]          # at a token's end: the empty token there is kept
    assert truncate_tokens(t, 7) == t[:3] + [TokenEvent(3, 4, " w", "draft", 2)]
    assert truncate_tokens(t, 4) == [t[0], TokenEvent(1, 2, "l", "ngram-mod", 1), t[2]]
    assert truncate_tokens(t, 0) == []
    assert truncate_tokens(t, 100) == t


# -- titles and file names --------------------------------------------------------------------------

def test_a_title_is_cut_only_past_sixty_characters_without_a_space_before_the_ellipsis():
    assert title_from("x" * 60) == "x" * 60
    assert title_from("x" * 61) == "x" * 59 + "…"
    assert title_from("a" * 58 + " bcdef") == "a" * 58 + "…"
    assert title_from(" \n ") == "Untitled chat"


def test_slugs_lose_dashes_at_both_ends_and_at_the_cut():
    assert slugify("--Xerox, X!--") == "xerox-x"
    assert slugify("a" * 47 + " b") == "a" * 47
    assert slugify("Hi: " + "b" * 60) == "hi-" + "b" * 45
    assert slugify("?!") == "chat"


# -- the Markdown export -------------------------------------------------------------------------------

def test_the_whole_markdown_export_of_a_chat(utc):
    toks = [TokenEvent(0, 1, "One", "ngram-mod", 0), TokenEvent(1, 2, " two", "ngram-mod", 1),
            TokenEvent(2, 3, "\n", None, None)]
    chat = Chat(1, "", "  Be kind.  ", "m.gguf", 1_700_000_000.0, 1_700_000_100.0, [
        StoredMessage(1, 0, "user", "Count:\n1 2"),
        StoredMessage(2, 1, "assistant", "    indented\nline two  \n\n", tokens=toks,
                      stats={"n_generated": 3, "n_drafted": 2, "n_accepted": 2}, finish_reason="length"),
        StoredMessage(3, 2, "system", "A note."),
        StoredMessage(4, 3, "tool", "result"),
    ])
    assert chat_to_markdown(chat) == (
        "# Untitled chat\n"
        "\n"
        "_Exported from draftlight · started 2023-11-14 22:13_\n"
        "\n"
        "## System\n"
        "\n"
        "Be kind.\n"
        "\n"
        "## You\n"
        "\n"
        "```\n"
        "Count:\n"
        "1 2\n"
        "```\n"
        "\n"
        "## Assistant\n"
        "\n"
        "    indented\n"
        "line two\n"
        "\n"
        "<sub>3 tok · drafted 2 · accepted 2 (100%) · by ngram-mod · hit the token limit</sub>\n"
        "\n"
        "## System\n"
        "\n"
        "A note.\n"
        "\n"
        "## Tool\n"
        "\n"
        "result\n")


# -- the Lab's runs ------------------------------------------------------------------------------------

def lab_report(prompt: str, created: float):
    from app.lab import LabReport, LabResult
    return LabReport(prompt, "/m/model.gguf", 1, 8, [
        LabResult("none", {}, {"tokens_per_s": 10.0}, "1 2", [1, 2], [None, None], [None, None])],
        created=created)


def test_lab_runs_are_kept_newest_first_and_a_damaged_one_is_left_out(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    ids = [h.add_lab_run(lab_report(f"p{i}", 100.0 + i)) for i in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert raw(h, "SELECT id, created, model, prompt FROM lab_runs ORDER BY id") == [
        (ids[i], 100.0 + i, "/m/model.gguf", f"p{i}") for i in range(3)]
    h.db.execute("INSERT INTO lab_runs (created, model, prompt, report) VALUES (150, '', '', '{\"rounds\": 1}')")
    h.db.execute("INSERT INTO lab_runs (created, model, prompt, report) VALUES (50, '', '', 'not json')")
    back = h.lab_runs()
    assert [(r.id, r.prompt, r.created) for r in back] == [(ids[2], "p2", 102.0), (ids[1], "p1", 101.0),
                                                           (ids[0], "p0", 100.0)]
    assert [r.prompt for r in h.lab_runs(2)] == ["p2"]    # the limit counts the damaged newest one
    h.close()


def test_fifty_lab_runs_are_listed_by_default(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    for i in range(52):
        h.add_lab_run(lab_report(f"p{i}", float(i)))
    assert [r.prompt for r in h.lab_runs()] == [f"p{i}" for i in range(51, 1, -1)]
    h.close()


# -- the connection: timeout, threads, locks, errors ---------------------------------------------------------

def busy_timeout_ms(h: History) -> int:
    return h.db.execute("PRAGMA busy_timeout").fetchone()[0]


def test_the_busy_timeout_is_five_seconds_unless_given_and_can_be_changed(tmp_path):
    h = History(tmp_path / "a.sqlite3")
    assert busy_timeout_ms(h) == 5000
    h.close()
    h = History(tmp_path / "b.sqlite3", timeout=0.25)
    assert busy_timeout_ms(h) == 250
    h.set_timeout(1.5)
    assert busy_timeout_ms(h) == 1500
    h.set_timeout(-3)
    assert busy_timeout_ms(h) == 0
    h.close()
    with pytest.raises(HistoryError) as e:
        h.set_timeout(1)
    assert str(e.value) == (f"the chat history could not be set up: Cannot operate on a closed database. "
                            f"({h.path})")


def test_the_history_is_used_from_another_thread(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    cid = h.create_chat()
    errors: list[BaseException] = []

    def other():
        try:
            h.add_message(cid, "assistant", "saved by the watchdog")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert errors == [] and [m.content for m in h.load_chat(cid).messages] == ["saved by the watchdog"]
    h.close()


def test_a_history_opens_and_reads_while_another_program_writes(tmp_path):
    p = tmp_path / "h.sqlite3"
    h = History(p)
    h.create_chat(title="kept")
    h.close()
    other = sqlite3.connect(str(p), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")              # another program's write under way
    try:
        h = History(p, timeout=0.05)
        assert [c.title for c in h.list_chats()] == ["kept"] and h.integrity_ok()
        h.close()
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_read_that_fails_says_so_and_where(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    h.close()
    with pytest.raises(HistoryError) as e:
        h.list_chats()
    assert str(e.value) == (f"the chat history could not be read: Cannot operate on a closed database. "
                            f"({h.path})")


def test_a_history_that_cannot_be_made_says_why_and_where(tmp_path):
    (tmp_path / "a file").write_text("x")
    p = tmp_path / "a file" / "h.sqlite3"
    with pytest.raises(HistoryError) as e:
        History(p)
    assert str(e.value) == f"cannot open the chat history {p}: File exists"


# -- the files' modes ----------------------------------------------------------------------------------

@posix_only
def test_a_history_at_a_dangling_symlink_is_made_private_at_its_target(tmp_path, usual_umask):
    link = tmp_path / "h.sqlite3"
    target = tmp_path / "synced" / "chats.sqlite3"
    target.parent.mkdir()
    link.symlink_to(target)
    h = History(link)
    h.add_message(h.create_chat(), "user", "Hi")
    assert link.is_symlink() and mode(target) == 0o600
    wal = target.with_name(target.name + "-wal")
    assert not wal.exists() or mode(wal) == 0o600
    h.close()


@posix_only
def test_a_private_history_is_left_untouched(tmp_path):
    db = tmp_path / "h.sqlite3"
    db.write_bytes(b"")
    os.chmod(db, 0o600)
    os.chmod(tmp_path, 0o700)
    before = (db.stat().st_ctime_ns, tmp_path.stat().st_ctime_ns)
    time.sleep(0.05)
    storage.private_files(db)
    storage.private_folder(tmp_path, ours=True)
    assert (db.stat().st_ctime_ns, tmp_path.stat().st_ctime_ns) == before   # no chmod: nothing changed


@posix_only
def test_a_file_that_vanishes_before_it_is_tightened_is_no_error(tmp_path):
    storage._tighten(tmp_path / "gone.sqlite3-shm")     # SQLite removed it after the listing
    assert not (tmp_path / "gone.sqlite3-shm").exists()


@posix_only
def test_a_named_history_folder_is_made_with_its_parents(tmp_path, usual_umask):
    folder = tmp_path / "new" / "deeper" / "chats"
    h = History(folder / "h.sqlite3")
    assert mode(folder) == 0o700 and mode(h.path) == 0o600
    h.close()
