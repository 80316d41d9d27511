"""The chat app: a thin Textual adapter over :class:`app.session.ChatSession`.

The data path is one way and easy to follow:

1. the prompt posts :class:`PromptInput.Send`; :meth:`DraftlightApp.send` hands the
   text to the session, which stores it and starts the reply in its own thread;
2. the thread runs ``Engine.generate`` and appends each token (the engine's own
   :class:`~speculators.events.TokenEvent`) to the reply's turn, posting a
   :class:`~app.session.ReplyProgress` when none is on its way (so tokens and live
   figures coalesce while the UI is busy);
3. every session event arrives here as a :class:`SessionMessage`: the session
   applies it first (history, statistics, lookup caches), then
   :meth:`~app.ui.session_events.SessionEvents.show_session_event` pushes the new state into the widgets
   (a reply's progress at most :meth:`DraftlightApp.paint_every_s` apart).

Widgets and screens never name this class: they are given their data and post
messages (or dismiss with a result).

The app is composed of parts, one job each (:class:`~app.ui.app_part.AppPart`): the session's
events (:mod:`app.ui.session_events`), the pacing of a streaming reply's paints
(:mod:`app.ui.painting`), the actions on chats, replies, settings and the view
(:mod:`app.ui.chat_actions`, :mod:`app.ui.reply_actions`, :mod:`app.ui.settings_actions`,
:mod:`app.ui.view_actions`), serving the model (:mod:`app.ui.server_actions`) and the commands
(:mod:`app.ui.commands`, from :data:`app.ui.actions.ACTIONS`). This module holds the layout, the
welcome screen, the bars, loading, sending and the conversation's views. May touch: its widgets and screens; the session
through its public methods.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import OptionList, Static

import themes as theme_data

from .. import config as config_mod
from .. import paths, session as sess
from ..errors import describe, user_errors
from ..options import ModelOptions
from ..runner import usable_cores
from ..session import ChatSession, Turn
from ..storage import History, HistoryError
from .actions import ACTIONS, EXTRA_KEYS, STARTERS, ActionSpec, Starter
from .chat_actions import ChatActions
from .commands import Commands
from .painting import ReplyPainting
from .reply_actions import ReplyActions
from .server_actions import ServerActions
from .session_events import SessionEvents, SessionMessage
from .settings_actions import SettingsActions
from .themes import to_textual
from .view_actions import ViewActions
from .widgets import (KeyBar, Legend, LoadPanel, MessageView, PromptInput, StarterList, StatsPanel, TopBar)
from .wording import sentence

#: (the names other modules and the tests import from here)
__all__ = ["ACTIONS", "EXTRA_KEYS", "STARTERS", "ActionSpec", "DraftlightApp", "LagProbe", "SessionMessage",
           "Starter", "downloads_folder", "usable_cores"]

W = TypeVar("W", bound=Widget)


class LagProbe:
    """Benchmark hook: the lag between a token's event and the frame that shows it."""

    def __init__(self) -> None:
        self.lags: dict[int, float] = {}

    def record(self, index: int, lag: float) -> None:
        self.lags.setdefault(index, lag)


def downloads_folder() -> Path:
    """Where Textual saves screenshots (the platform's Downloads folder)."""
    from platformdirs import user_downloads_path
    return user_downloads_path()


