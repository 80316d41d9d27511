"""Snapshots (pytest-textual-snapshot) of the main screens.

Regenerate after an intended change with ``pytest tests/test_ui_snapshots.py --snapshot-update``
and look at the SVGs in tests/__snapshots__/.
"""

from __future__ import annotations

import time

from app import config as config_mod
from app.ui.app import DraftlightApp
from app.ui.scripted import ScriptedEngine
from app.ui.widgets import PromptInput
from speculators.params import SpecParams
from tests.test_ui_app import open_settings

SCRIPT = [
    (None, ["Speculative"]),
    ("ngram-mod", [" decoding", " lets", " a", " cheap"]),
    (None, [" drafter"]),
    (None, [" guess"]),
    ("ngram-simple", [" the", " next", " tokens", ";"]),
    (None, [" the"]),
    (None, [" model"]),
    ("ngram-mod", [" checks", " them", " in", " one", " batch", "."]),
    (None, ["\n\n"]),
    ("ngram-simple", ["Accepted", " tokens", " light", " up"]),
    (None, [" in"]),
    (None, [" colour", "."]),
]


def make_app() -> DraftlightApp:
    engine = ScriptedEngine(SCRIPT, fixed_time_s=0.5)
    cfg = config_mod.Config()
    cfg.spec = SpecParams.from_types("ngram-simple,ngram-mod")
    return DraftlightApp(cfg, engine_factory=lambda m, s, p: engine, persist_config=False)


async def _wait(pilot, cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        await pilot.pause(0.02)


async def _chat(pilot) -> None:
    app = pilot.app
    await _wait(pilot, lambda: app.engine is not None)
    app.query_one(PromptInput).cursor_blink = False
    app.send("What is speculative decoding?")
    await _wait(pilot, lambda: app.job is None)
    # a reply's start turns the cursor's blinking back on: stopped again once it has ended, the
    # cursor shows (as the stored image has it) however long the reply took
    app.query_one(PromptInput).cursor_blink = False
    await pilot.pause(0.1)


def test_main_screen_with_coloured_draft_runs(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_chat)


def test_main_screen_with_statistics_panel(snap_compare):
    async def run(pilot):
        await _chat(pilot)
        await pilot.press("f4")
        await pilot.pause(0.1)
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


def test_settings_pane(snap_compare):
    async def run(pilot):
        app = pilot.app
        await _wait(pilot, lambda: app.engine is not None)
        app.query_one(PromptInput).cursor_blink = False
        await open_settings(pilot, app)
        field = app.screen.query_one("#f-ngram_mod--n_max")
        field.value = "2000"
        field.cursor_blink = False
        await pilot.pause(0.1)
        app.screen.query_one("#s-scroll").scroll_to(y=9, animate=False)
        await pilot.pause(0.1)
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=run)


def test_lab_screen_with_results(snap_compare):
    async def run(pilot):
        from app.ui.lab import LabScreen
        app = pilot.app
        await _chat(pilot)
        await pilot.press("f8")
        await _wait(pilot, lambda: isinstance(app.screen, LabScreen))
        lab = app.screen
        lab.query_one("#lab-rounds").value = "1"
        await pilot.press("ctrl+r")
        await _wait(pilot, lambda: lab.report is not None and not lab.running, timeout=10)
        for inp in lab.query("Input"):
            inp.cursor_blink = False
        await pilot.pause(0.2)
    assert snap_compare(make_app(), terminal_size=(120, 50), run_before=run)
