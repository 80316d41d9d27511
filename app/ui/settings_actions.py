"""The actions on settings: the settings dialog (F3, its Server group applied by
:mod:`app.ui.server_actions`), the Lab (F8), and the static lookup cache built from the settings.

May touch: the session's settings (through ``apply_settings``), the Settings and Lab screens.
"""

from __future__ import annotations

from typing import Any

from textual import on

from ..errors import describe, user_errors
from .app_part import AppPart
from .screens import SettingsResult, SettingsScreen


class SettingsActions(AppPart):
    """The app's part that changes settings."""

    def action_settings(self) -> None:
        s = self.session
        if s.engine is None and s.loading:
            self.notify("The model is still loading.", timeout=3)
        self.push_screen(SettingsScreen(self.config.spec, self.config.sampling, self.config.model,
                                        self.config.max_tokens, s.engine, overflow=self.config.overflow,
                                        lookup=s.lookup_figures(),
                                        n_ctx=s.n_ctx if s.engine is not None else None,
                                        serving=bool(s.serving_url), serve_port=self.serve_port),
                         self._settings_done)

    def action_lab(self, prompt_file: str | None = None, served: int | None = None) -> None:
        """The Lab; its prompt: ``prompt_file``, the served request ``served``, or the chat's latest message."""
        from .lab import LabScreen
        if isinstance(self.screen, LabScreen):
            return
        if self.session.job is not None:
            self.notify("The Lab opens once the reply has finished (Esc stops it).", timeout=4)
            return
        self.push_screen(LabScreen(self.session, styles=self.draft_styles, history=self.history,
                                   prompt_file=prompt_file, served=served))

    def _lab_use(self, name: str, spec: Any) -> None:
        c = self.config
        outcome = self.session.apply_settings(spec, c.sampling, c.model, c.max_tokens, c.overflow)
        if outcome == "reload":
            self._show_loading(c.model)
        elif outcome == "rebuild":
            self._set_state("rebuilding speculators…")
        self.notify(f"Speculation: {name} (from the Lab), saved.", timeout=4)
        self._refresh_welcome()

    def _settings_done(self, result: SettingsResult | None) -> None:
        if result is None:
            return
        outcome = self.session.apply_settings(result.spec, result.sampling, result.model, result.max_tokens,
                                              result.overflow)
        self.apply_serve_settings(result.serve, result.serve_port)
        if outcome == "reload":
            self.notify("Reloading the model with the new settings…", timeout=3)
            self._show_loading(result.model)
        elif outcome == "rebuild":
            self._set_state("rebuilding speculators…")
        else:
            self.notify("Settings saved.", timeout=2)
        self._refresh_welcome()

    def on_lab_screen_use_config(self, msg: Any) -> None:
        self._lab_use(msg.name, msg.spec)

    @on(SettingsScreen.BuildStatic)
    def _build_static(self, msg: SettingsScreen.BuildStatic) -> None:
        try:
            self.session.build_static_cache(msg.files)
        except user_errors() as e:
            if isinstance(self.screen, SettingsScreen):
                self.screen.show_build_done(None, describe(e), self.session.lookup_figures())
            return

    @on(SettingsScreen.CancelBuild)
    def _cancel_build(self, _msg: SettingsScreen.CancelBuild) -> None:
        self.session.cancel_build()
