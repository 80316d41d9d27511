"""FieldRow: one settings field on one line (label, input, and its hint or what is wrong).

Its hint comes from :func:`app.settings_form.field_hint`; it validates nothing itself.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Input, Label, Static

from speculators.param_kinds import KINDS

from ...settings_form import field_hint


class FieldRow(Horizontal):
    """label · input · hint or error, on one line."""

    DEFAULT_CSS = """
    FieldRow { height: auto; margin-left: 4; }
    FieldRow > .f-label { width: 20; color: $text-muted; }
    FieldRow > Input { width: 12; }
    FieldRow.-wide > Input { width: 1fr; max-width: 44; }
    FieldRow > .f-note { width: 1fr; color: $text-muted; padding-left: 2; }
    FieldRow.-wide > .f-note { width: 1fr; }
    FieldRow > .f-note.-error { color: $error; text-style: bold; }
    """

    def __init__(self, key: str, label: str, kind: str, value: str, hint: str | None = None):
        super().__init__(classes="-wide" if KINDS[kind].wide else "")
        self.key = key
        self.kind = kind
        self.label = label
        self.value = value
        #: the note beside the field when its value is valid
        self.hint = hint if hint is not None else field_hint(key, kind)

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="f-label")
        yield Input(self.value, compact=True, id="f-" + self.key.replace(".", "--"))
        yield Static(self.hint, classes="f-note")

    def set_error(self, message: str | None) -> None:
        note = self.query_one(".f-note", Static)
        if message:
            note.update(f"✗ {message}")
            note.add_class("-error")
        else:
            note.update(self.hint)
            note.remove_class("-error")
