"""Messages the worker threads post to the app (and a few between widgets).

Token messages coalesce: the generation worker appends tokens to a
:class:`TokenBatch` and posts a :class:`TokensArrived` only when no batch is
waiting for the UI; while the UI is busy, further tokens join the waiting
batch. The UI takes the batch's tokens when it handles the message.
"""

from __future__ import annotations

import threading
from typing import Any

from textual.message import Message

from speculators.events import GenerationResult, GenerationStats, TokenEvent


class TokenBatch:
    """Tokens from the worker not yet shown; shared under a lock."""

    __slots__ = ("_lock", "tokens", "times", "taken", "n_drafted", "n_accepted")

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self.tokens: list[TokenEvent] = []
        #: perf_counter() when the worker got each token's event from the engine
        self.times: list[float] = []
        self.taken = False
        self.n_drafted = 0
        self.n_accepted = 0

    def take(self) -> tuple[list[TokenEvent], list[float]]:
        """Called by the UI: close the batch and return what it holds."""
        with self._lock:
            self.taken = True
            return self.tokens, self.times


class TokensArrived(Message):
    """New tokens for the reply ``reply_key`` (take them from ``batch``)."""

    def __init__(self, reply_key: int, batch: TokenBatch):
        super().__init__()
        self.reply_key = reply_key
        self.batch = batch


class StatsUpdated(Message):
    """A statistics snapshot while a reply streams (a newer one replaces it)."""

    def __init__(self, reply_key: int, stats: GenerationStats):
        super().__init__()
        self.reply_key = reply_key
        self.stats = stats

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatsUpdated) and message.reply_key == self.reply_key


class ReplyFinished(Message):
    def __init__(self, reply_key: int, result: GenerationResult):
        super().__init__()
        self.reply_key = reply_key
        self.result = result


class ReplyFailed(Message):
    def __init__(self, reply_key: int, error: str):
        super().__init__()
        self.reply_key = reply_key
        self.error = error


class LoadProgress(Message):
    """Progress of preparing/loading the model (total 0: no measure)."""

    def __init__(self, done: int, total: int, phase: str):
        super().__init__()
        self.done = done
        self.total = total
        self.phase = phase

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgress)


class ModelLoaded(Message):
    def __init__(self, engine: Any, path: str, seconds: float):
        super().__init__()
        self.engine = engine
        self.path = path
        self.seconds = seconds


class ModelLoadFailed(Message):
    def __init__(self, error: str, path: str | None):
        super().__init__()
        self.error = error
        self.path = path


class SpecApplied(Message):
    """The speculator chain was rebuilt (``error`` set when it failed)."""

    def __init__(self, skipped: dict[str, str], error: str | None = None):
        super().__init__()
        self.skipped = skipped
        self.error = error
