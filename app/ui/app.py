"""The chat app.

The data path is one way and easy to follow:

1. the prompt posts :class:`PromptInput.Send`; :meth:`DraftlightApp.send` stores
   the message and builds a :class:`GenerationRequest`;
2. a thread worker (:func:`worker.run_generation`) runs ``Engine.generate``;
3. its events come back as messages (:class:`TokensArrived`, coalesced while the
   UI is busy, :class:`StatsUpdated`, :class:`ReplyFinished`);
4. the handlers here update the reply's widget, the statistics and the store.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static

from speculators.events import STOP_CANCELLED, GenerationStats
from speculators.params import SpecParams

import themes as theme_data

from .. import config as config_mod
from .. import paths, storage
from ..fileutil import atomic_write_text
from ..options import ModelOptions
from ..storage import History, HistoryError, TokenRecord
from . import worker as worker_mod
from .clipboard import copy_to_system
from .messages import (LoadProgress, ModelLoaded, ModelLoadFailed, ReplyFailed, ReplyFinished, SpecApplied,
                       StatsUpdated, TokensArrived)
from .screens import ChatsScreen, HelpScreen, SettingsResult, SettingsScreen, TextPromptScreen
from .stats import SessionStats
from .themes import draft_styles, to_textual
from .widgets import Legend, LoadPanel, MessageView, PromptInput, ProvenanceHover, StatsPanel, TopBar


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

    @property
    def key_display(self) -> str:
        first = self.keys.split(",")[0]
        return "+".join(p.capitalize() if len(p) > 1 else p.upper() for p in first.split("+")) \
            .replace("Ctrl+", "Ctrl+").replace("Escape", "Esc")


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("help", "f1", "Help", "Show every key and what it does", "App", show=True),
    ActionSpec("chats", "f2", "Chats", "Saved chats: resume, rename, delete, export", "Chats", show=True),
    ActionSpec("settings", "f3", "Settings", "Speculation, sampling and model settings", "Settings", show=True),
    ActionSpec("toggle_stats", "f4", "Stats", "Show or hide the statistics panel", "View", show=True),
    ActionSpec("toggle_colour", "f5", "Colour", "Colour drafted tokens on or off", "View", show=True),
    ActionSpec("toggle_off_view", "f6", "Markdown/plain",
               "Uncoloured view: switch between Markdown and plain text", "View"),
    ActionSpec("system_prompt", "f7", "System prompt", "Edit the system prompt of this chat", "Chat"),
    ActionSpec("stop", "escape", "Stop", "Stop the reply at once (keeps what was written)", "Chat", show=True),
    ActionSpec("regenerate", "ctrl+r", "Regenerate", "Write the last reply again", "Chat", show=True),
    ActionSpec("edit_last", "ctrl+g", "Edit last", "Edit your last message and send it again", "Chat"),
    ActionSpec("copy_reply", "ctrl+o", "Copy reply", "Copy the last reply to the clipboard",
               "Chat"),
    ActionSpec("new_chat", "ctrl+n", "New chat", "Start a new chat", "Chats"),
    ActionSpec("export", "ctrl+s", "Export", "Export this chat to a Markdown file", "Chats"),
    ActionSpec("quit", "ctrl+q", "Quit", "Quit draftlight", "App", priority=True),
)

#: keys that are not app actions, for the help screen
EXTRA_KEYS: tuple[tuple[str, str, str], ...] = (
    ("Prompt", "Enter", "Send the message"),
    ("Prompt", "Shift+Enter, Ctrl+J", "New line (Ctrl+J works in any terminal)"),
    ("Prompt", "Up / Down", "Previous messages (when the prompt is empty)"),
    ("Messages", "Tab / Shift+Tab", "Move between the prompt and the messages"),
    ("Messages", "c", "Copy the focused message"),
    ("Messages", "Left/Right, [ / ]", "Select drafted runs: who drafted them"),
    ("App", "Ctrl+P", "Command palette (every action, and themes)"),
)

#: actions that work only on the chat screen itself (not over dialogs)
_MAIN_ONLY = {a.action for a in ACTIONS} - {"quit", "help"}


@dataclass
class ReplyJob:
    key: int
    view: MessageView
    msg_id: int | None
    cancel: threading.Event = field(default_factory=threading.Event)
    record: TokenRecord = field(default_factory=TokenRecord)
    last_saved: float = 0.0
    live: GenerationStats | None = None
    started: float = field(default_factory=time.perf_counter)


class LagProbe:
    """Benchmark hook: the lag between a token's event and the frame that shows it."""

    def __init__(self) -> None:
        self.lags: dict[int, float] = {}

    def record(self, index: int, lag: float) -> None:
        self.lags.setdefault(index, lag)


