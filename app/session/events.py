"""The session's events: what its threads report, applied on the owner (UI) thread.

A thread the session started (loading, a reply, a read-ahead, a settings change, a static
cache build) never changes the session itself: it posts one of these, and the owner thread
hands it to :meth:`app.session.ChatSession.apply` (which keeps the session up to date) and
then to the UI's handler of the same type (``app.ui.app.DraftlightApp.ui_handlers``).
Handlers are found by type, never by name, so :data:`SessionEvent` lists every event and a
renamed class fails where a table names it.

Plain data only: this module imports nothing of the session, the runner or the UI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speculators.events import GenerationResult

__all__ = ["LoadProgress", "EngineReady", "EngineFailed", "SpecApplied", "ReplyProgress", "ContextTrimmed",
           "ReplyDone", "ReplyFailed", "LookupSaved", "HistoryNotice", "StaticBuildProgress", "StaticBuilt",
           "RunnerStopped", "ReadAhead", "ServeChanged", "ServedProgress", "ServedDone", "SessionEvent"]


@dataclass
class LoadProgress:
    phase: str
    done: int
    total: int


@dataclass
class EngineReady:
    engine: Any
    seconds: float
    store: Any = None
    warnings: list[str] = field(default_factory=list)
    spec_error: str | None = None


@dataclass
class EngineFailed:
    error: str
    path: str | None


@dataclass
class SpecApplied:
    """The chain was rebuilt (``error``: it was not, and the old one stays)."""

    skipped: dict[str, str]
    error: str | None = None
    store: Any = None
    warnings: list[str] = field(default_factory=list)
    #: the engine whose chain it was (a model loaded since makes this one stale)
    engine: Any = None


@dataclass
class ReplyProgress:
    """The reply moved on: new tokens are in ``turn.tokens`` (read them with
    :meth:`ChatSession.new_tokens`) and its live figures are newer. One is on its way at a
    time: the reply thread posts the next only once the owner has applied this one, so
    whatever arrives meanwhile coalesces (an owner that applies it later, at its own pace,
    gets fewer, fuller updates)."""

    key: int


@dataclass
class ContextTrimmed:
    """Older turns were left out of what the model sees for this reply."""

    key: int
    first_kept: int       # index in ``turns`` of the first message the model still sees
    n_dropped: int        # messages left out
    n_prompt: int         # prompt tokens after the cut
    n_ctx: int


@dataclass
class ReplyDone:
    key: int
    result: GenerationResult


@dataclass
class ReplyFailed:
    key: int
    error: str


@dataclass
class LookupSaved:
    info: dict


@dataclass
class HistoryNotice:
    """Saving the chat history failed (``error``: why), or works again (``error`` None: what
    was kept in memory meanwhile is saved now). Posted by the owner thread itself, once per
    spell of failures: a reply whose every save fails is said once, not once per token."""

    error: str | None = None


@dataclass
class StaticBuildProgress:
    done: int
    total: int
    name: str


@dataclass
class StaticBuilt:
    info: dict | None = None
    error: str | None = None


@dataclass
class RunnerStopped:
    """The model's runner process died between replies (nothing was waiting on it): what the
    chat should say, and whether it was not started again (the same death twice in a row)."""
    message: str
    gave_up: bool = False


@dataclass
class ReadAhead:
    """The model began (``reading``) or ended reading the conversation ahead of the next reply
    (:meth:`ChatSession.warm`); at the end, ``tokens``: how many it read."""
    reading: bool
    tokens: int = 0


@dataclass
class ServeChanged:
    """The chat's server started (``url``: where it listens; ``warnings``: what its address
    means) or stopped (``url`` None; ``error``: why, where it was not asked to)."""
    url: str | None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class ServedProgress:
    """A served request arrived (``new``: its :class:`~app.session.serving.ServedRequest`) or
    moved on; coalesced as :class:`ReplyProgress` is."""
    rid: int
    new: Any = None


@dataclass
class ServedDone:
    """A served request ended (answered, failed, or its client left)."""
    rid: int


SessionEvent = (LoadProgress | EngineReady | EngineFailed | SpecApplied | ReplyProgress
                | ContextTrimmed | ReplyDone | ReplyFailed | LookupSaved | StaticBuildProgress | StaticBuilt
                | RunnerStopped | ReadAhead | HistoryNotice | ServeChanged | ServedProgress | ServedDone)
