"""Chat history in SQLite, with the provenance of every generated token.

One file in the user data dir (``paths.history_db()``), in WAL mode: each
write is one transaction, so a process killed mid-write leaves the last
committed state intact. A reply being streamed is written as it grows
(status ``streaming``) and finished at the end; a reply whose process died
keeps status ``streaming`` and reads back as interrupted.

Per token we keep the id, its text, which speculator drafted it (or None)
and its draft position, so a resumed chat is coloured exactly as it was.

The files are the person's alone (0600, in a 0700 data folder), and any
thread may use the store (one lock over the connection). A write that fails
(a full disk, a lock held too long, a damaged page) raises
:class:`HistoryError` and leaves the last committed state.

>>> import tempfile, pathlib
>>> h = History(pathlib.Path(tempfile.mkdtemp()) / "h.sqlite3")
>>> cid = h.create_chat()
>>> _ = h.add_message(cid, "user", "Hello there")
>>> h.list_chats()[0].title
'Hello there'
>>> h.close()
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from speculators.events import TokenEvent

from . import paths
from .errors import UserError

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


class HistoryError(UserError):
    """The chat history cannot be opened, read or saved; the message says why and where
    (SQLite's own reason: a full disk, a lock held too long by another program, a damaged
    page, ...)."""


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


#: the history's files are the person's chats: only they may read them (config and exports are
#: 0600 too); the data folder draftlight owns is 0700
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700
#: the files SQLite keeps beside the database (WAL mode; a rollback journal after a crash in another mode)
SIDE_FILES = ("-wal", "-shm", "-journal")


def _tighten(path: Path) -> None:
    """Take group's and others' permissions off ``path`` (a file or folder of ours), if it has any."""
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, mode & ~0o077)


def private_folder(folder: Path, ours: bool) -> None:
    """Make sure ``folder`` exists, private to the user when draftlight made it or owns it.

    A folder that is missing is created 0700. One that exists is tightened only when it is
    ``ours`` (the data folder draftlight keeps, from platformdirs): a folder the person named
    for the history keeps the permissions they gave it."""
    if not folder.is_dir():
        folder.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
    if ours:
        _tighten(folder)


def private_files(db: Path) -> None:
    """The database file and those SQLite keeps beside it, 0600: the database is created so
    (SQLite gives its ``-wal``, ``-shm`` and journal the database's permissions), and files an
    older draftlight left readable by others are tightened. A ``db`` that is a dangling symlink
    gets its target created so (no ``O_EXCL``: it refuses a symlink, and SQLite would then create
    the target with the umask's permissions)."""
    if not db.exists():
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
    for p in (db, *(db.with_name(db.name + s) for s in SIDE_FILES)):
        if p.is_file():
            _tighten(p)


class History:
    """The chat store.

    Safe to use from any thread: every use of the connection holds :attr:`lock` (the UI thread
    writes the chat; the exit watchdog saves the reply being written when Textual's shutdown
    hangs). Every SQLite error after the database opened (a full disk, a lock another program
    holds longer than ``timeout`` seconds, a damaged page) is a :class:`HistoryError` saying
    what could not be done, why and where, never ``sqlite3``'s own exception.
    """

    def __init__(self, path: Path | str | None = None, *, timeout: float = 5.0):
        self.path = Path(path) if path is not None else paths.history_db()
        self.lock = threading.RLock()
        try:
            private_folder(self.path.parent, ours=path is None)
            private_files(self.path)
        except OSError as e:
            raise HistoryError(f"cannot open the chat history {self.path}: {e.strerror or e}") from None
        try:
            self.db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None,
                                      check_same_thread=False)
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
    @contextlib.contextmanager
    def _using(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection, this thread's alone for the block; an SQLite error in it is a
        :class:`HistoryError`: "the chat history could not be ``doing``: why (where)"."""
        with self.lock:
            try:
                yield self.db
            except sqlite3.Error as e:
                raise HistoryError(f"the chat history could not be {doing}: {e} ({self.path})") from e

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed at the end of the block, rolled back where anything
        in it (the commit included) failed, so a failed save leaves the last saved state."""
        with self._using("saved") as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    def _read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._using("read")

    def set_timeout(self, seconds: float) -> None:
        """How long a write waits for a lock another program holds before it fails."""
        with self._using("set up") as db:
            db.execute(f"PRAGMA busy_timeout = {max(0, int(seconds * 1000))}")

    def close(self) -> None:
        with self.lock, contextlib.suppress(sqlite3.Error):
            self.db.close()

    # -- chats ---------------------------------------------------------------
    def create_chat(self, title: str = "", system_prompt: str = "", model: str = "") -> int:
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO chats (title, system_prompt, model, created, updated) VALUES (?,?,?,?,?)",
                (title, system_prompt, model, now, now))
        return int(cur.lastrowid)

    def list_chats(self) -> list[ChatSummary]:
        """Every chat, the most recently used first."""
        with self._read() as db:
            rows = db.execute(
                "SELECT c.id, c.title, c.updated, c.created, COUNT(m.id) FROM chats c "
                "LEFT JOIN messages m ON m.chat_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
            ).fetchall()
        return [ChatSummary(r[0], r[1] or "Untitled chat", r[2], r[3], r[4]) for r in rows]

    def sent_messages(self, limit: int = 200) -> list[str]:
        """The person's latest messages over every chat, oldest first (the prompt's Up/Down)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT content FROM messages WHERE role='user' ORDER BY created DESC, id DESC LIMIT ?",
                (limit,)).fetchall()
        return [r[0] for r in reversed(rows)]

    def rename_chat(self, chat_id: int, title: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE chats SET title=? WHERE id=?", (title.strip() or "Untitled chat", chat_id))

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE chats SET system_prompt=? WHERE id=?", (text, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM chats WHERE id=?", (chat_id,))

    def chat_exists(self, chat_id: int) -> bool:
        with self._read() as db:
            return db.execute("SELECT 1 FROM chats WHERE id=?", (chat_id,)).fetchone() is not None

    def load_chat(self, chat_id: int) -> Chat:
        """The chat and its messages; KeyError where there is no such chat."""
        with self._read() as db:
            row = db.execute(
                "SELECT id, title, system_prompt, model, created, updated FROM chats WHERE id=?",
                (chat_id,)).fetchone()
            if row is None:
                raise KeyError(chat_id)
            rows = db.execute(
                "SELECT id, seq, role, content, status, finish_reason, stats, tokens, created "
                "FROM messages WHERE chat_id=? ORDER BY seq", (chat_id,)).fetchall()
        chat = Chat(*row)
        for r in rows:
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
        with self._tx() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE chat_id=?",
                             (chat_id,)).fetchone()[0]
            cur = db.execute(
                "INSERT INTO messages (chat_id, seq, role, content, status, finish_reason, stats, tokens, created)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (chat_id, seq, role, content, status, finish_reason,
                 json.dumps(stats) if stats is not None else None,
                 tokens_to_json(tokens) if tokens is not None else None, now))
            if role == "user":
                db.execute("UPDATE chats SET title=? WHERE id=? AND title=''", (title_from(content), chat_id))
            db.execute("UPDATE chats SET updated=? WHERE id=?", (now, chat_id))
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
        with self._tx() as db:
            db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", (*vals, message_id))
            db.execute("UPDATE chats SET updated=? WHERE id=(SELECT chat_id FROM messages WHERE id=?)",
                       (time.time(), message_id))

    def delete_messages(self, message_ids: Sequence[int]) -> None:
        if not message_ids:
            return
        with self._tx() as db:
            db.executemany("DELETE FROM messages WHERE id=?", [(i,) for i in message_ids])

    # -- export ------------------------------------------------------------------
    def export_markdown(self, chat_id: int) -> str:
        chat = self.load_chat(chat_id)
        return chat_to_markdown(chat)

    # -- the Lab's runs ------------------------------------------------------------
    def add_lab_run(self, report: Any) -> int:
        """Keep a :class:`app.lab.LabReport`; returns its id."""
        with self._tx() as db:
            cur = db.execute("INSERT INTO lab_runs (created, model, prompt, report) VALUES (?, ?, ?, ?)",
                             (report.created, report.model, report.prompt, report.to_json()))
        return int(cur.lastrowid)

    def lab_runs(self, limit: int = 50) -> list[Any]:
        """The kept Lab reports, newest first (a damaged one is left out, not deleted)."""
        from .lab import LabReport
        with self._read() as db:
            rows = db.execute("SELECT id, report FROM lab_runs ORDER BY created DESC, id DESC LIMIT ?",
                              (limit,)).fetchall()
        out = []
        for rid, data in rows:
            try:
                out.append(LabReport.from_dict(json.loads(data), id=int(rid)))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def integrity_ok(self) -> bool:
        with self._read() as db:
            return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


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
