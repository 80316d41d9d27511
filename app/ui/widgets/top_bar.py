"""The top bar: app name, model, speculation, chat title, whether the model is served, and state,
fitted to one line.

May touch: its own line (it is given what to show).
"""

from __future__ import annotations

from textual.content import Content

from .one_line import OneLine


class TopBar(OneLine):
    """One calm line: app name, model, speculation, state."""

    DEFAULT_CSS = """
    TopBar { dock: top; height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    """

    def show(self, model: str, spec: str, state: str, chat: str = "", n_spec: int = 0, auto: bool = False,
             serving: str = "") -> None:
        """Name, model and state always, and ``serving`` (e.g. "serving :8080": other programs can
        reach the model) before the state; the speculators and the chat title when they fit whole."""
        width = (self.size.width or 80) - 2
        state_c = Content.styled(state, "$accent" if "…" in state else "$foreground-muted")
        if serving:
            state_c = Content.assemble((serving, "bold $success"), "  ·  ", state_c)
        room = max(0, width - state_c.cell_length - 2)
        left = Content.assemble(("draftlight", "bold $primary"), "  ", (model, "$foreground"))
        if spec:
            prefix = "auto: " if auto else ""
            full = Content.assemble("  ·  ", (prefix + spec, "$secondary"))
            short = Content.assemble("  ·  ", (prefix + (f"{n_spec} speculators" if n_spec > 1 else spec), "$secondary"))
            for piece in (full, short):
                if left.cell_length + piece.cell_length <= room:
                    left = left + piece
                    break
        if chat and left.cell_length + 5 + 12 <= room:
            # the chat title only when it has room to be readable
            title = Content.styled(chat, "$foreground-muted").truncate(room - left.cell_length - 5, ellipsis=True)
            left = left + Content("  ·  ") + title
        left = left.truncate(room, ellipsis=True)
        pad = max(1, width - left.cell_length - state_c.cell_length)
        self.set_line(left + " " * pad + state_c)
