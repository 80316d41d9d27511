"""Chat history in SQLite, with the provenance of every generated token.

One file in the user data dir (``paths.history_db()``), in WAL mode: each
write is one transaction, so a process killed mid-write leaves the last
committed state intact. A reply being streamed is written as it grows
(status ``streaming``) and finished at the end; a reply whose process died
keeps status ``streaming`` and reads back as interrupted.

Per token we keep the id, its text, which speculator drafted it (or None)
and its draft position, so a resumed chat is coloured exactly as it was.

>>> import tempfile, pathlib
>>> h = History(pathlib.Path(tempfile.mkdtemp()) / "h.sqlite3")
>>> cid = h.create_chat()
>>> _ = h.add_message(cid, "user", "Hello there")
>>> h.list_chats()[0].title
'Hello there'
>>> h.close()
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from speculators.events import TokenEvent

from . import paths

#: 2: the Lab's runs (lab_runs)
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id            INTEGER PRIMARY KEY,
    title         TEXT NOT NULL DEFAULT '',
    system_prompt TEXT NOT NULL DEFAULT '',
    model         TEXT NOT NULL DEFAULT '',
    created       REAL NOT NULL,
    updated       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id            INTEGER PRIMARY KEY,
    chat_id       INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    seq           INTEGER NOT NULL,
    role          TEXT NOT NULL,
    content       TEXT NOT NULL DEFAULT '',
    status        TEXT NOT NULL DEFAULT 'done',
    finish_reason TEXT,
    stats         TEXT,
    tokens        TEXT,
    created       REAL NOT NULL,
    UNIQUE (chat_id, seq)
);
CREATE INDEX IF NOT EXISTS chats_by_updated ON chats(updated DESC);
CREATE TABLE IF NOT EXISTS lab_runs (
    id            INTEGER PRIMARY KEY,
    created       REAL NOT NULL,
    model         TEXT NOT NULL DEFAULT '',
    prompt        TEXT NOT NULL DEFAULT '',
    report        TEXT NOT NULL
);
"""

#: message status values
DONE = "done"
STREAMING = "streaming"   # being written; after a restart: interrupted
CANCELLED = "cancelled"
ERROR = "error"

TITLE_MAX = 60


class HistoryError(RuntimeError):
    """The history database cannot be opened or is damaged."""


def tokens_to_json(tokens: Sequence[TokenEvent]) -> str:
    """A reply's tokens (the engine's own :class:`TokenEvent` records) as stored JSON.

    Speculator names are stored once; tokens refer to them by index.

    >>> t = [TokenEvent(0, 5, "Hi", None, None), TokenEvent(1, 6, " there", "ngram-mod", 0)]
    >>> [x.to_dict() for x in tokens_from_json(tokens_to_json(t))] == [x.to_dict() for x in t]
    True
    """
    names: list[str] = []
    index: dict[str, int] = {}
    by = []
    for t in tokens:
        b = t.drafted_by
        if b is None:
            by.append(-1)
        else:
            if b not in index:
                index[b] = len(names)
                names.append(b)
            by.append(index[b])
    return json.dumps({"v": 1, "names": names, "ids": [t.id for t in tokens], "text": [t.text for t in tokens],
                       "by": by, "pos": [-1 if t.draft_pos is None else t.draft_pos for t in tokens]},
                      separators=(",", ":"), ensure_ascii=False)


def tokens_from_json(data: str | None) -> list[TokenEvent]:
    if not data:
        return []
    d = json.loads(data)
    names = d.get("names", [])
    return [TokenEvent(i, tok, text, None if b < 0 else names[b], None if p < 0 else p)
            for i, (tok, text, b, p) in enumerate(zip(d["ids"], d["text"], d["by"], d["pos"]))]


def truncate_tokens(tokens: Sequence[TokenEvent], n_chars: int) -> list[TokenEvent]:
    """The tokens that make up the first ``n_chars`` characters (the last one cut to fit)."""
    out: list[TokenEvent] = []
    total = 0
    for t in tokens:
        if total >= n_chars and t.text:
            break
        piece = t.text[: max(0, n_chars - total)]
        if piece != t.text:
            t = TokenEvent(t.index, t.id, piece, t.drafted_by, t.draft_pos)
        out.append(t)
        total += len(piece)
    return out


