"""Chat history on real SQLite files in the (per-test) user data dir."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app import paths
from app.storage import DONE, STREAMING, History, HistoryError, slugify
from speculators.events import TokenEvent

ROOT = Path(__file__).resolve().parent.parent


def record(*tokens) -> list[TokenEvent]:
    return [TokenEvent(i, 100 + i, text, by, pos) for i, (text, by, pos) in enumerate(tokens)]


def test_the_history_lives_in_the_user_data_dir():
    h = History()
    assert h.path == paths.history_db() and h.path.exists()
    assert h.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    h.close()


def test_chats_are_listed_newest_first_and_titled_from_the_first_message():
    h = History()
    a = h.create_chat()
    h.add_message(a, "user", "  What is   a KV cache?\nMore detail here")
    time.sleep(0.01)
    b = h.create_chat()
    h.add_message(b, "user", "x" * 100)
    chats = h.list_chats()
    assert [c.id for c in chats] == [b, a]
    assert chats[1].title == "What is a KV cache? More detail here"
    assert chats[0].title.endswith("…") and len(chats[0].title) == 60
    # adding to the older chat makes it the newest
    time.sleep(0.01)
    h.add_message(a, "assistant", "A cache of keys and values.")
    assert [c.id for c in h.list_chats()] == [a, b]
    assert h.list_chats()[0].n_messages == 2
    h.close()


def test_rename_delete_and_cascade():
    h = History()
    a = h.create_chat()
    m = h.add_message(a, "user", "hello")
    h.rename_chat(a, "Greetings")
    assert h.list_chats()[0].title == "Greetings"
    # a later first user message does not overwrite a given title
    h.add_message(a, "user", "second")
    assert h.load_chat(a).title == "Greetings"
    h.delete_chat(a)
    assert h.list_chats() == []
    assert h.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    with pytest.raises(KeyError):
        h.load_chat(a)
    h.close()


def test_token_provenance_round_trips():
    h = History()
    c = h.create_chat(system_prompt="Be brief.")
    rec = record(("Hel", "ngram-mod", 0), ("lo", "ngram-mod", 1), ("!", None, None), (" é", "draft-simple", 0))
    mid = h.add_message(c, "assistant", "", status=STREAMING)
    h.update_message(mid, content="Hello! é", tokens=rec, stats={"n_generated": 4, "n_drafted": 3},
                     status=DONE, finish_reason="stop")
    h.close()
    h2 = History()
    chat = h2.load_chat(c)
    assert chat.system_prompt == "Be brief."
    m = chat.messages[0]
    assert (m.content, m.status, m.finish_reason) == ("Hello! é", DONE, "stop")
    assert [t.text for t in m.tokens] == [t.text for t in rec] and [t.id for t in m.tokens] == [t.id for t in rec]
    assert [t.drafted_by for t in m.tokens] == ["ngram-mod", "ngram-mod", None, "draft-simple"]
    assert [t.draft_pos for t in m.tokens] == [0, 1, None, 0]
    assert m.stats == {"n_generated": 4, "n_drafted": 3}
    h2.close()


def test_export_markdown():
    h = History()
    c = h.create_chat(system_prompt="Be kind.")
    h.add_message(c, "user", "Hi")
    h.add_message(c, "assistant", "Hello!", stats={"n_generated": 2, "tokens_per_s": 10.0, "n_drafted": 1,
                                                    "n_accepted": 1})
    h.add_message(c, "assistant", "Half", status=STREAMING)
    md = h.export_markdown(c)
    assert md.startswith("# Hi\n")
    assert "## System\n\nBe kind." in md
    assert "## You\n\nHi" in md and "## Assistant\n\nHello!" in md
    # the same line as the reply's footer in the chat (app.figures)
    assert "<sub>2 tok · drafted 1 · accepted 1 (100%)</sub>" in md and "<sub>interrupted</sub>" in md
    assert slugify("Hi: what's up?") == "hi-what-s-up"
    h.close()


def test_a_newer_schema_is_refused_clearly(tmp_path):
    p = tmp_path / "h.sqlite3"
    db = sqlite3.connect(p)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(HistoryError, match="newer draftlight"):
        History(p)


def test_a_damaged_file_is_reported_not_a_traceback(tmp_path):
    p = tmp_path / "h.sqlite3"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(HistoryError, match="cannot open the chat history"):
        History(p)


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from app.storage import History
    from speculators.events import TokenEvent
    h = History({path!r})
    c = h.create_chat()
    print("ready", c, flush=True)
    i = 0
    while True:
        r = [TokenEvent(j, j, "tok%d " % j, "ngram-mod" if j % 2 else None, j % 7) for j in range(200)]
        mid = h.add_message(c, "user", "message %d" % i)
        h.update_message(mid, content="".join(t.text for t in r), tokens=r, stats={{"i": i}})
        i += 1
""")


def test_a_process_killed_mid_write_leaves_every_committed_message_whole(tmp_path):
    path = tmp_path / "h.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready")
        time.sleep(0.8)  # hundreds of transactions
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    h = History(path)
    assert h.integrity_ok()
    chat = h.load_chat(h.list_chats()[0].id)
    assert len(chat.messages) > 3
    expected = "".join("tok%d " % j for j in range(200))
    # every message is whole: the update of the last one may be lost, never half-written
    for m in chat.messages[:-1]:
        assert m.content == expected and len(m.tokens) == 200 and m.stats["i"] == m.seq
    last = chat.messages[-1]
    assert last.content in ("message %d" % last.seq, expected)
    h.close()


def test_pasted_code_is_fenced_in_the_export():
    h = History()
    c = h.create_chat()
    code = "Why does this fail?\ndef f(x):\n    return x * 2  # **bold?**\n```\nnested\n```"
    h.add_message(c, "user", code)
    h.add_message(c, "assistant", "Because *reasons*.")
    md = h.export_markdown(c)
    assert f"## You\n\n````\n{code}\n````\n" in md             # a fence longer than the one inside
    assert "## Assistant\n\nBecause *reasons*." in md          # the model's Markdown stays Markdown
    h.close()
