"""Shown while the model loads, or when it cannot be loaded (with a way to pick another model).

May touch: its own children; it posts :class:`LoadPanel.Pick`.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Static


class LoadPanel(Vertical):
    """Shown while the model loads, or when it cannot be loaded (with a way to pick another)."""

    DEFAULT_CSS = """
    LoadPanel { height: auto; margin: 1 2; padding: 1 2; border: round $primary 60%; background: $surface; }
    LoadPanel.-error { border: round $error; }
    LoadPanel > .title { text-style: bold; color: $primary; }
    LoadPanel.-error > .title { color: $error; }
    LoadPanel > .detail { color: $text-muted; margin-top: 1; }
    LoadPanel > ProgressBar { margin-top: 1; }
    LoadPanel > .pick { height: auto; margin-top: 1; display: none; }
    LoadPanel.-error > .pick { display: block; }
    LoadPanel.-error > ProgressBar { display: none; }
    LoadPanel .pick Input { width: 1fr; }
    LoadPanel .pick Horizontal { height: auto; margin-top: 1; }
    LoadPanel .pick Button { margin-right: 2; min-width: 12; }
    """

    class Pick(Message):
        """Load the model at ``path`` (None: the embedded default)."""

        def __init__(self, path: str | None):
            super().__init__()
            self.path = path

    def compose(self) -> ComposeResult:
        from textual.containers import Horizontal
        from textual.widgets import Button, Input, ProgressBar
        yield Static("Loading the model…", classes="title", id="load-title")
        yield ProgressBar(total=None, show_eta=False, id="load-bar")
        yield Static("", classes="detail", id="load-detail")
        with Vertical(classes="pick"):
            yield Input(placeholder="path to a .gguf model file", id="model-path")
            with Horizontal():
                yield Button("Load", variant="primary", id="load-path")
                yield Button("Default model", id="load-default")

    def show_progress(self, phase: str, done: int, total: int, path: str | None = None) -> None:
        from textual.widgets import ProgressBar
        self.remove_class("-error")
        title = {"assemble": "Preparing the default model (first run)…",
                 "verify": "Checking the default model…",
                 "probe": "Checking once which llama.cpp CPU kernels work here…"}.get(phase, "Loading the model…")
        if phase in ("assemble", "verify") and total > 0 and done >= total:
            # prepared: what follows (the runner starting, the weights loading) has no steps to count
            title, done, total = "Loading the model…", 0, 0
        self.query_one("#load-title", Static).update(title)
        bar = self.query_one("#load-bar", ProgressBar)
        if total > 0:
            bar.update(total=total, progress=done)
        else:
            bar.update(total=None)
        if path:
            self.query_one("#load-detail", Static).update(path)

    def hide(self) -> None:
        """Out of sight, and its bar no longer animated (a hidden indeterminate bar keeps a
        15-a-second timer that the UI would pay for while replies stream)."""
        from textual.widgets import ProgressBar
        self.query_one("#load-bar", ProgressBar).update(total=1, progress=0)
        self.display = False

    def show_error(self, error: str, path: str | None) -> None:
        from textual.widgets import Input
        self.add_class("-error")
        self.query_one("#load-title", Static).update("The model could not be loaded")
        self.query_one("#load-detail", Static).update(
            Content.assemble((error, "$foreground"), "\n\nEnter the path of another GGUF model, "
                             "or load the embedded default model."))
        inp = self.query_one("#model-path", Input)
        if path and not inp.value:
            inp.value = path
        inp.focus()

    def on_button_pressed(self, event) -> None:
        from textual.widgets import Input
        event.stop()
        if event.button.id == "load-path":
            value = self.query_one("#model-path", Input).value.strip()
            if value:
                self.post_message(self.Pick(value))
        elif event.button.id == "load-default":
            self.post_message(self.Pick(None))

    def on_input_submitted(self, event) -> None:
        event.stop()
        if event.value.strip():
            self.post_message(self.Pick(event.value.strip()))
