"""The key bar: Textual's footer, dimming and lighting its keys in place where it can.

May touch: its own key widgets; it reads the screen's active bindings.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.widgets import Footer

try:    # (not exported by Textual: without it the key bar composes itself anew, as Textual's does)
    from textual.widgets._footer import FooterKey
except ImportError:     # pragma: no cover
    FooterKey = None


class KeyBar(Footer):
    """The key bar: Textual's footer, except that where only which keys are enabled changed
    (Esc's Stop and Ctrl+R's Regenerate, as each reply starts and ends), it dims and lights
    its keys in place.

    Textual's footer composes itself anew whenever the screen's bindings may have changed: new
    key widgets, styled and laid out, and with them the whole screen laid out again. That was
    twice a reply, ~70 ms of the UI's CPU a reply in a chat of 30 exchanges (taken, on 2 cores,
    from the model's threads). It still composes anew when the keys shown, their order or
    their labels change (a focused message adds its own)."""

    #: what the bar showed when it was last composed (:meth:`_shown`)
    _composed: tuple | None = None

    def _shown(self) -> tuple[tuple, dict[tuple[str, str], tuple[bool, str]]]:
        """What the bar shows (keys, actions, labels, groups, in order) and, per key, whether
        it is enabled and its tooltip."""
        shown: list[tuple] = []
        state: dict[tuple[str, str], tuple[bool, str]] = {}
        for _node, binding, enabled, tooltip in self.screen.active_bindings.values():
            if not binding.show:
                continue
            shown.append((binding.key, binding.action, binding.description, id(binding.group),
                          self.app.get_key_display(binding)))
            state.setdefault((binding.key, binding.action), (enabled, tooltip))
        return (tuple(shown), self.show_command_palette, self.compact), state

    def compose(self) -> ComposeResult:
        if self._bindings_ready:
            self._composed = self._shown()[0]
        yield from super().compose()

    def bindings_changed(self, screen: Any) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        self.call_after_refresh(self._update_keys)

    def _update_keys(self) -> None:
        if not self.is_attached:
            return
        what, state = self._shown()
        if FooterKey is None or what != self._composed:
            self.call_next(self.recompose)
            return
        try:
            for key in self.query(FooterKey):
                enabled, tooltip = state.get((key.key, key.action), (not key._disabled, key.tooltip))
                if key._disabled == enabled:
                    key._disabled = not enabled
                    key.set_class(not enabled, "-disabled")
                if tooltip and key.tooltip != tooltip:
                    key.tooltip = tooltip
        except AttributeError:      # pragma: no cover (a Textual whose keys are made otherwise)
            self.call_next(self.recompose)
