"""The chat's end of the wire to one runner process: the socket's writer and reader threads, and
the requests in flight, each with a queue of its own.

:class:`Link` owns one runner process and its socket: :meth:`Link.send` queues a message for
the *writer* thread (so no caller, the UI's thread included, ever blocks on a busy or stopped
runner's socket), and the *reader* thread hands every answer to a callback
(:meth:`app.runner.RunnerEngine._on_answer`). :class:`Calls` is the table of requests in
flight: every request has an id, every answer names it, and it goes to that request's own
:class:`Call` queue; an answer to a request that was given up is dropped, never taken for
another's. The messages themselves are in :mod:`app.runner_protocol`.

Knows nothing of engines, models or the chat: :mod:`app.runner` decides what to send.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import subprocess
import threading
from multiprocessing.connection import Connection
from typing import Callable

from . import runner_protocol as rp

__all__ = ["Link", "Call", "Calls", "Died", "Abandoned", "StuckAfterCancel"]


class Died:
    """Put in a request's queue when its runner is gone."""


class Abandoned(Exception):
    """A request this side stopped waiting for (its answer, when it comes, is dropped)."""


class StuckAfterCancel(Exception):
    """A request was stopped but its runner did not end it in time: the runner was killed."""


class Call:
    """A request in flight: the answers for it arrive in :attr:`answers`, in order."""

    def __init__(self, rid: int, link: "Link"):
        self.rid = rid
        self.link = link
        self.answers: queue.Queue[rp.FromRunner | Died] = queue.Queue()


class Link:
    """One runner process, and the writer and reader threads that talk to it."""

    def __init__(self, proc: subprocess.Popen, conn: Connection,
                 on_answer: Callable[["Link", rp.FromRunner], None], on_gone: Callable[["Link"], None]):
        self.proc = proc
        self.conn = conn
        self.gone = False
        #: set where this side ended the runner (killed, closed): its death is not a crash
        self.ended_here = False
        #: set where requests were waiting when it died: they tell of its death, not the log reader
        self.died_under_request = False
        self._outbox: queue.SimpleQueue[rp.ToRunner | None] = queue.SimpleQueue()
        self._on_answer = on_answer
        self._on_gone = on_gone
        threading.Thread(target=self._write, name="draftlight-runner-write", daemon=True).start()
        threading.Thread(target=self._read, name="draftlight-runner-read", daemon=True).start()

    def send(self, msg: rp.ToRunner) -> None:
        """Queue ``msg`` for the runner: never blocks."""
        self._outbox.put(msg)

    def _write(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            try:
                self.conn.send(msg)
            except (OSError, EOFError, ValueError):
                return             # the reader sees the end

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (OSError, EOFError, ValueError):
                break
            self._on_answer(self, msg)
        self.gone = True
        self._outbox.put(None)
        self._on_gone(self)

    def close(self) -> None:
        self._outbox.put(None)
        with contextlib.suppress(OSError):
            self.conn.close()


class Calls:
    """The requests in flight, by id (thread-safe): what :class:`Link`'s reader hands answers to."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._by_id: dict[int, Call] = {}
        self._lock = threading.Lock()

    def open(self, link: Link) -> Call:
        """A new request to ``link``, waited for until it ends, is dropped or its runner dies."""
        call = Call(next(self._ids), link)
        with self._lock:
            self._by_id[call.rid] = call
        return call

    def deliver(self, link: Link, msg: rp.FromRunner) -> None:
        """Hand ``msg`` (from ``link``) to the request it answers; an ending ends the request.
        Dropped where that request was given up (or belongs to another runner)."""
        with self._lock:
            if isinstance(msg, rp.ENDINGS):
                call = self._by_id.pop(msg.rid, None)
            else:
                call = self._by_id.get(msg.rid)
        if call is not None and call.link is link:
            call.answers.put(msg)

    def drop(self, call: Call) -> bool:
        """Stop waiting for ``call`` (its answers, when they come, are dropped); whether it was
        still waited for."""
        with self._lock:
            return self._by_id.pop(call.rid, None) is not None

    def fail(self, link: Link) -> None:
        """``link``'s runner is gone: every request waiting on it is told (:class:`Died`)."""
        with self._lock:
            calls = [c for c in self._by_id.values() if c.link is link]
            for c in calls:
                del self._by_id[c.rid]
            if calls:
                link.died_under_request = True
        for c in calls:
            c.answers.put(Died())
