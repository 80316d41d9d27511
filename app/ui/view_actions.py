"""The actions on the view: themes and draft colours, the statistics panel (F4), colouring (F5),
Markdown or plain (F6), and the drafted-run line.

May touch: the views' palette and layout, the bars, the [ui] choices remembered.
"""

from __future__ import annotations

from textual import on

import themes as theme_data

from .app_part import AppPart
from .themes import draft_styles
from .widgets import MessageView, ProvenanceHover, StatsPanel


class ViewActions(AppPart):
    """The app's part that changes how the chat is shown."""

    def _apply_draft_palette(self) -> None:
        t = self.themes.get(self.theme) or self.themes[theme_data.DEFAULT_THEME]
        self.draft_styles = draft_styles(t)
        self.palette_version += 1
        for v in self._views():
            v.set_palette(self.draft_styles, self.palette_version)
        server = self.server_screen()
        if server is not None:
            server.set_palette(self.draft_styles, self.palette_version)
        self._refresh_bars()
        self._refresh_stats()

    def _on_theme_changed(self, _theme) -> None:
        self._apply_draft_palette()
        if self.theme in self.themes and self.config.ui.get("theme") != self.theme:
            self.remember_ui(theme=self.theme)

    def set_theme(self, name: str) -> None:
        if name in self.themes:
            self.theme = name
            self.notify(f"Theme: {self.themes[name].label}", timeout=2)

    def action_toggle_stats(self) -> None:
        panel = self.query_one(StatsPanel)
        panel.display = not panel.display
        self._refresh_stats()
        self.remember_ui(stats_panel=bool(panel.display))

    def _apply_view(self) -> None:
        for v in self._views():
            v.set_view(self.colouring, self.markdown_view)
        self._refresh_bars()

    def action_toggle_colour(self) -> None:
        self.colouring = not self.colouring
        self._apply_view()
        self.remember_ui(colouring=self.colouring)

    def action_toggle_off_view(self) -> None:
        # the layout only: colouring stays as F5 left it
        self.off_view = "plain" if self.off_view == "markdown" else "markdown"
        self._apply_view()
        self.remember_ui(off_view=self.off_view)
        self.notify(f"{'Markdown' if self.markdown_view else 'Plain'} view"
                    f"{'' if self.colouring else ' (colouring off: F5)'}", timeout=2)

    @on(ProvenanceHover)
    def _hover_info(self, msg: ProvenanceHover) -> None:
        if msg.info != self._hover:
            self._hover = msg.info
            self._refresh_bars()

    def on_descendant_blur(self, event) -> None:
        # the drafted-run line belongs to the focused message only
        if isinstance(event.widget, MessageView) and self._hover is not None:
            self._hover = None
            self._refresh_bars()
