"""The Lab screen on the scripted engine: it runs, fills the table, sorts, cancels, "Use this"
changes (and saves) the chat's speculation, it exports, and the runs are kept."""

from __future__ import annotations

import threading

from textual.widgets import DataTable, SelectionList

from app import config as config_mod
from app import paths
from app.ui.lab import LabScreen
from app.ui.scripted import ScriptedEngine

from .test_ui_app import SCRIPT, make_app, send_and_wait, until


async def open_lab(pilot, app) -> LabScreen:
    await send_and_wait(pilot, app, "Count to ten")
    await pilot.press("f8")
    await until(pilot, lambda: isinstance(app.screen, LabScreen))
    await pilot.pause()
    return app.screen


async def test_the_lab_runs_fills_the_table_and_use_this_sets_the_chats_speculation():
    app, engine = make_app(spec="ngram-simple")
    async with app.run_test(size=(120, 50)) as pilot:
        lab = await open_lab(pilot, app)
        configs = lab.query_one("#lab-configs", SelectionList)
        assert configs.selected[:2] == ["none", "auto"] and "ngram-mod" in configs.selected
        lab.query_one("#lab-rounds").value = "2"
        await pilot.press("ctrl+r")
        await until(pilot, lambda: lab.report is not None and not lab.running, timeout=20)
        await pilot.pause()
        table = lab.query_one("#lab-table", DataTable)
        names = [str(k.value) for k in table.rows]
        assert set(names) == set(configs.selected) and "none" in names
        # the prompt was the chat's message, as the model gets it
        assert engine.requests[-1][-1]["content"] == "Count to ten"
        assert all(len(r.figures["rounds_tokens_per_s"]) == 2 for r in lab.report.results)
        # sorted by tokens/s, fastest first; a click on a heading sorts by it
        tps = [lab.report.result(n).figures["tokens_per_s"] for n in names]
        assert tps == sorted(tps, reverse=True)
        await pilot.click("#lab-table", offset=(3, 0))      # the "configuration" heading
        await pilot.pause()
        assert lab.sort_key == "name"
        assert [str(k.value) for k in table.rows] == sorted(names)
        # the outputs side by side, coloured: the scripted drafts are drafted by their speculators
        sel = lab.query_one("#lab-out-sel")
        assert "".join(t.text for t in sel.tokens) == "Hello world! How are you today?"
        assert any(t.drafted_by for t in sel.tokens)
        # "Use this" on ngram-mod: the chat's speculation, saved
        table.move_cursor(row=[str(k.value) for k in table.rows].index("ngram-mod"))
        await pilot.pause()
        await pilot.press("ctrl+u")
        await until(pilot, lambda: [t.value for t in app.config.spec.types] == ["ngram-mod"])
        assert [t.value for t in config_mod.load().spec.types] == ["ngram-mod"]
        # kept in SQLite beside the chats
        assert app.history.lab_runs()[0].prompt == "Count to ten"
        # exported as Markdown, JSON and CSV
        await pilot.press("ctrl+e")
        await pilot.pause()
        files = sorted(p.suffix for p in (paths.data_dir() / "lab").iterdir())
        assert files == [".csv", ".json", ".md"]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, LabScreen))


async def test_cancel_stops_the_lab_keeps_nothing_and_puts_the_chats_settings_back():
    gate = threading.Event()
    gate.set()
    engine = ScriptedEngine(SCRIPT, gate=gate)
    app, _ = make_app(engine=engine, spec="ngram-simple")
    async with app.run_test(size=(120, 50)) as pilot:
        lab = await open_lab(pilot, app)
        before = engine.set_spec_calls
        gate.clear()                      # the first run holds after its first step
        await pilot.press("ctrl+r")
        await until(pilot, lambda: lab.running)
        await pilot.press("escape")        # while running: cancel, not close
        await until(pilot, lambda: not lab.running, timeout=10)
        gate.set()
        assert isinstance(app.screen, LabScreen) and lab.report is None
        assert "Cancelled" in str(lab.query_one("#lab-status").render())
        assert app.history.lab_runs() == []
        # the chat's own chain is back
        assert engine.set_spec_calls > before and [t.value for t in engine.spec.types] == ["ngram-simple"]
        assert [t.value for t in app.config.spec.types] == ["ngram-simple"]


async def test_the_lab_without_a_message_says_what_to_do():
    app, engine = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await pilot.press("f8")
        await until(pilot, lambda: isinstance(app.screen, LabScreen))
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert "send a message in the chat first, or give a file" in str(app.screen.query_one("#lab-status").render())
