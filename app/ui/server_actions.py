"""The actions on serving the chat's model to other programs: the Server screen (F9), the switch
that starts and stops serving (Ctrl+T there, the palette, F3's Server group), and what the screen
and the top bar show of it.

Serving listens on 127.0.0.1 only, on the port remembered as ``[ui] serve_port`` (default 8080);
it is never started by itself at launch. May touch: the session's server (through
``start_serving``/``stop_serving``), the Server screen, the bars; the Lab (a served request as its
prompt).
"""

from __future__ import annotations

import functools
from typing import Iterable
from urllib.parse import urlsplit

from textual import on
from textual.app import SystemCommand
from textual.screen import Screen

from ..errors import describe, user_errors
from ..session.serving import DEFAULT_PORT
from .app_part import AppPart
from .screens import ServerScreen


class ServerActions(AppPart):
    """The app's part that serves the model and shows the requests."""

    SERVE_HOST = "127.0.0.1"

    @property
    def serve_port(self) -> int:
        """The port serving uses: the one remembered in ``[ui] serve_port``, else 8080."""
        port = self.config.ui.get("serve_port", DEFAULT_PORT)
        return port if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 \
            else DEFAULT_PORT

    def serving_label(self) -> str:
        """What the top bar says while the model is served ("serving :8080"); "" while not."""
        url = self.session.serving_url
        if not url:
            return ""
        port = urlsplit(url).port
        return f"serving :{port}" if port else "serving"

    def server_screen(self) -> ServerScreen | None:
        """The Server screen, where it is open (also under a dialog)."""
        return next((s for s in self.screen_stack if isinstance(s, ServerScreen)), None)

    def action_server(self) -> None:
        if self.server_screen() is not None:
            return
        self.push_screen(ServerScreen(self.session.served, self.session.serving_url, self.serve_port,
                                      coloured=self.colouring, markdown=self.markdown_view,
                                      styles=self.draft_styles, palette_version=self.palette_version))

    def start_serving(self, port: int | None = None) -> bool:
        """Serve the model on 127.0.0.1 (``port``: the remembered one); what stops it (the port
        taken, ...) is said, and nothing else happens."""
        port = self.serve_port if port is None else port
        try:
            self.session.start_serving(self.SERVE_HOST, port)
        except user_errors() as e:
            msg = describe(e)
            self.notify(f"Not serving: {msg}.", severity="error", timeout=10)
            return False
        return True

    def stop_serving(self) -> None:
        self.session.stop_serving()

    def action_toggle_serving(self) -> None:
        if self.session.serving_url:
            self.stop_serving()
        else:
            self.start_serving()

    @on(ServerScreen.Toggle)
    def _server_toggle(self, msg: ServerScreen.Toggle) -> None:
        msg.stop()
        self.action_toggle_serving()

    @on(ServerScreen.UseInLab)
    def _server_use_in_lab(self, msg: ServerScreen.UseInLab) -> None:
        msg.stop()
        screen = self.server_screen()
        if screen is not None and screen.is_current:
            screen.dismiss(None)
        self.call_later(self.action_lab, None, msg.rid)

    def apply_serve_settings(self, serve: bool | None, port: int | None) -> None:
        """F3's Server group: the port remembered; serving started, stopped, or moved to the new port."""
        if port is not None and port != self.config.ui.get("serve_port", DEFAULT_PORT):
            self.remember_ui(serve_port=port)
        serving = bool(self.session.serving_url)
        if serve is None:
            return
        if serving and (not serve or urlsplit(self.session.serving_url).port != self.serve_port):
            self.stop_serving()
            serving = False
        if serve and not serving:
            self.start_serving()

    def show_serve_changed(self, url: str | None, error: str | None, warnings: Iterable[str]) -> None:
        """Serving started or stopped: said, and shown in the top bar and on the Server screen."""
        if url:
            self.notify(f"Serving on {url} — OpenAI's API under /v1", timeout=5)
        elif error:
            self.notify(f"Serving stopped: {error}", severity="error", timeout=10)
        else:
            self.notify("Stopped serving.", timeout=3)
        for w in warnings:
            self.notify(w, severity="warning", timeout=10)
        screen = self.server_screen()
        if screen is not None:
            screen.serving_changed(url, self.serve_port)
        self._refresh_bars()

    # -- command palette -------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        if self.session.serving_url:
            yield SystemCommand("Stop serving", f"Stop serving the model at {self.session.serving_url}",
                                self.stop_serving)
        else:
            yield SystemCommand("Start serving the model (HTTP)",
                                f"OpenAI's API on {self.SERVE_HOST}:{self.serve_port} (F9 shows the requests)",
                                functools.partial(self.start_serving, None))
        yield from super().get_system_commands(screen)
