"""A one-line bar that repaints only when what it shows changes (the base of the top bar and legend).

May touch: its own content.
"""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widgets import Static


class OneLine(Static):
    """A line of fixed height: an update with what it already shows does nothing, and none
    asks for a new layout (while a reply streams these change a few times a second; a layout
    pass over the whole screen each time would take the CPU the model needs)."""

    _shown: Any = None

    def set_line(self, content: Content) -> None:
        # Content's == looks at the text alone; a change of colour is a change too
        key = (content.plain, tuple(content.spans))
        if key == self._shown:
            return
        self._shown = key
        self.update(content, layout=False)
