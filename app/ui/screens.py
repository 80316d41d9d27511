"""Screens: help, settings, chats, and small dialogs (confirm, text prompt)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Label, OptionList, ProgressBar, Static, Switch, TextArea
from textual.widgets.option_list import Option

from speculators.params import ParamError, SpecParams
from speculators.sampling import SamplingParams
from speculators.descriptor import Have, descriptors
from speculators.types import PRIORITY, LiveMapping, SpecType

from ..config import default_sampling
from ..options import ModelOptions
from ..storage import ChatSummary


# ---------------------------------------------------------------------------
# small dialogs
# ---------------------------------------------------------------------------

class ConfirmScreen(ModalScreen[bool]):
    """Yes/no; Enter or y confirms, Esc or n cancels."""

    BINDINGS = [Binding("escape,n", "cancel", "Cancel"), Binding("y", "confirm", "Confirm")]

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 60; max-width: 90%; height: auto; padding: 1 2;
        border: round $error; background: $surface; }
    ConfirmScreen .question { margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """

    def __init__(self, question: str, confirm_label: str = "Delete"):
        super().__init__()
        self.question = question
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, classes="question")
            with Horizontal():
                yield Button("Cancel", id="no")
                yield Button(self.confirm_label, variant="error", id="yes")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_confirm(self) -> None:
        self.dismiss(True)


