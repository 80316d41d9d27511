"""SettingsScreen: the settings pane (speculation, sampling, model, context overflow, lookup caches,
the server).

The Textual side only: the fields, how values are parsed, formatted and checked come from
:mod:`app.settings_form`; which types can be used and the draft models on disk from
:mod:`app.model_files`. It reads the engine it is given (its model, chain and devices) and
never changes it: the result is a :class:`~app.settings_form.SettingsResult` the app applies.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Input, Label, OptionList, ProgressBar, Static, Switch
from textual.widgets.option_list import Option

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import PRIORITY, SpecType

from ...model_files import availability, devices_text, discover_draft_models
from ...options import ModelOptions
from ...settings_form import (MODEL_FIELDS, OVERFLOW_CHOICES, SAMPLING_FIELDS, SERVE_FIELDS, SPEC_FIELDS, SPEC_INFO,
                              SettingsResult, collect_errors, ctx_hint, field_error, format_value, get_dotted,
                              parse_value, set_dotted)
from .field_row import FieldRow


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
    SettingsScreen #serve { margin: 1 0 0 2; }
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
                 n_ctx: int | None = None, serving: bool = False, serve_port: int = 8080):
        super().__init__()
        #: the Server group: whether the chat serves its model now, and the port it serves on
        self.serving = serving
        self.serve_port = serve_port
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
            return format_value(getattr(self.sampling, name), kind)
        if section == "model":
            if name == "ctx_size" and self.n_ctx:
                return str(self.n_ctx)   # the size in use; the hint says what was asked for
            return format_value(getattr(self.model_opts, name), kind)
        if section == "chat":
            return str(self.max_tokens)
        if section == "serve":
            return str(self.serve_port)
        return format_value(get_dotted(self.spec, key), kind)

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
        yield self._server_group()

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

    def _server_group(self) -> list[Widget]:
        """The Server group: the switch that serves the model over HTTP on 127.0.0.1, and its port.
        (A checkbox: the pane's Switches are the speculation types', one each.)"""
        return [Static("Server", classes="s-section"),
                Checkbox("Serve the model over HTTP (127.0.0.1)", value=self.serving, id="serve",
                         compact=True),
                Static("OpenAI's API under /v1, as draftlight serve gives it; served requests and the "
                       "chat's replies take turns on the model.", classes="s-note"),
                *(FieldRow(key, label, kind, self._value(key, kind)) for key, label, kind in SERVE_FIELDS),
                Static("Serving stops when draftlight quits and is not started again at the next launch. "
                       "F9 shows the requests as they come.", classes="s-note")]

    @property
    def ready(self) -> bool:
        """Whether every group of the form is mounted (and the form can be read)."""
        return self._ready

    def on_mount(self) -> None:
        self.query_one("#sw-auto", Switch).focus()
        # the next group on a timer, not call_later: Textual runs queued callbacks before a key
        # that came meanwhile, so a chain of them would hold Esc until the last group was in
        self.set_timer(0.01, self._mount_next)

    async def _mount_next(self) -> None:
        if self._ready or self._dismissing:
            return
        group = next(self._to_mount, None)
        if group is not None:
            await self.query_one("#s-scroll", VerticalScroll).mount_all(group)
            self.set_timer(0.01, self._mount_next)
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
        serve_port = self.serve_port
        errors: dict[str, str] = {}
        for row in self.query(FieldRow):
            text = row.query_one(Input).value
            try:
                value = parse_value(text, row.kind)
            except ValueError as e:
                errors[row.key] = str(e)
                continue
            section, name = row.key.split(".", 1)
            if section == "model" and name == "ctx_size" and self.n_ctx and value == self.n_ctx:
                value = self.model_opts.ctx_size   # the size in use, as shown: no change
            error = field_error(row.key, row.kind, value)
            if error is not None:
                errors[row.key] = error
            if section == "sampling":
                setattr(sampling, name, value)
            elif section == "model":
                setattr(model, name, value)
            elif section == "chat":
                max_tokens = value
            elif section == "serve":
                serve_port = value
            else:
                set_dotted(spec, row.key, value)
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
        serve = self.query("#serve")
        return SettingsResult(spec, sampling, model, max_tokens, overflow,
                              serve=bool(serve.first().value) if serve else self.serving,
                              serve_port=serve_port), errors

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

    # A build's progress and end may come to a pane that is still mounting its groups (one opened
    # while a build started from an earlier one runs): the lookup section's widgets are then not
    # there yet, and only what is mounted is updated.

    def show_build_progress(self, done: int, total: int, name: str) -> None:
        for bar in self.query("#lc-progress").results(ProgressBar):
            bar.display = True
            bar.update(total=total or None, progress=done)
        self.query_one("#s-status", Static).update(f"learning from {name}…")

    def show_build_done(self, info: dict | None, error: str | None, lookup: dict | None) -> None:
        self._building = False
        for bar in self.query("#lc-progress").results(ProgressBar):
            bar.display = False
        for bid, disabled in (("#lc-chats", False), ("#lc-files", False), ("#lc-cancel", True)):
            for button in self.query(bid).results(Button):
                button.disabled = disabled
        self.lookup = lookup or self.lookup
        for text in self.query("#lookup-info").results(Static):
            text.update(self._lookup_text())
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