class DraftlightApp(SessionEvents, ReplyPainting, ChatActions, ReplyActions, SettingsActions,
                    ViewActions, ServerActions, Commands, App[int]):
    """Chat with a local model; drafted tokens light up in their speculator's colour."""

    TITLE = "draftlight"
    ENABLE_COMMAND_PALETTE = True

    BINDINGS = [Binding(a.keys, a.action, a.bar or a.label, show=a.show, priority=a.priority, tooltip=a.help)
                for a in ACTIONS if a.keys]

    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    #conversation { height: 1fr; padding: 1 1 0 1; scrollbar-size-vertical: 1; }
    #welcome { padding: 1 2; height: auto; }
    #welcome-text { color: $text-muted; }
    #starters { margin: 1 0 0 0; }
    .context-cut { color: $text-muted; text-style: italic; padding: 0 2; margin: 0 0 1 0; height: auto; }
    #prompt-box { height: auto; padding: 0 1; background: $surface; border-top: hkey $panel; }
    #prompt-box:focus-within { border-top: hkey $primary 60%; }
    PromptInput { height: auto; max-height: 8; min-height: 2; background: $surface; }
    PromptInput:focus { background: $surface; }
    Footer { background: $panel; }
    """

    palette_version: int = 0

    def __init__(self, config: config_mod.Config | None = None, *,
                 engine_factory: sess.EngineFactory | None = None,
                 history: History | None = None, user_themes_dir: Path | None = None,
                 persist_config: bool = True, saved_config: config_mod.Config | None = None,
                 lookup_root: str | None = None, notices: list[str] | None = None,
                 open_lab: bool = False, lab_prompt_file: str | None = None):
        super().__init__()
        #: ``draftlight lab``: open the Lab once the model is loaded (the prompt: this file, or the
        #: latest saved chat's messages)
        self._open_lab = open_lab
        self._lab_prompt_file = lab_prompt_file
        #: warnings to show once the app is up (a damaged config.toml, ...)
        self.notices = list(notices or [])
        self.session = ChatSession(config, post=self._post_event, engine_factory=engine_factory,
                                   history=history, open_history=False, saved_config=saved_config,
                                   persist_config=persist_config, lookup_root=lookup_root)
        self._history_given = history is not None
        cfg = self.session.config
        self.colouring: bool = bool(cfg.ui_get("colouring"))
        self.off_view: str = cfg.ui_get("off_view")
        self.state = "loading…"
        #: when the model began reading the conversation ahead (None: it is not reading)
        self._read_ahead_since: float | None = None
        self.lag_probe: LagProbe | None = None
        self.draft_styles: dict = {}
        self.themes, self.theme_errors = theme_data.load_all(
            user_themes_dir if user_themes_dir is not None else paths.user_themes_dir())
        self._hover: str | None = None
        self._quitting = False
        self._spec_retry = False
        self._views_by_key: dict[int, MessageView] = {}
        self._cut_marker: Static | None = None
        self._init_painting()
        self._main_widgets: dict[type, Widget] = {}

    # -- the session's voice ---------------------------------------------------------------
    def _post_event(self, event: Any) -> None:
        """Called from the session's threads: hand the event to the UI thread."""
        self.post_message(SessionMessage(event))

    @property
    def config(self) -> config_mod.Config:
        return self.session.config

    @property
    def engine(self) -> Any:
        return self.session.engine

    @property
    def job(self) -> Any:
        return self.session.job

    @property
    def history(self) -> History | None:
        return self.session.history

    @property
    def chat_id(self) -> int | None:
        return self.session.chat_id

    @property
    def markdown_view(self) -> bool:
        """F6: replies laid out as Markdown (else as plain text); independent of colouring (F5)."""
        return self.off_view == "markdown"

    # -- layout ------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield TopBar(id="topbar")
        with Horizontal(id="main"):
            with VerticalScroll(id="conversation"):
                with Vertical(id="welcome"):
                    yield Static(self._welcome_text(), id="welcome-text")
                    yield StarterList(*self._starter_options(), id="starters")
                yield LoadPanel(id="load")
            yield StatsPanel(id="stats")
        yield Legend(id="legend")
        with Horizontal(id="prompt-box"):
            yield PromptInput(id="prompt", placeholder="Message the model — Enter sends, Ctrl+J adds a line")
        yield KeyBar(compact=True)

    def _welcome_text(self) -> Content:
        spec_on = bool(self.session.configured_types)
        pieces: list[Any] = [
            ("Ask anything.", "bold $foreground"), " Tokens a speculator drafted and the model accepted light "
            "up in that speculator's colour; the model's own tokens stay plain.\n",
            ("F3", "bold $accent"), " speculation settings  " if spec_on else " turn speculators on  ",
            ("F4", "bold $accent"), " statistics  ",
            ("F1", "bold $accent"), " all keys  ", ("Ctrl+P", "bold $accent"), " commands"]
        if spec_on:
            # requests whose replies copy from them (the list below): the drafts are right there
            pieces += ["\n\nTry one: its reply repeats what it quotes, so the drafts are accepted. ",
                       ("↓", "bold $accent"), " to pick one, ", ("Enter", "bold $accent"), " to send it, "
                       "or click it."]
        return Content.assemble(*pieces)

    @staticmethod
    def _starter_options() -> list[Any]:
        # a wrapped request keeps its lines under its first word, the mark alone in its column
        from rich.table import Table
        options = []
        for st in STARTERS:
            grid = Table.grid()
            grid.add_column(width=2, no_wrap=True)
            grid.add_column(ratio=1)
            grid.add_row("›", st.text)
            options.append(grid)
        return options

    def _refresh_welcome(self) -> None:
        """The welcome text, and its starters only while speculation is on (they show it at work)."""
        self.query_one("#welcome-text", Static).update(self._welcome_text())
        starters = self.query_one(StarterList)
        starters.display = bool(self.session.configured_types)
        if not starters.display:
            self._keys_out_of(starters)

    def _show_welcome(self, show: bool) -> None:
        welcome = self.query_one("#welcome")
        welcome.display = show
        if not show:
            self._keys_out_of(welcome)

    def _main_widget(self, cls: type[W]) -> W | None:
        """The main screen's one widget of ``cls`` (also under a dialog), None before it is
        composed; remembered: a DOM query takes ~0.5 ms, and a streaming reply asks several
        times a second."""
        w = self._main_widgets.get(cls)
        if w is not None and w.is_attached:
            return w
        if not self.screen_stack:
            return None
        found = self.screen_stack[0].query(cls)
        w = found.first() if found else None
        if w is not None:
            self._main_widgets[cls] = w
        return w

    def _keys_out_of(self, hidden: Widget) -> None:
        """The keyboard back to the prompt where it was in ``hidden`` (also under a dialog)."""
        main = self.screen_stack[0]
        focused = main.focused
        prompt = self._main_widget(PromptInput)
        if prompt is not None and focused is not None and (focused is hidden or hidden in focused.ancestors):
            main.set_focus(prompt)

    def _starters_shown(self) -> bool:
        starters = self.query_one(StarterList)
        return bool(starters.display and self.query_one("#welcome").display and not self.session.turns
                    and self.session.job is None)

    @on(OptionList.OptionSelected, "#starters")
    def _starter_picked(self, msg: OptionList.OptionSelected) -> None:
        # (the list has handed the keyboard back to the prompt)
        msg.stop()
        self.action_starter(msg.option_index + 1)

    def on_mount(self) -> None:
        s = self.session
        if s.history is None and not self._history_given:
            try:
                s.history = History(timeout=s.HISTORY_WAIT_S)
            except Exception as e:
                s.history_error = describe(e)
        self.query_one(PromptInput).sent = s.sent_messages()
        for t in self.themes.values():
            self.register_theme(to_textual(t))
        wanted = self.config.ui_get("theme")
        if wanted not in self.themes:
            if wanted != config_mod.UI_DEFAULTS["theme"]:
                self.notify(f"theme {wanted!r} not found; using the dark theme", severity="warning")
            wanted = theme_data.DEFAULT_THEME
        self.theme = wanted
        self._apply_draft_palette()
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        for err in self.theme_errors:
            self.notify(f"theme skipped: {err}", severity="warning", timeout=10)
        if s.history_error:
            self.notify(f"{s.history_error} — chats will not be saved", severity="error", timeout=15)
        for notice in self.notices:
            self.notify(notice, severity="warning", timeout=30)
        stats = self.query_one(StatsPanel)
        stats.display = bool(self.config.ui_get("stats_panel"))
        self._refresh_stats()
        self._refresh_welcome()
        prompt, starters = self.query_one(PromptInput), self.query_one(StarterList)
        # Down from the empty prompt of an empty chat goes to the starters; they hand it back
        prompt.below = lambda: starters if self._starters_shown() else None
        starters.back = prompt
        prompt.focus()
        self.start_loading(self.config.model)

    # -- themes --------------------------------------------------------------------
    def remember_ui(self, **values: Any) -> None:
        """A [ui] choice: used now and saved (without the command line's one-off flags)."""
        err = self.session.remember_ui(**values)
        if err:
            self.notify(err, severity="error")
    # -- bars --------------------------------------------------------------------------
    def _refresh_bars(self) -> None:
        if not self.is_mounted:
            return
        top, legend = self._main_widget(TopBar), self._main_widget(Legend)
        if top is None or legend is None:
            return
        s = self.session
        types = s.active_types
        spec = (", ".join(types) if types else "no speculation") if s.engine is not None else ""
        top.show(s.model_label, spec, self.shown_state(), s.title, len(types), auto=self._running_auto(),
                 serving=self.serving_label())
        waiting = s.configured_types if s.engine is None else []
        legend.show(types, self.draft_styles, self.colouring, self.off_view, self._hover, s.skipped, waiting)

    #: a read-ahead of the conversation is said in the top bar once it has taken this long (the
    #: next turn's usually takes a few milliseconds: the earlier turns are read already)
    READ_AHEAD_SHOWN_AFTER_S = 0.25

    def shown_state(self) -> str:
        """The state the top bar shows: :attr:`state`, or, while the chat is ready and the model
        has been reading the conversation ahead for a moment, that."""
        since = self._read_ahead_since      # (None once it ends, as session.reading_ahead)
        if (self.state == "ready" and since is not None
                and time.monotonic() - since >= self.READ_AHEAD_SHOWN_AFTER_S - 0.01):
            return "reading…"
        return self.state

    def on_resize(self) -> None:
        self.call_after_refresh(self._refresh_bars)

    def _set_state(self, state: str) -> None:
        self.state = state
        self._refresh_bars()
        # while a reply streams on cores the model's threads fill, the prompt's cursor holds still:
        # each blink repaints the screen, twice a second, CPU the model's threads would have had
        blink = not (self._paint_every > 0 and state.startswith(("writing", "stopping")))
        prompt = self._main_widget(PromptInput)
        if prompt is not None and prompt.cursor_blink != blink:
            prompt.cursor_blink = blink

    def _refresh_stats(self) -> None:
        panel = self.query_one(StatsPanel)
        if not panel.display:
            return
        s = self.session
        job = s.job
        live = job.live if job is not None else None
        tokens = s.new_tokens(job.turn, 0) if job is not None else []
        loaded = s.engine is not None
        panel.show_stats(s.stats.with_live(live, tokens), live is not None, self.draft_styles,
                         s.lookup_figures(), active=s.active_types if loaded else None,
                         auto=self._running_auto() if loaded else None)

    def _running_auto(self) -> bool:
        """Whether the loaded model's speculation is Automatic (the running chain's, not the settings')."""
        spec = getattr(self.session.engine, "spec", None)
        return bool(getattr(spec, "is_auto", False)) and bool(self.session.active_types)

    # -- loading -------------------------------------------------------------------------
    def start_loading(self, model: ModelOptions) -> None:
        self.session.load(model)
        self._show_loading(model)

    def _show_loading(self, model: ModelOptions) -> None:
        self._set_state("loading…")
        panel = self.query_one(LoadPanel)
        panel.display = True
        panel.show_progress("load", 0, 0, model.model or "the embedded default model (Gemma 3 270M)")
        self._show_welcome(not self._views())
        self._refresh_bars()
        self.refresh_bindings()

    @on(LoadPanel.Pick)
    def _pick_model(self, msg: LoadPanel.Pick) -> None:
        path = str(Path(msg.path).expanduser()) if msg.path else None
        self.config.model.model = path
        self.start_loading(self.config.model)

    def _place_cut_marker(self, n_dropped: int | None = None) -> None:
        """A line before the first message the model still sees (the history keeps them all)."""
        s = self.session
        if self._cut_marker is not None:
            self._cut_marker.remove()
            self._cut_marker = None
        if s.context_start <= 0 or s.context_start >= len(s.turns):
            return
        first = self._views_by_key.get(s.turns[s.context_start].key)
        if first is None:
            return
        hidden = n_dropped if n_dropped is not None else sum(1 for t in s.turns[:s.context_start] if t.sent_to_model)
        marker = Static(f"⋯ the model no longer sees the {hidden} message{'s' if hidden != 1 else ''} above "
                        f"(the context is full; they stay saved here) ⋯", classes="context-cut")
        self._cut_marker = marker
        self.query_one("#conversation", VerticalScroll).mount(marker, before=first)
    # -- sending ---------------------------------------------------------------------------
    @on(PromptInput.Send)
    def _on_send(self, msg: PromptInput.Send) -> None:
        self.send(msg.text)

    def send(self, text: str, from_prompt: bool = True) -> bool:
        """Send ``text`` as the person's message and start the reply; False if it cannot be sent now."""
        if not text.strip():
            return False
        prompt = self.query_one(PromptInput)
        s = self.session
        n_before = len(s.turns)
        try:
            reply = s.send(text)
        except HistoryError as e:
            # nothing was sent: the text is (or is put back) in the prompt, to send again
            if not from_prompt and not prompt.text.strip():
                prompt.text = text
            self.notify(f"{sentence(describe(e))} Your message was not sent: it is in the prompt, to send again.",
                        severity="error", timeout=15)
            return False
        except user_errors() as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", severity="warning", timeout=4)
            return False
        prompt.remember(text.strip("\n"))
        if from_prompt:
            # what was typed after Enter, before the message was taken, stays in the prompt
            now = prompt.text
            prompt.text = now[len(text):] if now.startswith(text) else ""
            prompt.move_cursor(prompt.document.end)
        if reply is None:
            self.notify("The model is still loading; your message will be sent when it is ready.", timeout=4)
            return False
        for turn in s.turns[n_before:]:
            self._mount_turn(turn)
        self._reply_started()
        return True

    def _reply_started(self) -> None:
        # a reply's first paint starts the clock: what sending it cost (its views laid out and
        # mounted) is not a paint's
        self._paint_cpu = None
        view = self._views_by_key.get(self.session.job.turn.key) if self.session.job else None
        if view is not None:
            view.start_streaming(reserve=self.RESERVE_LINES_CONTENDED if self._paint_every > 0 else 1)
        self._set_state("writing…")
        self.refresh_bindings()

    def _make_view(self, turn: Turn) -> MessageView:
        label = self.session.model_label if turn.role == "assistant" else None
        v = MessageView(turn.role, turn.text if not turn.tokens else "", tokens=turn.tokens or None,
                        stats=turn.stats, status=turn.status, finish=turn.finish, key=turn.key, label=label,
                        coloured=self.colouring, markdown=self.markdown_view, styles=self.draft_styles, palette_version=self.palette_version,
                        probe=self.lag_probe, error=turn.error if turn.role == "assistant" else None)
        self._views_by_key[turn.key] = v
        return v

    def _mount_turn(self, turn: Turn) -> MessageView:
        view = self._make_view(turn)
        conv = self.query_one("#conversation", VerticalScroll)
        if self.query("#welcome"):
            self._show_welcome(False)
        conv.mount(view)
        self.call_after_refresh(self._stick_to_bottom)
        return view

    def _turn(self, key: int) -> Turn | None:
        return next((t for t in self.session.turns if t.key == key), None)

    def _stick_to_bottom(self) -> None:
        """Follow new text once the conversation overflows (until the person scrolls up)."""
        conv = self.query_one("#conversation", VerticalScroll)
        if conv.max_scroll_y > 0 and not conv.is_anchored:
            conv.anchor()

    def _views(self) -> list[MessageView]:
        return list(self.query_one("#conversation").query(MessageView))
    def action_focus_next(self) -> None:
        # Tab from the prompt goes to the latest message (not the first, far up the chat), or in
        # an empty chat to the starter requests
        views = self._views()
        if isinstance(self.focused, PromptInput) and views:
            views[-1].focus()
            return
        if isinstance(self.focused, PromptInput) and self._starters_shown():
            self.screen.set_focus(self.query_one(StarterList))
            return
        super().action_focus_next()

    def action_starter(self, n: int) -> None:
        """Send the welcome screen's ``n``-th starter request (1-based)."""
        if 1 <= n <= len(STARTERS) and not self.session.turns and self.session.job is None:
            self.send(STARTERS[n - 1].text, from_prompt=False)
    async def action_quit(self) -> None:
        self._quitting = True
        self.session.stop()
        self.exit(0)

    def on_unmount(self) -> None:
        self.session.close()

    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """Textual's screenshot (the palette's "Screenshot"), into a folder that exists: Textual
        saves it to the Downloads folder, which a fresh or headless machine may not have, and
        then says no more than "Failed to save screenshot"."""
        folder = Path(path).expanduser() if path else downloads_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.notify(f"Cannot save the screenshot in {folder}: {e.strerror or e}", title="Screenshot",
                        severity="error")
            return None
        return super().deliver_screenshot(filename, str(folder), time_format)
