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
   :meth:`DraftlightApp.on_session_message` pushes the new state into the widgets
   (a reply's progress at most :meth:`DraftlightApp.paint_every_s` apart).

Widgets and screens never name this class: they are given their data and post
messages (or dismiss with a result).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import OptionList, Static

import themes as theme_data

from .. import config as config_mod
from .. import paths, session as sess
from ..errors import UserError, describe
from ..options import ModelOptions
from ..runner import usable_cores
from ..session import ChatSession, Turn
from ..storage import History, HistoryError
from .clipboard import copy_to_system
from .screens import (ChatsResult, ChatsScreen, HelpScreen, SettingsResult, SettingsScreen, TextPromptScreen)
from .themes import draft_styles, to_textual
from .widgets import (KeyBar, Legend, LoadPanel, MessageView, PromptInput, ProvenanceHover, StarterList,
                      StatsPanel, TopBar)


W = TypeVar("W", bound=Widget)


class SessionMessage(Message):
    """A session event, carried to the UI thread. Live statistics replace older ones in the queue."""

    def __init__(self, event: Any):
        super().__init__()
        self.event = event

    def can_replace(self, message: Message) -> bool:
        ev = self.event
        other = getattr(message, "event", None)
        return (isinstance(ev, (sess.LoadProgress, sess.StaticBuildProgress))
                and type(other) is type(ev) and getattr(ev, "key", None) == getattr(other, "key", None))


@dataclass(frozen=True)
class ActionSpec:
    """One user action: its binding, its footer label, its help line; also a palette command."""

    action: str
    keys: str
    label: str
    help: str
    group: str
    show: bool = False
    priority: bool = False
    #: how the keyboard reaches an action without a key of its own (no binding then)
    reach: str = ""
    #: the key bar's label, where ``label`` is too long for it (the bar shows Esc's Stop at all
    #: times, dimmed between replies, and must fit 80 columns)
    bar: str = ""

    @property
    def key_display(self) -> str:
        """The first key as the help shows it (or how the keyboard reaches the action)."""
        if not self.keys:
            return self.reach
        first = self.keys.split(",")[0]
        return "+".join(p.capitalize() if len(p) > 1 else p.upper() for p in first.split("+")) \
            .replace("Ctrl+", "Ctrl+").replace("Escape", "Esc")


@dataclass(frozen=True)
class Starter:
    """A request on the welcome screen that shows speculation at work: the reply copies text from
    the request, so the drafters (which draft from what the context already holds) are right."""

    text: str      # sent as the person's message
    copied: str    # the part of it the reply repeats (tests/test_starters.py checks it does)


#: chosen by measuring them on the default model at the chat's default settings (each through
#: the real session, several seeds: tests/test_starters.py, where the rates are)
STARTERS: tuple[Starter, ...] = (
    Starter("Copy this shopping list exactly: milk, eggs, bread, butter, cheese, apples, rice, tea.",
            "milk, eggs, bread, butter, cheese, apples, rice, tea."),
    Starter("Repeat this exactly: one, two, three, four, five, six, seven, eight, nine, ten.",
            "one, two, three, four, five, six, seven, eight, nine, ten."),
    Starter("Repeat this address: 14 Harbour Street, Flat 3, Leith, Edinburgh EH6 6JJ.",
            "14 Harbour Street, Flat 3, Leith, Edinburgh EH6 6JJ."),
    Starter("Repeat this list exactly: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.",
            "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday."),
)

ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("help", "f1", "Help", "Show every key and what it does", "App", show=True),
    ActionSpec("chats", "f2", "Chats", "Saved chats: resume, rename, delete, export", "Chats", show=True),
    ActionSpec("settings", "f3", "Settings", "Speculation, sampling and model settings", "Settings", show=True),
    ActionSpec("toggle_stats", "f4", "Stats", "Show or hide the statistics panel", "View", show=True),
    ActionSpec("toggle_colour", "f5", "Colour", "Colour drafted tokens on or off", "View", show=True),
    ActionSpec("toggle_off_view", "f6", "Markdown/plain",
               "Show replies as Markdown or as plain text (colouring stays as F5 sets it)", "View"),
    ActionSpec("system_prompt", "f7", "System prompt",
               "Edit the system prompt: this chat's, and the default for new chats", "Chat"),
    ActionSpec("lab", "f8", "Lab", "Which speculation pays on this prompt: configurations side by side, "
               "on the loaded model", "View"),
    ActionSpec("stop", "escape", "Stop", "Stop the reply at once (keeps what was written)", "Chat", show=True),
    ActionSpec("regenerate", "ctrl+r", "Regenerate", "Write the last reply again", "Chat", show=True,
               bar="Retry"),
    ActionSpec("edit_last", "ctrl+g", "Edit last", "Edit your last message and send it again", "Chat"),
    ActionSpec("copy_reply", "ctrl+o", "Copy reply", "Copy the last reply to the clipboard",
               "Chat"),
    ActionSpec("new_chat", "ctrl+n", "New chat", "Start a new chat", "Chats"),
    ActionSpec("export", "ctrl+s", "Export", "Export this chat to a Markdown file", "Chats"),
    ActionSpec("quit", "ctrl+q", "Quit", "Quit draftlight", "App", priority=True),
) + tuple(ActionSpec(f"starter({i})", "", f"Starter {i}",
                     f"Send “{st.text}” (while the chat is empty)", "Chat",
                     reach="Down, Enter" if i == 1 else f"Down ×{i}, Enter")
          for i, st in enumerate(STARTERS, 1))
