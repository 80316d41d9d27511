"""TextPromptScreen: ask for a line or a block of text. Touches nothing but itself: it dismisses
with the text, or None when cancelled."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static, TextArea


class TextPromptScreen(ModalScreen[str | None]):
    """Ask for a line (or, with ``multiline``, a block) of text; None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save", show=False)]

    DEFAULT_CSS = """
    TextPromptScreen { align: center middle; }
    TextPromptScreen > Vertical { width: 76; max-width: 95%; height: auto; padding: 1 2;
        border: round $primary; background: $surface; }
    TextPromptScreen .title { text-style: bold; color: $primary; }
    TextPromptScreen .hint { color: $text-muted; margin-bottom: 1; }
    TextPromptScreen TextArea { height: 8; }
    TextPromptScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    TextPromptScreen Button { margin-left: 2; }
    """

    def __init__(self, title: str, value: str = "", *, hint: str = "", multiline: bool = False,
                 ok_label: str = "Save"):
        super().__init__()
        self.title_text = title
        self.value = value
        self.hint = hint
        self.multiline = multiline
        self.ok_label = ok_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            if self.hint:
                yield Static(self.hint, classes="hint")
            if self.multiline:
                yield TextArea(self.value, id="value", soft_wrap=True, tab_behavior="focus")
            else:
                yield Input(self.value, id="value")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button(self.ok_label, variant="primary", id="ok")

    def on_mount(self) -> None:
        self.query_one("#value").focus()

    def _value(self) -> str:
        w = self.query_one("#value")
        return w.text if isinstance(w, TextArea) else w.value  # type: ignore[attr-defined]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(self._value())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(self._value() if event.button.id == "ok" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        self.dismiss(self._value())
