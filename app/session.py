"""The chat session: everything the chat does, without Textual.

A :class:`ChatSession` owns the conversation, the engine's lifecycle (load,
apply settings, close), the reply being written, the history store, the
lookup caches and the statistics. It speaks in typed events.

Threads: the public methods are called from one *owner* thread (the UI's).
Work that takes time (loading, generating, rebuilding the chain, saving the
lookup caches) runs in threads the session starts; they report by calling
``post(event)``, which must hand the event back to the owner thread, where
:meth:`ChatSession.apply` brings the session up to date before the UI looks
at it. The Textual app does this with ``post_message``; a test with a queue::

    q = queue.Queue()
    s = ChatSession(config, post=q.put, engine_factory=factory, history=History(tmp / "h.db"))
    s.load()
    drain(s, q, until=lambda: s.engine is not None)
    s.send("Hello")
    drain(s, q, until=lambda: s.job is None)
    s.turns[-1].text          # the reply

One record per token: the engine's :class:`~speculators.events.TokenEvent`
objects are appended to the reply's :attr:`Turn.tokens` by the generation
thread; the same objects are stored (``storage.tokens_to_json``) and drawn
by the widget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

from speculators.events import (STOP_CANCELLED, STOP_CONTEXT, FinishEvent, GenerationResult, GenerationStats,
                                StatsEvent, StepEvent, TokenEvent)
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import SpecType

from . import config as config_mod
from . import storage
from .errors import UserError, describe
from .figures import SessionStats
from .options import ModelOptions
from .storage import History, HistoryError

Post = Callable[[Any], Any]
Progress = Callable[[int, int, str], None]


# ---------------------------------------------------------------------------
# the engine, as the session sees it
# ---------------------------------------------------------------------------

class ChatEngine(Protocol):
    """What the session needs of an engine (:class:`speculators.engine.Engine`, or the scripted one)."""

    model: Any            # .path
    chain: Any            # .speculators (each .name), .skipped {type: reason}
    spec: SpecParams
    config: Any           # .n_ctx
    template: Any         # .stop_strings

    def set_spec(self, params: SpecParams, resources: dict | None = None) -> Any: ...

    def prompt_tokens(self, messages: Sequence[dict] | None = None, text: str | None = None,
                      raw: bool = False) -> list[int]: ...

    def generate(self, prompt: Sequence[int], max_tokens: int = 512, sampling: SamplingParams | None = None,
                 stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None,
                 stats_interval_s: float = 0.25, context_shift: bool = False,
                 n_keep: int = 0) -> Iterator[Any]: ...

    def close(self) -> None: ...


class EngineFactory(Protocol):
    def __call__(self, model_options: ModelOptions, spec: SpecParams, progress: Progress) -> ChatEngine: ...


def default_engine_factory(model_options: ModelOptions, spec: SpecParams, progress: Progress) -> ChatEngine:
    """The real engine, in a runner process of its own (:mod:`app.runner`): the default model
    (assembled on first run) or ``--model``. A crash of native code ends the runner, not the chat."""
    from .runner import RunnerEngine
    return RunnerEngine(model_options, spec, progress)


def uses_lookup_caches(spec: SpecParams) -> bool:
    """ngram-cache is asked for, by name or under ``auto``."""
    from speculators.auto import uses_type
    return uses_type(spec, SpecType.NGRAM_CACHE)


# ---------------------------------------------------------------------------
# events (posted by the session's threads, applied on the owner thread)
# ---------------------------------------------------------------------------

@dataclass
class LoadProgress:
    phase: str
    done: int
    total: int


@dataclass
class EngineReady:
    engine: Any
    seconds: float
    store: Any = None
    warnings: list[str] = field(default_factory=list)
    spec_error: str | None = None


@dataclass
class EngineFailed:
    error: str
    path: str | None


@dataclass
class SpecApplied:
    """The chain was rebuilt (``error``: it was not, and the old one stays)."""

    skipped: dict[str, str]
    error: str | None = None
    store: Any = None
    warnings: list[str] = field(default_factory=list)
    #: the engine whose chain it was (a model loaded since makes this one stale)
    engine: Any = None


@dataclass
class ReplyProgress:
    """The reply moved on: new tokens are in ``turn.tokens`` (read them with
    :meth:`ChatSession.new_tokens`) and its live figures are newer. One is on its way at a
    time: the reply thread posts the next only once the owner has applied this one, so
    whatever arrives meanwhile coalesces (an owner that applies it later, at its own pace,
    gets fewer, fuller updates)."""

    key: int


@dataclass
class ContextTrimmed:
    """Older turns were left out of what the model sees for this reply."""

    key: int
    first_kept: int       # index in ``turns`` of the first message the model still sees
    n_dropped: int        # messages left out
    n_prompt: int         # prompt tokens after the cut
    n_ctx: int


@dataclass
class ReplyDone:
    key: int
    result: GenerationResult


@dataclass
class ReplyFailed:
    key: int
    error: str


@dataclass
class LookupSaved:
    info: dict


@dataclass
class HistoryNotice:
    """Saving the chat history failed (``error``: why), or works again (``error`` None: what
    was kept in memory meanwhile is saved now). Posted by the owner thread itself, once per
    spell of failures: a reply whose every save fails is said once, not once per token."""

    error: str | None = None


@dataclass
class StaticBuildProgress:
    done: int
    total: int
    name: str


@dataclass
class StaticBuilt:
    info: dict | None = None
    error: str | None = None


@dataclass
class RunnerStopped:
    """The model's runner process died between replies (nothing was waiting on it): what the
    chat should say, and whether it was not started again (the same death twice in a row)."""
    message: str
    gave_up: bool = False


@dataclass
class ReadAhead:
    """The model began (``reading``) or ended reading the conversation ahead of the next reply
    (:meth:`ChatSession.warm`); at the end, ``tokens``: how many it read."""
    reading: bool
    tokens: int = 0


SessionEvent = (LoadProgress | EngineReady | EngineFailed | SpecApplied | ReplyProgress
                | ContextTrimmed | ReplyDone | ReplyFailed | LookupSaved | StaticBuildProgress | StaticBuilt
                | RunnerStopped | ReadAhead | HistoryNotice)


# ---------------------------------------------------------------------------
# the conversation
# ---------------------------------------------------------------------------

_turn_keys = itertools.count(1)


@dataclass(eq=False)
class Turn:
    """One message of the conversation. A reply's tokens are the engine's own records."""

    role: str
    text: str = ""
    msg_id: int | None = None
    tokens: list[TokenEvent] = field(default_factory=list)
    stats: dict | None = None
    status: str = storage.DONE
    finish: str | None = None
    error: str | None = None
    key: int = field(default_factory=lambda: next(_turn_keys))
    #: perf_counter() when the generation thread got each token (benchmarks: event-to-paint lag)
    arrived: list[float] = field(default_factory=list)

    @property
    def sent_to_model(self) -> bool:
        if self.error or self.role not in ("user", "assistant"):
            return False
        return bool(self.text.strip()) or self.role == "user"


@dataclass(eq=False)
class ReplyJob:
    turn: Turn
    messages: list[dict]
    #: index in turns of each non-system message in ``messages``
    turn_index: list[int]
    cancel: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    signalled: bool = False                # a ReplyProgress is on its way to the owner
    live: GenerationStats | None = None    # the live figures the owner has applied
    live_next: GenerationStats | None = None   # newer ones, not applied yet
    n_joined: int = 0                      # tokens already in turn.text
    last_saved: float = field(default_factory=time.perf_counter)
    started: float = field(default_factory=time.perf_counter)
    thread: threading.Thread | None = None
    lstrip_pending: bool = True            # the reply's leading whitespace is not shown


class SessionError(UserError):
    """The session cannot do that now (the message says why)."""


OVERFLOW_POLICIES = config_mod.OVERFLOW_POLICIES


# ---------------------------------------------------------------------------
# the session
# ---------------------------------------------------------------------------

class ChatSession:
    """See the module docstring."""

    SAVE_EVERY_S = 0.5
    #: seconds the runner is given to save its caches and exit when the chat closes (then it is killed)
    CLOSE_RUNNER_S = 0.75
    #: while saving fails, a streaming reply is saved again this far apart (each try may wait
    #: out a lock another program holds: History's timeout, on the owner thread)
    SAVE_RETRY_S = 5.0
    #: seconds a history write on the owner (UI) thread waits for a lock another program holds
    #: before it fails and is kept to be tried again (the screen must not stop for it)
    HISTORY_WAIT_S = 0.2
    #: the same, for the last saves when the chat closes
    HISTORY_WAIT_CLOSING_S = 1.0

    def __init__(self, config: config_mod.Config | None = None, *, post: Post,
                 engine_factory: EngineFactory | None = None, history: History | None = None,
                 open_history: bool = True, saved_config: config_mod.Config | None = None,
                 persist_config: bool = True, lookup_root: str | os.PathLike | None = None,
                 use_lookup_store: bool = True):
        self.config = config or config_mod.Config()
        #: what config.toml holds; changes made in the app go here too, command-line flags do not
        self.saved_config = saved_config if saved_config is not None else \
            config_mod.Config.from_toml_dict(self.config.to_toml_dict())
        self.persist_config = persist_config
        #: saved_config as config.toml held it when last read or written: a save writes what differs
        self._config_on_disk = self.saved_config.copy()
        self.post = post
        self.engine_factory = engine_factory or default_engine_factory
        self.engine: ChatEngine | None = None
        self.engine_lock = threading.Lock()
        self.history = history
        self.history_error: str | None = None
        if history is None and open_history:
            try:
                self.history = History(timeout=self.HISTORY_WAIT_S)
            except HistoryError as e:
                self.history_error = str(e)
        #: history writes that failed, by what they save (a turn, a chat's system prompt, ...):
        #: tried again, oldest first, at the next save (:meth:`_save`)
        self._unsaved: dict[Any, Callable[[], None]] = {}
        #: why the last save failed, while saves fail (said once: :class:`HistoryNotice`)
        self.history_failing: str | None = None
        self.lookup_root = lookup_root
        self.use_lookup_store = use_lookup_store
        #: the lookup caches of the loaded model's vocabulary (when ngram-cache is in use)
        self.store: Any = None
        #: (engine, store) a settings change opened whose SpecApplied is not applied yet; its own
        #: lock (the owner thread must never wait for engine_lock, which a reply holds throughout)
        self._spec_store: tuple[Any, Any] | None = None
        self._spec_store_lock = threading.Lock()
        self.lookup_last_save: dict | None = None
        self.chat_id: int | None = None
        self.title = ""
        self.system_prompt = self.config.system_prompt
        self.turns: list[Turn] = []
        #: index in turns of the first message the model saw for the last reply (0: all)
        self.context_start = 0
        self.job: ReplyJob | None = None
        self.stats = SessionStats()
        self.loading = False
        self.load_error: str | None = None
        self.queued: str | None = None
        self.closed = False
        self._threads: list[threading.Thread] = []
        self._build_cancel: threading.Event | None = None
        #: the read-ahead of the conversation under way (see :meth:`warm`), and its stop
        self.warming: threading.Thread | None = None
        self._warm_cancel: threading.Event | None = None
        #: whether the model is reading the conversation ahead now (its ReadAhead events applied)
        self.reading_ahead = False

    # -- threads -------------------------------------------------------------------
    def _start(self, target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=f"draftlight-{name}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()
        return t

    # -- labels ----------------------------------------------------------------------
    @property
    def model_label(self) -> str:
        if self.engine is None:
            m = self.config.model.model
            return Path(m).stem if m else "default model"
        return Path(str(getattr(self.engine.model, "path", "") or "")).stem or "model"

    @property
    def active_types(self) -> list[str]:
        """Speculators in the chain, in priority order (empty while no model is loaded)."""
        chain = getattr(self.engine, "chain", None)
        return [s.name for s in getattr(chain, "speculators", [])] if chain is not None else []

    @property
    def skipped(self) -> dict[str, str]:
        chain = getattr(self.engine, "chain", None)
        return dict(getattr(chain, "skipped", {}) or {}) if chain is not None else {}

    @property
    def configured_types(self) -> list[str]:
        return [getattr(t, "value", str(t)) for t in self.config.spec.types]

    @property
    def n_ctx(self) -> int:
        cfg = getattr(self.engine, "config", None)
        n = getattr(cfg, "n_ctx", None)
        ctx = getattr(self.engine, "ctx", None)
        return int(getattr(ctx, "n_ctx", None) or n or self.config.model.ctx_size or 4096)

    # -- config ------------------------------------------------------------------------
    def save_config(self) -> str | None:
        """Write config.toml; returns an error message, or None."""
        if not self.persist_config:
            return None
        try:
            config_mod.save(self.saved_config, since=self._config_on_disk)
        except config_mod.ConfigError as e:
            return describe(e)
        except OSError as e:
            return f"could not save settings: {describe(e)}"
        self._config_on_disk = self.saved_config.copy()
        return None

    def remember_ui(self, **values: Any) -> str | None:
        self.config.ui.update(values)
        self.saved_config.ui.update(values)
        return self.save_config()

    # -- loading -------------------------------------------------------------------------
    def load(self, model: ModelOptions | None = None) -> None:
        """Load (or reload) the model in a thread; :class:`EngineReady` or :class:`EngineFailed` follows."""
        if model is not None:
            self.config.model = model
        self._stop_warm()
        old, self.engine = self.engine, None
        old_store, self.store = self.store, None
        self.loading = True
        self.load_error = None
        self._start(self._load_thread, dataclasses.replace(self.config.model), self.config.spec.copy(),
                    old, old_store, name="load")

    def _load_thread(self, model: ModelOptions, spec: SpecParams, old: Any, old_store: Any) -> None:
        if old is not None:
            with self.engine_lock:
                old.close()
        if old_store is not None:
            with contextlib.suppress(Exception):
                old_store.close()
        t0 = time.perf_counter()
        last = [0.0]

        def progress(done: int, total: int, phase: str) -> None:
            now = time.perf_counter()
            if done >= total or now - last[0] > 0.05:
                last[0] = now
                self.post(LoadProgress(phase, done, total))

        try:
            engine = self.engine_factory(model, spec, progress)
        except Exception as e:  # every failure becomes an event, never a traceback
            self.post(EngineFailed(describe(e), model.model))
            return
        if hasattr(engine, "on_idle_death"):   # a runner: a death between replies is said, not silent
            engine.on_idle_death = lambda msg, gave_up: self.post(RunnerStopped(msg, gave_up))
        store, warnings, spec_error = None, list(getattr(engine, "load_warnings", None) or []), None
        try:
            with self.engine_lock:
                store, store_warnings = self._open_store(engine, spec)
                warnings += store_warnings
                engine.set_spec(spec, resources=store.resources() if store is not None else None)
        except Exception as e:
            spec_error = describe(e)
        self.post(EngineReady(engine, time.perf_counter() - t0, store, warnings, spec_error))

    def _open_store(self, engine: Any, spec: SpecParams) -> tuple[Any, list[str]]:
        """The lookup caches of the engine's vocabulary, loaded (None when ngram-cache is not used)."""
        if not (self.use_lookup_store and uses_lookup_caches(spec)):
            return None, []
        if hasattr(engine, "open_store"):
            # the runner keeps the caches beside the model
            try:
                return engine.open_store(spec, self.lookup_root)
            except Exception as e:
                return None, [f"lookup caches unavailable ({describe(e)}); ngram-cache runs without them"]
        model = getattr(engine, "model", None)
        if model is None or not hasattr(model, "token_bytes"):
            return None, []  # the scripted engine has no vocabulary
        from .lookup_store import LookupStore, LookupStoreError
        nc = spec.ngram_cache
        try:
            store = LookupStore.for_model(model, static_path=nc.lookup_cache_static or None,
                                          dynamic_path=nc.lookup_cache_dynamic or None, root=self.lookup_root)
        except (LookupStoreError, OSError) as e:
            return None, [f"lookup caches unavailable ({describe(e)}); ngram-cache runs without them"]
        return store, list(store.warnings)

    def _closing_store(self, store: Any) -> None:
        if store is not None and store is not self.store:
            with contextlib.suppress(Exception):
                store.close()

    # -- settings --------------------------------------------------------------------------
    def apply_settings(self, spec: SpecParams, sampling: SamplingParams, model: ModelOptions,
                       max_tokens: int, overflow: str | None = None) -> str:
        """Use (and save) new settings. Returns ``"reload"``, ``"rebuild"`` or ``"saved"``."""
        old_model = self.config.model
        spec_changed = spec.to_dict() != self.config.spec.to_dict()
        model_changed = _model_key(model) != _model_key(old_model)
        for cfg in (self.config, self.saved_config):
            cfg.spec = spec.copy()
            cfg.sampling = dataclasses.replace(sampling)
            cfg.model = ModelOptions(**model.__dict__)
            cfg.max_tokens = max_tokens
            if overflow is not None:
                cfg.overflow = overflow
        self.save_config()
        if model_changed:
            self.stop()
            self.load(ModelOptions(**model.__dict__))
            return "reload"
        if spec_changed and self.engine is not None:
            return self._apply_spec(spec)
        return "saved"

    def rebuild_chain(self) -> bool:
        """Build the chain for the configured speculation again (e.g. settings applied while loading);
        the model is loaded again where that speculation needs it loaded another way."""
        if self.engine is None:
            return False
        self._apply_spec(self.config.spec)
        return True

    def _apply_spec(self, spec: SpecParams) -> str:
        """Stop the reply and put ``spec`` to use on the loaded model: ``"rebuild"`` (its chain, in
        a thread), or ``"reload"`` where it needs the model loaded another way (its MTP layers,
        state snapshots: loaded again, as the engine's load plan has it for this spec)."""
        self.stop()
        if not self._loaded_for(spec):
            self.load()
            return "reload"
        self._start(self._spec_thread, self.engine, spec.copy(), name="apply")
        return "rebuild"

    def _loaded_for(self, spec: SpecParams) -> bool:
        """Whether the loaded model is loaded as ``spec`` needs it (:func:`speculators.engine.loaded_as_needed`:
        the one load plan the chat, ``generate`` and ``bench`` share). True where it cannot be told
        (a scripted engine)."""
        engine = self.engine
        m = getattr(engine, "model", None)
        path = getattr(m, "path", None)
        if not path or not isinstance(getattr(m, "load_mtp", None), bool):
            return True
        from speculators.engine import LoadPlan, loaded_as_needed
        recurrent = bool(getattr(m, "is_recurrent", False) or getattr(m, "is_hybrid", False))
        try:
            return loaded_as_needed(str(path), spec, LoadPlan(m.load_mtp, int(getattr(engine, "n_rs_seq", 0) or 0)),
                                    recurrent)
        except Exception:
            return True

    def _spec_thread(self, engine: Any, spec: SpecParams) -> None:
        with self.engine_lock:
            # a store an earlier change opened (its SpecApplied not applied yet) is the one to use:
            # two quick changes open the caches once
            store, warnings = self.store, []
            with self._spec_store_lock:
                if store is None and self._spec_store is not None and self._spec_store[0] is engine:
                    store = self._spec_store[1]
            if store is None:
                store, warnings = self._open_store(engine, spec)
                with self._spec_store_lock:
                    self._spec_store = (engine, store) if store is not None else None
            try:
                chain = engine.set_spec(spec, resources=store.resources() if store is not None else None)
            except Exception as e:
                self.post(SpecApplied(dict(getattr(engine.chain, "skipped", {}) or {}), describe(e), store, warnings,
                                      engine))
                return
            self.post(SpecApplied(dict(getattr(chain, "skipped", {}) or {}), None, store, warnings, engine))

    # -- the Lab --------------------------------------------------------------------------------
    def lab_prompts(self) -> list[tuple[int, str]]:
        """The person's messages the Lab can run on: (turn index, text), the latest last."""
        return [(i, t.text) for i, t in enumerate(self.turns) if t.role == "user" and t.text.strip()]

    def lab_usable_types(self) -> list[str]:
        """The types this model can use (as Automatic judges them, draft model included)."""
        from speculators.auto import auto_plan
        path = str(getattr(getattr(self.engine, "model", None), "path", "") or "") or None
        sp = self.config.spec.copy()
        sp.types = SpecParams.auto().types
        try:
            return [c.name for c in auto_plan(sp, path) if c.used]
        except Exception:
            return ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]

    def run_lab(self, configs: Sequence[Any], *, turn: int | None = None, text: str | None = None,
                rounds: int = 3, max_tokens: int = 128, progress: Callable[[int, int, str], None] | None = None,
                cancel: Callable[[], bool] | None = None) -> Any:
        """Run the Lab (:func:`app.lab.run_lab`) on the loaded model, in the calling thread.

        The prompt is the conversation up to the person's message at ``turn`` (default: their
        latest), or ``text`` alone. The chat's own speculation is put back afterwards, whatever
        happens. Raises :class:`SessionError` while a reply is being written or no model is loaded.
        """
        from .lab import run_lab
        if self.job is not None:
            raise SessionError("wait for the reply to finish")
        engine = self.engine
        if engine is None:
            raise SessionError("no model is loaded")
        if text is None:
            prompts = self.lab_prompts()
            if not prompts:
                raise SessionError("no message to run the Lab on: send one, or give a file")
            idx = turn if turn is not None else prompts[-1][0]
            msgs = self.conversation(upto=idx + 1)
            label = self.turns[idx].text
        else:
            msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []) \
                + [{"role": "user", "content": text}]
            label = text
        store = self.store
        with self.engine_lock:
            try:
                prompt = engine.prompt_tokens(messages=msgs)
                n_ctx = int(getattr(getattr(engine, "ctx", None), "n_ctx", 0) or 0)
                if n_ctx and len(prompt) + max_tokens >= n_ctx:
                    raise SessionError(f"the prompt ({len(prompt)} tokens) and {max_tokens} more do not fit the "
                                       f"context of {n_ctx}: fewer tokens, or a larger context (F3)")
                stop = tuple(getattr(getattr(engine, "template", None), "stop_strings", ()) or ())
                return run_lab(engine, prompt, configs, rounds=rounds, max_tokens=max_tokens, stop=stop,
                               prompt_text=label, cancel=cancel, progress=progress,
                               resources=lambda sp: store.resources() if store is not None and
                               uses_lookup_caches(sp) else None)
            finally:
                # the chat's own speculation back, as it was
                with contextlib.suppress(Exception):
                    engine.set_spec(self.config.spec.copy(),
                                    resources=store.resources() if store is not None else None)

    # -- the conversation --------------------------------------------------------------------
    def conversation(self, upto: int | None = None) -> list[dict]:
        """The messages the model is given (before any cut to fit the context)."""
        msgs: list[dict] = []
        if self.system_prompt.strip():
            msgs.append({"role": "system", "content": self.system_prompt})
        for t in self.turns[:upto]:
            if t.sent_to_model:
                msgs.append({"role": t.role, "content": t.text})
        return msgs

    def sent_messages(self, limit: int = 200) -> list[str]:
        """What the person sent before (oldest first), for the prompt's Up/Down."""
        if self.history is None:
            return []
        try:
            return self.history.sent_messages(limit)
        except Exception:
            return []

    def _ensure_chat(self) -> None:
        if self.chat_id is not None or self.history is None:
            return
        self.chat_id = self.history.create_chat(system_prompt=self.system_prompt, model=self.model_label)

    def send(self, text: str) -> Turn | None:
        """Add the person's message and start the reply.

        Returns the reply's turn; None when the message was queued because the
        model is still loading. Raises :class:`SessionError` when it cannot be sent, and
        :class:`HistoryError` when it cannot be saved: then nothing was sent (the conversation
        is as it was), so the person's text stays where they typed it, to send again.
        """
        text = text.strip("\n")
        if not text.strip():
            raise SessionError("the message is empty")
        if self.job is not None:
            raise SessionError("a reply is still being written — Esc stops it")
        if self.engine is None:
            if self.loading:
                self.queued = text
                return None
            raise SessionError("no model is loaded — pick one above")
        self._ensure_chat()
        turn = Turn("user", text)
        if self.history is not None and self.chat_id is not None:
            turn.msg_id = self.history.add_message(self.chat_id, "user", text)
        self.turns.append(turn)
        try:
            reply = self.start_reply()
        except HistoryError:
            # the reply's record could not be added: the message is taken back, its saved
            # record too (at the next save, where the history refuses this one as well)
            self.turns.remove(turn)
            if self.history is not None and turn.msg_id is not None:
                history, msg_id = self.history, turn.msg_id
                self._unsaved[("turn", turn.key)] = lambda: history.delete_messages([msg_id])
            raise
        if self.history is not None and self.chat_id is not None and not self.title:
            self.title = storage.title_from(text)
        self._retry_unsaved()
        return reply

    def start_reply(self) -> Turn:
        """Write a reply to the conversation as it stands (the last turn is the person's)."""
        if self.engine is None:
            raise SessionError("no model is loaded")
        if self.job is not None:
            raise SessionError("a reply is still being written — Esc stops it")
        self._ensure_chat()
        messages = self.conversation()
        turn_index = [i for i, t in enumerate(self.turns) if t.sent_to_model]
        turn = Turn("assistant", status=storage.STREAMING)
        if self.history is not None and self.chat_id is not None:
            turn.msg_id = self.history.add_message(self.chat_id, "assistant", "", status=storage.STREAMING)
        self.turns.append(turn)
        job = ReplyJob(turn, messages, turn_index)
        self.job = job
        job.thread = self._start(self._reply_thread, job, self.engine, self.config.max_tokens,
                                 dataclasses.replace(self.config.sampling), self.config.overflow,
                                 name=f"reply-{turn.key}")
        return turn

    # -- reading ahead ------------------------------------------------------------------------
    def warm(self) -> bool:
        """Have the model read the conversation as it stands, while the person reads and types
        (:meth:`speculators.engine.Engine.warm`): the next reply's prompt is then read but for
        the new message. On the default model the transcript's fixed start alone (~310 tokens)
        took ~0.9 s of the first reply's first token on a 2-core CPU. A read-ahead of another
        conversation still under way is stopped (what it read is kept); a reply asked for
        meanwhile waits for this one, whose work is its prompt's start. Returns whether one
        was started."""
        engine = self.engine
        if self.closed or engine is None or self.job is not None or not callable(getattr(engine, "warm", None)):
            return False
        self._stop_warm()
        cancel = self._warm_cancel = threading.Event()
        self.warming = self._start(self._warm_thread, engine, self.conversation(), self.config.max_tokens,
                                   cancel, name="warm")
        return True

    def _stop_warm(self) -> None:
        if self._warm_cancel is not None:
            self._warm_cancel.set()

    def _warm_thread(self, engine: Any, messages: list[dict], max_tokens: int, cancel: threading.Event) -> None:
        with self.engine_lock:
            if cancel.is_set() or self.engine is not engine or self.closed or getattr(engine, "alive", True) is False:
                return      # (a runner that is down is not started for this: the reply starts it)
            try:
                prompt = engine.prompt_tokens(messages=messages)
                n_ctx = _engine_n_ctx(engine)
                if len(prompt) + reply_room(n_ctx, max_tokens) > n_ctx:
                    return      # the reply will leave older turns out: its prompt starts otherwise
                self.post(ReadAhead(True))
                n_read = 0
                try:
                    n_read = engine.warm(prompt, cancel=cancel.is_set) or 0
                finally:
                    self.post(ReadAhead(False, n_read))
            except Exception as e:
                # nothing is lost: the reply reads its prompt itself; a runner that died doing
                # this is said as one that died between replies (it is started again)
                if _is_crash(e):
                    from .runner import RunnerGaveUp
                    self.post(RunnerStopped(describe(e), isinstance(e, RunnerGaveUp)))

    def stop(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
            # the runner is told at once (the reply thread would see the flag within a poll)
            stop_now = getattr(self.engine, "stop", None)
            if callable(stop_now):
                stop_now()

    # -- the reply thread ---------------------------------------------------------------------
    def _reply_thread(self, job: ReplyJob, engine: ChatEngine, max_tokens: int, sampling: SamplingParams,
                      overflow: str) -> None:
        key = job.turn.key
        with self.engine_lock:
            if job.cancel.is_set() and self.engine is not engine:
                self.post(ReplyFailed(key, "the model was unloaded"))
                return
            try:
                prompt, cut = fit_to_context(engine, job.messages, max_tokens, overflow, job.turn_index)
                if cut is not None:
                    self.post(ContextTrimmed(key, cut[0], cut[1], len(prompt), _engine_n_ctx(engine)))
                stop = tuple(getattr(getattr(engine, "template", None), "stop_strings", ()) or ())
                result = None
                # under the rolling window a reply that fills the context shifts it (the system
                # prompt stays) instead of stopping, as llama-server does
                rolling = overflow == "rolling"
                n_keep = system_tokens(engine, job.messages) if rolling else 0
                for ev in engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                          cancel=job.cancel.is_set, context_shift=rolling, n_keep=n_keep):
                    if isinstance(ev, StepEvent):
                        if ev.tokens:
                            self._add_tokens(job, ev.tokens)
                    elif isinstance(ev, StatsEvent):
                        self._add_stats(job, dataclasses.replace(ev.stats))
                    elif isinstance(ev, FinishEvent):
                        result = ev.result
                if result is None:
                    raise RuntimeError("the engine ended without a result")
            except Exception as e:
                msg = describe(e)
                if _is_crash(e) and job.turn.tokens:
                    msg = f"the reply was cut here: {msg}"
                self.post(ReplyFailed(key, msg))
                return
            # the reply is done before the caches learn it (a runner restarted by a stop loads
            # its model before it can learn: the chat does not wait for that)
            self.post(ReplyDone(key, result))
            store = self.store
            if store is None:
                return
            try:
                # under the engine lock: the speculator reads the dynamic cache while drafting
                learned = store.learn(list(prompt) + list(result.tokens))
            except Exception as e:
                self.post(LookupSaved({"error": describe(e)}))
                return
        if learned:
            self._save_lookup(store)

    def _save_lookup(self, store: Any) -> None:
        try:
            res = store.save()
        except Exception as e:
            self.post(LookupSaved({"error": describe(e)}))
            return
        self.post(LookupSaved({"path": res.path, "skipped": res.skipped, "ngrams": res.ngrams,
                               "entries": res.entries, "added_entries": res.added_entries,
                               "warnings": list(res.warnings)}))

    def _add_tokens(self, job: ReplyJob, tokens: Sequence[TokenEvent]) -> None:
        now = time.perf_counter()
        with job.lock:
            for t in tokens:
                if job.lstrip_pending:
                    # a transcript's "Assistant:" is followed by a space the reply does not begin with
                    stripped = t.text.lstrip()
                    if stripped:
                        job.lstrip_pending = False
                    t.text = stripped
                job.turn.tokens.append(t)
                job.turn.arrived.append(now)
            post = self._signal(job)
        if post:
            self.post(ReplyProgress(job.turn.key))

    def _add_stats(self, job: ReplyJob, stats: GenerationStats) -> None:
        with job.lock:
            job.live_next = stats
            post = self._signal(job)
        if post:
            self.post(ReplyProgress(job.turn.key))

    @staticmethod
    def _signal(job: ReplyJob) -> bool:
        """(Under ``job.lock``) whether a ReplyProgress must be posted: none is on its way."""
        post = not job.signalled
        job.signalled = True
        return post

    def new_tokens(self, turn: Turn, start: int) -> list[TokenEvent]:
        """The tokens of ``turn`` from ``start`` on (safe while the reply is written)."""
        job = self.job
        if job is not None and job.turn is turn:
            with job.lock:
                return turn.tokens[start:]
        return turn.tokens[start:]

    # -- applying events (owner thread) ----------------------------------------------------------
    def apply(self, ev: Any) -> None:
        """Bring the session up to date with an event from one of its threads."""
        handler = self.handlers().get(type(ev))
        if handler is not None:
            handler(ev)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """The session's handler of each event type it keeps itself up to date with (by type:
        a renamed event class is a NameError here, never a handler silently lost)."""
        return {EngineReady: self._on_EngineReady, ReadAhead: self._on_ReadAhead,
                EngineFailed: self._on_EngineFailed, SpecApplied: self._on_SpecApplied,
                ReplyProgress: self._on_ReplyProgress, ContextTrimmed: self._on_ContextTrimmed,
                ReplyDone: self._on_ReplyDone, ReplyFailed: self._on_ReplyFailed,
                RunnerStopped: self._on_RunnerStopped, LookupSaved: self._on_LookupSaved,
                StaticBuilt: self._on_StaticBuilt}

    def _on_EngineReady(self, ev: EngineReady) -> None:
        if self.closed:
            with contextlib.suppress(Exception):
                ev.engine.close()
            self._closing_store(ev.store)
            return
        self.engine = ev.engine
        self.store = ev.store
        self.loading = False
        self.warm()

    def _on_ReadAhead(self, ev: ReadAhead) -> None:
        self.reading_ahead = ev.reading

    def _on_EngineFailed(self, ev: EngineFailed) -> None:
        self.loading = False
        self.load_error = ev.error

    def _on_SpecApplied(self, ev: SpecApplied) -> None:
        if ev.engine is not None and ev.engine is not self.engine:
            # for a model that has been unloaded since: its caches are of no use
            self._closing_store(ev.store)
            return
        if ev.store is not None and ev.store is not self.store:
            old, self.store = self.store, ev.store
            self._closing_store(old)
        with self._spec_store_lock:
            if self._spec_store is not None and self._spec_store[1] is self.store:
                self._spec_store = None
        self.warm()     # a drafter that reads the target's states has the whole context read again

    def _job_for(self, key: int) -> ReplyJob | None:
        job = self.job
        return job if job is not None and job.turn.key == key else None

    def _on_ReplyProgress(self, ev: ReplyProgress) -> None:
        job = self._job_for(ev.key)
        if job is None:
            return
        with job.lock:
            job.signalled = False
            tokens = job.turn.tokens
            if job.n_joined < len(tokens):
                job.turn.text += "".join(t.text for t in tokens[job.n_joined:])
                job.n_joined = len(tokens)
            if job.live_next is not None:
                job.live, job.live_next = job.live_next, None
        now = time.perf_counter()
        every = self.SAVE_EVERY_S if self.history_failing is None else self.SAVE_RETRY_S
        if self.history is not None and job.turn.msg_id is not None and now - job.last_saved >= every:
            # the reply so far, so that a crash or a kill loses at most half a second of it (a
            # save that fails keeps the reply here, says so once, and is tried again later)
            job.last_saved = now
            self._store_turn(job.turn)

    def _on_ContextTrimmed(self, ev: ContextTrimmed) -> None:
        if self._job_for(ev.key) is not None:
            self.context_start = ev.first_kept

    def _on_ReplyDone(self, ev: ReplyDone) -> None:
        job = self._job_for(ev.key)
        if job is None:
            return
        r = ev.result
        turn = job.turn
        with job.lock:
            tokens = turn.tokens
        # the reply is the engine's text (a stop string is never in it), less the leading
        # whitespace the turn never showed; a finished reply ends at its last visible character
        # (transcript models end their turn with a newline before the next "User:" line)
        shown = "".join(t.text for t in tokens)
        final = r.text.lstrip()
        if r.finish_reason != STOP_CANCELLED:
            final = final.rstrip()
        if final != shown and shown.startswith(final):
            tokens = storage.truncate_tokens(tokens, len(final))
        turn.tokens = list(tokens)
        turn.text = "".join(t.text for t in turn.tokens)
        turn.stats = r.stats.to_dict()
        turn.finish = r.finish_reason
        turn.status = storage.CANCELLED if r.finish_reason == STOP_CANCELLED else storage.DONE
        self.stats.add(r.stats, turn.tokens)
        self._store_turn(turn, final=True)
        self.job = None

    def _on_ReplyFailed(self, ev: ReplyFailed) -> None:
        job = self._job_for(ev.key)
        if job is None:
            return
        turn = job.turn
        turn.error = ev.error
        turn.status = storage.ERROR
        turn.text = "".join(t.text for t in turn.tokens)
        if self.history is not None and turn.msg_id is not None:
            history, msg_id = self.history, turn.msg_id
            if turn.tokens:
                text, tokens = turn.text, list(turn.tokens)
                self._save(("turn", turn.key), lambda: history.update_message(
                    msg_id, content=text, tokens=tokens, status=storage.ERROR, finish_reason="error"))
            else:
                turn.msg_id = None
                self._save(("turn", turn.key), lambda: history.delete_messages([msg_id]))
        # the person's message that could not be answered is not sent again with the next one
        idx = self.turns.index(turn) if turn in self.turns else -1
        if idx > 0 and not turn.tokens and self.turns[idx - 1].role == "user":
            self.turns[idx - 1].error = ev.error
        self.job = None

    def _on_RunnerStopped(self, ev: RunnerStopped) -> None:
        if not ev.gave_up:
            self.warm()     # the fresh runner's context is empty: it reads the conversation again

    def _on_LookupSaved(self, ev: LookupSaved) -> None:
        self.lookup_last_save = ev.info

    def _store_turn(self, turn: Turn, final: bool = False) -> bool:
        """Save ``turn`` as it stands (``final``: its figures, status and end too); whether it
        is saved. Never raises (it runs on event paths and at the exit): a save that fails
        keeps the turn in memory and is tried again at the next save (:meth:`_save`)."""
        if self.history is None or turn.msg_id is None:
            return True
        return self._save(("turn", turn.key), lambda: self._write_turn(turn, final))

    def _save(self, key: Any, write: Callable[[], None]) -> bool:
        """Run a history ``write`` (``key``: what it saves; it replaces a failed write of the
        same thing), after the writes that failed before; whether all are saved now. Never
        raises: where saving fails the chat goes on in memory, what failed is kept to be tried
        again at the next save, and the person is told once (and again when it works)."""
        self._unsaved[key] = write
        return self._retry_unsaved()

    def _retry_unsaved(self) -> bool:
        """Try the writes that failed, oldest first, up to the first that fails again (so one
        save waits out a lock once at most); whether none is left. Said by
        :class:`HistoryNotice`: the first failure of a spell, and its end."""
        if self.history is None:
            self._unsaved.clear()
            return True
        while self._unsaved:
            key, write = next(iter(self._unsaved.items()))
            try:
                write()
            except HistoryError as e:
                if self.history_failing is None:
                    self.post(HistoryNotice(str(e)))
                self.history_failing = str(e)
                return False
            if self._unsaved.get(key) is write:
                del self._unsaved[key]
        if self.history_failing is not None:
            self.history_failing = None
            self.post(HistoryNotice(None))
        return True

    def _write_turn(self, turn: Turn, final: bool) -> None:
        """(:meth:`_store_turn`'s write) the turn as it is now; raises :class:`HistoryError`."""
        if self.history is None or turn.msg_id is None:
            return
        job = self.job
        if job is not None and job.turn is turn:
            # the reply thread appends to these while it writes: save a copy taken under its lock
            with job.lock:
                tokens, text = list(turn.tokens), turn.text
        else:
            tokens, text = turn.tokens, turn.text
        if final:
            self.history.update_message(turn.msg_id, content=text, tokens=tokens, stats=turn.stats,
                                        status=turn.status, finish_reason=turn.finish)
        else:
            self.history.update_message(turn.msg_id, content=text, tokens=tokens)

    # -- editing the conversation ---------------------------------------------------------------
    def regenerate(self) -> Turn:
        """Drop the last reply and write it again."""
        if self.job is not None or self.engine is None:
            raise SessionError("wait for the reply to finish" if self.job else "no model is loaded")
        if self.turns and self.turns[-1].role == "assistant":
            last = self.turns.pop()
            if self.history is not None and last.msg_id is not None:
                self.history.delete_messages([last.msg_id])
        if not self.turns or self.turns[-1].role != "user":
            raise SessionError("nothing to regenerate yet")
        self.turns[-1].error = None
        return self.start_reply()

    def edit_last(self) -> tuple[str, list[Turn]]:
        """Take back the person's last message (and what followed): returns its text and the removed turns."""
        if self.job is not None:
            raise SessionError("stop the reply first (Esc)")
        idx = max((i for i, t in enumerate(self.turns) if t.role == "user"), default=None)
        if idx is None:
            raise SessionError("no message of yours to edit")
        gone = self.turns[idx:]
        del self.turns[idx:]
        if self.history is not None:
            self.history.delete_messages([t.msg_id for t in gone if t.msg_id is not None])
        self.context_start = min(self.context_start, len(self.turns))
        return gone[0].text, gone

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt = text.strip()
        if self.history is not None and self.chat_id is not None:
            # applies from the next reply either way; the chat's copy is saved (or tried again)
            history, chat_id, prompt = self.history, self.chat_id, self.system_prompt
            self._save(("system", chat_id), lambda: history.set_system_prompt(chat_id, prompt))
        self.config.system_prompt = self.system_prompt
        self.saved_config.system_prompt = self.system_prompt
        self.save_config()
        self.warm()

    def new_chat(self) -> None:
        self._detach_job()
        self.turns = []
        self.chat_id = None
        self.title = ""
        self.context_start = 0
        self.system_prompt = self.config.system_prompt
        self.warm()

    def _detach_job(self) -> None:
        """Stop a reply that is being written; its end is still saved to its own chat."""
        job = self.job
        if job is None:
            return
        job.cancel.set()
        stop_now = getattr(self.engine, "stop", None)
        if callable(stop_now):
            stop_now()        # the runner is told at once, not at the reply thread's next look
        with job.lock:
            job.turn.text = "".join(t.text for t in job.turn.tokens)
        job.turn.status = storage.CANCELLED
        job.turn.finish = STOP_CANCELLED
        self._store_turn(job.turn, final=True)
        self.job = None

    def resume(self, chat_id: int) -> None:
        """Open a saved chat (the reply being written is stopped and saved to its own chat).
        Raises :class:`HistoryError` where the history cannot be read."""
        if self.history is None:
            raise SessionError(self.history_error or "chat history is not available")
        self._retry_unsaved()       # the chat is read back as it was left, where that can be saved
        try:
            chat = self.history.load_chat(chat_id)
        except KeyError:
            raise SessionError("that chat no longer exists") from None
        self._detach_job()
        self.chat_id = chat.id
        self.title = chat.title
        self.system_prompt = chat.system_prompt
        self.context_start = 0
        self.turns = [Turn(m.role, m.content, m.id, list(m.tokens), m.stats, m.status, m.finish_reason,
                           "not answered" if m.status == storage.ERROR and m.role == "user" else None)
                      for m in chat.messages]
        self.warm()

    def list_chats(self) -> list[storage.ChatSummary]:
        return self.history.list_chats() if self.history is not None else []

    def rename(self, chat_id: int, title: str) -> None:
        """Raises :class:`HistoryError` where it cannot be saved (the title is then unchanged)."""
        if self.history is None:
            return
        self.history.rename_chat(chat_id, title)
        if chat_id == self.chat_id:
            self.title = title.strip() or "Untitled chat"

    def delete(self, chat_id: int) -> bool:
        """Delete a saved chat; True when it was the open one (the session is then a new chat).
        Raises :class:`HistoryError` where it cannot be deleted (it is then as it was)."""
        if self.history is None:
            return False
        self.history.delete_chat(chat_id)
        if chat_id == self.chat_id:
            self.new_chat()
            return True
        return False

    def export(self, path: str | os.PathLike, chat_id: int | None = None) -> Path:
        from .fileutil import atomic_write_text
        cid = chat_id if chat_id is not None else self.chat_id
        if self.history is None or cid is None:
            raise SessionError("nothing to export yet — send a message first")
        p = Path(os.path.expanduser(str(path)))
        atomic_write_text(p, storage.chat_to_markdown(self.history.load_chat(cid)))
        return p

    # -- lookup caches -------------------------------------------------------------------------
    def lookup_figures(self) -> dict | None:
        """Cache sizes and what each cache contributed (None when ngram-cache is not in use)."""
        store = self.store
        if store is None:
            return None
        from .lookup_store import LookupStore
        info = {k: dataclasses.asdict(v) for k, v in store.info().items()}
        engine = self.engine
        if engine is None:
            contrib = {}
        elif hasattr(engine, "lookup_contribution"):
            try:
                contrib = engine.lookup_contribution()
            except Exception:
                contrib = {}
        else:
            contrib = LookupStore.contribution(engine)
        return {"folder": str(store.folder), "caches": info, "sources": contrib,
                "pending_entries": store.pending_entries, "last_save": self.lookup_last_save}

    def build_static_cache(self, files: Sequence[str] | None) -> None:
        """Build the static cache from ``files`` (None: from the saved chats) in a thread."""
        if self.store is None:
            raise SessionError("the lookup caches are not in use: turn ngram-cache (or Automatic) on first")
        if self._build_cancel is not None:
            raise SessionError("a static cache is already being built")
        # the saved chats are read here: the history belongs to the owner thread
        corpus = self._chats_corpus() if files is None else None
        if files is None and not corpus.strip():
            raise SessionError("there are no saved chats to learn from yet")
        self._build_cancel = threading.Event()
        self._start(self._build_thread, self.store, list(files) if files is not None else None, corpus,
                    self._build_cancel, name="build-static")

    def cancel_build(self) -> None:
        if self._build_cancel is not None:
            self._build_cancel.set()

    def _chats_corpus(self) -> str:
        if self.history is None:
            return ""
        parts = []
        for c in self.history.list_chats():
            with contextlib.suppress(KeyError):
                chat = self.history.load_chat(c.id)
                parts.extend(m.content for m in chat.messages if m.content.strip())
        return "\n\n".join(parts)

    def _build_thread(self, store: Any, files: list[str] | None, corpus: str | None,
                      cancel: threading.Event) -> None:
        from .lookup_store import BuildCancelled
        tmp = None
        try:
            if files is None:
                fd, tmp = tempfile.mkstemp(prefix="chats-", suffix=".txt", dir=str(store.folder))
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(corpus or "")
                files = [tmp]

            last = [0.0]

            def progress(done: int, total: int, name: str) -> None:
                now = time.perf_counter()
                if done >= total or now - last[0] > 0.1:
                    last[0] = now
                    self.post(StaticBuildProgress(done, total, "saved chats" if name == tmp else
                                                  os.path.basename(name)))
            res = store.build_static(files, progress=progress, cancel=cancel.is_set)
            self.post(StaticBuilt(dataclasses.asdict(res)))
        except BuildCancelled:
            self.post(StaticBuilt(None, "cancelled: the static cache was left as it was"))
        except Exception as e:
            self.post(StaticBuilt(None, describe(e)))
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _on_StaticBuilt(self, ev: StaticBuilt) -> None:
        self._build_cancel = None

    # -- the end ---------------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop the reply (saved as stopped), save the lookup caches, free the model, close the history."""
        if self.closed:
            return
        self.closed = True
        self._stop_warm()
        job = self.job
        if self.history is not None:
            # the last saves may wait a little longer for a lock another program holds
            with contextlib.suppress(HistoryError):
                self.history.set_timeout(self.HISTORY_WAIT_CLOSING_S)
        self._detach_job()
        if job is None:
            self._retry_unsaved()     # (a reply's save, just above, tried them)
        if self._build_cancel is not None:
            self._build_cancel.set()
        store, self.store = self.store, None
        engine, self.engine = self.engine, None
        from .runner import RunnerEngine
        if isinstance(engine, RunnerEngine):
            # the runner saves its lookup caches as it exits; one that does not exit in time (stuck
            # in native code) is killed: the caches were saved after the last reply
            engine.close(timeout=min(timeout, self.CLOSE_RUNNER_S))
        else:
            # an engine in this process: wait (briefly) for a reply thread to notice the cancel
            # before freeing the model
            if job is not None and job.thread is not None:
                job.thread.join(timeout)
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            if engine is not None and self.engine_lock.acquire(timeout=timeout):
                try:
                    engine.close()
                finally:
                    self.engine_lock.release()
        if self.history is not None:
            self.history.close()