# (the starters have no key of their own: Down from the empty prompt of an empty chat moves into
# the welcome screen's list of them, in any terminal; Alt+digit, their keys before, is no key in a
# terminal: xterm and tmux send ESC and the digit, which Textual reads as a typed "™")

#: keys that are not app actions, for the help screen
EXTRA_KEYS: tuple[tuple[str, str, str], ...] = (
    ("Prompt", "Enter", "Send the message"),
    ("Prompt", "Shift+Enter, Ctrl+J", "New line (Ctrl+J works in any terminal)"),
    ("Prompt", "Up / Down", "Previous messages (when the prompt is empty)"),
    ("Prompt", "Down", "In an empty chat, past the previous messages: into the starter requests "
     "(Enter sends one; Esc, Up past the first, or typing goes back to the prompt)"),
    ("Messages", "Tab / Shift+Tab", "Move between the prompt and the messages"),
    ("Messages", "c", "Copy the focused message"),
    ("Messages", "Left/Right, [ / ]", "Select drafted runs: who drafted them"),
    ("App", "Ctrl+P", "Command palette (every action, and themes)"),
)

#: actions that work only on the chat screen itself (not over dialogs)
_MAIN_ONLY = {a.action.partition("(")[0] for a in ACTIONS} - {"quit", "help"}



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


def _sentence(text: str) -> str:
    """An error's line as a sentence: a capital first, a full stop last."""
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


