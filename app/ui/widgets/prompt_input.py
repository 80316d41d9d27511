"""The prompt: Enter sends, a newline key adds a line, Up/Down walk what was sent before.

May touch: its own text; it posts :class:`PromptInput.Send` and hands the keyboard on
(:mod:`.keyboard`) to the widget :attr:`PromptInput.below` names.
"""

from __future__ import annotations

from typing import Any, Callable

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import TextArea

from .keyboard import hand_keys_to, typed_ahead


def _prompt_bindings() -> list:
    """TextArea's bindings minus the keys the app uses (F6/F7 select line/all there)."""
    taken = {"f6", "f7"}
    out = []
    for b in TextArea.BINDINGS:
        keys = [k for k in b.key.split(",") if k.strip() not in taken] if isinstance(b, Binding) else None
        if keys is None:
            out.append(b)
        elif keys:
            out.append(Binding(",".join(keys), b.action, b.description, show=b.show, priority=b.priority,
                               key_display=b.key_display, tooltip=b.tooltip))
    return out


class PromptInput(TextArea, inherit_bindings=False):
    """Multi-line prompt: Enter sends, Shift+Enter / Ctrl+J / Alt+Enter insert a newline.

    With an empty prompt, Up and Down walk through what was sent before; Down from the empty
    prompt (past the newest message sent) goes on to :attr:`below` where it gives a widget
    (the welcome screen's starter requests).
    """

    BINDINGS = _prompt_bindings()

    class Send(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    NEWLINE_KEYS = ("shift+enter", "ctrl+j", "newline", "alt+enter", "ctrl+enter")

    def __init__(self, sent: list[str] | None = None, **kw: Any):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         highlight_cursor_line=False, compact=True, **kw)
        self.sent: list[str] = list(sent or [])
        self._hist_pos: int | None = None
        #: where Down from the empty prompt takes the keyboard (None: nowhere, now)
        self.below: Callable[[], Widget | None] = lambda: None

    def remember(self, text: str) -> None:
        if text and (not self.sent or self.sent[-1] != text):
            self.sent.append(text)
        self._hist_pos = None

    def _show_history(self, pos: int | None) -> None:
        self._hist_pos = pos
        self.text = "" if pos is None else self.sent[pos]
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if typed_ahead(self, event):
            return
        key = event.key
        if key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Send(self.text))
            return
        if key in self.NEWLINE_KEYS or "newline" in event.aliases:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        browsing = self._hist_pos is not None and self.text == self.sent[self._hist_pos]
        if key == "up" and self.sent and (not self.text or browsing):
            event.stop()
            event.prevent_default()
            pos = len(self.sent) - 1 if self._hist_pos is None else max(0, self._hist_pos - 1)
            self._show_history(pos)
            return
        if key == "down" and browsing:
            event.stop()
            event.prevent_default()
            assert self._hist_pos is not None
            nxt = self._hist_pos + 1
            self._show_history(nxt if nxt < len(self.sent) else None)
            return
        if key == "down" and not self.text:
            event.stop()
            event.prevent_default()
            self._hist_pos = None
            target = self.below()
            if target is not None:
                hand_keys_to(self, target)
            return
        if self._hist_pos is not None and not browsing:
            self._hist_pos = None
        await super()._on_key(event)