def _model_key(m: ModelOptions) -> tuple:
    ngl = -1 if m.n_gpu_layers is None else m.n_gpu_layers   # None and -1 both mean "automatic"
    placement = tuple(getattr(m, k, None) for k in ("rpc", "device", "split_mode", "tensor_split", "main_gpu"))
    return (m.model or None, m.ctx_size, m.threads, ngl, getattr(m, "extra_bufts", "auto"), *placement)


def _is_crash(e: BaseException) -> bool:
    """The engine's process died (see :mod:`app.runner`)."""
    from .runner import RunnerCrashed
    return isinstance(e, RunnerCrashed)


def _engine_n_ctx(engine: Any) -> int:
    ctx = getattr(engine, "ctx", None)
    n = getattr(ctx, "n_ctx", None) or getattr(getattr(engine, "config", None), "n_ctx", None)
    return int(n or 4096)


# ---------------------------------------------------------------------------
# fitting the conversation into the context
# ---------------------------------------------------------------------------

class ContextOverflow(UserError):
    """The conversation (or one message) does not fit the context under the chosen policy."""


def system_tokens(engine: Any, messages: list[dict]) -> int:
    """Tokens the system prompt takes at the start of the prompt (1: just BOS, when there is none)."""
    if not messages or messages[0]["role"] != "system":
        return 1
    head = engine.prompt_tokens(messages=messages[:1])
    full = engine.prompt_tokens(messages=messages)
    n = 0
    while n < min(len(head), len(full)) and head[n] == full[n]:
        n += 1
    return max(1, n)


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the reply when older turns must go: a quarter of the context at most."""
    return max(1, min(max_tokens, n_ctx // 4))


def suggest_ctx(n_needed: int) -> int:
    """The next context size (a multiple of 256) that holds ``n_needed`` tokens and a reply."""
    n = max(256, n_needed + n_needed // 3)
    return -(-n // 256) * 256


def fit_to_context(engine: Any, messages: list[dict], max_tokens: int, policy: str,
                   turn_index: Sequence[int] | None = None) -> tuple[list[int], tuple[int, int] | None]:
    """The prompt for ``messages``, with older turns left out if it does not fit.

    Returns ``(prompt tokens, cut)``; ``cut`` is None when everything fits,
    else ``(index in turns of the first message kept, messages dropped)``
    (``turn_index[i]`` is the turn of the i-th non-system message). Whole
    messages are dropped, so the template's special tokens are never split:

    - ``rolling``: the oldest messages after the system prompt go first;
    - ``truncate-middle``: the first exchange stays, the ones after it go;
    - ``stop``: nothing is dropped; a conversation that does not fit is an error.

    The last message (the person's) always stays; if it cannot fit on its own,
    :class:`ContextOverflow` says by how much and which context size would do.
    """
    n_ctx = _engine_n_ctx(engine)
    prompt = engine.prompt_tokens(messages=messages)
    room = reply_room(n_ctx, max_tokens)
    if len(prompt) + room <= n_ctx:
        return prompt, None
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    body = messages[len(system):]
    last = body[-1:]
    alone = engine.prompt_tokens(messages=system + last)
    if len(alone) + room > n_ctx:
        need = len(alone) + room
        raise ContextOverflow(
            f"this message needs {len(alone)} tokens of context (with the system prompt) plus room for "
            f"the reply, {need} in all, but the context holds {n_ctx}; shorten it, or raise the context "
            f"size to {suggest_ctx(need)} (settings F3, or -c {suggest_ctx(need)})")
    if policy == "stop":
        if len(prompt) < n_ctx - 1:
            return prompt, None   # the reply stops when the context is full
        raise ContextOverflow(
            f"the conversation has {len(prompt)} tokens and the context holds {n_ctx} (with room for a reply); "
            f"start a new chat (Ctrl+N), raise the context size, or choose a rolling window in settings (F3)")
    # drop whole messages, oldest first (after the first exchange for truncate-middle); pairs stay
    # together where they can, so the model never sees a reply without its question
    keep_head = 2 if policy == "truncate-middle" and len(body) > 3 else 0
    head = body[:keep_head]

    def build(k: int) -> list[dict]:
        return system + head + body[keep_head + k:]

    lo, hi = 1, len(body) - keep_head - 1   # drop k messages from the middle/oldest; the last stays
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        toks = engine.prompt_tokens(messages=build(mid))
        if len(toks) + room <= n_ctx:
            best, hi = (mid, toks), mid - 1
        else:
            lo = mid + 1
    if best is None:
        k = len(body) - keep_head - 1
        best = (k, engine.prompt_tokens(messages=build(k)))
    k, toks = best
    # a kept reply whose question was dropped: drop it too (never start with the model's own words)
    if keep_head + k < len(body) - 1 and body[keep_head + k]["role"] == "assistant":
        k += 1
        toks = engine.prompt_tokens(messages=build(k))
    first_kept_msg = keep_head + k
    idx = list(turn_index) if turn_index is not None else list(range(len(body)))
    first_kept = idx[first_kept_msg] if first_kept_msg < len(idx) else (idx[-1] if idx else 0)
    return toks, (first_kept, k)