class DraftlightApp(App[int]):
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
        #: a ReplyProgress waiting for its paint, and when the last paint was
        self._progress: sess.ReplyProgress | None = None
        self._progress_timer: Any = None
        self._painted = 0.0
        self._paint_every = 0.0
        #: the time between paints now (``_paint_every``, or more: see :attr:`UI_CPU_SHARE`),
        #: the UI thread's CPU clock at the last paint, and the mean CPU of a paint's cycle
        self._paint_gap = 0.0
        self._paint_cpu: float | None = None
        self._paint_cost: float | None = None
        self._main_widgets: dict[type, Widget] = {}
        self._live_shown: Any = None
        self._live_at = 0.0

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
    def _apply_draft_palette(self) -> None:
        t = self.themes.get(self.theme) or self.themes[theme_data.DEFAULT_THEME]
        self.draft_styles = draft_styles(t)
        self.palette_version += 1
        for v in self._views():
            v.set_palette(self.draft_styles, self.palette_version)
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
        top.show(s.model_label, spec, self.shown_state(), s.title, len(types), auto=self._running_auto())
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

    # -- session events ---------------------------------------------------------------------
    def on_session_message(self, msg: SessionMessage) -> None:
        ev = msg.event
        if isinstance(ev, sess.ReplyProgress):
            self._reply_progress(ev)
            return
        # anything else comes after the progress it follows: show that first
        self._flush_progress()
        self.session.apply(ev)
        handler = self.ui_handlers().get(type(ev))
        if handler is not None:
            handler(ev)

    def ui_handlers(self) -> dict[type, Callable[[Any], None]]:
        """What the screen does with each session event (by type, as :meth:`ChatSession.handlers`;
        :class:`~app.session.ReplyProgress` is painted by :meth:`_reply_progress`)."""
        return {sess.LoadProgress: self._ui_LoadProgress, sess.EngineReady: self._ui_EngineReady,
                sess.EngineFailed: self._ui_EngineFailed, sess.SpecApplied: self._ui_SpecApplied,
                sess.ContextTrimmed: self._ui_ContextTrimmed, sess.ReplyDone: self._ui_ReplyDone,
                sess.ReplyFailed: self._ui_ReplyFailed, sess.RunnerStopped: self._ui_RunnerStopped,
                sess.ReadAhead: self._ui_ReadAhead, sess.LookupSaved: self._ui_LookupSaved,
                sess.StaticBuildProgress: self._ui_StaticBuildProgress, sess.StaticBuilt: self._ui_StaticBuilt,
                sess.HistoryNotice: self._ui_HistoryNotice}

    def _ui_LoadProgress(self, ev: sess.LoadProgress) -> None:
        self.query_one(LoadPanel).show_progress(ev.phase, ev.done, ev.total)

    def _ui_EngineReady(self, ev: sess.EngineReady) -> None:
        if self._quitting or self.session.engine is None:
            return
        # what exists now lives for the whole session: keep it out of the collector's scans,
        # which would otherwise pause streaming now and then
        gc.collect()
        gc.freeze()
        self._paint_every = self._paint_gap = self.paint_every_s()
        self._paint_cost = None       # another model, other threads: its paints are timed afresh
        self.query_one(LoadPanel).hide()
        self._set_state("ready")
        self.refresh_bindings()
        if not isinstance(self.focused, PromptInput):
            self.query_one(PromptInput).focus()
        for w in ev.warnings:
            self.notify(w, severity="warning", timeout=10)
        if ev.spec_error:
            self.notify(f"Speculation not changed: {ev.spec_error}", severity="error", timeout=8)
        for name, why in self.session.skipped.items():
            self.notify(f"{name} is off: {why}", severity="warning", timeout=8)
        if self._open_lab:
            self._open_lab = False
            if not self._lab_prompt_file and not self.session.turns and self.history is not None:
                chats = []
                with contextlib.suppress(Exception):
                    chats = self.history.list_chats()
                if chats:
                    self.resume_chat(chats[0].id)
            self.action_lab(self._lab_prompt_file)
        self._notify_unused_draft_model()
        engine = self.session.engine
        if getattr(engine, "spec", None) is not None and \
                engine.spec.to_dict() != self.config.spec.to_dict() and not self._spec_retry and not ev.spec_error:
            # settings applied while the model was loading
            self._spec_retry = True
            self.session.rebuild_chain()
        else:
            self._spec_retry = False
        self._refresh_welcome()
        self._refresh_stats()
        queued, self.session.queued = self.session.queued, None
        if queued is not None:
            self.send(queued, from_prompt=False)

    def _ui_EngineFailed(self, ev: sess.EngineFailed) -> None:
        self._set_state("no model")
        panel = self.query_one(LoadPanel)
        panel.display = True
        panel.show_error(ev.error, ev.path)
        self._show_welcome(False)
        conv = self.query_one("#conversation", VerticalScroll)
        conv.anchor(False)
        self.call_after_refresh(lambda: conv.scroll_to_widget(panel, animate=False, top=True))
        self.refresh_bindings()

    def _notify_unused_draft_model(self) -> None:
        """What Automatic says about how it runs with these settings (``runtime.auto_warnings``:
        a draft model it cannot use, its controller off under synthetic acceptance), in place,
        each once until the settings change it."""
        from ..runtime import auto_warnings
        engine = self.session.engine
        msgs = auto_warnings(getattr(engine, "spec", None), getattr(engine, "auto_plan", None))
        said = getattr(self, "_auto_warned", ())
        for msg in msgs:
            if msg not in said:
                self.notify(msg[0].upper() + msg[1:], severity="warning", timeout=12)
        self._auto_warned = tuple(msgs)

    def _ui_SpecApplied(self, ev: sess.SpecApplied) -> None:
        # the new chain lives until the next change: keep it out of the collector's scans too
        gc.collect()
        gc.freeze()
        if ev.error:
            self.notify(f"Speculation not changed: {ev.error}", severity="error", timeout=8)
        else:
            types = self.session.active_types
            self.notify(f"Speculation: {', '.join(types) if types else 'off'}", timeout=3)
            for name, why in ev.skipped.items():
                self.notify(f"{name} is off: {why}", severity="warning", timeout=8)
            self._notify_unused_draft_model()
        for w in ev.warnings:
            self.notify(w, severity="warning", timeout=10)
        if self.session.job is None:
            self.state = "ready"
        self._refresh_welcome()
        self._refresh_bars()
        self._refresh_stats()

    #: the shortest time between two paints of a streaming reply when the model's threads take
    #: every core (see :meth:`paint_every_s`). What arrives sooner waits for the next paint,
    #: together: the session posts its next ReplyProgress only once this one is applied, so a
    #: paint carries every token (and the newest figures) since the last. A paint costs the UI
    #: process a few ms of CPU; at one per token that was a fifth of a core at 30 tokens/s,
    #: taken from the model's threads (chat 0.84x ``generate``'s speed on 2 cores). Ten a
    #: second at most: that still reads as a smooth stream (and left the model ~0.02x more than
    #: fifteen); :attr:`UI_CPU_SHARE` may space them further.
    PAINT_EVERY_CONTENDED_S = 1 / 10
    #: and there, the share of one core the UI thread may take while a reply streams: each paint's
    #: cycle (the tokens added, the frame, the live figures, what else the thread did meanwhile)
    #: is timed on the thread's CPU clock, and the next paint waits until its cost is this share
    #: of the time since the last. On 2 cores a paint's cycle took ~3.5 ms of CPU: a paint every
    #: ~0.14 s. A slower frame (Markdown, a wide terminal) paints less often, but at least every
    #: :attr:`PAINT_EVERY_MAX_S`. What the UI takes, the model's threads lose about one for one.
    UI_CPU_SHARE = 0.025
    PAINT_EVERY_MAX_S = 1 / 4
    #: where the model's threads take every core, a streaming reply has this many lines from the
    #: start and grows twice as many at a time (blank until written; ``ReplyBody._height``):
    #: each new line otherwise lays the whole screen out again, a few ms of the UI's CPU each,
    #: and those layouts were the largest part of what the UI took from the model while a
    #: reply streamed
    RESERVE_LINES_CONTENDED = 4
    #: how often the live figures (the reply's footer, the top bar's speed, F4) change while a
    #: reply streams: a person reads them a few times a second
    LIVE_EVERY_S = 0.25

    def paint_every_s(self) -> float:
        """0 (paint each update as it comes) while a core is left for the UI beside the model's
        threads; :attr:`PAINT_EVERY_CONTENDED_S` where they take every core."""
        ctx = getattr(self.session.engine, "ctx", None)
        threads = getattr(ctx, "n_threads", None)
        if not isinstance(threads, int) or threads <= 0:
            return 0.0
        return self.PAINT_EVERY_CONTENDED_S if threads + 1 > usable_cores() else 0.0

    def _reply_progress(self, ev: sess.ReplyProgress) -> None:
        if self._progress is not None:
            if self._progress.key == ev.key:
                return
            self._flush_progress()
        due = self._painted + self._paint_gap - time.monotonic()
        if due > 0:
            self._progress = ev
            # a plain loop callback (a Textual timer is a task of its own, each time); the paint
            # itself runs as the app's next callback, where its errors are the app's
            self._progress_timer = asyncio.get_running_loop().call_later(
                due, self.call_next, self._flush_progress)
            return
        self._show_progress(ev)

    def _pace_paints(self) -> None:
        """The time to the next paint, from the CPU the UI thread used since the last (see
        :attr:`UI_CPU_SHARE`)."""
        cpu = time.thread_time()
        if self._paint_cpu is not None:
            cost = cpu - self._paint_cpu
            mean = self._paint_cost = cost if self._paint_cost is None else 0.7 * self._paint_cost + 0.3 * cost
            self._paint_gap = min(self.PAINT_EVERY_MAX_S, max(self._paint_every, mean / self.UI_CPU_SHARE))
        self._paint_cpu = cpu

    def _flush_progress(self) -> None:
        """Show the progress that waits for its paint (now, whatever its time)."""
        ev, self._progress = self._progress, None
        if self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None
        if ev is not None:
            self._show_progress(ev)

    def _show_progress(self, ev: sess.ReplyProgress) -> None:
        self.session.apply(ev)
        self._painted = now = time.monotonic()
        if self._paint_every > 0:
            self._pace_paints()
        view = self._views_by_key.get(ev.key)
        job = self.session.job
        if view is None or job is None or job.turn.key != ev.key or not view.is_attached:
            return
        n0 = view.body.n_tokens
        tokens = self.session.new_tokens(job.turn, n0)
        if tokens:
            times = job.turn.arrived[n0:n0 + len(tokens)] if self.lag_probe is not None else None
            view.add_tokens(tokens, times)
            conv = view.parent
            if conv is not None and not getattr(conv, "is_anchored", True):
                self.call_after_refresh(self._stick_to_bottom)
        if job.live is not None and job.live is not self._live_shown and now - self._live_at >= self.LIVE_EVERY_S:
            self._live_shown, self._live_at = job.live, now
            view.live_stats(job.live)
            tps = job.live.tokens_per_s
            self._set_state(f"writing… {tps:.0f} tok/s" if tps else "writing…")
            self._refresh_stats()

    def _ui_ContextTrimmed(self, ev: sess.ContextTrimmed) -> None:
        self._place_cut_marker(ev.n_dropped)
        self.notify(f"The conversation outgrew the context ({ev.n_ctx} tokens): the model no longer sees "
                    f"the {ev.n_dropped} oldest message{'s' if ev.n_dropped != 1 else ''}.", timeout=6)

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

    def _ui_ReplyDone(self, ev: sess.ReplyDone) -> None:
        turn = self._turn(ev.key)
        view = self._views_by_key.get(ev.key)
        if turn is not None and view is not None and view.is_attached:
            # tokens that arrived after the last ReplyProgress, then the final form
            rest = turn.tokens[view.body.n_tokens:]
            if rest:
                view.add_tokens(rest)
            view.finish_streaming(turn.stats, turn.finish, turn.text)
        if self.session.job is None:     # (a reply left by Ctrl+N or F2 ends while another is written)
            self._set_state("stopped" if ev.result.finish_reason == "cancelled" else "ready")
        self._refresh_stats()
        self.refresh_bindings()

    def _ui_ReplyFailed(self, ev: sess.ReplyFailed) -> None:
        view = self._views_by_key.get(ev.key)
        if view is not None and view.is_attached:
            view.fail(ev.error)
        if self.session.job is None:
            self._set_state("error")
        self.notify(ev.error, severity="error", timeout=8)
        self.refresh_bindings()

    def _ui_RunnerStopped(self, ev: sess.RunnerStopped) -> None:
        """The runner died between replies: said, with what happens next (it was started again,
        or, the same death twice in a row, not)."""
        if ev.gave_up:
            self._set_state("error")
        self.notify(ev.message[0].upper() + ev.message[1:], severity="error" if ev.gave_up else "warning",
                    timeout=20 if ev.gave_up else 12)
        self._refresh_welcome()
        self._refresh_stats()
        self.refresh_bindings()

    def _ui_ReadAhead(self, ev: sess.ReadAhead) -> None:
        if ev.reading:
            self._read_ahead_since = time.monotonic()
            self.set_timer(self.READ_AHEAD_SHOWN_AFTER_S, self._refresh_bars)
        else:
            self._read_ahead_since = None
            self._refresh_bars()

    def _ui_LookupSaved(self, ev: sess.LookupSaved) -> None:
        if ev.info.get("error"):
            self.notify(f"lookup cache not saved: {ev.info['error']}", severity="warning", timeout=8)
        for w in ev.info.get("warnings") or []:
            self.notify(w, severity="warning", timeout=8)
        self._refresh_stats()

    def _ui_StaticBuildProgress(self, ev: sess.StaticBuildProgress) -> None:
        if isinstance(self.screen, SettingsScreen):
            self.screen.show_build_progress(ev.done, ev.total, ev.name)

    def _ui_StaticBuilt(self, ev: sess.StaticBuilt) -> None:
        if isinstance(self.screen, SettingsScreen):
            self.screen.show_build_done(ev.info, ev.error, self.session.lookup_figures())
        if ev.error:
            self.notify(f"static cache not built: {ev.error}", severity="warning", timeout=8)
        else:
            info = ev.info or {}
            self.notify(f"Static cache built: {info.get('entries', 0):,} entries from "
                        f"{info.get('tokens', 0):,} tokens.", timeout=5)
        self._refresh_stats()

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
            self.notify(f"{_sentence(describe(e))} Your message was not sent: it is in the prompt, to send again.",
                        severity="error", timeout=15)
            return False
        except UserError as e:
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

    def _ui_HistoryNotice(self, ev: sess.HistoryNotice) -> None:
        """A save of the chat failed (said once until saving works again), or works again."""
        if ev.error:
            self.notify(f"{_sentence(ev.error)} The chat goes on here and is saved once the history can be "
                        "written again.", severity="error", timeout=15)
        else:
            self.notify("The chat history is saved again.", timeout=4)

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

    # -- actions ---------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _MAIN_ONLY and len(self.screen_stack) > 1:
            return False
        if action == "stop":
            # dimmed, not hidden, between replies: the key bar keeps its keys where they are (and
            # lights Esc in place as a reply starts, instead of composing itself anew)
            return True if self.session.job is not None else None
        if action == "starter":
            # only while the chat is empty, as the welcome text that shows them
            return not self.session.turns and self.session.job is None
        if action in ("regenerate", "edit_last") and (self.session.engine is None or self.session.job is not None):
            return None if action == "regenerate" else False
        return True

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

    def action_stop(self) -> None:
        job = self.session.job
        if job is None:
            return
        self.session.stop()
        view = self._views_by_key.get(job.turn.key)
        if view is not None:
            view.foot.update("stopping…")
        self._set_state("stopping…")

    def action_regenerate(self) -> None:
        s = self.session
        last = s.turns[-1] if s.turns else None
        try:
            reply = s.regenerate()
        except UserError as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", timeout=3)
            return
        if last is not None and last is not reply and last.role == "assistant":
            self._remove_view(last.key)
        user = s.turns[-2] if len(s.turns) >= 2 else None
        if user is not None and user.key in self._views_by_key:
            self._views_by_key[user.key].remove_class("-error")
        self._mount_turn(reply)
        self._reply_started()

    def _remove_view(self, key: int) -> None:
        v = self._views_by_key.pop(key, None)
        if v is not None:
            v.remove()

    def action_edit_last(self) -> None:
        try:
            text, gone = self.session.edit_last()
        except UserError as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", timeout=3)
            return
        for t in gone:
            self._remove_view(t.key)
        prompt = self.query_one(PromptInput)
        prompt.text = text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        if not self.session.turns:
            self._show_welcome(True)
        self._place_cut_marker()

    @on(MessageView.CopyRequested)
    def _copy_message(self, msg: MessageView.CopyRequested) -> None:
        self.copy_text(msg.text, "message")

    def copy_text(self, text: str, what: str = "text") -> None:
        if not text:
            self.notify(f"The {what} is empty.", timeout=2)
            return
        self.copy_to_clipboard(text)  # OSC 52: works over SSH in most terminals
        self._copy_system(text)
        self.notify(f"Copied the {what} ({len(text)} characters).", timeout=2)

    @work(thread=True, group="clipboard", exit_on_error=False)
    def _copy_system(self, text: str) -> None:
        copy_to_system(text)

    def action_copy_reply(self) -> None:
        focused = self.focused
        if isinstance(focused, MessageView):
            self.copy_text(focused.text, "message")
            return
        replies = [v for v in self._views() if v.role == "assistant"]
        if not replies:
            self.notify("No reply to copy yet.", timeout=2)
            return
        self.copy_text(replies[-1].text, "reply")

    def action_system_prompt(self) -> None:
        def done(value: str | None) -> None:
            if value is None:
                return
            self.session.set_system_prompt(value)
            self.notify("System prompt saved (also the default for new chats).", timeout=3)
        self.push_screen(TextPromptScreen(
            "System prompt", self.session.system_prompt, multiline=True,
            hint="Sent before the conversation. Applies from the next reply. Ctrl+S saves."), done)

    def action_new_chat(self) -> None:
        self.session.new_chat()
        self._show_conversation()
        self._set_state("ready" if self.session.engine is not None else self.state)
        self.query_one(PromptInput).focus()

    def _show_conversation(self) -> None:
        """Replace the views with the session's turns, scrolled to the latest."""
        for v in self._views():
            v.remove()
        if self._cut_marker is not None:
            self._cut_marker.remove()
            self._cut_marker = None
        self._views_by_key.clear()
        self._hover = None
        turns = self.session.turns
        conv = self.query_one("#conversation", VerticalScroll)
        self._show_welcome(not turns)
        if turns:
            conv.mount_all([self._make_view(t) for t in turns])
        self.call_after_refresh(self._after_show)
        self._refresh_bars()
        self.refresh_bindings()

    def _after_show(self) -> None:
        conv = self.query_one("#conversation", VerticalScroll)
        conv.scroll_end(animate=False, immediate=True)
        self._stick_to_bottom()

    def resume_chat(self, chat_id: int) -> None:
        try:
            self.session.resume(chat_id)
        except UserError as e:
            self.notify(describe(e)[:1].upper() + describe(e)[1:] + ".", severity="warning")
            return
        self._show_conversation()
        self.query_one(PromptInput).focus()

    def export_chat(self, chat_id: int | None = None) -> None:
        s = self.session
        cid = chat_id if chat_id is not None else s.chat_id
        if s.history is None or cid is None:
            self.notify("Nothing to export yet — send a message first.", timeout=3)
            return
        try:
            import platformdirs
            folder = Path(platformdirs.user_documents_dir())
        except Exception:
            folder = Path.home()
        title = next((c.title for c in s.list_chats() if c.id == cid), "chat")
        from ..storage import slugify
        default = str(folder / f"{slugify(title)}.md")

        def done(value: str | None) -> None:
            if not value:
                return
            try:
                path = s.export(value.strip(), cid)
            except (UserError, OSError) as e:
                self.notify(f"could not export: {describe(e)}", severity="error")
                return
            self.notify(f"Exported to {path}", timeout=5)
        self.push_screen(TextPromptScreen("Export chat to Markdown", default, hint="File to write:",
                                          ok_label="Export"), done)

    def action_export(self) -> None:
        self.export_chat()

    def action_chats(self) -> None:
        s = self.session
        if s.history is None:
            self.notify(s.history_error or "Chat history is not available.", severity="warning")
            return

        def done(result: ChatsResult | None) -> None:
            if result is None:
                return
            if result.action == "resume" and result.chat_id is not None:
                self.resume_chat(result.chat_id)
            elif result.action == "new":
                self.action_new_chat()
            elif result.action == "export":
                self.export_chat(result.chat_id)
        self.push_screen(ChatsScreen(s.list_chats(), s.chat_id), done)

    @on(ChatsScreen.Rename)
    def _rename_chat(self, msg: ChatsScreen.Rename) -> None:
        try:
            self.session.rename(msg.chat_id, msg.title)
        except UserError as e:
            self.notify(_sentence(describe(e)), severity="error", timeout=10)
            return
        self._refresh_chats_screen(msg.chat_id)
        self._refresh_bars()

    @on(ChatsScreen.Delete)
    def _delete_chat(self, msg: ChatsScreen.Delete) -> None:
        try:
            if self.session.delete(msg.chat_id):
                self._show_conversation()
        except UserError as e:
            self.notify(_sentence(describe(e)), severity="error", timeout=10)
            return
        self._refresh_chats_screen()
        self.notify("Chat deleted.", timeout=2)

    def _refresh_chats_screen(self, select: int | None = None) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, ChatsScreen):
                screen.set_chats(self.session.list_chats(), self.session.chat_id, select)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        rows = [(a.group, a.key_display, a.help) for a in ACTIONS]
        rows += list(EXTRA_KEYS)
        order = ["Chat", "Prompt", "Messages", "Chats", "View", "Settings", "App"]
        rows.sort(key=lambda r: order.index(r[0]) if r[0] in order else 99)
        self.push_screen(HelpScreen(rows))

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

    def action_settings(self) -> None:
        s = self.session
        if s.engine is None and s.loading:
            self.notify("The model is still loading.", timeout=3)
        self.push_screen(SettingsScreen(self.config.spec, self.config.sampling, self.config.model,
                                        self.config.max_tokens, s.engine, overflow=self.config.overflow,
                                        lookup=s.lookup_figures(),
                                        n_ctx=s.n_ctx if s.engine is not None else None), self._settings_done)

    def action_lab(self, prompt_file: str | None = None) -> None:
        from .lab import LabScreen
        if isinstance(self.screen, LabScreen):
            return
        if self.session.job is not None:
            self.notify("The Lab opens once the reply has finished (Esc stops it).", timeout=4)
            return
        self.push_screen(LabScreen(self.session, styles=self.draft_styles, history=self.history,
                                   prompt_file=prompt_file))

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
        except UserError as e:
            if isinstance(self.screen, SettingsScreen):
                self.screen.show_build_done(None, describe(e), self.session.lookup_figures())
            return

    @on(SettingsScreen.CancelBuild)
    def _cancel_build(self, _msg: SettingsScreen.CancelBuild) -> None:
        self.session.cancel_build()

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

    # -- command palette -------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        main = screen is self.screen_stack[0]
        for a in ACTIONS:
            if a.action == "quit" or (a.action.partition("(")[0] in _MAIN_ONLY and not main):
                continue
            if a.action == "stop" and self.session.job is None:
                continue
            if a.action.startswith("starter(") and (self.session.turns or self.session.job is not None):
                continue
            yield SystemCommand(a.label if a.label != "Stop" else "Stop the reply",
                                f"{a.help}  [{a.key_display}]",
                                functools.partial(self.run_action, a.action))
        for name, t in self.themes.items():
            yield SystemCommand(f"Theme: {t.label}", f"Use the {t.label.lower()} theme"
                                + ("" if t.source == "built-in" else f" ({t.source})"),
                                functools.partial(self.set_theme, name))
        for cmd in super().get_system_commands(screen):
            if cmd.title in ("Theme", "Quit"):
                continue
            yield cmd
        yield SystemCommand("Quit", "Quit draftlight  [Ctrl+Q]", self.action_quit)
