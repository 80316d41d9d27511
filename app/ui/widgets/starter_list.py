"""The welcome screen's starter requests: a list that hands the keyboard back to the prompt.

May touch: its own highlight, and the focus (:mod:`.keyboard`) of the widget :attr:`StarterList.back`.
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widget import Widget
from textual.widgets import OptionList

from .keyboard import hand_keys_to, typed_ahead


class StarterList(OptionList):
    """The welcome screen's starter requests, one option each: Up/Down pick, Enter (or a click)
    sends (an :class:`OptionList.OptionSelected`, the keyboard back at :attr:`back`). Up from the
    first one, Esc, or typing a character (which goes with it) hand the keyboard back.

    The highlight shows only while the list has the keyboard (it starts on the first request)."""

    DEFAULT_CSS = """
    StarterList, StarterList:focus {
        height: auto; background: transparent; background-tint: transparent; border: none;
        padding: 0; margin: 0;
    }
    """

    def __init__(self, *requests: Any, **kw: Any):
        super().__init__(*requests, compact=True, **kw)
        self.highlighted = None        # (OptionList starts on its first option)
        #: where the keyboard goes back to (the prompt)
        self.back: Widget | None = None

    # (Textual calls each class's handler of an event: these add to OptionList's own)
    def on_focus(self) -> None:
        if self.highlighted is None and self.option_count:
            self.highlighted = 0

    def on_blur(self) -> None:
        self.highlighted = None

    def action_cursor_up(self) -> None:
        if not self.highlighted:
            self.action_leave()
            return
        self.highlighted -= 1

    def action_cursor_down(self) -> None:
        # no wrapping round to the first: the list ends at its last request
        if self.highlighted is None:
            self.highlighted = 0
        elif self.highlighted < self.option_count - 1:
            self.highlighted += 1

    def action_select(self) -> None:
        super().action_select()
        self.action_leave()

    def action_leave(self, key: events.Key | None = None) -> None:
        if self.back is not None:
            hand_keys_to(self, self.back, key)

    #: keys the list acts on as they come (not as bindings, which run once the key has gone up
    #: to the app: by then a key typed after it may have reached the list)
    KEYS = {"up": "cursor_up", "down": "cursor_down", "enter": "select", "escape": "leave",
            "home": "first", "end": "last", "pageup": "page_up", "pagedown": "page_down"}

    async def _on_key(self, event: events.Key) -> None:
        if typed_ahead(self, event):
            return
        action = self.KEYS.get(event.key)
        if action is not None:
            event.stop()
            event.prevent_default()
            getattr(self, f"action_{action}")()
        elif event.is_printable and event.character and event.key != "tab":
            # typing: it was meant for the prompt
            event.stop()
            event.prevent_default()
            self.action_leave(event)