@dataclass
class StoredMessage:
    id: int
    seq: int
    role: str
    content: str
    status: str = DONE
    finish_reason: str | None = None
    stats: dict[str, Any] | None = None
    tokens: list[TokenEvent] = field(default_factory=list)
    created: float = 0.0

    @property
    def interrupted(self) -> bool:
        return self.status == STREAMING


@dataclass
class ChatSummary:
    id: int
    title: str
    updated: float
    created: float
    n_messages: int


@dataclass
class Chat:
    id: int
    title: str
    system_prompt: str
    model: str
    created: float
    updated: float
    messages: list[StoredMessage] = field(default_factory=list)


def title_from(text: str) -> str:
    """A chat title: the first line of the first message, shortened."""
    line = " ".join(text.strip().split())
    if len(line) > TITLE_MAX:
        line = line[: TITLE_MAX - 1].rstrip() + "…"
    return line or "Untitled chat"


class History:
    """The chat store. Use from one thread (the UI's)."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else paths.history_db()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(str(self.path), timeout=5.0, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{self.path} was written by a newer draftlight (schema {version})")
            if version < SCHEMA_VERSION:
                # CREATE ... IF NOT EXISTS: safe to repeat if a first run died here
                self.db.executescript("BEGIN IMMEDIATE;" + _SCHEMA
                                      + f"PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"cannot open the chat history {self.path}: {e}") from None

    # -- plumbing ------------------------------------------------------------
    def _tx(self):
        db = self.db

        class _Tx:
            def __enter__(self_inner):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, exc, tb):
                if exc_type is None:
                    db.execute("COMMIT")
                else:
                    db.execute("ROLLBACK")
                return False
        return _Tx()

    def close(self) -> None:
        try:
            self.db.close()
        except sqlite3.Error:  # pragma: no cover
            pass

    # -- chats ---------------------------------------------------------------
    def create_chat(self, title: str = "", system_prompt: str = "", model: str = "") -> int:
        now = time.time()
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO chats (title, system_prompt, model, created, updated) VALUES (?,?,?,?,?)",
                (title, system_prompt, model, now, now))
        return int(cur.lastrowid)

    def list_chats(self) -> list[ChatSummary]:
        """Every chat, the most recently used first."""
        rows = self.db.execute(
            "SELECT c.id, c.title, c.updated, c.created, COUNT(m.id) FROM chats c "
            "LEFT JOIN messages m ON m.chat_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [ChatSummary(r[0], r[1] or "Untitled chat", r[2], r[3], r[4]) for r in rows]

    def sent_messages(self, limit: int = 200) -> list[str]:
        """The person's latest messages over every chat, oldest first (the prompt's Up/Down)."""
        rows = self.db.execute(
            "SELECT content FROM messages WHERE role='user' ORDER BY created DESC, id DESC LIMIT ?",
            (limit,)).fetchall()
        return [r[0] for r in reversed(rows)]

    def rename_chat(self, chat_id: int, title: str) -> None:
        with self._tx():
            self.db.execute("UPDATE chats SET title=? WHERE id=?", (title.strip() or "Untitled chat", chat_id))

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        with self._tx():
            self.db.execute("UPDATE chats SET system_prompt=? WHERE id=?", (text, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._tx():
            self.db.execute("DELETE FROM chats WHERE id=?", (chat_id,))

    def chat_exists(self, chat_id: int) -> bool:
        return self.db.execute("SELECT 1 FROM chats WHERE id=?", (chat_id,)).fetchone() is not None

    def load_chat(self, chat_id: int) -> Chat:
        row = self.db.execute(
            "SELECT id, title, system_prompt, model, created, updated FROM chats WHERE id=?",
            (chat_id,)).fetchone()
        if row is None:
            raise KeyError(chat_id)
        chat = Chat(*row)
        for r in self.db.execute(
                "SELECT id, seq, role, content, status, finish_reason, stats, tokens, created "
                "FROM messages WHERE chat_id=? ORDER BY seq", (chat_id,)):
            chat.messages.append(StoredMessage(
                id=r[0], seq=r[1], role=r[2], content=r[3], status=r[4], finish_reason=r[5],
                stats=json.loads(r[6]) if r[6] else None, tokens=tokens_from_json(r[7]),
                created=r[8]))
        return chat

    # -- messages --------------------------------------------------------------
    def add_message(self, chat_id: int, role: str, content: str, *, status: str = DONE,
                    tokens: Sequence[TokenEvent] | None = None, stats: dict | None = None,
                    finish_reason: str | None = None) -> int:
        """Append a message; the first user message titles an untitled chat."""
        now = time.time()
        with self._tx():
            seq = self.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE chat_id=?",
                                  (chat_id,)).fetchone()[0]
            cur = self.db.execute(
                "INSERT INTO messages (chat_id, seq, role, content, status, finish_reason, stats, tokens, created)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (chat_id, seq, role, content, status, finish_reason,
                 json.dumps(stats) if stats is not None else None,
                 tokens_to_json(tokens) if tokens is not None else None, now))
            if role == "user":
                self.db.execute("UPDATE chats SET title=? WHERE id=? AND title=''",
                                (title_from(content), chat_id))
            self.db.execute("UPDATE chats SET updated=? WHERE id=?", (now, chat_id))
        return int(cur.lastrowid)

    def update_message(self, message_id: int, *, content: str | None = None,
                       tokens: Sequence[TokenEvent] | None = None, stats: dict | None = None,
                       status: str | None = None, finish_reason: str | None = None) -> None:
        sets, vals = [], []
        for col, val in (("content", content), ("status", status), ("finish_reason", finish_reason)):
            if val is not None:
                sets.append(f"{col}=?")
                vals.append(val)
        if tokens is not None:
            sets.append("tokens=?")
            vals.append(tokens_to_json(tokens))
        if stats is not None:
            sets.append("stats=?")
            vals.append(json.dumps(stats))
        if not sets:
            return
        with self._tx():
            self.db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", (*vals, message_id))
            self.db.execute("UPDATE chats SET updated=? WHERE id=(SELECT chat_id FROM messages WHERE id=?)",
                            (time.time(), message_id))

    def delete_messages(self, message_ids: Sequence[int]) -> None:
        if not message_ids:
            return
        with self._tx():
            self.db.executemany("DELETE FROM messages WHERE id=?", [(i,) for i in message_ids])

    # -- export ------------------------------------------------------------------
    def export_markdown(self, chat_id: int) -> str:
        chat = self.load_chat(chat_id)
        return chat_to_markdown(chat)

    # -- the Lab's runs ------------------------------------------------------------
    def add_lab_run(self, report: Any) -> int:
        """Keep a :class:`app.lab.LabReport`; returns its id."""
        with self._tx():
            cur = self.db.execute("INSERT INTO lab_runs (created, model, prompt, report) VALUES (?, ?, ?, ?)",
                                  (report.created, report.model, report.prompt, report.to_json()))
        return int(cur.lastrowid)

    def lab_runs(self, limit: int = 50) -> list[Any]:
        """The kept Lab reports, newest first (a damaged one is left out, not deleted)."""
        from .lab import LabReport
        out = []
        for rid, data in self.db.execute("SELECT id, report FROM lab_runs ORDER BY created DESC, id DESC LIMIT ?",
                                         (limit,)):
            try:
                out.append(LabReport.from_dict(json.loads(data), id=int(rid)))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def integrity_ok(self) -> bool:
        return self.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def chat_to_markdown(chat: Chat) -> str:
    out = [f"# {chat.title or 'Untitled chat'}", ""]
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.created))
    out += [f"_Exported from draftlight · started {stamp}_", ""]
    if chat.system_prompt:
        out += ["## System", "", chat.system_prompt.strip(), ""]
    for m in chat.messages:
        who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role.title())
        body = m.content.rstrip()
        out += [f"## {who}", "", fence_as_typed(body) if m.role == "user" else body, ""]
        if m.role == "assistant":
            # the same line as under the reply in the chat
            from .figures import reply_footer
            note = reply_footer(m.tokens, m.stats, m.finish_reason, m.status)
            if note:
                out += [f"<sub>{note}</sub>", ""]
    return "\n".join(out).rstrip() + "\n"


def fence_as_typed(text: str) -> str:
    r"""What a person typed, for Markdown: a message of several lines (pasted code, a log, a
    list as typed) goes in a fence longer than any inside it, so it reads as it was sent;
    one line stays text::

        >>> print(fence_as_typed("def f(x):\n    return x  # *not* emphasis"))
        ```
        def f(x):
            return x  # *not* emphasis
        ```
        >>> print(fence_as_typed("see:\n```py\nx = 1\n```"))
        ````
        see:
        ```py
        x = 1
        ```
        ````
        >>> fence_as_typed("What is 2 * 3?")
        'What is 2 * 3?'
    """
    if "\n" not in text.strip():
        return text
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}\n{text}\n{ticks}"


def slugify(title: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()
    return (s[:48].rstrip("-") or "chat")
