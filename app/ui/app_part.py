"""The base of the app's parts: each part is one job of :class:`app.ui.app.DraftlightApp`.

The app is composed of parts (its session events, the pacing of a streaming reply's paints, the
actions on chats, replies, settings and the view, its commands), each a class of methods that
work on the app's own state, listed as bases of the app. A part is made by Textual's metaclass
(as every widget and app is) so that its ``@on`` handlers are found: Textual collects them per
class, from the classes its metaclass made. May touch: nothing itself.
"""

from __future__ import annotations

from textual.app import App


class AppPart(metaclass=type(App)):
    """A part of the app: methods only (no ``__init__``, no state of its own but the app's)."""
