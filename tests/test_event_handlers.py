"""Session events reach their handlers by type: every event the session posts is handled by the
session or the screen, and a handler table cannot name an event that is not one."""

from __future__ import annotations

import typing

from app import session as sess


def _event_types() -> set[type]:
    return set(typing.get_args(sess.SessionEvent))


def test_every_session_event_has_a_handler_and_every_handler_an_event(tmp_path):
    from app.ui.app import DraftlightApp
    s = sess.ChatSession(post=lambda ev: None, open_history=False, persist_config=False)
    app = DraftlightApp.__new__(DraftlightApp)          # the table only: no terminal, no session
    ours, ui = set(s.handlers()), set(DraftlightApp.ui_handlers(app))
    events = _event_types()
    assert ours <= events and ui <= events
    # ReplyProgress is painted by the screen's own coalescing path, and kept up to date by the session
    unhandled = events - ours - ui - {sess.ReplyProgress}
    assert not unhandled, f"events nobody handles: {sorted(t.__name__ for t in unhandled)}"
    assert sess.ReplyProgress in ours


def test_an_event_is_applied_by_its_type_not_its_name(tmp_path):
    """A class named like an event but not one is not handled (dispatch by name would)."""
    s = sess.ChatSession(post=lambda ev: None, open_history=False, persist_config=False)
    s.reading_ahead = False
    s.apply(sess.ReadAhead(True))
    assert s.reading_ahead is True
    fake = type("ReadAhead", (), {"reading": False})()
    s.apply(fake)
    assert s.reading_ahead is True
