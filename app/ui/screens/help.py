"""HelpScreen: every action with its key. It shows the rows it is given (the app's one list of
actions) and touches nothing else."""

from __future__ import annotations

from typing import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    """Every action with its key (the same list feeds the bindings and the command palette)."""

    BINDINGS = [Binding("escape,f1,q", "close", "Close")]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 78; max-width: 96%; height: 90%; padding: 1 2;
        border: round $primary; background: $surface; }
    HelpScreen .title { text-style: bold; color: $primary; }
    HelpScreen .group { text-style: bold; color: $secondary; margin-top: 1; }
    HelpScreen .row { height: auto; }
    HelpScreen .key { width: 23; padding-left: 2; text-style: bold; color: $accent; }
    HelpScreen .desc { width: 1fr; }
    HelpScreen .foot { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, rows: Sequence[tuple[str, str, str]]):
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        # a key column and a description column: a long description wraps inside its own column
        with VerticalScroll():
            yield Static("Keys", classes="title")
            group = None
            for g, key, desc in self.rows:
                if g != group:
                    group = g
                    yield Static(g, classes="group")
                with Horizontal(classes="row"):
                    yield Static(key, classes="key")
                    yield Static(desc, classes="desc")
            yield Static("Every action is also in the command palette (Ctrl+P). Esc closes this.", classes="foot")

    def action_close(self) -> None:
        self.dismiss(None)
