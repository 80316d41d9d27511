"""Which actions are available where, the help screen (F1) and the command palette (Ctrl+P),
all derived from :data:`app.ui.actions.ACTIONS`.

May touch: the help screen; it reads the session's state.
"""

from __future__ import annotations

import functools
from typing import Iterable

from textual.app import SystemCommand
from textual.screen import Screen

from .actions import ACTIONS, EXTRA_KEYS, MAIN_ONLY
from .app_part import AppPart
from .screens import HelpScreen


class Commands(AppPart):
    """The app's part that says which actions are available, and lists them."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in MAIN_ONLY and len(self.screen_stack) > 1:
            return False
        if action == "stop":
            # dimmed, not hidden, between replies: the key bar keeps its keys where they are (and
            # lights Esc in place as a reply starts, instead of composing itself anew)
            return True if self.session.job is not None else None
        if action == "starter":
            # only while the chat is empty, as the welcome text that shows them
            return not self.session.turns and self.session.job is None
        if action in ("regenerate", "edit_last") and (self.session.engine is None or self.session.job is not None):
            return None if action == "regenerate" else False
        return True

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        rows = [(a.group, a.key_display, a.help) for a in ACTIONS]
        rows += list(EXTRA_KEYS)
        order = ["Chat", "Prompt", "Messages", "Chats", "View", "Settings", "App"]
        rows.sort(key=lambda r: order.index(r[0]) if r[0] in order else 99)
        self.push_screen(HelpScreen(rows))

    # -- command palette -------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        main = screen is self.screen_stack[0]
        for a in ACTIONS:
            if a.action == "quit" or (a.action.partition("(")[0] in MAIN_ONLY and not main):
                continue
            if a.action == "stop" and self.session.job is None:
                continue
            if a.action.startswith("starter(") and (self.session.turns or self.session.job is not None):
                continue
            yield SystemCommand(a.label if a.label != "Stop" else "Stop the reply",
                                f"{a.help}  [{a.key_display}]",
                                functools.partial(self.run_action, a.action))
        for name, t in self.themes.items():
            yield SystemCommand(f"Theme: {t.label}", f"Use the {t.label.lower()} theme"
                                + ("" if t.source == "built-in" else f" ({t.source})"),
                                functools.partial(self.set_theme, name))
        for cmd in super().get_system_commands(screen):
            if cmd.title in ("Theme", "Quit"):
                continue
            yield cmd
        yield SystemCommand("Quit", "Quit draftlight  [Ctrl+Q]", self.action_quit)