class TextPromptScreen(ModalScreen[str | None]):
    """Ask for a line (or, with ``multiline``, a block) of text; None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save", show=False)]

    DEFAULT_CSS = """
    TextPromptScreen { align: center middle; }
    TextPromptScreen > Vertical { width: 76; max-width: 95%; height: auto; padding: 1 2;
        border: round $primary; background: $surface; }
    TextPromptScreen .title { text-style: bold; color: $primary; }
    TextPromptScreen .hint { color: $text-muted; margin-bottom: 1; }
    TextPromptScreen TextArea { height: 8; }
    TextPromptScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    TextPromptScreen Button { margin-left: 2; }
    """

    def __init__(self, title: str, value: str = "", *, hint: str = "", multiline: bool = False,
                 ok_label: str = "Save"):
        super().__init__()
        self.title_text = title
        self.value = value
        self.hint = hint
        self.multiline = multiline
        self.ok_label = ok_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            if self.hint:
                yield Static(self.hint, classes="hint")
            if self.multiline:
                yield TextArea(self.value, id="value", soft_wrap=True, tab_behavior="focus")
            else:
                yield Input(self.value, id="value")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button(self.ok_label, variant="primary", id="ok")

    def on_mount(self) -> None:
        self.query_one("#value").focus()

    def _value(self) -> str:
        w = self.query_one("#value")
        return w.text if isinstance(w, TextArea) else w.value  # type: ignore[attr-defined]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(self._value())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(self._value() if event.button.id == "ok" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        self.dismiss(self._value())


# ---------------------------------------------------------------------------
# help
# ---------------------------------------------------------------------------

class HelpScreen(ModalScreen[None]):
    """Every action with its key (the same list feeds the bindings and the command palette)."""

    BINDINGS = [Binding("escape,f1,q", "close", "Close")]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 78; max-width: 96%; height: 90%; padding: 1 2;
        border: round $primary; background: $surface; }
    HelpScreen .title { text-style: bold; color: $primary; }
    HelpScreen .group { text-style: bold; color: $secondary; margin-top: 1; }
    HelpScreen .row { height: auto; }
    HelpScreen .key { width: 23; padding-left: 2; text-style: bold; color: $accent; }
    HelpScreen .desc { width: 1fr; }
    HelpScreen .foot { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, rows: Sequence[tuple[str, str, str]]):
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        # a key column and a description column: a long description wraps inside its own column
        with VerticalScroll():
            yield Static("Keys", classes="title")
            group = None
            for g, key, desc in self.rows:
                if g != group:
                    group = g
                    yield Static(g, classes="group")
                with Horizontal(classes="row"):
                    yield Static(key, classes="key")
                    yield Static(desc, classes="desc")
            yield Static("Every action is also in the command palette (Ctrl+P). Esc closes this.", classes="foot")

    def action_close(self) -> None:
        self.dismiss(None)


# ---------------------------------------------------------------------------
# chats
# ---------------------------------------------------------------------------

def _ago(t: float) -> str:
    d = max(0.0, time.time() - t)
    if d < 60:
        return "just now"
    if d < 3600:
        return f"{int(d // 60)} min ago"
    if d < 86400:
        return f"{int(d // 3600)} h ago"
    return time.strftime("%Y-%m-%d", time.localtime(t))


def chat_labels(chats: Sequence[ChatSummary]) -> dict[int, tuple[str, str]]:
    """Per chat id: the title to show and, for titles that repeat, when it was started; the
    second and later chats of a title are numbered in the order they were started::

        >>> from app.storage import ChatSummary
        >>> cs = [ChatSummary(3, "Hello", 30.0, 20.0, 2), ChatSummary(2, "Plan", 10.0, 9.0, 4),
        ...       ChatSummary(1, "Hello", 5.0, 1.0, 2)]
        >>> [chat_labels(cs)[c.id][0] for c in cs]          # the list, newest first
        ['Hello (2)', 'Plan', 'Hello']
        >>> chat_labels(cs)[2][1]
        ''
    """
    by_title: dict[str, list[ChatSummary]] = {}
    for c in chats:
        by_title.setdefault(c.title, []).append(c)
    out: dict[int, tuple[str, str]] = {}
    for title, same in by_title.items():
        if len(same) == 1:
            out[same[0].id] = (title, "")
            continue
        for n, c in enumerate(sorted(same, key=lambda c: (c.created, c.id)), 1):
            out[c.id] = (title if n == 1 else f"{title} ({n})",
                         time.strftime("%Y-%m-%d %H:%M", time.localtime(c.created)))
    return out


@dataclass
class ChatsResult:
    """What the person chose in the chats list: ``resume``, ``new`` or ``export`` (with the chat)."""

    action: str
    chat_id: int | None = None


class ChatsScreen(ModalScreen[ChatsResult | None]):
    """Saved chats, newest first: resume, new, rename, delete, export.

    It is given the list and the open chat; it dismisses with a :class:`ChatsResult`.
    Renaming and deleting keep the list open: they are posted as :class:`ChatsScreen.Rename`
    and :class:`ChatsScreen.Delete`, and whoever does them calls :meth:`set_chats` with the new list.
    """

    BINDINGS = [
        Binding("escape,f2", "close", "Close"),
        Binding("enter", "resume", "Resume"),
        Binding("n", "new", "New"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("e", "export", "Export"),
    ]

    DEFAULT_CSS = """
    ChatsScreen { align: center middle; }
    ChatsScreen > Vertical { width: 84; max-width: 96%; height: 85%; padding: 0 1;
        border: round $primary; background: $surface; }
    ChatsScreen .title { text-style: bold; color: $primary; padding: 0 1; }
    ChatsScreen OptionList, ChatsScreen OptionList:focus { height: 1fr; border: none; background: $surface;
        padding: 0; }
    ChatsScreen .hint { color: $text-muted; padding: 0 1; }
    ChatsScreen Footer { dock: bottom; }
    """

    class Rename(Message):
        def __init__(self, chat_id: int, title: str):
            super().__init__()
            self.chat_id = chat_id
            self.title = title

    class Delete(Message):
        def __init__(self, chat_id: int):
            super().__init__()
            self.chat_id = chat_id

    def __init__(self, chats: Sequence[ChatSummary], current: int | None = None):
        super().__init__()
        self.chats = list(chats)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Chats", classes="title")
            yield OptionList(id="chats")
            yield Static(Content.assemble(
                ("Enter", "bold $accent"), " resume  ", ("n", "bold $accent"), " new  ",
                ("r", "bold $accent"), " rename  ", ("d", "bold $accent"), " delete  ",
                ("e", "bold $accent"), " export  ", ("Esc", "bold $accent"), " close"), classes="hint")
        # this screen's own keys (the chat's are not usable here)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.refresh_list(select=self.current)
        self.query_one(OptionList).focus()

    def set_chats(self, chats: Sequence[ChatSummary], current: int | None = None,
                  select: int | None = None) -> None:
        self.chats = list(chats)
        self.current = current
        self.refresh_list(select)

    def refresh_list(self, select: int | None = None) -> None:
        ol = self.query_one(OptionList)
        ol.clear_options()
        labels = chat_labels(self.chats)
        for c in self.chats:
            mark = "● " if c.id == self.current else "  "
            title, started = labels[c.id]
            # the subtitle is dimmed, not given a colour: it stays readable on the highlighted row
            sub = f"    {_ago(c.updated)} · {c.n_messages} messages" + (f" · started {started}" if started else "")
            prompt = Content.assemble((mark, "$accent"), (title, "bold"), "\n", (sub, "dim"))
            ol.add_option(Option(prompt, id=str(c.id)))
        if not self.chats:
            ol.add_option(Option(Content.styled("No saved chats yet — send a message to start one.", "dim"),
                                 id="none", disabled=True))
        if self.chats:
            idx = 0
            if select is not None:
                for i, c in enumerate(self.chats):
                    if c.id == select:
                        idx = i
            ol.highlighted = idx

    def _selected(self) -> int | None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            # a key pressed before the list was highlighted (Enter right after F2): the row the
            # list opens on, this chat's or the newest
            if not self.chats:
                return None
            return self.current if any(c.id == self.current for c in self.chats) else self.chats[0].id
        opt = ol.get_option_at_index(ol.highlighted)
        if opt.id in (None, "none"):
            return None
        return int(opt.id)

    def _title(self, cid: int) -> str:
        return next((c.title for c in self.chats if c.id == cid), "")

    @on(OptionList.OptionSelected)
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_resume()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_resume(self) -> None:
        cid = self._selected()
        if cid is not None:
            self.dismiss(ChatsResult("resume", cid))

    def action_new(self) -> None:
        self.dismiss(ChatsResult("new"))

    def action_rename(self) -> None:
        cid = self._selected()
        if cid is None:
            return

        def done(value: str | None) -> None:
            if value is not None and value.strip():
                self.post_message(self.Rename(cid, value.strip()))
        self.app.push_screen(TextPromptScreen("Rename chat", self._title(cid)), done)

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.post_message(self.Delete(cid))
        self.app.push_screen(ConfirmScreen(f"Delete the chat “{self._title(cid)}”? This cannot be undone."), done)

    def action_export(self) -> None:
        cid = self._selected()
        if cid is not None:
            self.dismiss(ChatsResult("export", cid))


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------

#: each type's one line (its descriptor's ``info``), in priority order
SPEC_INFO: Mapping[SpecType, str] = LiveMapping(lambda: {d.type: d.info for d in descriptors()})

#: (key, label, kind) — key is "section.name" of SpecParams / "sampling.x" / "model.x"
Field = tuple[str, str, str]

#: each type's fields (its descriptor's ``fields``), for the types that have some
SPEC_FIELDS: Mapping[SpecType, list[Field]] = LiveMapping(
    lambda: {d.type: [(f.key, f.label, f.kind) for f in d.fields] for d in descriptors() if d.fields})

#: the spec fields' own hints (the others say their default)
_SPEC_HINTS: Mapping[str, str] = LiveMapping(
    lambda: {f.key: f.hint for d in descriptors() for f in d.fields if f.hint})

SAMPLING_FIELDS: list[Field] = [
    ("sampling.temperature", "temperature", "float"),
    ("sampling.top_k", "top-k", "int"),
    ("sampling.top_p", "top-p", "float"),
    ("sampling.min_p", "min-p", "float"),
    ("sampling.seed", "seed", "seed"),
]

OVERFLOW_CHOICES: list[tuple[str, str]] = [
    ("rolling", "Rolling window: leave out the oldest messages (the system prompt stays)"),
    ("truncate-middle", "Truncate the middle: keep the first exchange, leave out the ones after it"),
    ("stop", "Stop: say so, and let me start a new chat or raise the context size"),
]

MODEL_FIELDS: list[Field] = [
    ("model.model", "model file", "path"),
    ("model.ctx_size", "context size", "int"),
    ("model.n_gpu_layers", "GPU layers", "ngl"),
    ("model.threads", "threads", "optint"),
    ("model.rpc", "RPC servers", "str"),
    ("model.device", "devices", "str"),
    ("model.tensor_split", "tensor split", "str"),
    ("chat.max_tokens", "max reply tokens", "int"),
]

_DEFAULT_SPEC = SpecParams()
_DEFAULT_SAMPLING = default_sampling()


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj: Any, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    setattr(obj, parts[-1], value)


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "seed" and value == 0xFFFFFFFF:
        return ""
    if kind == "ngl" and value == -1:
        return "auto"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _parse(text: str, kind: str) -> Any:
    """Parse a field; raises ValueError with a short message."""
    t = text.strip()
    if kind == "path":
        return os.path.expanduser(t) if t else None
    if kind == "str":
        return t or None
    if kind == "optint":
        if not t or t == "auto":
            return None
        kind = "int"
    if kind == "seed":
        if not t or t == "random":
            return 0xFFFFFFFF
        kind = "int"
    if kind == "ngl":
        if t in ("", "auto"):
            return -1
        if t == "all":
            return 999
        kind = "int"
    if kind == "int":
        try:
            return int(t)
        except ValueError:
            raise ValueError("expected a whole number") from None
    if kind == "float":
        try:
            v = float(t)
        except ValueError:
            raise ValueError("expected a number") from None
        if not math.isfinite(v):
            raise ValueError("expected a finite number")
        return v
    return t


def _hint(key: str, kind: str) -> str:
    section, name = key.split(".", 1)
    if section == "sampling":
        d = getattr(_DEFAULT_SAMPLING, name)
    elif section == "model":
        return {"model.model": "empty: the embedded default model",
                "model.ctx_size": "default 4096 · 0: the model's own",
                "model.n_gpu_layers": "auto, all or a number",
                "model.threads": "empty: physical cores",
                "model.rpc": "HOST:PORT,… · trusted networks only",
                "model.device": "empty: all below · none: CPU only",
                "model.tensor_split": "e.g. 3,1 · empty: by free memory"}.get(key, "")
    elif section == "chat":
        return "default 1024"
    else:
        d = _get(_DEFAULT_SPEC, key)
    if kind == "seed":
        return "empty: random"
    if key in _SPEC_HINTS:
        return _SPEC_HINTS[key]
    if kind == "path":
        return "optional"
    return f"default {_fmt(d, kind)}"


_TYPES_CACHE: dict[str, tuple[str | None, list[str]]] = {}


def gguf_kind(path: str | None) -> tuple[str | None, list[str]]:
    """(architecture, model-based spec types the file supports), from its header; cached."""
    if not path:
        return None, []
    key = str(path)
    if key not in _TYPES_CACHE:
        try:
            from speculators.gguf_detect import types_from_info, read_gguf
            info = read_gguf(key, tensors=True)
            _TYPES_CACHE[key] = (info.architecture, [t.value for t in types_from_info(info)])
        except Exception:
            _TYPES_CACHE[key] = (None, [])
    return _TYPES_CACHE[key]


def model_has_mtp(engine: Any) -> bool:
    path = getattr(getattr(engine, "model", None), "path", None)
    return SpecType.DRAFT_MTP.value in gguf_kind(path)[1]


def registered_types() -> set[str]:
    """Types the speculators package implements."""
    from speculators.chain import implemented_types
    return {t.value for t in implemented_types()}


#: how the settings pane names the drafter a type needs (its descriptor's ``drafter_label``)
_DRAFTER_LABEL: Mapping[SpecType, str] = LiveMapping(
    lambda: {d.type: d.drafter_label for d in descriptors() if d.drafter_label})


def availability(engine: Any, draft_model: str | None) -> dict[str, str | None]:
    """For each type, why it cannot be used now (None: it can): what its descriptor needs."""
    skipped = dict(getattr(getattr(engine, "chain", None), "skipped", {}) or {})
    impl = registered_types()
    arch, drafter_types = gguf_kind(draft_model) if draft_model and Path(draft_model).is_file() else (None, [])
    target_path = getattr(getattr(engine, "model", None), "path", None)
    have = Have(target_types=frozenset(gguf_kind(target_path)[1]), draft_model=draft_model or None,
                draft_arch=arch, draft_types=frozenset(drafter_types))
    out: dict[str, str | None] = {}
    for d in descriptors():
        reason: str | None = None
        if impl is not None and d.name not in impl:
            reason = "not implemented in this version of draftlight"
        else:
            reason = d.needs.missing(d, have)
        if reason is None and d.name in skipped:
            reason = skipped[d.name]
        out[d.name] = reason
    return out


def discover_draft_models(engine: Any) -> list[tuple[str, str]] | None:
    """Draft-model candidates on disk as (path, note), from app.model_discovery (None: no picker)."""
    try:
        from ..model_discovery import find_gguf_models
    except Exception:
        return None
    target = getattr(engine, "model", None)
    target_path = str(getattr(target, "path", "") or "")
    out: list[tuple[str, str]] = []
    for c in find_gguf_models():
        if target_path and os.path.realpath(c.path) == os.path.realpath(target_path):
            continue
        note = c.display_name
        if c.size:
            note += f" · {c.size / 2**20:.0f} MiB"
        if c.spec_types:
            note += " · " + ", ".join(t.value for t in c.spec_types)
        try:
            # the loaded model where this process has it, else its file (the runner holds the model)
            ref = target if hasattr(target, "ptr") else target_path
            verdict = c.compatibility_with(ref) if ref else None
        except Exception as e:  # a file that cannot be checked is shown with why
            verdict = None
            note += f" · {e}"
        if verdict is not None:
            note += " · compatible" if verdict.ok else f" · ✗ {verdict.reason}"
        out.append((str(c.path), note))
    return out


def devices_text(devices: Any) -> str:
    """The devices the model was loaded with (RPC servers' included), with their memory then.

    >>> from speculators.devices import Device
    >>> print(devices_text([Device("CPU", "Xeon", "CPU", 2 << 30, 4 << 30),
    ...                     Device("RPC0", "10.0.0.2:50052", "RPC", 1 << 30, 8 << 30, "10.0.0.2:50052")]))
    Devices when the model was loaded (names for the fields above):
      CPU      Xeon · 2,048 MiB free of 4,096 MiB
      RPC0     on 10.0.0.2:50052 · 1,024 MiB free of 8,192 MiB
    """
    if not devices:
        return "Devices: shown once the model is loaded."
    lines = ["Devices when the model was loaded (names for the fields above):"]
    for d in devices:
        where = f"on {d.endpoint}" if d.endpoint else d.description
        lines.append(f"  {d.name:<8} {where} · {d.memory_text()}")
    return "\n".join(lines)


@dataclass
class SettingsResult:
    spec: SpecParams
    sampling: SamplingParams
    model: ModelOptions
    max_tokens: int
    overflow: str = "rolling"


#: llama.cpp makes a context a multiple of this (llama_context pads n_ctx: -c 128 gives 256)
CTX_PAD = 256


def ctx_in_use(asked: int, n_ctx_train: int = 0) -> int | None:
    """The context size llama.cpp makes of ``-c asked`` (None: not known here, for 0 without the
    model's own)::

        >>> [ctx_in_use(n) for n in (128, 256, 300, 4096)]
        [256, 256, 512, 4096]
        >>> ctx_in_use(0, 32768), ctx_in_use(0)
        (32768, None)
    """
    n = asked or n_ctx_train
    return -(-n // CTX_PAD) * CTX_PAD if n > 0 else None


def ctx_hint(asked: int | None, in_use: int | None) -> str:
    """The note beside the context size: the size in use, and why it is not the one asked for.

    >>> ctx_hint(128, 256)
    'asked for 128: llama.cpp rounds up to a multiple of 256'
    >>> print(ctx_hint(4096, 4096))
    in use · default 4096 · 0: the model's own
    >>> ctx_hint(300, None)
    'llama.cpp will use 512 (a multiple of 256)'
    """
    if in_use is not None and asked is not None and asked != in_use:
        if asked == 0:
            return "0 asked for the model's own"
        return f"asked for {asked}: llama.cpp rounds up to a multiple of {CTX_PAD}"
    if in_use is not None:
        return "in use · " + _hint("model.ctx_size", "int")
    if asked and ctx_in_use(asked) != asked:
        return f"llama.cpp will use {ctx_in_use(asked)} (a multiple of {CTX_PAD})"
    return _hint("model.ctx_size", "int")


def collect_errors(spec: SpecParams, sampling: SamplingParams) -> dict[str, str]:
    """Every out-of-range value (validate() stops at the first; reset it and go on)."""
    errors: dict[str, str] = {}
    s = spec.copy()
    for _ in range(64):
        try:
            s.validate()
            break
        except ParamError as e:
            errors.setdefault(e.field, e.message)
            if "." in e.field:
                try:
                    _set(s, e.field, _get(_DEFAULT_SPEC, e.field))
                    continue
                except AttributeError:
                    pass
            break
    sm = dataclasses.replace(sampling)
    for _ in range(8):
        try:
            sm.validate()
            break
        except ParamError as e:
            errors.setdefault(f"sampling.{e.field}", e.message)
            try:
                setattr(sm, e.field, getattr(_DEFAULT_SAMPLING, e.field))
            except AttributeError:
                break
    return errors


class FieldRow(Horizontal):
    """label · input · hint or error, on one line."""

    DEFAULT_CSS = """
    FieldRow { height: auto; margin-left: 4; }
    FieldRow > .f-label { width: 20; color: $text-muted; }
    FieldRow > Input { width: 12; }
    FieldRow.-wide > Input { width: 1fr; max-width: 44; }
    FieldRow > .f-note { width: 1fr; color: $text-muted; padding-left: 2; }
    FieldRow.-wide > .f-note { width: 1fr; }
    FieldRow > .f-note.-error { color: $error; text-style: bold; }
    """

    def __init__(self, key: str, label: str, kind: str, value: str, hint: str | None = None):
        super().__init__(classes="-wide" if kind in ("path", "str") else "")
        self.key = key
        self.kind = kind
        self.label = label
        self.value = value
        #: the note beside the field when its value is valid
        self.hint = hint if hint is not None else _hint(key, kind)

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="f-label")
        yield Input(self.value, compact=True, id="f-" + self.key.replace(".", "--"))
        yield Static(self.hint, classes="f-note")

    def set_error(self, message: str | None) -> None:
        note = self.query_one(".f-note", Static)
        if message:
            note.update(f"✗ {message}")
            note.add_class("-error")
        else:
            note.update(self.hint)
            note.remove_class("-error")


class SettingsScreen(Screen[SettingsResult | None]):
    """Speculation (every type in priority order), sampling, and model settings."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "apply", "Apply", priority=True),
        Binding("f3", "cancel", "Close", show=False),
    ]

    DEFAULT_CSS = """
    SettingsScreen { background: $background; }
    SettingsScreen > .s-title { dock: top; height: 1; background: $panel; padding: 0 1; color: $primary;
        text-style: bold; }
    SettingsScreen > VerticalScroll { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    SettingsScreen .type-params { height: auto; }
    SettingsScreen .s-section { margin-top: 1; color: $secondary; text-style: bold; }
    SettingsScreen .s-note { color: $text-muted; margin-left: 2; }
    SettingsScreen .type-row { height: auto; margin-top: 1; }
    SettingsScreen Switch { border: none; padding: 0; height: 1; width: 6; margin-right: 1; margin-left: 1; }
    SettingsScreen Switch:focus { border: none; background-tint: $foreground 0%; text-style: reverse; }
    SettingsScreen .t-name { width: 16; text-style: bold; }
    SettingsScreen .t-desc { width: 1fr; color: $text-muted; }
    SettingsScreen .type-row.-unavailable .t-name { color: $text-disabled; }
    SettingsScreen .type-row.-unavailable .t-desc { color: $warning; }
    SettingsScreen .type-params.-off FieldRow > .f-label { color: $text-disabled; }
    SettingsScreen .s-bottom { dock: bottom; height: 1; padding: 0 1; background: $panel; }
    SettingsScreen .s-bottom Horizontal { height: auto; align-horizontal: right; }
    SettingsScreen .s-bottom Button { margin-left: 2; min-width: 10; }
    SettingsScreen #s-status { width: 1fr; color: $text-muted; }
    SettingsScreen #s-status.-error { color: $error; }
    SettingsScreen #overflow { height: auto; margin: 0 2; border: none; background: $background; }
    SettingsScreen .lookup-actions { height: auto; margin: 1 2 0 2; }
    SettingsScreen .lookup-actions Button { margin-right: 2; }
    SettingsScreen #lc-paths { margin: 0 2; }
    SettingsScreen #lc-progress { margin: 0 2; }
    SettingsScreen .s-note { width: 1fr; }
    SettingsScreen #drafts { height: auto; max-height: 10; margin: 0 4 0 4; display: none;
        border: round $panel; border-title-color: $foreground-muted; }
    """

    class BuildStatic(Message):
        """Build the static lookup cache from ``files`` (None: from the saved chats)."""

        def __init__(self, files: list[str] | None):
            super().__init__()
            self.files = files

    class CancelBuild(Message):
        pass

    def __init__(self, spec: SpecParams, sampling: SamplingParams, model: ModelOptions, max_tokens: int,
                 engine: Any, *, overflow: str = "rolling", lookup: dict | None = None,
                 n_ctx: int | None = None):
        super().__init__()
        #: the context size the loaded model runs with (llama.cpp rounds the one asked for up)
        self.n_ctx = n_ctx
        self.overflow = overflow
        self.lookup = lookup
        self._building = False
        self.spec = spec.copy()
        self.sampling = dataclasses.replace(sampling)
        self.model_opts = ModelOptions(**model.__dict__)
        self.max_tokens = max_tokens
        self.engine = engine
        self.errors: dict[str, str] = {}
        self.reasons: dict[str, str | None] = {}
        self._revalidate_pending = False
        self._ready = False
        self._dismissing = False
        #: Ctrl+S pressed before the form was all mounted: applied once it is
        self._apply_when_ready = False
        self._to_mount: Iterator[list[Widget]] = iter(())

    # -- building ------------------------------------------------------------------
    def _value(self, key: str, kind: str) -> str:
        section, name = key.split(".", 1)
        if section == "sampling":
            return _fmt(getattr(self.sampling, name), kind)
        if section == "model":
            if name == "ctx_size" and self.n_ctx:
                return str(self.n_ctx)   # the size in use; the hint says what was asked for
            return _fmt(getattr(self.model_opts, name), kind)
        if section == "chat":
            return str(self.max_tokens)
        return _fmt(_get(self.spec, key), kind)

    # The pane holds some two hundred widgets, and Textual lays a widget out in a few
    # milliseconds: composed at once, they would hold the UI thread for a second or two on a busy
    # machine. So the pane opens with its frame and the first group (Automatic and the first
    # type), and mounts the rest one group per turn of the UI loop (``_mount_next``): a key
    # pressed meanwhile is answered between two groups. Until the last group is in, the form is
    # not read (``ready`` is False): the status line says "opening…", Apply waits for it.

    def compose(self) -> ComposeResult:
        self.reasons = availability(self.engine, self.spec.draft.model)
        self._to_mount = self._groups()
        yield Static("Settings", classes="s-title")
        yield VerticalScroll(*next(self._to_mount), id="s-scroll")
        with Vertical(classes="s-bottom"):
            with Horizontal():
                yield Static("opening…", id="s-status")
                yield Button("Cancel", id="s-cancel", compact=True)
                yield Button("Apply  ^S", variant="primary", id="s-apply", compact=True, disabled=True)

    def _groups(self) -> Iterator[list[Widget]]:
        """The scroll's widgets in the order they show, one list per group mounted at once (each
        built when it is mounted: a switch reads the form as it is then)."""
        yield [Static("Speculation", classes="s-section"),
               Horizontal(Switch(value=self.spec.is_auto, id="sw-auto"),
                          Label("Automatic", classes="t-name"),
                          Static("draftlight picks the types this model can use and drafts only where it "
                                 "is expected to pay (recommended)", classes="t-desc"),
                          classes="type-row", id="row-auto"),
               Static(self._auto_text(), classes="s-note", id="auto-plan"),
               Static("Or choose by hand (Automatic off). Types are asked in this order; the first one "
                      "with a draft wins.", classes="s-note")]
        for t in PRIORITY:
            yield self._type_group(t)
        yield [Static("Sampling", classes="s-section"),
               *(FieldRow(key, label, kind, self._value(key, kind)) for key, label, kind in SAMPLING_FIELDS)]
        yield [Static("Model", classes="s-section"),
               Static("Changing these reloads the model; speculation and sampling do not.", classes="s-note"),
               *(FieldRow(key, label, kind, self._value(key, kind),
                          hint=ctx_hint(self.model_opts.ctx_size, self.n_ctx) if key == "model.ctx_size" else None)
                 for key, label, kind in MODEL_FIELDS),
               Static(devices_text(getattr(self.engine, "devices", None)), classes="s-note", id="devices")]
        yield self._overflow_and_lookup_group()

    def _type_group(self, t: SpecType) -> list[Widget]:
        """One speculation type's row (its switch, name and what it does, or why it cannot be
        used) and its parameters."""
        reason = self.reasons.get(t.value)
        on = t.value in self._form_types()
        row = Horizontal(Switch(value=on and reason is None, disabled=reason is not None or self._form_auto(),
                                id=f"sw-{t.value}"),
                         Label(t.value, classes="t-name"),
                         Static(reason or SPEC_INFO.get(t, ""), classes="t-desc", id=f"desc-{t.value}"),
                         classes="type-row" + (" -unavailable" if reason else ""), id=f"row-{t.value}")
        fields = SPEC_FIELDS.get(t, [])
        if not fields:
            return [row]
        params: list[Widget] = [FieldRow(key, label, kind, self._value(key, kind)) for key, label, kind in fields]
        if t is SpecType.DRAFT_SIMPLE:
            params.append(OptionList(id="drafts"))
        return [row, Vertical(*params, classes="type-params" + ("" if on else " -off"), id=f"params-{t.value}")]

    def _overflow_and_lookup_group(self) -> list[Widget]:
        overflow = OptionList(*[Option(label, id=f"ov-{name}") for name, label in OVERFLOW_CHOICES], id="overflow")
        names = [n for n, _ in OVERFLOW_CHOICES]
        overflow.highlighted = names.index(self.overflow) if self.overflow in names else 0
        paths = Input(placeholder="files to learn from, separated by ;  then press Enter", id="lc-paths")
        progress = ProgressBar(total=None, show_eta=False, id="lc-progress")
        paths.display = progress.display = False
        return [Static("When the conversation outgrows the context", classes="s-section"), overflow,
                Static("Lookup caches (ngram-cache)", classes="s-section"),
                Static(self._lookup_text(), classes="s-note", id="lookup-info"),
                Horizontal(Button("Build static cache from saved chats", id="lc-chats", compact=True,
                                  disabled=not self.lookup),
                           Button("…from files", id="lc-files", compact=True, disabled=not self.lookup),
                           Button("Stop building", id="lc-cancel", compact=True, disabled=True),
                           classes="lookup-actions"),
                paths, progress]

    @property
    def ready(self) -> bool:
        """Whether every group of the form is mounted (and the form can be read)."""
        return self._ready

    def on_mount(self) -> None:
        self.query_one("#sw-auto", Switch).focus()
        self.call_later(self._mount_next)

    async def _mount_next(self) -> None:
        if self._ready or self._dismissing:
            return
        group = next(self._to_mount, None)
        if group is not None:
            await self.query_one("#s-scroll", VerticalScroll).mount_all(group)
            self.call_later(self._mount_next)
            return
        self._ready = True
        self._revalidate()
        self._offer_drafts()
        if self._apply_when_ready:
            self.action_apply()

    @work(thread=True, exclusive=True, group="drafts", exit_on_error=False)
    def _offer_drafts(self) -> None:
        try:
            found = discover_draft_models(self.engine)
        except Exception:
            found = None
        if found:
            self.app.call_from_thread(self._show_drafts, found)

    def _show_drafts(self, found: list[tuple[str, str]]) -> None:
        ol = self.query_one("#drafts", OptionList)
        ol.border_title = "GGUF models on this machine (Enter picks one)"
        ol.clear_options()
        for path, note in found:
            ol.add_option(Option(Content.assemble((Path(path).name, "bold"), "\n",
                                                  (f"  {note}", "$foreground-muted")), id=path))
        ol.display = True

    @on(OptionList.OptionSelected, "#drafts")
    def _draft_picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.query_one("#f-draft--model", Input).value = event.option.id

    # -- reading the form ------------------------------------------------------------
    def read_form(self) -> tuple[SettingsResult, dict[str, str]]:
        spec = self.spec.copy()
        sampling = dataclasses.replace(self.sampling)
        model = ModelOptions(**self.model_opts.__dict__)
        max_tokens = self.max_tokens
        errors: dict[str, str] = {}
        for row in self.query(FieldRow):
            text = row.query_one(Input).value
            try:
                value = _parse(text, row.kind)
            except ValueError as e:
                errors[row.key] = str(e)
                continue
            section, name = row.key.split(".", 1)
            if section == "sampling":
                setattr(sampling, name, value)
            elif section == "model":
                if name == "ctx_size" and self.n_ctx and value == self.n_ctx:
                    value = self.model_opts.ctx_size   # the size in use, as shown: no change
                if name == "ctx_size" and value < 0:
                    errors[row.key] = "must be >= 0"
                if name == "threads" and value is not None and value < 1:
                    errors[row.key] = "must be at least 1 (empty: automatic)"
                if name == "n_gpu_layers" and value < -1:
                    errors[row.key] = "must be -1 (auto) or more"
                if name == "model" and value and not Path(value).is_file():
                    errors[row.key] = "no such file"
                setattr(model, name, value)
                if name in ("rpc", "tensor_split") and value:
                    from ..options import check_placement
                    try:
                        check_placement(ModelOptions(**{name: value}))
                    except ParamError as e:
                        errors[row.key] = e.message
            elif section == "chat":
                if value < 1:
                    errors[row.key] = "must be at least 1"
                max_tokens = value
            else:
                if row.kind == "path" and name == "lookup_cache_static" and value and not Path(value).is_file():
                    errors[row.key] = "no such file"
                if row.kind == "path" and name == "model" and value and not Path(value).is_file():
                    errors[row.key] = "no such file"
                _set(spec, row.key, value)
        types = []
        for t in PRIORITY:
            sw = self.query_one(f"#sw-{t.value}", Switch)
            if sw.value and not sw.disabled:
                types.append(t)
        spec.types = [SpecType.AUTO] if self.query_one("#sw-auto", Switch).value else types
        for k, v in collect_errors(spec, sampling).items():
            errors.setdefault(k, v)
        ol = self.query_one("#overflow", OptionList)
        overflow = self.overflow
        if ol.highlighted is not None:
            overflow = (ol.get_option_at_index(ol.highlighted).id or "ov-rolling")[3:]
        return SettingsResult(spec, sampling, model, max_tokens, overflow), errors

    def _revalidate(self) -> bool:
        """Check the form and say what is wrong beside each field (False: something is, or the
        form is still being mounted)."""
        if not self._ready:
            return False
        result, errors = self.read_form()
        self.errors = errors
        for row in self.query(FieldRow):
            row.set_error(errors.get(row.key))
        unplaced = [f"{k}: {v}" for k, v in errors.items()
                    if not self.query(f"#f-{k.replace('.', '--')}")]
        status = self.query_one("#s-status", Static)
        if errors:
            status.update(f"{len(errors)} value{'s' if len(errors) != 1 else ''} to fix"
                          + (f" — {'; '.join(unplaced)}" if unplaced else ""))
            status.add_class("-error")
        else:
            on = [t.value for t in result.spec.types]
            status.update("speculation: " + ("automatic" if result.spec.is_auto else ", ".join(on) if on else "off"))
            status.remove_class("-error")
        self.query_one("#s-apply", Button).disabled = bool(errors)
        return not errors

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        if event.input.id == "f-draft--model" and self.is_mounted:
            self._update_draft_availability(event.value.strip())
        if event.input.id == "f-model--ctx_size" and isinstance(event.input.parent, FieldRow):
            try:
                asked = int(event.value.strip())
            except ValueError:
                asked = None
            shown = asked == self.n_ctx and self.n_ctx is not None
            event.input.parent.hint = ctx_hint(self.model_opts.ctx_size if shown else asked,
                                               self.n_ctx if shown else None)
        self._schedule_revalidate()

    def _schedule_revalidate(self) -> None:
        # many fields change at once while the screen mounts: validate once after them
        if not self._revalidate_pending:
            self._revalidate_pending = True

            def run() -> None:
                self._revalidate_pending = False
                self._revalidate()
            self.call_after_refresh(run)

    def _update_draft_availability(self, draft_model: str) -> None:
        self.reasons = availability(self.engine, draft_model or None)
        auto = self._form_auto()
        for t in PRIORITY:       # the types' rows mounted so far (the rest read self.reasons)
            reason = self.reasons.get(t.value)
            for row in self.query(f"#row-{t.value}").results(Horizontal):
                row.set_class(reason is not None, "-unavailable")
            for sw in self.query(f"#sw-{t.value}").results(Switch):
                sw.disabled = reason is not None or auto
                if reason is not None:
                    sw.value = False
            for desc in self.query(f"#desc-{t.value}").results(Static):
                desc.update(reason or SPEC_INFO.get(t, ""))
        self.spec.draft.model = draft_model or None
        self._refresh_auto_text()

    def _auto_plan(self) -> list:
        """What Automatic uses and why: the running chain's answer, else from the GGUF headers."""
        plan = getattr(self.engine, "auto_plan", None) if self.spec.is_auto else None
        if plan:
            return list(plan)
        from speculators.auto import auto_plan
        path = str(getattr(getattr(self.engine, "model", None), "path", "") or "") or self.model_opts.model
        try:
            return auto_plan(SpecParams.auto(draft=dataclasses.replace(self.spec.draft)), path or None)
        except Exception:
            return []

    def _form_auto(self) -> bool:
        """Whether the form has Automatic on (the spec it was opened with, before it is mounted)."""
        sw = self.query("#sw-auto")
        return bool(sw.first().value) if sw else self.spec.is_auto

    def _form_types(self) -> list[str]:
        """The types switched on by hand in the form, in priority order."""
        out = []
        for t in PRIORITY:
            sw = self.query(f"#sw-{t.value}")
            if sw:
                if sw.first().value and not sw.first().disabled:
                    out.append(t.value)
            elif t in self.spec.types and self.reasons.get(t.value) is None:
                out.append(t.value)
        return out

    def _auto_text(self) -> str:
        """What the form's speculation is: Automatic's picks (and why not the others) while it is on;
        the types switched on by hand while it is off (never Automatic's picks then)."""
        if not self._form_auto():
            manual = self._form_types()
            return ("Automatic is off: " + (f"speculation uses {', '.join(manual)} (switched on below)"
                                              if manual else "no speculation (switch types on below)"))
        plan = self._auto_plan()
        used = [c.name for c in plan if c.used]
        unused = [f"{c.name} ({c.reason})" for c in plan if not c.used]
        lines = ["uses: " + (", ".join(used) if used else "nothing")]
        if unused:
            lines.append("not: " + "; ".join(unused))
        return "\n".join(lines)

    def _refresh_auto_text(self) -> None:
        plan = self.query("#auto-plan")
        if plan:
            plan.first().update(self._auto_text())

    @on(Switch.Changed, "#sw-auto")
    def _auto_switched(self, event: Switch.Changed) -> None:
        event.stop()
        for t in PRIORITY:
            for sw in self.query(f"#sw-{t.value}").results(Switch):
                sw.disabled = event.value or self.reasons.get(t.value) is not None
        self._refresh_auto_text()
        self._schedule_revalidate()

    @on(Switch.Changed)
    def _switched(self, event: Switch.Changed) -> None:
        name = (event.switch.id or "")[3:]
        params = self.query(f"#params-{name}")
        if params:
            params.first().set_class(not event.value, "-off")
        self._refresh_auto_text()
        self._schedule_revalidate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == "lc-paths":
            files = [os.path.expanduser(f.strip()) for f in event.value.split(";") if f.strip()]
            missing = [f for f in files if not os.path.isfile(f)]
            if not files or missing:
                status = self.query_one("#s-status", Static)
                status.update(f"no such file: {missing[0]}" if missing else "name at least one file")
                status.add_class("-error")
                return
            event.input.display = False
            self._start_build(files)
            return
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        bid = event.button.id
        if bid == "s-apply":
            self.action_apply()
        elif bid == "lc-chats":
            self._start_build(None)
        elif bid == "lc-files":
            inp = self.query_one("#lc-paths", Input)
            inp.display = True
            inp.focus()
        elif bid == "lc-cancel":
            self.post_message(self.CancelBuild())
        else:
            self.action_cancel()

    def action_apply(self) -> None:
        if not self._ready:
            self._apply_when_ready = True
            return
        if not self._revalidate():
            self.app.bell()
            bad = next(iter(self.errors))
            w = self.query(f"#f-{bad.replace('.', '--')}")
            if w:
                w.first().focus()
            return
        result, _ = self.read_form()
        self._close(result)

    def action_cancel(self) -> None:
        if self._building:
            self.post_message(self.CancelBuild())
        self._close(None)

    def _close(self, result: SettingsResult | None) -> None:
        """Dismiss once: a second Esc that arrives while the pane is going (a busy UI thread
        delivers both) must not pop the screen under it."""
        if self._dismissing or not self.is_current:
            return
        self._dismissing = True       # (not Textual's own _closing)
        self.dismiss(result)

    # -- lookup caches -----------------------------------------------------------------
    def _lookup_text(self) -> str:
        lk = self.lookup
        if not lk:
            return ("Not in use: turn ngram-cache (or Automatic) on. Its caches live per vocabulary in the "
                    "data folder: the dynamic one learns from every reply, the static one from what you give it.")
        lines = [f"folder {lk.get('folder', '')}"]
        for kind in ("static", "dynamic"):
            c = (lk.get("caches") or {}).get(kind) or {}
            state = f"{c.get('entries', 0):,} entries, {c.get('file_bytes', 0):,} bytes" if c.get("exists") \
                else "no file yet"
            lines.append(f"{kind}: {c.get('path', '')} — {state}")
        lines.append("The dynamic cache learns from each reply and is saved after it and on exit.")
        return "\n".join(lines)

    def show_build_progress(self, done: int, total: int, name: str) -> None:
        bar = self.query_one("#lc-progress", ProgressBar)
        bar.display = True
        bar.update(total=total or None, progress=done)
        self.query_one("#s-status", Static).update(f"learning from {name}…")

    def show_build_done(self, info: dict | None, error: str | None, lookup: dict | None) -> None:
        self._building = False
        self.query_one("#lc-progress", ProgressBar).display = False
        for bid, disabled in (("#lc-chats", False), ("#lc-files", False), ("#lc-cancel", True)):
            self.query_one(bid, Button).disabled = disabled
        self.lookup = lookup or self.lookup
        self.query_one("#lookup-info", Static).update(self._lookup_text())
        status = self.query_one("#s-status", Static)
        if error:
            status.update(f"static cache: {error}")
            status.add_class("-error")
        else:
            status.update(f"static cache built: {(info or {}).get('entries', 0):,} entries")
            status.remove_class("-error")

    def _start_build(self, files: list[str] | None) -> None:
        self._building = True
        for bid, disabled in (("#lc-chats", True), ("#lc-files", True), ("#lc-cancel", False)):
            self.query_one(bid, Button).disabled = disabled
        self.show_build_progress(0, 0, "saved chats" if files is None else "files")
        self.post_message(self.BuildStatic(files))