class DraftlightApp(App[int]):
    """Chat with a local model; drafted tokens light up in their speculator's colour."""

    TITLE = "draftlight"
    ENABLE_COMMAND_PALETTE = True

    BINDINGS = [Binding(a.keys, a.action, a.label, show=a.show, priority=a.priority, tooltip=a.help)
                for a in ACTIONS]

    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    #conversation { height: 1fr; padding: 1 1 0 1; scrollbar-size-vertical: 1; }
    #welcome { color: $text-muted; padding: 1 2; height: auto; }
    #prompt-box { height: auto; padding: 0 1; background: $surface; border-top: hkey $panel; }
    #prompt-box:focus-within { border-top: hkey $primary 60%; }
    PromptInput { height: auto; max-height: 8; min-height: 2; background: $surface; }
    PromptInput:focus { background: $surface; }
    Footer { background: $panel; }
    """

    palette_version: int = 0

    def __init__(self, config: config_mod.Config | None = None, *,
                 engine_factory: worker_mod.EngineFactory | None = None,
                 history: History | None = None, user_themes_dir: Path | None = None,
                 persist_config: bool = True, saved_config: config_mod.Config | None = None):
        super().__init__()
        #: the settings in use (config.toml with the command-line flags on top)
        self.config = config or config_mod.Config()
        #: what config.toml holds; the app's changes go here too, the flags do not
        self.saved_config = saved_config if saved_config is not None else \
            config_mod.Config.from_toml_dict(self.config.to_toml_dict())
        self.engine_factory = engine_factory or worker_mod.default_engine_factory
        self.persist_config = persist_config
        self.engine: Any = None
        self.engine_lock = threading.Lock()
        self.history: History | None = history
        self._history_error: str | None = None
        self.chat_id: int | None = None
        self.chat_title: str = ""
        self.system_prompt: str = self.config.system_prompt
        self.job: ReplyJob | None = None
        self._keys = itertools.count(1)
        self.session = SessionStats()
        self.colouring: bool = bool(self.config.ui_get("colouring"))
        self.off_view: str = self.config.ui_get("off_view")
        self.state = "loading…"
        self.lag_probe: LagProbe | None = None
        self.draft_styles: dict = {}
        self.themes, self.theme_errors = theme_data.load_all(
            user_themes_dir if user_themes_dir is not None else paths.user_themes_dir())
        self._queued: str | None = None
        self._hover: str | None = None
        self._loading = False
        self._quitting = False
        self._spec_retry = False

    # -- layout ------------------------------------------------------------------
    @property
    def view_mode(self) -> str:
        return "coloured" if self.colouring else self.off_view

    def compose(self) -> ComposeResult:
        yield TopBar(id="topbar")
        with Horizontal(id="main"):
            with VerticalScroll(id="conversation"):
                yield Static(self._welcome_text(), id="welcome")
                yield LoadPanel(id="load")
            yield StatsPanel(id="stats")
        yield Legend(id="legend")
        with Horizontal(id="prompt-box"):
            yield PromptInput(sent=self._sent_history(), id="prompt",
                              placeholder="Message the model — Enter sends, Ctrl+J adds a line")
        yield Footer(compact=True)

    def _welcome_text(self) -> Content:
        return Content.assemble(
            ("Ask anything.", "bold $foreground"), " Tokens a speculator drafted and the model accepted light "
            "up in that speculator's colour; the model's own tokens stay plain.\n",
            ("F3", "bold $accent"), " turn speculators on  ", ("F4", "bold $accent"), " statistics  ",
            ("F1", "bold $accent"), " all keys  ", ("Ctrl+P", "bold $accent"), " commands")

    def _sent_history(self) -> list[str]:
        if self.history is None:
            return []
        try:
            rows = self.history.db.execute(
                "SELECT content FROM messages WHERE role='user' ORDER BY created DESC, id DESC LIMIT 200"
            ).fetchall()
        except Exception:
            return []
        return [r[0] for r in reversed(rows)]

    def on_mount(self) -> None:
        if self.history is None:
            try:
                self.history = History()
            except HistoryError as e:
                self._history_error = str(e)
        if self.history is not None:
            self.query_one(PromptInput).sent = self._sent_history()
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
        if self._history_error:
            self.notify(f"{self._history_error} — chats will not be saved", severity="error", timeout=15)
        stats = self.query_one(StatsPanel)
        stats.display = bool(self.config.ui_get("stats_panel"))
        self._refresh_stats()
        self.query_one(PromptInput).focus()
        self.start_loading(self.config.model)

    # -- themes --------------------------------------------------------------------
    def _apply_draft_palette(self) -> None:
        t = self.themes.get(self.theme) or self.themes[theme_data.DEFAULT_THEME]
        self.draft_styles = draft_styles(t)
        self.palette_version += 1
        for v in self.query(MessageView):
            v.body.refresh()
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

    # -- config ----------------------------------------------------------------------
    def remember_ui(self, **values: Any) -> None:
        """A [ui] choice: used now and saved (without the command line's one-off flags)."""
        self.config.ui.update(values)
        self.saved_config.ui.update(values)
        self.save_config()

    def save_config(self) -> None:
        """Write config.toml: what the file held plus what was chosen in the app."""
        if not self.persist_config:
            return
        try:
            config_mod.save(self.saved_config)
        except OSError as e:
            self.notify(f"could not save settings: {e}", severity="error")

    # -- bars --------------------------------------------------------------------------
    def _model_label(self) -> str:
        if self.engine is None:
            return self.config.model.model and Path(self.config.model.model).stem or "default model"
        path = str(getattr(self.engine.model, "path", "") or "")
        return Path(path).stem or "model"

    def _spec_label(self) -> str:
        if self.engine is None or self.engine.chain is None:
            return ""
        names = [s.name for s in self.engine.chain.speculators]
        return ", ".join(names) if names else "no speculation"

    def _refresh_bars(self) -> None:
        if not self.is_mounted:
            return
        try:
            top = self.query_one(TopBar)
            legend = self.query_one(Legend)
        except Exception:
            return
        top.show(self._model_label(), self._spec_label(), self.state, self.chat_title)
        types = [s.name for s in self.engine.chain.speculators] if self.engine is not None and \
            self.engine.chain is not None else []
        skipped = dict(self.engine.chain.skipped) if self.engine is not None and self.engine.chain else {}
        legend.show(types, self.draft_styles, self.colouring, self.off_view, self._hover, skipped)

    def on_resize(self) -> None:
        self.call_after_refresh(self._refresh_bars)

    def _set_state(self, state: str) -> None:
        self.state = state
        self._refresh_bars()

    def _refresh_stats(self) -> None:
        panel = self.query_one(StatsPanel)
        if not panel.display:
            return
        live = self.job.live if self.job is not None else None
        panel.show_stats(self.session.with_live(live), live is not None, self.draft_styles)

    # -- loading -------------------------------------------------------------------------
    def start_loading(self, model: ModelOptions) -> None:
        self._loading = True
        old = self.engine
        self.engine = None
        self._set_state("loading…")
        panel = self.query_one(LoadPanel)
        panel.display = True
        panel.show_progress("load", 0, 0, model.model or "the embedded default model (Gemma 3 270M)")
        self.query_one("#welcome").display = not self._views()
        self.refresh_bindings()
        self._load_worker(model, self.config.spec.copy(), old)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load_worker(self, model: ModelOptions, spec: SpecParams, old: Any) -> None:
        if old is not None:
            with self.engine_lock:
                old.close()
        worker_mod.load_engine(self.engine_factory, model, spec, self.post_message)

    def on_load_progress(self, msg: LoadProgress) -> None:
        self.query_one(LoadPanel).show_progress(msg.phase, msg.done, msg.total)

    def on_model_loaded(self, msg: ModelLoaded) -> None:
        if self._quitting:
            msg.engine.close()
            return
        self.engine = msg.engine
        self._loading = False
        # what exists now lives for the whole session: keep it out of the collector's scans,
        # which would otherwise pause streaming now and then
        gc.collect()
        gc.freeze()
        self.query_one(LoadPanel).display = False
        self._set_state("ready")
        self.refresh_bindings()
        prompt = self.query_one(PromptInput)
        if not isinstance(self.focused, PromptInput):
            prompt.focus()
        for name, why in (self.engine.chain.skipped or {}).items():
            self.notify(f"{name} is off: {why}", severity="warning", timeout=8)
        if getattr(self.engine, "spec", None) is not None and \
                self.engine.spec.to_dict() != self.config.spec.to_dict() and not self._spec_retry:
            # settings applied while the model was loading
            self._spec_retry = True
            self._apply_spec_worker(self.engine, self.config.spec.copy())
        else:
            self._spec_retry = False
        if self._queued is not None:
            text, self._queued = self._queued, None
            self.send(text)

    def on_model_load_failed(self, msg: ModelLoadFailed) -> None:
        self._loading = False
        self._set_state("no model")
        panel = self.query_one(LoadPanel)
        panel.display = True
        panel.show_error(msg.error, msg.path)
        self.query_one("#welcome").display = False
        conv = self.query_one("#conversation", VerticalScroll)
        conv.anchor(False)
        self.call_after_refresh(lambda: conv.scroll_to_widget(panel, animate=False, top=True))
        self.refresh_bindings()

    @on(LoadPanel.Pick)
    def _pick_model(self, msg: LoadPanel.Pick) -> None:
        path = os.path.expanduser(msg.path) if msg.path else None
        self.config.model.model = path
        self.start_loading(self.config.model)

    # -- sending ---------------------------------------------------------------------------
    @on(PromptInput.Send)
    def _on_send(self, msg: PromptInput.Send) -> None:
        self.send(msg.text)

    def send(self, text: str) -> bool:
        """Send ``text`` as the user's message and start the reply; False if it cannot be sent now."""
        text = text.strip("\n")
        if not text.strip():
            return False
        prompt = self.query_one(PromptInput)
        if self.job is not None:
            self.notify("A reply is still being written — Esc stops it.", timeout=3)
            return False
        if self.engine is None:
            if self._loading:
                self._queued = text
                prompt.remember(text)
                prompt.text = ""
                self.notify("The model is still loading; your message will be sent when it is ready.",
                            timeout=4)
            else:
                self.notify("No model is loaded — pick one above.", severity="warning")
            return False
        prompt.remember(text)
        prompt.text = ""
        self._ensure_chat(text)
        view = MessageView("user", text)
        self._mount_view(view)
        if self.history is not None and self.chat_id is not None:
            view.msg_id = self.history.add_message(self.chat_id, "user", text)
            if not self.chat_title:
                self.chat_title = storage.title_from(text)
        self.start_reply()
        return True

    def _ensure_chat(self, first_text: str) -> None:
        if self.chat_id is not None or self.history is None:
            return
        self.chat_id = self.history.create_chat(system_prompt=self.system_prompt, model=self._model_label())

    def _mount_view(self, view: MessageView) -> None:
        conv = self.query_one("#conversation", VerticalScroll)
        welcome = self.query("#welcome")
        if welcome:
            welcome.first().display = False
        conv.mount(view)
        self.call_after_refresh(self._stick_to_bottom)

    def _stick_to_bottom(self) -> None:
        """Follow new text once the conversation overflows (until the user scrolls up)."""
        conv = self.query_one("#conversation", VerticalScroll)
        if conv.max_scroll_y > 0 and not conv.is_anchored:
            conv.anchor()

    def _views(self) -> list[MessageView]:
        return list(self.query_one("#conversation").query(MessageView))

    def conversation(self, exclude: MessageView | None = None) -> list[dict]:
        """The messages to send to the model."""
        msgs: list[dict] = []
        if self.system_prompt.strip():
            msgs.append({"role": "system", "content": self.system_prompt})
        for v in self._views():
            if v is exclude or v.error or v.role not in ("user", "assistant"):
                continue
            if v.role == "assistant" and not v.text.strip():
                continue
            msgs.append({"role": v.role, "content": v.text})
        return msgs

    def start_reply(self) -> None:
        view = MessageView("assistant", label=self._model_label())
        self._mount_view(view)
        view.start_streaming()
        msg_id = None
        if self.history is not None and self.chat_id is not None:
            msg_id = self.history.add_message(self.chat_id, "assistant", "", status=storage.STREAMING)
            view.msg_id = msg_id
        job = ReplyJob(next(self._keys), view, msg_id, last_saved=time.perf_counter())
        self.job = job
        req = worker_mod.GenerationRequest(job.key, self.conversation(exclude=view), self.config.max_tokens,
                                           dataclasses.replace(self.config.sampling))
        self._set_state("writing…")
        self.refresh_bindings()
        engine = self.engine

        def start() -> None:
            # once the new views are on screen, so the first tokens do not wait for their layout
            if job.cancel.is_set() or self.job is not job:
                return
            self.run_worker(functools.partial(worker_mod.run_generation, engine, req, self.post_message,
                                              job.cancel, self.engine_lock),
                            thread=True, group="generate", name=f"reply-{job.key}", exit_on_error=False)
        self.call_after_refresh(start)

    # -- streaming ------------------------------------------------------------------------------
    def on_tokens_arrived(self, msg: TokensArrived) -> None:
        tokens, times = msg.batch.take()
        job = self.job
        if job is None or msg.reply_key != job.key or not tokens:
            return
        for t in tokens:
            job.record.append(t.id, t.text, t.drafted_by, t.draft_pos)
        view = job.view
        if view.is_attached:
            view.add_tokens(((t.text, t.drafted_by, t.draft_pos) for t in tokens),
                            times if self.lag_probe is not None else None)
            conv = view.parent
            if conv is not None and not conv.is_anchored:
                self.call_after_refresh(self._stick_to_bottom)
        now = time.perf_counter()
        if self.history is not None and job.msg_id is not None and now - job.last_saved >= 0.5:
            # the reply so far, so that a crash or a kill loses at most half a second of it
            job.last_saved = now
            self.history.update_message(job.msg_id, content="".join(job.record.texts), tokens=job.record)

    def on_stats_updated(self, msg: StatsUpdated) -> None:
        job = self.job
        if job is None or msg.reply_key != job.key:
            return
        job.live = msg.stats
        job.view.live_stats(msg.stats)
        tps = msg.stats.tokens_per_s
        self._set_state(f"writing… {tps:.0f} tok/s" if tps else "writing…")
        self._refresh_stats()

    def on_reply_finished(self, msg: ReplyFinished) -> None:
        job = self.job
        if job is None or msg.reply_key != job.key:
            return
        r = msg.result
        stats = r.stats.to_dict()
        shown = "".join(job.record.texts)
        # a finished reply ends at its last visible character: transcript models end
        # their turn with a newline before the next "User:" line
        text = r.text.rstrip() if r.finish_reason != STOP_CANCELLED else r.text
        if text != shown and shown.startswith(text):
            # the engine trimmed a stop string whose start it had already streamed
            job.record = job.record.truncated(len(text))
            if job.view.is_attached:
                job.view.body.truncate(len(text))
        if job.view.is_attached:
            job.view.finish_streaming(stats, r.finish_reason, text)
        self.session.add(r.stats)
        job.live = None
        if self.history is not None and job.msg_id is not None:
            self.history.update_message(job.msg_id, content=text, tokens=job.record, stats=stats,
                                        status=storage.CANCELLED if r.finish_reason == STOP_CANCELLED
                                        else storage.DONE, finish_reason=r.finish_reason)
        self.job = None
        self._set_state("stopped" if r.finish_reason == STOP_CANCELLED else "ready")
        self._refresh_stats()
        self.refresh_bindings()

    def on_reply_failed(self, msg: ReplyFailed) -> None:
        job = self.job
        if job is None or msg.reply_key != job.key:
            return
        if job.view.is_attached:
            job.view.fail(msg.error)
        if self.history is not None and job.msg_id is not None:
            if len(job.record):
                self.history.update_message(job.msg_id, content="".join(job.record.texts), tokens=job.record,
                                            status=storage.ERROR, finish_reason="error")
            else:
                self.history.delete_messages([job.msg_id])
        self.job = None
        self._set_state("error")
        self.notify(msg.error, severity="error", timeout=8)
        self.refresh_bindings()

    @on(ProvenanceHover)
    def _hover_info(self, msg: ProvenanceHover) -> None:
        if msg.info != self._hover:
            self._hover = msg.info
            self._refresh_bars()

    # -- actions ---------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _MAIN_ONLY and len(self.screen_stack) > 1:
            return False
        if action == "stop":
            return self.job is not None
        if action in ("regenerate", "edit_last") and (self.engine is None or self.job is not None):
            return None if action == "regenerate" else False
        return True

    def action_stop(self) -> None:
        job = self.job
        if job is None:
            return
        job.cancel.set()
        job.view.foot.update("stopping…")
        self._set_state("stopping…")

    def action_regenerate(self) -> None:
        if self.job is not None or self.engine is None:
            return
        views = self._views()
        if not views:
            self.notify("Nothing to regenerate yet.", timeout=3)
            return
        last = views[-1]
        if last.role == "assistant":
            if self.history is not None and last.msg_id is not None:
                self.history.delete_messages([last.msg_id])
            last.remove()
            views.pop()
        if not views or views[-1].role != "user":
            self.notify("Nothing to regenerate yet.", timeout=3)
            return
        self.call_after_refresh(self.start_reply)

    def action_edit_last(self) -> None:
        if self.job is not None:
            self.notify("Stop the reply first (Esc).", timeout=3)
            return
        views = self._views()
        idx = max((i for i, v in enumerate(views) if v.role == "user"), default=None)
        if idx is None:
            self.notify("No message of yours to edit.", timeout=3)
            return
        text = views[idx].text
        gone = views[idx:]
        if self.history is not None:
            self.history.delete_messages([v.msg_id for v in gone if v.msg_id is not None])
        for v in gone:
            v.remove()
        prompt = self.query_one(PromptInput)
        prompt.text = text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        if len(views) == len(gone):
            self.query_one("#welcome").display = True

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
            self.system_prompt = value.strip()
            if self.history is not None and self.chat_id is not None:
                self.history.set_system_prompt(self.chat_id, self.system_prompt)
            self.config.system_prompt = self.system_prompt
            self.saved_config.system_prompt = self.system_prompt
            self.save_config()
            self.notify("System prompt saved (also the default for new chats).", timeout=3)
        self.push_screen(TextPromptScreen(
            "System prompt", self.system_prompt, multiline=True,
            hint="Sent before the conversation. Applies from the next reply. Ctrl+S saves."), done)

    def action_new_chat(self) -> None:
        if self.job is not None:
            self.action_stop()
        self._clear_conversation()
        self.chat_id = None
        self.chat_title = ""
        self.system_prompt = self.config.system_prompt
        self._refresh_bars()
        self.query_one(PromptInput).focus()

    def _clear_conversation(self) -> None:
        for v in self._views():
            v.remove()
        self.query_one("#welcome").display = True
        conv = self.query_one("#conversation", VerticalScroll)
        conv.anchor(False)
        conv.scroll_home(animate=False)

    def resume_chat(self, chat_id: int) -> None:
        if self.history is None:
            return
        if self.job is not None:
            self.action_stop()  # its end is still saved to its own chat
        try:
            chat = self.history.load_chat(chat_id)
        except KeyError:
            self.notify("That chat no longer exists.", severity="warning")
            return
        self._clear_conversation()
        self.chat_id = chat.id
        self.chat_title = chat.title
        self.system_prompt = chat.system_prompt
        views = []
        for m in chat.messages:
            if m.role == "assistant":
                v = MessageView("assistant", m.content if not len(m.tokens) else "",
                                tokens=m.tokens if len(m.tokens) else None, stats=m.stats, status=m.status,
                                finish=m.finish_reason, msg_id=m.id, label=chat.model or None)
            else:
                v = MessageView(m.role, m.content, msg_id=m.id)
            views.append(v)
        conv = self.query_one("#conversation", VerticalScroll)
        if views:
            self.query_one("#welcome").display = False
            conv.mount_all(views)
        self.call_after_refresh(self._stick_to_bottom)
        self._refresh_bars()
        self.query_one(PromptInput).focus()

    def rename_chat(self, chat_id: int, title: str) -> None:
        if self.history is None:
            return
        self.history.rename_chat(chat_id, title)
        if chat_id == self.chat_id:
            self.chat_title = title
            self._refresh_bars()

    def delete_chat(self, chat_id: int) -> None:
        if self.history is None:
            return
        self.history.delete_chat(chat_id)
        if chat_id == self.chat_id:
            self.action_new_chat()
        self.notify("Chat deleted.", timeout=2)

    def export_chat(self, chat_id: int | None = None) -> None:
        chat_id = chat_id if chat_id is not None else self.chat_id
        if self.history is None or chat_id is None:
            self.notify("Nothing to export yet — send a message first.", timeout=3)
            return
        chat = self.history.load_chat(chat_id)
        try:
            import platformdirs
            folder = Path(platformdirs.user_documents_dir())
        except Exception:
            folder = Path.home()
        default = str(folder / f"{storage.slugify(chat.title)}.md")

        def done(value: str | None) -> None:
            if not value:
                return
            path = Path(os.path.expanduser(value.strip()))
            try:
                atomic_write_text(path, storage.chat_to_markdown(self.history.load_chat(chat_id)))
            except OSError as e:
                self.notify(f"could not export: {e}", severity="error")
                return
            self.notify(f"Exported to {path}", timeout=5)
        self.push_screen(TextPromptScreen("Export chat to Markdown", default, hint="File to write:",
                                          ok_label="Export"), done)

    def action_export(self) -> None:
        self.export_chat()

    def action_chats(self) -> None:
        if self.history is None:
            self.notify(self._history_error or "Chat history is not available.", severity="warning")
            return
        self.push_screen(ChatsScreen())

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
        mode = self.view_mode
        for v in self._views():
            v.set_view(mode)
        self._refresh_bars()

    def action_toggle_colour(self) -> None:
        self.colouring = not self.colouring
        self._apply_view()
        self.remember_ui(colouring=self.colouring)

    def action_toggle_off_view(self) -> None:
        self.off_view = "plain" if self.off_view == "markdown" else "markdown"
        self.colouring = False
        self._apply_view()
        self.remember_ui(off_view=self.off_view, colouring=False)
        self.notify(f"Uncoloured view: {self.off_view}", timeout=2)

    def action_settings(self) -> None:
        if self.engine is None and self._loading:
            self.notify("The model is still loading.", timeout=3)
        self.push_screen(SettingsScreen(self.config.spec, self.config.sampling, self.config.model,
                                        self.config.max_tokens, self.engine), self._settings_done)

    def _settings_done(self, result: SettingsResult | None) -> None:
        if result is None:
            return
        old_model = self.config.model
        spec_changed = result.spec.to_dict() != self.config.spec.to_dict()
        model_changed = result.model_changed(old_model)
        for cfg in (self.config, self.saved_config):
            cfg.spec = result.spec.copy()
            cfg.sampling = dataclasses.replace(result.sampling)
            cfg.model = ModelOptions(**result.model.__dict__)
            cfg.max_tokens = result.max_tokens
        self.save_config()
        if model_changed:
            if self.job is not None:
                self.action_stop()
            self.notify("Reloading the model with the new settings…", timeout=3)
            self.start_loading(result.model)
        elif spec_changed and self.engine is not None:
            if self.job is not None:
                self.action_stop()
            self._set_state("rebuilding speculators…")
            self._apply_spec_worker(self.engine, result.spec)
        else:
            self.notify("Settings saved.", timeout=2)

    @work(thread=True, group="apply", exit_on_error=False)
    def _apply_spec_worker(self, engine: Any, spec: SpecParams) -> None:
        worker_mod.apply_spec(engine, spec, self.engine_lock, self.post_message)

    def on_spec_applied(self, msg: SpecApplied) -> None:
        if msg.error:
            self.notify(f"Speculation not changed: {msg.error}", severity="error", timeout=8)
        else:
            on = self._spec_label()
            self.notify(f"Speculation: {on}", timeout=3)
            for name, why in msg.skipped.items():
                self.notify(f"{name} is off: {why}", severity="warning", timeout=8)
        if self.job is None:
            self.state = "ready"
        self._refresh_bars()

    async def action_quit(self) -> None:
        self._quitting = True
        job = self.job
        if job is not None:
            job.cancel.set()
            if self.history is not None and job.msg_id is not None:
                self.history.update_message(job.msg_id, content="".join(job.record.texts), tokens=job.record,
                                            status=storage.CANCELLED, finish_reason=STOP_CANCELLED)
            self.job = None
        self.exit(0)

    def on_unmount(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
        engine = self.engine
        self.engine = None
        if engine is not None:
            # wait (briefly) for a reply thread to notice the cancel before freeing the model
            if self.engine_lock.acquire(timeout=5):
                try:
                    engine.close()
                finally:
                    self.engine_lock.release()
        if self.history is not None:
            self.history.close()

    # -- command palette -------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        main = screen is self.screen_stack[0]
        for a in ACTIONS:
            if a.action == "quit" or (a.action in _MAIN_ONLY and not main):
                continue
            if a.action == "stop" and self.job is None:
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
