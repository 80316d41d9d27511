"""The Lab screen: run configurations side by side on the chat's own model and prompt.

The prompt: one of the person's messages (the conversation up to it), a request the chat served
(its messages or text, "served: …", newest first), or a file.

UI → session (:meth:`app.session.ChatSession.run_lab`, in a thread worker) → engine; the
worker reports progress with ``call_from_thread`` and stops when Cancel (or Esc) asks; the
result (:class:`app.lab.LabReport`) fills a sortable table, two plots (acceptance by draft
position, the verify-cost curve with each configuration's break-even) and the outputs side
by side, coloured as in the chat. "Use this" hands the chosen configuration's speculation to
the app, which applies and saves it as F3 does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import (Button, DataTable, Footer, Input, Label, OptionList, ProgressBar, Select,
                             SelectionList, Static)
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from speculators.params import SpecParams

from ..errors import describe
from ..lab import COLUMNS, LabConfig, LabReport, first_divergence, presets
from ..measure import Cancelled
from .widgets import ReplyBody


def _cell(v: Any, key: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key in ("acceptance_rate", "fraction_of_ceiling") and isinstance(v, (int, float)):
        return f"{v * 100:.0f}%"
    if key in ("speedup_vs_none", "paired_vs_none") and isinstance(v, (int, float)):
        return f"{v:.2f}×"
    if isinstance(v, float):
        return f"{v:.1f}" if key in ("tokens_per_s", "ttft_ms") else f"{v:.2f}"
    return str(v)


class LabScreen(Screen[None]):
    """Which speculation pays on this model, machine and prompt."""

    BINDINGS = [
        Binding("escape", "close", "Close / cancel"),
        Binding("ctrl+r", "run", "Run", priority=True),
        Binding("ctrl+u", "use", "Use this", priority=True),
        Binding("ctrl+e", "export", "Export", priority=True),
        Binding("f8", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    LabScreen { background: $background; }
    LabScreen > .l-title { dock: top; height: 1; background: $panel; padding: 0 1; color: $primary;
        text-style: bold; }
    LabScreen > VerticalScroll { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    LabScreen .l-section { margin-top: 1; color: $secondary; text-style: bold; }
    LabScreen .l-note { color: $text-muted; margin-left: 2; width: 1fr; }
    LabScreen #lab-prompts { height: auto; max-height: 6; margin: 0 2; border: none; background: $background; }
    LabScreen .l-row { height: auto; margin: 0 2; }
    LabScreen .l-row Label { padding: 0 1 0 0; }
    LabScreen .l-row Input { width: 8; margin-right: 2; }
    LabScreen #lab-file { width: 1fr; max-width: 60; }
    LabScreen #lab-preset { width: 24; margin-right: 2; }
    LabScreen #lab-configs { height: auto; max-height: 12; margin: 0 2; border: none; background: $background; }
    LabScreen Button { margin-right: 2; min-width: 10; }
    LabScreen #lab-progress { margin: 1 2 0 2; }
    LabScreen #lab-status { margin: 0 2; color: $text-muted; }
    LabScreen #lab-status.-error { color: $error; }
    LabScreen #lab-table { height: auto; max-height: 16; margin: 0 2; }
    LabScreen .l-plots { height: 16; margin: 1 2 0 2; }
    LabScreen .l-plots PlotextPlot { width: 1fr; height: 16; }
    LabScreen .l-outputs { height: auto; margin: 0 2; }
    LabScreen .l-outputs > Vertical { width: 1fr; height: auto; padding: 0 1; border-left: outer $panel; }
    LabScreen .l-out-title { text-style: bold; color: $foreground-muted; }
    """

    class UseConfig(Message):
        """Apply this configuration's speculation to the chat (and save it, as F3 does)."""

        def __init__(self, name: str, spec: SpecParams):
            super().__init__()
            self.name = name
            self.spec = spec

    def __init__(self, session: Any, *, styles: dict | None = None, prompt_file: str | None = None,
                 history: Any = None, served: int | None = None):
        super().__init__()
        #: the served request highlighted as the prompt when the Lab opens (None: the latest message)
        self.served = served
        self.session = session
        self.draft_styles = styles or {}
        self.history = history
        self.prompt_file = prompt_file
        self.report: LabReport | None = None
        self.sort_key: str | None = "tokens_per_s"
        self.sort_reverse = True
        self._cancel = threading.Event()
        self.running = False
        usable = session.lab_usable_types() if session is not None else []
        self._presets = presets(usable, getattr(getattr(session, "config", None), "spec", None))
        self._configs: dict[str, LabConfig] = {}

    # -- building -----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("Lab — which speculation pays on this model and prompt", classes="l-title")
        with VerticalScroll(id="lab-scroll"):
            yield Static("Prompt", classes="l-section")
            prompts = self.session.lab_prompts() if self.session is not None else []
            served = list(reversed(getattr(self.session, "served", ()) or ()))
            if prompts or served:
                yield Static("One of your messages (the conversation up to it is the prompt), a served "
                             "request, or a file:" if served else
                             "One of your messages (the conversation up to it is the prompt), or a file:",
                             classes="l-note")
                yield OptionList(*[Option(text.replace("\n", " ")[:90], id=f"turn-{i}") for i, text in prompts],
                                 *[Option(f"served: {req.label}"[:90], id=f"served-{req.rid}") for req in served],
                                 id="lab-prompts")
            else:
                yield Static("No message in this chat yet: give a file, or send a message first.",
                             classes="l-note")
            with Horizontal(classes="l-row"):
                yield Label("file")
                yield Input(self.prompt_file or "", placeholder="a text file to use as the prompt instead",
                            id="lab-file", compact=True)
            yield Static("Configurations", classes="l-section")
            with Horizontal(classes="l-row"):
                yield Select([(name, name) for name in self._presets], value="Quick", allow_blank=False,
                             id="lab-preset", compact=True)
                yield Label("rounds")
                yield Input("3", id="lab-rounds", compact=True)
                yield Label("tokens")
                yield Input("64", id="lab-tokens", compact=True)
                yield Button("Run", id="lab-run", variant="primary", compact=True)
                yield Button("Cancel", id="lab-cancel", disabled=True, compact=True)
            yield SelectionList[str](id="lab-configs")
            yield ProgressBar(total=1, show_eta=False, id="lab-progress")
            yield Static("Configurations run in turn, round after round (every other round in reverse "
                         "order), on the loaded model; the chat's settings are put back afterwards.",
                         id="lab-status")
            yield Static("Results (click a heading to sort; the highlighted row is the one compared below)",
                         classes="l-section")
            yield DataTable(id="lab-table", cursor_type="row", zebra_stripes=True)
            with Horizontal(classes="l-plots"):
                from textual_plotext import PlotextPlot
                yield PlotextPlot(id="lab-acc")
                yield PlotextPlot(id="lab-cost")
            yield Static("Outputs", classes="l-section")
            yield Static("", classes="l-note", id="lab-divergence")
            with Horizontal(classes="l-outputs"):
                with Vertical():
                    yield Static("none", classes="l-out-title", id="lab-out-none-title")
                    yield ReplyBody(styles=self.draft_styles, id="lab-out-none")
                with Vertical():
                    yield Static("", classes="l-out-title", id="lab-out-sel-title")
                    yield ReplyBody(styles=self.draft_styles, id="lab-out-sel")
            with Horizontal(classes="l-row"):
                yield Button("Use this", id="lab-use", disabled=True, compact=True)
                yield Button("Export", id="lab-export", disabled=True, compact=True)
                yield Button("Close", id="lab-close", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        self._fill_configs("Quick")
        ol = self.query("#lab-prompts")
        if ol:
            self._highlight_prompt(ol.first())
        table = self.query_one("#lab-table", DataTable)
        for key, heading in COLUMNS:
            table.add_column(heading, key=key)
        self._plot_empty()
        runs = []
        if self.history is not None:
            try:
                runs = self.history.lab_runs(1)
            except Exception:
                runs = []
        if runs:
            self.show_report(runs[0], saved=False)
            self._status(f"The last run ({len(runs[0].results)} configurations) is shown; Run measures again.")

    def _highlight_prompt(self, ol: OptionList) -> None:
        """The served request the Lab was opened on, else the person's latest message, else the
        newest served request."""
        ids = [ol.get_option_at_index(i).id or "" for i in range(ol.option_count)]
        wanted = f"served-{self.served}" if self.served is not None else None
        if wanted in ids:
            ol.highlighted = ids.index(wanted)
            return
        turns = [i for i, oid in enumerate(ids) if oid.startswith("turn-")]
        ol.highlighted = turns[-1] if turns else 0

    def _fill_configs(self, preset: str) -> None:
        sl = self.query_one("#lab-configs", SelectionList)
        sl.clear_options()
        self._configs = {c.name: c for c in self._presets.get(preset, [])}
        for name in self._configs:
            sl.add_option((name, name, True))

    @on(Select.Changed, "#lab-preset")
    def _preset(self, ev: Select.Changed) -> None:
        if isinstance(ev.value, str):
            self._fill_configs(ev.value)

    # -- running --------------------------------------------------------------------------
    def _status(self, text: str, error: bool = False) -> None:
        st = self.query_one("#lab-status", Static)
        st.update(text)
        st.set_class(error, "-error")

    def _read(self) -> tuple[list[LabConfig], int | None, str | None, int | None, int, int] | None:
        try:
            rounds = int(self.query_one("#lab-rounds", Input).value)
            tokens = int(self.query_one("#lab-tokens", Input).value)
            if not 1 <= rounds <= 20 or not 8 <= tokens <= 2048:
                raise ValueError
        except ValueError:
            self._status("rounds: 1 to 20; tokens: 8 to 2048", error=True)
            return None
        chosen = [self._configs[n] for n in self.query_one("#lab-configs", SelectionList).selected
                  if n in self._configs]
        if not [c for c in chosen if c.name != "none"]:
            self._status("choose at least one configuration besides none", error=True)
            return None
        path = self.query_one("#lab-file", Input).value.strip()
        text = turn = served = None
        if path:
            try:
                text = Path(path).expanduser().read_text(encoding="utf-8", errors="replace").strip()
            except OSError as e:
                self._status(f"cannot read {path}: {e.strerror or e}", error=True)
                return None
            if not text:
                self._status(f"{path} is empty", error=True)
                return None
        else:
            ol = self.query("#lab-prompts")
            if not ol or ol.first().highlighted is None:
                self._status("no prompt: send a message in the chat first, or give a file", error=True)
                return None
            oid = ol.first().get_option_at_index(ol.first().highlighted).id or "turn-0"
            kind, _, number = oid.partition("-")
            if kind == "served":
                served = int(number)
            else:
                turn = int(number)
        return chosen, turn, text, served, rounds, tokens

    def action_run(self) -> None:
        if self.running:
            return
        got = self._read()
        if got is None:
            return
        chosen, turn, text, served, rounds, tokens = got
        self._cancel.clear()
        self.running = True
        self.query_one("#lab-run", Button).disabled = True
        self.query_one("#lab-cancel", Button).disabled = False
        bar = self.query_one("#lab-progress", ProgressBar)
        bar.update(total=len(chosen + ([] if any(c.name == "none" for c in chosen) else [None])) * rounds,
                   progress=0)
        self._status("starting…")
        self._worker(chosen, turn, text, served, rounds, tokens)

    @work(thread=True, exclusive=True, group="lab")
    def _worker(self, configs: list[LabConfig], turn: int | None, text: str | None, served: int | None,
                rounds: int, tokens: int) -> None:
        worker = get_current_worker()

        def cancelled() -> bool:
            return worker.is_cancelled or self._cancel.is_set()
        try:
            report = self.session.run_lab(configs, turn=turn, text=text, served=served, rounds=rounds,
                                          max_tokens=tokens,
                                          progress=lambda d, t, what: self.app.call_from_thread(
                                              self._progress, d, t, what), cancel=cancelled)
        except Cancelled:
            self.app.call_from_thread(self._ended, None, "Cancelled: nothing was kept; the chat's settings are "
                                                         "as they were.")
        except Exception as e:   # every failure is a line on the screen, never a traceback
            self.app.call_from_thread(self._ended, None, describe(e), True)
        else:
            self.app.call_from_thread(self._ended, report, None)

    def _progress(self, done: int, total: int, what: str) -> None:
        self.query_one("#lab-progress", ProgressBar).update(total=total, progress=done)
        self._status(what)

    def _ended(self, report: LabReport | None, message: str | None, error: bool = False) -> None:
        self.running = False
        self.query_one("#lab-run", Button).disabled = False
        self.query_one("#lab-cancel", Button).disabled = True
        if report is None:
            self._status(message or "", error=error)
            return
        self.show_report(report, saved=True)

    def action_cancel(self) -> None:
        if self.running:
            self._cancel.set()
            self._status("cancelling…")

    def action_close(self) -> None:
        if self.running:
            self.action_cancel()
            return
        self.dismiss(None)

    # -- results ----------------------------------------------------------------------------
    def show_report(self, report: LabReport, saved: bool = True) -> None:
        self.report = report
        if saved and self.history is not None:
            try:
                report.id = self.history.add_lab_run(report)
            except Exception as e:
                self.notify(f"The results were not kept: {describe(e)}", severity="warning")
        self._fill_table()
        self._plot(report)
        self.query_one("#lab-use", Button).disabled = False
        self.query_one("#lab-export", Button).disabled = False
        best = report.fastest()
        none = report.result("none") if any(r.name == "none" for r in report.results) else None
        ratio = (best.figures.get("tokens_per_s") or 0) / (none.figures.get("tokens_per_s") or 1) if none else 0
        self._status(f"Fastest: {best.name}, {best.figures.get('tokens_per_s', 0):.1f} tok/s"
                     + (f" ({ratio:.2f}× none)" if none else "") + f"; {report.rounds} round{'s' if report.rounds != 1 else ''} of "
                     f"{len(report.results)} configurations, up to {report.max_tokens} tokens."
                     + self._unsteady_note(report))

    @staticmethod
    def _unsteady_note(report: LabReport) -> str:
        names = report.unsteady()
        if not names:
            return ""
        return (f" The machine's speed changed during the run (other programs busy?): for {', '.join(names)} "
                "the fastest-run and paired ratios disagree; run again, with more rounds.")

    def _fill_table(self) -> None:
        table = self.query_one("#lab-table", DataTable)
        table.clear()
        assert self.report is not None
        for r in self.report.rows(self.sort_key, self.sort_reverse):
            table.add_row(*[_cell(self.report.value(r, k), k) for k, _ in COLUMNS], key=r.name)
        if table.row_count:
            table.move_cursor(row=0)
            self._compare(self.report.rows(self.sort_key, self.sort_reverse)[0].name)

    @on(DataTable.HeaderSelected, "#lab-table")
    def _sort(self, ev: DataTable.HeaderSelected) -> None:
        key = str(ev.column_key.value)
        if self.report is None:
            return
        self.sort_reverse = not self.sort_reverse if key == self.sort_key else key != "name"
        self.sort_key = key
        self._fill_table()

    @on(DataTable.RowHighlighted, "#lab-table")
    def _row(self, ev: DataTable.RowHighlighted) -> None:
        if self.report is not None and ev.row_key is not None and ev.row_key.value:
            self._compare(str(ev.row_key.value))

    def selected(self) -> str | None:
        table = self.query_one("#lab-table", DataTable)
        if self.report is None or not table.row_count:
            return None
        return str(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value)

    def _compare(self, name: str) -> None:
        rep = self.report
        if rep is None:
            return
        none = next((r for r in rep.results if r.name == "none"), None)
        sel = rep.result(name)
        if none is not None:
            self.query_one("#lab-out-none", ReplyBody).set_text("")
            self.query_one("#lab-out-none", ReplyBody).append_tokens(none.token_events())
        body = self.query_one("#lab-out-sel", ReplyBody)
        body.set_text("")
        body.append_tokens(sel.token_events())
        self.query_one("#lab-out-sel-title", Static).update(name)
        div = self.query_one("#lab-divergence", Static)
        if none is None or sel is none:
            div.update("")
            return
        i = first_divergence(none.tokens, sel.tokens)
        if i is None:
            div.update(f"{name} wrote exactly what none wrote.")
        else:
            where = "".join(none.pieces[:i])[-40:].replace("\n", " ")
            div.update(f"{name} departs from none at token {i + 1} (after “…{where}”)"
                       + (": with quantized weights a batched verify can tip a near-tie, which is not a "
                          "speculation error" if rep.quantized else ""))

    def _plot_empty(self) -> None:
        for pid, title in (("#lab-acc", "acceptance by draft position"), ("#lab-cost", "verify cost")):
            from textual_plotext import PlotextPlot
            p = self.query_one(pid, PlotextPlot)
            p.plt.clear_figure()
            p.plt.title(title + " (after a run)")
            p.refresh()

    def _plot(self, rep: LabReport) -> None:
        from textual_plotext import PlotextPlot
        acc = self.query_one("#lab-acc", PlotextPlot)
        plt = acc.plt
        plt.clear_figure()
        plt.title("acceptance by draft position")
        plt.xlabel("draft position")
        drawn = False
        for r in rep.results:
            if r.acceptance_by_pos:
                xs = list(range(1, len(r.acceptance_by_pos[:16]) + 1))
                plt.plot(xs, r.acceptance_by_pos[:16], label=r.name, marker="braille")
                drawn = True
        if drawn:
            plt.ylim(0, 1)
        acc.refresh()
        cost = self.query_one("#lab-cost", PlotextPlot)
        plt = cost.plt
        plt.clear_figure()
        plt.title("verify cost (1 = one decode) vs tokens per step")
        plt.xlabel("draft length")
        if rep.cost_curve:
            ks = list(range(len(rep.cost_curve)))
            plt.plot(ks, rep.cost_curve, label="cost of a verify", marker="braille")
            # each configuration at (its mean draft length, the tokens a verified step gives):
            # above the curve, its drafts pay for their verify
            for r in rep.results:
                L = r.figures.get("mean_draft_len") or 0
                mal = r.figures.get("mean_acceptance_length")
                if L >= 1 and mal:
                    plt.scatter([min(L, ks[-1])], [mal], label=f"{r.name} (break-even {rep.cost_curve[min(int(round(L)), ks[-1])]:.2f})",
                                marker="dot")
        cost.refresh()

    # -- actions -------------------------------------------------------------------------------
    def action_use(self) -> None:
        name = self.selected()
        if self.report is None or name is None:
            return
        r = self.report.result(name)
        try:
            spec = SpecParams.from_dict(dict(r.spec))
            spec.validate()
        except Exception as e:
            self._status(f"{name} cannot be used: {describe(e)}", error=True)
            return
        self.post_message(self.UseConfig(name, spec))
        self._status(f"The chat now uses {name} (saved to the settings, as F3 does).")

    def action_export(self) -> None:
        if self.report is None:
            return
        from .. import paths
        import time as _time
        stamp = _time.strftime("%Y%m%d-%H%M%S", _time.localtime(self.report.created))
        folder = paths.data_dir() / "lab"
        from ..fileutil import atomic_write_bytes
        written = []
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for ext, text in (("md", self.report.to_markdown()), ("json", self.report.to_json()),
                              ("csv", self.report.to_csv())):
                p = folder / f"lab-{stamp}.{ext}"
                atomic_write_bytes(p, text.encode("utf-8"))
                written.append(p)
        except OSError as e:
            self._status(f"Export failed: {e.strerror or e}", error=True)
            return
        self._status("Exported: " + ", ".join(str(p) for p in written))

    @on(Button.Pressed)
    def _button(self, ev: Button.Pressed) -> None:
        actions = {"lab-run": self.action_run, "lab-cancel": self.action_cancel, "lab-use": self.action_use,
                   "lab-export": self.action_export, "lab-close": self.action_close}
        fn = actions.get(ev.button.id or "")
        if fn is not None:
            ev.stop()
            fn()
