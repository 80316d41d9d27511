"""What the screen does with each session event: a table keyed by the event's class.

:class:`SessionMessage` carries an event from the session's threads to the UI thread;
:meth:`SessionEvents.show_session_event` lets the session apply it first, then calls the
handler :meth:`SessionEvents.ui_handlers` names for its type (a :class:`~app.session.ReplyProgress`
goes to the paint pacing of :mod:`app.ui.painting`). May touch: the app's widgets, its state
line and notifications; the session only through its public methods.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Callable

from textual import on
from textual.containers import VerticalScroll
from textual.message import Message

from .. import session as sess
from .app_part import AppPart
from .screens import SettingsScreen
from .widgets import LoadPanel, PromptInput
from .wording import sentence


class SessionMessage(Message):
    """A session event, carried to the UI thread. Live statistics replace older ones in the queue."""

    def __init__(self, event: Any):
        super().__init__()
        self.event = event

    def can_replace(self, message: Message) -> bool:
        ev = self.event
        other = getattr(message, "event", None)
        return (isinstance(ev, (sess.LoadProgress, sess.StaticBuildProgress))
                and type(other) is type(ev) and getattr(ev, "key", None) == getattr(other, "key", None))


class SessionEvents(AppPart):
    """The app's part that shows the session's events (by type: a renamed event class breaks
    :meth:`ui_handlers`, and tests/test_event_handlers.py checks every event is handled)."""

    @on(SessionMessage)     # (by type: a renamed message class takes its handler with it)
    def show_session_event(self, msg: SessionMessage) -> None:
        """Let the session apply the event, then show it (a reply's progress: when its paint is due)."""
        ev = msg.event
        if isinstance(ev, sess.ReplyProgress):
            self._reply_progress(ev)
            return
        # anything else comes after the progress it follows: show that first
        self._flush_progress()
        self.session.apply(ev)
        handler = self.ui_handlers().get(type(ev))
        if handler is not None:
            handler(ev)

    def ui_handlers(self) -> dict[type, Callable[[Any], None]]:
        """What the screen does with each session event (by type, as :meth:`ChatSession.handlers`;
        :class:`~app.session.ReplyProgress` is painted by :meth:`_reply_progress`)."""
        return {sess.LoadProgress: self._ui_LoadProgress, sess.EngineReady: self._ui_EngineReady,
                sess.EngineFailed: self._ui_EngineFailed, sess.SpecApplied: self._ui_SpecApplied,
                sess.ContextTrimmed: self._ui_ContextTrimmed, sess.ReplyDone: self._ui_ReplyDone,
                sess.ReplyFailed: self._ui_ReplyFailed, sess.RunnerStopped: self._ui_RunnerStopped,
                sess.ReadAhead: self._ui_ReadAhead, sess.LookupSaved: self._ui_LookupSaved,
                sess.StaticBuildProgress: self._ui_StaticBuildProgress, sess.StaticBuilt: self._ui_StaticBuilt,
                sess.HistoryNotice: self._ui_HistoryNotice, sess.ServeChanged: self._ui_ServeChanged,
                sess.ServedProgress: self._ui_ServedProgress, sess.ServedDone: self._ui_ServedDone}

    def _ui_LoadProgress(self, ev: sess.LoadProgress) -> None:
        self.query_one(LoadPanel).show_progress(ev.phase, ev.done, ev.total)

    def _ui_EngineReady(self, ev: sess.EngineReady) -> None:
        if self._quitting or self.session.engine is None:
            return
        # what exists now lives for the whole session: keep it out of the collector's scans,
        # which would otherwise pause streaming now and then
        gc.collect()
        gc.freeze()
        self._paint_every = self._paint_gap = self.paint_every_s()
        self._paint_cost = None       # another model, other threads: its paints are timed afresh
        self.query_one(LoadPanel).hide()
        self._set_state("ready")
        self.refresh_bindings()
        if not isinstance(self.focused, PromptInput):
            self.query_one(PromptInput).focus()
        for w in ev.warnings:
            self.notify(w, severity="warning", timeout=10)
        if ev.spec_error:
            self.notify(f"Speculation not changed: {ev.spec_error}", severity="error", timeout=8)
        for name, why in self.session.skipped.items():
            self.notify(f"{name} is off: {why}", severity="warning", timeout=8)
        if self._open_lab:
            self._open_lab = False
            if not self._lab_prompt_file and not self.session.turns and self.history is not None:
                chats = []
                with contextlib.suppress(Exception):
                    chats = self.history.list_chats()
                if chats:
                    self.resume_chat(chats[0].id)
            self.action_lab(self._lab_prompt_file)
        self._notify_unused_draft_model()
        engine = self.session.engine
        if getattr(engine, "spec", None) is not None and \
                engine.spec.to_dict() != self.config.spec.to_dict() and not self._spec_retry and not ev.spec_error:
            # settings applied while the model was loading
            self._spec_retry = True
            self.session.rebuild_chain()
        else:
            self._spec_retry = False
        self._refresh_welcome()
        self._refresh_stats()
        queued, self.session.queued = self.session.queued, None
        if queued is not None:
            self.send(queued, from_prompt=False)

    def _ui_EngineFailed(self, ev: sess.EngineFailed) -> None:
        self._set_state("no model")
        panel = self.query_one(LoadPanel)
        panel.display = True
        panel.show_error(ev.error, ev.path)
        self._show_welcome(False)
        conv = self.query_one("#conversation", VerticalScroll)
        conv.anchor(False)
        self.call_after_refresh(lambda: conv.scroll_to_widget(panel, animate=False, top=True))
        self.refresh_bindings()

    def _notify_unused_draft_model(self) -> None:
        """What Automatic says about how it runs with these settings (``runtime.auto_warnings``:
        a draft model it cannot use, its controller off under synthetic acceptance), in place,
        each once until the settings change it."""
        from ..runtime import auto_warnings
        engine = self.session.engine
        msgs = auto_warnings(getattr(engine, "spec", None), getattr(engine, "auto_plan", None))
        said = getattr(self, "_auto_warned", ())
        for msg in msgs:
            if msg not in said:
                self.notify(msg[0].upper() + msg[1:], severity="warning", timeout=12)
        self._auto_warned = tuple(msgs)

    def _ui_SpecApplied(self, ev: sess.SpecApplied) -> None:
        # the new chain lives until the next change: keep it out of the collector's scans too
        gc.collect()
        gc.freeze()
        if ev.error:
            self.notify(f"Speculation not changed: {ev.error}", severity="error", timeout=8)
        else:
            types = self.session.active_types
            self.notify(f"Speculation: {', '.join(types) if types else 'off'}", timeout=3)
            for name, why in ev.skipped.items():
                self.notify(f"{name} is off: {why}", severity="warning", timeout=8)
            self._notify_unused_draft_model()
        for w in ev.warnings:
            self.notify(w, severity="warning", timeout=10)
        if self.session.job is None:
            self.state = "ready"
        self._refresh_welcome()
        self._refresh_bars()
        self._refresh_stats()

    def _ui_ContextTrimmed(self, ev: sess.ContextTrimmed) -> None:
        self._place_cut_marker(ev.n_dropped)
        self.notify(f"The conversation outgrew the context ({ev.n_ctx} tokens): the model no longer sees "
                    f"the {ev.n_dropped} oldest message{'s' if ev.n_dropped != 1 else ''}.", timeout=6)

    def _ui_ReplyDone(self, ev: sess.ReplyDone) -> None:
        turn = self._turn(ev.key)
        view = self._views_by_key.get(ev.key)
        if turn is not None and view is not None and view.is_attached:
            # tokens that arrived after the last ReplyProgress, then the final form
            rest = turn.tokens[view.body.n_tokens:]
            if rest:
                view.add_tokens(rest)
            view.finish_streaming(turn.stats, turn.finish, turn.text)
        if self.session.job is None:     # (a reply left by Ctrl+N or F2 ends while another is written)
            self._set_state("stopped" if ev.result.finish_reason == "cancelled" else "ready")
        self._refresh_stats()
        self.refresh_bindings()

    def _ui_ReplyFailed(self, ev: sess.ReplyFailed) -> None:
        view = self._views_by_key.get(ev.key)
        if view is not None and view.is_attached:
            view.fail(ev.error)
        if self.session.job is None:
            self._set_state("error")
        self.notify(ev.error, severity="error", timeout=8)
        self.refresh_bindings()

    def _ui_RunnerStopped(self, ev: sess.RunnerStopped) -> None:
        """The runner died between replies: said, with what happens next (it was started again,
        or, the same death twice in a row, not)."""
        if ev.gave_up:
            self._set_state("error")
        self.notify(ev.message[0].upper() + ev.message[1:], severity="error" if ev.gave_up else "warning",
                    timeout=20 if ev.gave_up else 12)
        self._refresh_welcome()
        self._refresh_stats()
        self.refresh_bindings()

    def _ui_ReadAhead(self, ev: sess.ReadAhead) -> None:
        if ev.reading:
            self._read_ahead_since = time.monotonic()
            self.set_timer(self.READ_AHEAD_SHOWN_AFTER_S, self._refresh_bars)
        else:
            self._read_ahead_since = None
            self._refresh_bars()

    def _ui_LookupSaved(self, ev: sess.LookupSaved) -> None:
        if ev.info.get("error"):
            self.notify(f"lookup cache not saved: {ev.info['error']}", severity="warning", timeout=8)
        for w in ev.info.get("warnings") or []:
            self.notify(w, severity="warning", timeout=8)
        self._refresh_stats()

    def _ui_StaticBuildProgress(self, ev: sess.StaticBuildProgress) -> None:
        if isinstance(self.screen, SettingsScreen):
            self.screen.show_build_progress(ev.done, ev.total, ev.name)

    def _ui_StaticBuilt(self, ev: sess.StaticBuilt) -> None:
        if isinstance(self.screen, SettingsScreen):
            self.screen.show_build_done(ev.info, ev.error, self.session.lookup_figures())
        if ev.error:
            self.notify(f"static cache not built: {ev.error}", severity="warning", timeout=8)
        else:
            info = ev.info or {}
            self.notify(f"Static cache built: {info.get('entries', 0):,} entries from "
                        f"{info.get('tokens', 0):,} tokens.", timeout=5)
        self._refresh_stats()

    def _ui_ServeChanged(self, ev: sess.ServeChanged) -> None:
        self.show_serve_changed(ev.url, ev.error, ev.warnings)

    def _ui_ServedProgress(self, ev: sess.ServedProgress) -> None:
        # (the session has taken the request's news; the Server screen paints them at its pace)
        screen = self.server_screen()
        if screen is not None:
            screen.request_changed(ev.rid)

    def _ui_ServedDone(self, ev: sess.ServedDone) -> None:
        screen = self.server_screen()
        if screen is not None:
            screen.request_changed(ev.rid)
        self._refresh_stats()          # F4 counts served requests too (the session added this one's)

    def _ui_HistoryNotice(self, ev: sess.HistoryNotice) -> None:
        """A save of the chat failed (said once until saving works again), or works again."""
        if ev.error:
            self.notify(f"{sentence(ev.error)} The chat goes on here and is saved once the history can be "
                        "written again.", severity="error", timeout=15)
        else:
            self.notify("The chat history is saved again.", timeout=4)
