"""The conversation's record: one :class:`Turn` per message, and the session's refusals.

A reply's tokens are the engine's own :class:`~speculators.events.TokenEvent` records: the
reply thread (:mod:`app.session.reply`) appends them, the history stores them
(``storage.tokens_to_json``) and the chat widget draws them. Plain data: imports nothing of
the session's threads, the runner or the UI.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from speculators.events import TokenEvent

from .. import storage
from ..errors import UserError

__all__ = ["Turn", "SessionError"]

_turn_keys = itertools.count(1)


@dataclass(eq=False)
class Turn:
    """One message of the conversation. A reply's tokens are the engine's own records."""

    role: str
    text: str = ""
    msg_id: int | None = None
    tokens: list[TokenEvent] = field(default_factory=list)
    stats: dict | None = None
    status: str = storage.DONE
    finish: str | None = None
    error: str | None = None
    key: int = field(default_factory=lambda: next(_turn_keys))
    #: perf_counter() when the generation thread got each token (benchmarks: event-to-paint lag)
    arrived: list[float] = field(default_factory=list)

    @property
    def sent_to_model(self) -> bool:
        if self.error or self.role not in ("user", "assistant"):
            return False
        return bool(self.text.strip()) or self.role == "user"


class SessionError(UserError):
    """The session cannot do that now (the message says why)."""
