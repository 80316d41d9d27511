"""The chat session: everything the chat does, without Textual (the room between the UI and the runner).

The path of a message: UI (:mod:`app.ui.app`) → :class:`ChatSession` → its reply thread →
the engine (:class:`app.runner.RunnerEngine` → the runner process) → token events → back to the
owner thread as session events → the UI. One module per job:

==========================  ==============================================================
:mod:`.core`                :class:`ChatSession`: shared state, send, dispatch by type, close
:mod:`.events`              the events the session's threads post (:data:`SessionEvent`)
:mod:`.engine`              the engine as the session sees it (:class:`ChatEngine`)
:mod:`.conversation`        :class:`Turn` (one message) and :class:`SessionError`
:mod:`.context_fit`         which older messages the model no longer sees (pure logic)
:mod:`.loading`             loading the model, putting settings to use
:mod:`.reply`               the reply thread and how a reply ends
:mod:`.read_ahead`          reading the conversation ahead of the next reply
:mod:`.saving`              history writes that may fail, kept and tried again
:mod:`.chats`               editing the conversation, the saved chats
:mod:`.lookup`              the lookup caches (ngram-cache) and the static cache build
:mod:`.lab_requests`        the Lab's runs on the loaded model
==========================  ==============================================================

Everything a caller needs is importable from here (``from app.session import ChatSession,
ReplyDone``). The session never imports Textual or :mod:`app.ui`.
"""

from __future__ import annotations

from .context_fit import ContextOverflow, fit_to_context, reply_room, suggest_ctx, system_tokens
from .conversation import SessionError, Turn
from .core import ChatSession
from .engine import ChatEngine, EngineFactory, Post, Progress, default_engine_factory, uses_lookup_caches
from .events import (ContextTrimmed, EngineFailed, EngineReady, HistoryNotice, LoadProgress, LookupSaved, ReadAhead,
                     ReplyDone, ReplyFailed, ReplyProgress, RunnerStopped, SessionEvent, SpecApplied,
                     ServeChanged, ServedDone, ServedProgress, StaticBuildProgress, StaticBuilt)
from .reply import ReplyJob
from .serving import ServedRequest

__all__ = ["ChatSession", "Turn", "ReplyJob", "SessionError", "ChatEngine", "EngineFactory", "Post", "Progress",
           "default_engine_factory", "uses_lookup_caches", "ContextOverflow", "fit_to_context", "reply_room",
           "suggest_ctx", "system_tokens", "SessionEvent", "LoadProgress", "EngineReady", "EngineFailed",
           "SpecApplied", "ReplyProgress", "ContextTrimmed", "ReplyDone", "ReplyFailed", "LookupSaved",
           "HistoryNotice", "StaticBuildProgress", "StaticBuilt", "RunnerStopped", "ReadAhead",
           "ServeChanged", "ServedProgress", "ServedDone", "ServedRequest"]
