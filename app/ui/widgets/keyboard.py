"""Handing the keyboard from one widget to another without losing keys typed ahead.

May touch: the focus of the screen the widgets are on, and the keys it forwards.
"""

from __future__ import annotations

from textual import events
from textual.widget import Widget


def hand_keys_to(widget: Widget, target: Widget, key: events.Key | None = None) -> None:
    """Give ``target`` the keyboard now, and ``key`` (one meant for it) with it.

    Now, not after the messages already queued as :meth:`Widget.focus` does: a terminal may send
    several keys at once (typed ahead, or a script's), and the ones after this must reach
    ``target``, not ``widget`` (see :func:`typed_ahead`)."""
    widget.screen.set_focus(target)
    if key is not None:
        forward_key(target, key)


def forward_key(target: Widget, key: events.Key) -> None:
    again = events.Key(key.key, key.character)
    again._set_forwarded()        # as the app forwards a key to the focused widget
    target.post_message(again)


def typed_ahead(widget: Widget, event: events.Key) -> bool:
    """A key queued for ``widget`` before the keyboard moved on from it: hand it on to where the
    keyboard is now (True), so keys typed in a row keep their order and target."""
    focused = widget.screen.focused
    if focused is None or focused is widget:
        return False
    event.stop()
    event.prevent_default()
    forward_key(focused, event)
    return True
