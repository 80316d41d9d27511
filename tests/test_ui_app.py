"""Pilot tests of the chat app against a scripted engine (app/ui/scripted.py).

The scripted engine yields the engine's own event types from a script, so
these tests exercise the real widgets, worker threads and message flow; the
real engine is exercised by the end-to-end test (tests/test_ui_e2e_tmux.py).
"""

from __future__ import annotations

import statistics
import threading
import time
from app import config as config_mod
from app import paths
from app.ui.app import ACTIONS, DraftlightApp, usable_cores
from app.ui.scripted import ScriptedEngine
from app.ui.widgets import KeyBar, Legend, LoadPanel, MessageView, PromptInput, StatsPanel
from speculators.params import SpecParams

#: "Hello" and " world" drafted by ngram-mod (positions 0, 1), "!" the model's own,
#: then a plain step, then an ngram-simple draft.
SCRIPT = [
    ("ngram-mod", ["Hello", " world", "!"]),
    (None, [" How"]),
    ("ngram-simple", [" are", " you", " today", "?"]),
]
SCRIPT_TEXT = "Hello world! How are you today?"


def make_app(script=SCRIPT, *, spec: str = "ngram-mod,ngram-simple", engine: ScriptedEngine | None = None,
             factory=None, **kw):
    engine = engine or ScriptedEngine(script, **kw)
    cfg = config_mod.Config()
    cfg.spec = SpecParams.from_types(spec) if spec else SpecParams()
    calls: list = []

    def default_factory(model, spec_params, progress):
        calls.append(model)
        return engine
    app = DraftlightApp(cfg, engine_factory=factory or default_factory)
    app.factory_calls = calls  # type: ignore[attr-defined]
    return app, engine


async def until(pilot, cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.02)


async def ready(pilot, app) -> None:
    await until(pilot, lambda: app.engine is not None)


async def open_settings(pilot, app) -> None:
    """F3, and wait until the settings pane has mounted all of its groups (it opens with the
    first and mounts the rest one per turn of the UI loop)."""
    await pilot.press("f3")
    await until(pilot, lambda: getattr(app.screen, "ready", False))


async def send_and_wait(pilot, app, text: str = "hi") -> MessageView:
    await ready(pilot, app)
    assert app.send(text)
    await until(pilot, lambda: app.job is None)
    await pilot.pause()
    return app._views()[-1]


async def test_send_streams_reply_with_draft_colouring():
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await pilot.press(*"hello")
        await pilot.press("enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        user, reply = app._views()
        assert (user.role, user.text) == ("user", "hello")
        assert reply.text == SCRIPT_TEXT
        runs = [(reply.text[r.start:r.end], r.by, r.pos0, r.pos1) for r in reply.body.runs]
        assert runs == [("Hello world", "ngram-mod", 0, 1), (" are you today", "ngram-simple", 0, 2)]
        # the drafted text carries its speculator's colour, plain text none
        mod = app.draft_styles["ngram-mod"]
        # the body's first line says who wrote it (the model's name); the text follows
        assert reply.body.top == 1 and reply.body.render_line(0).text.strip() == reply.label
        segs = list(reply.body.render_line(reply.body.top))
        styled = {seg.text: seg.style for seg in segs if seg.text.strip()}
        assert styled["Hello"].color.triplet.hex == mod.foreground.hex.lower()
        assert styled[" world"].color.triplet.hex == mod.foreground.hex.lower()
        plain = next(st for t, st in styled.items() if "How" in t)
        assert plain.color != styled["Hello"].color and not plain.meta
        assert styled["Hello"].meta == {"by": "ngram-mod", "pos": 0, "run": 0}
        assert "by ngram-mod, ngram-simple" in str(reply.foot.render())
        assert "accepted 5" in str(reply.foot.render())
        # the prompt was cleared and the engine saw the conversation
        assert app.query_one(PromptInput).text == ""
        assert engine.requests[-1][-1] == {"role": "user", "content": "hello"}


async def test_enter_sends_and_ctrl_j_inserts_a_newline():
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        await pilot.press("a", "ctrl+j", "b")
        prompt = app.query_one(PromptInput)
        assert prompt.text == "a\nb"
        assert not app._views()
        await pilot.press("enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == "a\nb"


async def test_up_and_down_walk_the_input_history_when_empty():
    app, engine = make_app()
    async with app.run_test() as pilot:
        await send_and_wait(pilot, app, "first")
        await send_and_wait(pilot, app, "second")
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("down")
        assert prompt.text == "second"
        await pilot.press("down")
        assert prompt.text == ""
        # with text typed, Up moves the cursor instead
        await pilot.press("x", "up")
        assert prompt.text == "x"


async def test_the_key_bar_lights_esc_in_place_as_a_reply_starts_and_ends():
    """Esc's Stop is dimmed between replies and lit while one streams, Ctrl+R's the other way
    round, in the same key widgets: the bar is not composed anew for a reply (which styled new
    keys and laid the whole chat out again, twice a reply). It is where the keys shown change."""
    from textual.widgets._footer import FooterKey
    gate = threading.Event()
    app, engine = make_app(gate=gate)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await pilot.pause()
        bar = app.query_one(KeyBar)

        def keys() -> dict[str, FooterKey]:
            return {k.action: k for k in bar.query(FooterKey)}

        idle = keys()
        assert {"stop", "regenerate", "settings"} <= set(idle)
        assert idle["stop"].has_class("-disabled") and not idle["regenerate"].has_class("-disabled")
        app.send("hi")
        await until(pilot, lambda: app._views()[-1].text == "Hello world!")
        await pilot.pause()
        streaming = keys()
        assert streaming == idle, "the key bar was composed anew for the reply"
        assert not streaming["stop"].has_class("-disabled") and streaming["regenerate"].has_class("-disabled")
        await pilot.press("escape")
        await until(pilot, lambda: app.job is None, timeout=10)
        await pilot.pause()
        assert keys() == idle
        assert idle["stop"].has_class("-disabled") and not idle["regenerate"].has_class("-disabled")
        # a focused message brings a key of its own: then the bar is composed anew
        app._views()[-1].focus()
        await pilot.pause()
        await pilot.pause()
        assert "copy" in keys() and keys()["settings"] is not idle["settings"]


async def test_escape_stops_at_once_and_keeps_the_text():
    gate = threading.Event()
    app, engine = make_app(gate=gate)
    async with app.run_test() as pilot:
        await ready(pilot, app)
        app.send("hi")
        await until(pilot, lambda: app._views()[-1].text == "Hello world!")
        await pilot.press("escape")
        # the engine is held at its gate for good: the reply can end only by not waiting for it
        await until(pilot, lambda: app.job is None, timeout=10)
        assert not gate.is_set()
        reply = app._views()[-1]
        assert reply.text == "Hello world!"
        assert reply.finish == "cancelled"
        assert "stopped" in str(reply.foot.render())
        stored = app.history.load_chat(app.chat_id).messages[-1]
        assert (stored.content, stored.status) == ("Hello world!", "cancelled")
        assert [t.drafted_by for t in stored.tokens[:2]] == ["ngram-mod", "ngram-mod"]


async def test_colour_toggle_and_markdown_view():
    app, engine = make_app()
    async with app.run_test() as pilot:
        reply = await send_and_wait(pilot, app)
        assert reply.body.coloured
        await pilot.press("f5")
        # the plain view (the default) stays; only the colours go
        assert not reply.body.coloured and reply.body.display and reply._markdown is None
        assert "colouring off" in str(app.query_one(Legend).render())
        plain_styles = {s.style for s in reply.body.render_line(reply.body.top) if s.text.strip()}
        assert len(plain_styles) == 1  # one style for all text: no colours
        await pilot.press("f6")  # Markdown: the Markdown widget shows, the body hides, still uncoloured
        assert reply._markdown is not None and reply._markdown.display and not reply.body.display
        assert not app.colouring
        await pilot.press("f5")
        assert reply.body.coloured and app.colouring and reply._markdown.display
        assert config_mod.load().ui_get("colouring") is True
        assert config_mod.load().ui_get("off_view") == "markdown"


async def test_hover_and_keyboard_selection_show_the_drafter():
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        reply = await send_and_wait(pilot, app)
        await pilot.hover(reply.body, offset=(1, reply.body.top))
        await pilot.pause()
        legend = str(app.query_one(Legend).render())
        assert "drafted by ngram-mod at draft position 0" in legend
        assert reply.body.tooltip and "ngram-mod" in str(reply.body.tooltip)
        await pilot.hover(reply.body, offset=(14, reply.body.top))  # "How": the model's own
        await pilot.pause()
        assert "drafted by ngram-mod" not in str(app.query_one(Legend).render())
        reply.focus()
        await pilot.press("right")
        assert reply.body.selected_run == 0
        assert "ngram-mod · draft positions 0–1 · 2 tokens" in str(app.query_one(Legend).render())
        await pilot.press("right")
        assert reply.body.selected_run == 1
        assert "ngram-simple" in str(app.query_one(Legend).render())


async def test_regenerate_replaces_the_last_reply():
    app, engine = make_app()
    async with app.run_test() as pilot:
        await send_and_wait(pilot, app, "q1")
        await pilot.press("ctrl+r")
        await until(pilot, lambda: len(engine.requests) == 2 and app.job is None)
        await pilot.pause()
        views = app._views()
        assert [v.role for v in views] == ["user", "assistant"]
        assert engine.requests[1] == [{"role": "user", "content": "q1"}]
        stored = app.history.load_chat(app.chat_id).messages
        assert [m.role for m in stored] == ["user", "assistant"]


async def test_edit_and_resend_the_last_user_message():
    app, engine = make_app()
    async with app.run_test() as pilot:
        await send_and_wait(pilot, app, "first")
        await send_and_wait(pilot, app, "secnod")
        await pilot.press("ctrl+g")
        await pilot.pause()
        prompt = app.query_one(PromptInput)
        assert prompt.text == "secnod"
        assert [v.text for v in app._views() if v.role == "user"] == ["first"]
        prompt.text = "second"
        await pilot.press("enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 4)
        assert [m["content"] for m in engine.requests[-1]] == ["first", SCRIPT_TEXT, "second"]
        stored = [m.content for m in app.history.load_chat(app.chat_id).messages]
        assert stored == ["first", SCRIPT_TEXT, "second", SCRIPT_TEXT]


async def test_system_prompt_is_sent_and_copy_uses_the_clipboard():
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        await pilot.press("f7")
        await pilot.pause()
        await pilot.press(*"Be brief.")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.session.system_prompt == "Be brief."
        await send_and_wait(pilot, app, "hi")
        assert engine.requests[-1][0] == {"role": "system", "content": "Be brief."}
        await pilot.press("ctrl+o")
        assert app.clipboard == SCRIPT_TEXT
        reply = app._views()[-1]
        reply.focus()
        await pilot.press("c")
        assert app.clipboard == SCRIPT_TEXT


async def test_a_resumed_chat_shows_the_same_colouring():
    app, engine = make_app()
    async with app.run_test() as pilot:
        before = await send_and_wait(pilot, app, "remember me")
        runs_before = [(r.start, r.end, r.by, r.pos0, r.pos1) for r in before.body.runs]
        chat_id = app.chat_id
    # a new app (a restart) on the same history file
    app2, _ = make_app()
    async with app2.run_test() as pilot:
        await ready(pilot, app2)
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert app2.chat_id == chat_id
        views = app2._views()
        assert [v.text for v in views] == ["remember me", SCRIPT_TEXT]
        assert [(r.start, r.end, r.by, r.pos0, r.pos1) for r in views[1].body.runs] == runs_before
        assert "accepted 5" in str(views[1].foot.render())
        assert app2.session.title == "remember me"


async def test_chats_rename_delete_with_confirmation_and_export(tmp_path):
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send_and_wait(pilot, app, "chat one")
        app.action_new_chat()
        await send_and_wait(pilot, app, "chat two")
        titles = [c.title for c in app.history.list_chats()]
        assert titles == ["chat two", "chat one"]  # newest first
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        inp = app.screen.query_one("#value")
        inp.value = "renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert app.history.list_chats()[0].title == "renamed"
        # export the highlighted chat
        await pilot.press("e")
        await pilot.pause()
        out = tmp_path / "out.md"
        app.screen.query_one("#value").value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        md = out.read_text()
        assert md.startswith("# renamed") and "## You" in md and SCRIPT_TEXT in md
        # export closed the list: open it again
        await pilot.press("f2")
        await pilot.pause()
        # delete asks first; "n" keeps it
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("n")
        await pilot.pause()
        assert len(app.history.list_chats()) == 2
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert [c.title for c in app.history.list_chats()] == ["chat one"]
        assert app.chat_id is None and not app._views()  # the open chat was the one deleted


async def test_settings_validation_messages_and_apply_without_reload():
    app, engine = make_app(spec="ngram-mod")
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        screen = app.screen
        field = screen.query_one("#f-ngram_mod--n_match")
        field.value = "0"
        await pilot.pause()
        row = field.parent
        note = str(row.query_one(".f-note").render())
        assert "must be between 1 and 1024" in note
        assert screen.query_one("#s-apply").disabled
        field.value = "abc"
        await pilot.pause()
        assert "expected a whole number" in str(row.query_one(".f-note").render())
        temp = screen.query_one("#f-sampling--temperature")
        temp.value = "-1"
        await pilot.pause()
        assert "must be >= 0" in str(temp.parent.query_one(".f-note").render())
        await pilot.press("ctrl+s")  # refused while values are wrong
        await pilot.pause()
        assert app.screen is screen
        field.value = "8"
        temp.value = "0"
        screen.query_one("#sw-ngram-simple").value = True
        await pilot.pause()
        assert not screen.query_one("#s-apply").disabled
        await pilot.press("ctrl+s")
        await until(pilot, lambda: engine.set_spec_calls >= 2)
        await pilot.pause()
        assert app.screen is not screen
        assert [t.value for t in engine.spec.types] == ["ngram-simple", "ngram-mod"]
        assert engine.spec.ngram_mod.n_match == 8
        assert len(app.factory_calls) == 1  # no reload: only the chain was rebuilt
        saved = config_mod.load()
        assert saved.spec.ngram_mod.n_match == 8 and saved.sampling.temperature == 0.0
        assert [t.value for t in saved.spec.types] == ["ngram-simple", "ngram-mod"]


async def test_settings_lists_every_type_in_priority_order_with_unavailable_ones_disabled():
    from speculators.types import PRIORITY
    from textual.widgets import Switch
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        switches = [s.id[3:] for s in app.screen.query(Switch)]
        assert switches == ["auto"] + [t.value for t in PRIORITY]   # Automatic first
        for name in ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"):
            assert app.screen.query_one(f"#sw-{name}").disabled
            reason = str(app.screen.query_one(f"#desc-{name}").render())
            assert reason and ("needs" in reason or "not implemented" in reason)
        assert not app.screen.query_one("#sw-ngram-mod").disabled
        assert app.screen.query_one("#sw-ngram-mod").value


async def test_changing_the_context_size_reloads_the_model():
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        app.screen.query_one("#f-model--ctx_size").value = "2048"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.factory_calls) == 2 and app.engine is not None)
        assert app.factory_calls[-1].ctx_size == 2048
        assert config_mod.load().model.ctx_size == 2048


async def test_rpc_servers_and_devices_are_set_in_the_settings_pane_and_reload_the_model():
    """F3's Model section: the RPC servers, devices and tensor split as llama.cpp's flags take them;
    a malformed one is an error in place; a good one reloads the model with it and is saved."""
    from speculators.devices import Device
    app, engine = make_app()
    engine.devices = [Device("CPU", "a test CPU", "CPU", 3 << 30, 4 << 30)]
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        shown = str(app.screen.query_one("#devices").render())
        assert "CPU" in shown and "3,072 MiB free of 4,096 MiB" in shown
        app.screen.query_one("#f-model--rpc").value = "gpu-box"
        app.screen.query_one("#f-model--tensor_split").value = "3,x"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert len(app.factory_calls) == 1                 # nothing applied while values are wrong
        notes = " ".join(str(n.render()) for n in app.screen.query(".f-note"))
        assert "expected HOST:PORT" in notes and "invalid tensor split '3,x'" in notes
        app.screen.query_one("#f-model--rpc").value = "192.168.1.20:50052"
        app.screen.query_one("#f-model--device").value = "RPC0"
        app.screen.query_one("#f-model--tensor_split").value = "3,1"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.factory_calls) == 2 and app.engine is not None)
        m = app.factory_calls[-1]
        assert (m.rpc, m.device, m.tensor_split) == ("192.168.1.20:50052", "RPC0", "3,1")
        saved = config_mod.load().model
        assert (saved.rpc, saved.device, saved.tensor_split) == ("192.168.1.20:50052", "RPC0", "3,1")


async def test_a_missing_model_shows_a_message_and_another_can_be_picked(tmp_path):
    from speculators.llama import ModelError
    engine = ScriptedEngine(SCRIPT)
    seen = []

    def factory(model, spec, progress):
        seen.append(model.model)
        if model.model and model.model.endswith("missing.gguf"):
            raise ModelError(f"model file not found: {model.model}")
        return engine
    cfg = config_mod.Config()
    cfg.model.model = str(tmp_path / "missing.gguf")
    app = DraftlightApp(cfg, engine_factory=factory)
    async with app.run_test(size=(100, 30)) as pilot:
        panel = app.query_one(LoadPanel)
        await until(pilot, lambda: panel.has_class("-error"))
        await pilot.pause()
        text = str(panel.query_one("#load-detail").render())
        assert "model file not found" in text and "Traceback" not in text
        assert app.engine is None
        good = tmp_path / "good.gguf"
        panel.query_one("#model-path").value = str(good)
        await pilot.click("#load-path")
        await until(pilot, lambda: app.engine is not None)
        assert seen[-1] == str(good) and not panel.display


async def test_a_message_typed_while_loading_is_sent_when_ready():
    release = threading.Event()
    engine = ScriptedEngine(SCRIPT)

    def slow_factory(model, spec, progress):
        progress(0, 0, "load")
        release.wait(5)
        return engine
    app = DraftlightApp(config_mod.Config(), engine_factory=slow_factory)
    async with app.run_test() as pilot:
        await pilot.press(*"early")
        await pilot.press("enter")
        await pilot.pause()
        assert app.engine is None and not app._views()
        release.set()
        await until(pilot, lambda: len(app._views()) == 2 and app.job is None)
        assert app._views()[0].text == "early"


async def test_a_generation_error_is_shown_without_a_traceback():
    app, engine = make_app(fail="the prompt has 9000 tokens but the context holds 4096")
    async with app.run_test() as pilot:
        await ready(pilot, app)
        app.send("too long")
        await until(pilot, lambda: app.job is None)
        await pilot.pause()
        reply = app._views()[-1]
        assert reply.has_class("-error") and "context holds 4096" in reply.text
        # neither the failed reply nor the message it could not answer is sent to the model again,
        # so the next message is not stuck behind it
        assert app.session.conversation() == []
        assert app.send("short")
        await until(pilot, lambda: app.job is None)
        assert engine.requests[-1] == [{"role": "user", "content": "short"}]


async def test_statistics_panel_shows_per_speculator_figures_and_bars():
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await send_and_wait(pilot, app)
        await pilot.press("f4")
        await pilot.pause()
        text = str(app.query_one(StatsPanel).body.render())
        assert "ngram-mod" in text and "ngram-simple" in text
        assert "acceptance by draft position" in text and "█" in text
        assert "tokens gen/acc 2/2 (100%)" in text
        assert config_mod.load().ui_get("stats_panel") is True


async def test_themes_from_the_palette_persist_and_a_broken_user_theme_is_reported():
    d = paths.user_themes_dir()
    d.mkdir(parents=True)
    (d / "broken.toml").write_text("name = 'broken'\n[colors]\nprimary = 'not a colour'\n")
    (d / "mine.toml").write_text("name = 'mine'\ndark = true\n[colors]\nprimary = '#ff0000'\n"
                                 "[draft]\n'ngram-mod' = '#00ff00'\n")
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        assert "mine" in app.themes and "broken" not in app.themes
        assert any("broken.toml" in n.message for n in app._notifications)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for label in ("Theme: Dark", "Theme: Light", "Theme: High contrast", "Theme: Mine"):
            assert label in titles
        app.set_theme("mine")
        await pilot.pause()
        assert app.draft_styles["ngram-mod"].foreground.hex.lower() == "#00ff00"
        # a type the user theme leaves out falls back to the built-in colour
        assert app.draft_styles["ngram-simple"].foreground is not None
        assert config_mod.load().ui_get("theme") == "mine"
        app.set_theme("light")
        await pilot.pause()
        assert config_mod.load().ui_get("theme") == "light"


async def test_every_action_has_a_key_a_help_line_and_a_palette_command():
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        keys = {b.action: b.key for bs in app._bindings.key_to_bindings.values() for b in bs}
        titles = {c.title for c in app.get_system_commands(app.screen)}
        for a in ACTIONS:
            # a key of its own, or (the starters: a list the keyboard moves into) the way there
            assert a.action in keys or (not a.keys and a.action.startswith("starter(")
                                        and a.key_display.startswith("Down")), a.action
            if a.action != "stop":
                assert a.label in titles or a.action == "quit" and "Quit" in titles, a.action
        await pilot.press("f1")
        await pilot.pause()
        help_text = "\n".join(str(w.render()) for w in app.screen.query("Static"))
        for a in ACTIONS:
            assert a.help in help_text
        await pilot.press("escape")


async def test_the_draft_model_picker_fills_the_field_and_enables_draft_simple(monkeypatch, tmp_path):
    from app.ui.screens import settings as screens     # the module SettingsScreen reads it from
    draft = tmp_path / "small-draft.gguf"
    draft.write_bytes(b"GGUF")
    monkeypatch.setattr(screens, "discover_draft_models",
                        lambda engine: [(str(draft), "small draft · 90 MiB · compatible")])
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        picker = app.screen.query_one("#drafts")
        await until(pilot, lambda: picker.display and picker.option_count == 1)
        assert app.screen.query_one("#sw-draft-simple").disabled or \
            "not implemented" not in str(app.screen.query_one("#desc-draft-simple").render())
        picker.focus()
        picker.highlighted = 0
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.query_one("#f-draft--model").value == str(draft)
        reason = str(app.screen.query_one("#desc-draft-simple").render())
        if "not implemented" not in reason:
            assert not app.screen.query_one("#sw-draft-simple").disabled


async def test_a_new_chat_while_a_reply_streams_stops_it_and_saves_it_to_its_own_chat():
    gate = threading.Event()
    app, engine = make_app(gate=gate)
    async with app.run_test() as pilot:
        await ready(pilot, app)
        app.send("first chat")
        await until(pilot, lambda: app._views()[-1].text == "Hello world!")
        old_chat = app.chat_id
        await pilot.press("ctrl+n")
        await until(pilot, lambda: app.job is None)
        assert app.chat_id is None and not app._views()
        stored = app.history.load_chat(old_chat).messages
        assert [(m.role, m.status) for m in stored] == [("user", "done"), ("assistant", "cancelled")]
        assert stored[1].content == "Hello world!"
        gate.set()
        await send_and_wait(pilot, app, "second chat")
        assert app.chat_id != old_chat and app._views()[-1].text == SCRIPT_TEXT


async def test_a_stop_string_the_engine_trims_after_streaming_it_is_removed_from_the_reply():
    from speculators.events import FinishEvent

    class Trimming(ScriptedEngine):
        def generate(self, *a, **kw):
            for ev in super().generate(*a, **kw):
                if isinstance(ev, FinishEvent):
                    ev.result.text = ev.result.text[: -len("\nUser")]
                yield ev
    engine = Trimming([("ngram-mod", ["Hi", " there", "\n"]), (None, ["User"])])
    app, _ = make_app(engine=engine)
    async with app.run_test() as pilot:
        reply = await send_and_wait(pilot, app)
        assert reply.text == "Hi there"
        assert [(r.by, reply.text[r.start:r.end]) for r in reply.body.runs] == [("ngram-mod", "Hi there")]
        stored = app.history.load_chat(app.chat_id).messages[-1]
        assert stored.content == "Hi there" and "".join(t.text for t in stored.tokens) == "Hi there"


async def test_command_line_flags_win_but_are_not_saved_by_the_app():
    from app import cli, cmd_chat
    config_mod.save(config_mod.Config())  # a config file with the defaults
    args = cli.build_parser().parse_args(["chat", "--temp", "0", "--spec-type", "ngram-mod", "-n", "50"])
    cfg, saved = cmd_chat._configs(args)
    assert (cfg.sampling.temperature, [t.value for t in cfg.spec.types], cfg.max_tokens) == (0.0, ["ngram-mod"], 50)
    engine = ScriptedEngine(SCRIPT)
    app = DraftlightApp(cfg, engine_factory=lambda m, s, p: engine, saved_config=saved)
    async with app.run_test() as pilot:
        await ready(pilot, app)
        assert [t.value for t in engine.spec.types] == ["ngram-mod"]
        await pilot.press("f5")  # a UI choice is saved ...
    on_disk = config_mod.load()
    assert on_disk.ui_get("colouring") is False
    # ... but not the one-off flags
    assert on_disk.sampling.temperature == 0.8 and on_disk.spec.is_auto and on_disk.max_tokens == 1024


async def test_the_drafted_run_line_does_not_outlive_the_focused_message():
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        reply = await send_and_wait(pilot, app)
        reply.focus()
        await pilot.press("right")
        await pilot.pause()
        assert "run 1/2" in str(app.query_one(Legend).render())
        app.query_one(PromptInput).focus()
        await pilot.pause()
        assert "run 1/2" not in str(app.query_one(Legend).render())
        assert "ngram-mod" in str(app.query_one(Legend).render())   # the legend is back
        reply.focus()
        await pilot.press("right")
        await pilot.pause()
        app.action_new_chat()
        await pilot.pause()
        assert "run 1/2" not in str(app.query_one(Legend).render())


async def test_welcome_text_follows_the_speculation_setting():
    app, _ = make_app(spec="")
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        assert "turn speculators on" in str(app.query_one("#welcome-text").render())
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        text = str(app.query_one("#welcome-text").render())
        assert "turn speculators on" not in text and "speculation settings" in text


async def test_a_resumed_chat_opens_at_its_latest_message_and_tab_goes_there():
    app, engine = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        for i in range(6):
            await send_and_wait(pilot, app, f"message {i}")
        cid = app.chat_id
        app.action_new_chat()
        await pilot.pause()
        app.resume_chat(cid)
        await pilot.pause()
        await pilot.pause(0.1)
        conv = app.query_one("#conversation")
        assert conv.max_scroll_y > 0 and conv.scroll_y == conv.max_scroll_y
        app.query_one(PromptInput).focus()
        await pilot.press("tab")
        assert app.focused is app._views()[-1]


async def test_the_chats_list_shows_its_own_keys():
    from textual.widgets import Footer
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send_and_wait(pilot, app, "one")
        await pilot.press("f2")
        await pilot.pause()
        screen = app.screen
        assert type(screen).__name__ == "ChatsScreen" and screen.query(Footer)
        shown = {ab.binding.action for ab in screen.active_bindings.values() if ab.binding.show}
        assert {"new", "rename", "delete", "export", "close"} <= shown
        assert "regenerate" not in shown and "settings" not in shown   # the chat's keys do not apply here


async def test_the_top_bar_keeps_the_state_at_80_columns():
    app, _ = make_app(spec="ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache")
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await pilot.pause()
        top = str(app.query_one("TopBar").render())
        assert top.rstrip().endswith("ready") and not top.rstrip().endswith("·")
        assert "5 speculators" in top
        legend = str(app.query_one(Legend).render())
        assert "mod" in legend and "cache" in legend and "…" not in legend


async def test_a_chat_past_a_small_context_keeps_going_and_marks_what_the_model_no_longer_sees():
    from tests.test_session import CountingEngine, words
    engine = CountingEngine(n_ctx=120)
    app, _ = make_app(engine=engine)
    app.config.max_tokens = 16
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        for i in range(10):
            app.send(words(10, f"m{i}"))
            await until(pilot, lambda: app.job is None)
        await pilot.pause()
        marker = app.query(".context-cut")
        assert marker and "no longer sees" in str(marker.first().render())
        views = app._views()
        first_seen = app.session.turns[app.session.context_start].key
        idx = [v.key for v in views].index(first_seen)
        # the marker sits right before the first message the model still sees
        conv_children = list(app.query_one("#conversation").children)
        assert conv_children.index(marker.first()) == conv_children.index(views[idx]) - 1
        assert all(not v.has_class("-error") for v in views)


async def test_settings_offer_automatic_first_and_say_what_it_picked():
    from textual.widgets import Switch
    app, engine = make_app(spec="auto")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        screen = app.screen
        assert screen.query_one("#sw-auto", Switch).value is True
        assert all(sw.disabled for sw in screen.query(Switch) if sw.id != "sw-auto")
        plan = str(screen.query_one("#auto-plan").render())
        assert "uses: ngram-simple" in plan and "ngram-cache" in plan and "draft-simple (" in plan
        screen.query_one("#sw-auto", Switch).value = False
        await pilot.pause()
        assert not screen.query_one("#sw-ngram-mod", Switch).disabled
        screen.query_one("#sw-ngram-mod", Switch).value = True
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: engine.set_spec_calls >= 2)
        assert [t.value for t in app.config.spec.types] == ["ngram-mod"]
        assert config_mod.load().spec.types == app.config.spec.types


def contended_app(n: int, word: str, tokens_per_s: float):
    """An app whose scripted engine says its threads take every core (as the real engine
    reports them), with a reply of ``n`` tokens ``word0``, ``word1``, …: (app, engine, script)."""
    from types import SimpleNamespace
    script = [(None, [f"{word}{i}"]) for i in range(n)]
    app, engine = make_app(script, spec="", tokens_per_s=tokens_per_s)
    engine.ctx = SimpleNamespace(n_threads=usable_cores())
    return app, engine, script


async def test_where_the_model_takes_every_core_a_streaming_reply_paints_a_few_times_a_second():
    """With the model's threads on every core the reply is painted at most 10 times a second
    (tokens in between wait and come together), every token still arrives in order, and the
    footer ends with the final figures, not a late 'writing…'."""
    n = 120
    app, engine, script = contended_app(n, " w", 200)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        assert app.paint_every_s() == app.PAINT_EVERY_CONTENDED_S
        paints: list[tuple[float, int]] = []
        assert app.send("go")
        await until(pilot, lambda: len(app._views()) == 2)
        view = app._views()[-1]
        original = view.add_tokens

        def counting(tokens, times=None):
            paints.append((time.monotonic(), len(tokens)))
            original(tokens, times)
        view.add_tokens = counting
        await until(pilot, lambda: app.job is None, timeout=15)
        await pilot.pause(0.2)
        assert view.text == "".join(t for _, toks in script for t in toks).lstrip()
        assert [t.text for t in view.body.tokens][-1] == f" w{n - 1}"
        live = [t for t, _ in paints[:-1]]       # the last one comes with the reply's end
        gaps = [b - a for a, b in zip(live, live[1:])]
        assert gaps and min(gaps) >= app.PAINT_EVERY_CONTENDED_S * 0.9
        assert max(k for _, k in paints) > 1      # tokens came together
        foot = str(view.foot.render())
        assert "writing" not in foot and f"{n} tok" in foot


async def test_where_the_model_takes_every_core_a_costly_paint_paints_less_often():
    """Each paint's cycle is timed on the UI thread's CPU clock: where a paint costs 6 ms, the
    next waits until that is UI_CPU_SHARE of the time since (capped at PAINT_EVERY_MAX_S), so
    the UI thread takes about that share of a core from the model's threads."""
    app, engine, script = contended_app(400, " w", 200)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        assert app.send("go")
        await until(pilot, lambda: len(app._views()) == 2)
        view = app._views()[-1]
        original = view.add_tokens
        paints: list[float] = []

        def costly(tokens, times=None):
            paints.append(time.monotonic())
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.006:     # a slow frame: 6 ms of the UI thread's CPU
                pass
            original(tokens, times)
        view.add_tokens = costly
        await until(pilot, lambda: app.job is None, timeout=20)
        await pilot.pause(0.2)
        assert view.text == "".join(t for _, toks in script for t in toks).lstrip()
        gaps = [b - a for a, b in zip(paints[2:-1], paints[3:-1])]   # once the cost is known
        assert len(gaps) >= 3
        expected = min(app.PAINT_EVERY_MAX_S, 0.006 / app.UI_CPU_SHARE)
        assert expected > 2 * app.PAINT_EVERY_CONTENDED_S
        assert statistics.median(gaps) >= 0.8 * expected, gaps
        # the model loaded again, now with its threads leaving a core free: its replies are
        # painted as they come again
        from types import SimpleNamespace
        engine.ctx = SimpleNamespace(n_threads=usable_cores() - 1) if usable_cores() > 1 else None
        await open_settings(pilot, app)
        app.screen.query_one("#f-model--ctx_size").value = "2048"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.factory_calls) == 2 and app.engine is not None and app.state == "ready")
        assert app.paint_every_s() == 0.0
        assert app.send("again")
        await until(pilot, lambda: len(app._views()) == 4)
        view = app._views()[-1]
        original = view.add_tokens
        paints.clear()
        view.add_tokens = costly
        await until(pilot, lambda: app.job is None, timeout=20)
        gaps = [b - a for a, b in zip(paints[2:-1], paints[3:-1])]
        assert len(gaps) >= 3 and statistics.median(gaps) < app.PAINT_EVERY_CONTENDED_S, gaps


async def test_where_the_model_takes_every_core_a_streaming_reply_grows_a_few_lines_at_a_time():
    """While it streams, the reply has RESERVE_LINES_CONTENDED lines from before its first token,
    then grows twice that many at a time (a new line within them repaints that line, no layout
    of the screen), and the prompt's cursor holds still; at the end the reply is as tall as its
    text and the cursor blinks again."""
    app, engine, script = contended_app(300, " word", 150)
    async with app.run_test(size=(60, 40)) as pilot:
        await ready(pilot, app)
        prompt = app.query_one(PromptInput)
        assert prompt.cursor_blink
        assert app.send("go")
        await until(pilot, lambda: len(app._views()) == 2)
        view = app._views()[-1]
        step = app.RESERVE_LINES_CONTENDED
        # the room is made at once, before the first token
        assert view.body.reserve == step and view.body._height(0) == step
        seen: set[tuple[int, int]] = set()
        while app.job is not None:
            await pilot.pause(0.05)
            body = view.body
            # (the text's height: the body's first line says who wrote it)
            height = body.size.height - body.top
            if app.job is not None and height > 0:
                assert not prompt.cursor_blink
                lines = len(body._lines)
                seen.add((lines, height))
                if lines > height + step:
                    # the layout trails more than a frame (a stalled machine): it comes as soon
                    # as the UI has processed what is queued, tall enough for those lines
                    await pilot.pause()
                    if app.job is not None:     # (at the end the reply fits its text exactly)
                        assert body.size.height - body.top >= body._height(lines), (lines, body.size.height)
        grown = [(lines, height) for lines, height in seen if lines > 0]
        assert any(lines < height for lines, height in grown), "no paint fell within a reserve"
        assert any(height > step for _, height in grown), "the reply never grew"
        for lines, height in grown:
            assert height == step or (height - step) % (2 * step) == 0, (lines, height)
            # never taller than the lines need (a layout only ever trails the lines)
            assert height - 3 * step <= lines, (lines, height)
        await pilot.pause(0.2)
        assert view.body.size.height - view.body.top == len(view.body._lines) > step
        assert prompt.cursor_blink


async def test_with_a_core_to_spare_each_update_is_painted_as_it_comes():
    from types import SimpleNamespace
    app, engine = make_app()
    engine.ctx = SimpleNamespace(n_threads=1)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        assert app.paint_every_s() == (0.0 if usable_cores() >= 2 else app.PAINT_EVERY_CONTENDED_S)
        engine.ctx = None                          # an engine that does not say: as it comes
        assert app.paint_every_s() == 0.0


async def test_chats_with_the_same_title_are_told_apart():
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send_and_wait(pilot, app, "hello")
        app.action_new_chat()
        await send_and_wait(pilot, app, "hello")
        assert [c.title for c in app.history.list_chats()] == ["hello", "hello"]
        await pilot.press("f2")
        await pilot.pause()
        from textual.widgets import OptionList
        ol = app.screen.query_one(OptionList)
        rows = [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]
        assert len(set(rows)) == 2
        assert "hello (2)" in rows[0] and "started" in rows[0] and "started" in rows[1]


async def test_the_statistics_panel_scrolls_from_the_keyboard_and_explains_its_terms():
    app, engine = make_app()
    async with app.run_test(size=(120, 24)) as pilot:
        await send_and_wait(pilot, app)
        await pilot.press("f4")
        await pilot.pause()
        panel = app.query_one(StatsPanel)
        text = str(panel.body.render())
        assert "What the terms mean" in text and "calls b/g/a:" in text and "cold" in text
        for _ in range(6):                        # Tab reaches it
            if app.focused is panel:
                break
            await pilot.press("tab")
            await pilot.pause()
        assert app.focused is panel
        assert panel.max_scroll_y > 0             # more than fits at 24 rows
        await pilot.press("end")
        await pilot.pause(0.3)
        assert panel.scroll_y == panel.max_scroll_y
        await pilot.press("home")
        await pilot.pause(0.3)
        assert panel.scroll_y == 0
        await pilot.press("pagedown")
        await pilot.pause(0.3)
        assert panel.scroll_y > 0


async def test_the_legend_keeps_its_labels_at_100_columns_with_six_speculators():
    six = "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache,draft-simple"
    app, engine = make_app(spec=six)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        await pilot.pause()
        assert len(app.session.active_types) == 6
        line = str(app.query_one(Legend).render())
        assert line.startswith("drafted by") and "plain: the model" in line, line
        for name in ("simple", "map-k", "map-k4v", "mod", "cache", "draft"):
            assert f" {name} " in line or f"■ {name}" in line, (name, line)
        assert "…" not in line


async def test_nothing_animates_out_of_sight_once_the_model_is_loaded():
    """The load panel's indeterminate bar runs a 15-a-second timer; hidden after the load, it
    must not keep it (the UI would pay for it while every reply streams)."""
    from textual.widgets import ProgressBar
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot, app)
        assert not app.query_one(LoadPanel).display
        animated = [w for w in app.screen.query("*") if getattr(w, "auto_refresh", None)]
        assert animated == []
        assert app.query_one("#load-bar", ProgressBar).auto_refresh is None


async def test_the_palettes_screenshot_is_saved_where_the_downloads_folder_did_not_exist(monkeypatch, tmp_path):
    import app.ui.app as ui_app
    folder = tmp_path / "no such" / "Downloads"
    monkeypatch.setattr(ui_app, "downloads_folder", lambda: folder)
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        (shot,) = [c for c in app.get_system_commands(app.screen) if c.title == "Screenshot"]
        shot.callback()
        for _ in range(100):
            await pilot.pause(0.05)
            if any("Saved screenshot" in n.message for n in app._notifications):
                break
        saved = list(folder.glob("*.svg"))
        assert len(saved) == 1 and saved[0].read_text().startswith("<svg")
        assert not any("Failed" in n.message for n in app._notifications)
        # where the folder cannot be made, the reason is said
        blocker = tmp_path / "a file"
        blocker.write_text("")
        monkeypatch.setattr(ui_app, "downloads_folder", lambda: blocker / "Downloads")
        shot.callback()
        for _ in range(100):
            await pilot.pause(0.05)
            if any("Cannot save" in n.message for n in app._notifications):
                break
        assert any("Cannot save the screenshot in" in n.message and "a file" in n.message
                   for n in app._notifications), [n.message for n in app._notifications]


class ReadingEngine(ScriptedEngine):
    """A scripted engine that reads the conversation ahead (``warm``) until :attr:`release` is set."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.release = threading.Event()
        self.reads: list[int] = []

    def warm(self, prompt, cancel=None) -> int:
        self.reads.append(len(prompt))
        while not self.release.wait(0.01):
            if cancel is not None and cancel():
                return 0
        return len(prompt)


def _top_states(app, monkeypatch) -> list[str]:
    """Every state the top bar is asked to show, in order."""
    from app.ui.widgets import TopBar
    shown: list[str] = []
    real = TopBar.show

    def show(bar, model, spec, state, *a, **kw):
        shown.append(state)
        return real(bar, model, spec, state, *a, **kw)
    monkeypatch.setattr(TopBar, "show", show)
    return shown


async def test_a_long_read_ahead_is_said_in_the_top_bar_and_a_message_sent_meanwhile_waits_for_it(monkeypatch):
    engine = ReadingEngine(SCRIPT)
    app, _ = make_app(engine=engine)
    shown = _top_states(app, monkeypatch)
    async with app.run_test(size=(100, 24)) as pilot:
        await ready(pilot, app)
        await until(pilot, lambda: engine.reads)                 # the model is ready: it reads ahead
        await until(pilot, lambda: "reading…" in str(app.query_one("TopBar").render()))
        assert app.session.reading_ahead
        assert app.send("hi")                                    # taken, and waits for the read-ahead
        await pilot.pause(0.1)
        assert app.job is not None and app._views()[-1].text == ""
        assert "writing…" in str(app.query_one("TopBar").render())
        engine.release.set()
        await until(pilot, lambda: app.job is None)
        assert app._views()[-1].text == SCRIPT_TEXT
        await until(pilot, lambda: str(app.query_one("TopBar").render()).rstrip().endswith("ready"))
    assert "reading…" in shown


async def test_a_quick_read_ahead_is_not_said(monkeypatch):
    engine = ReadingEngine(SCRIPT)
    engine.release.set()                                         # each read-ahead ends at once
    app, _ = make_app(engine=engine)
    shown = _top_states(app, monkeypatch)
    async with app.run_test(size=(100, 24)) as pilot:
        await ready(pilot, app)
        await until(pilot, lambda: engine.reads)
        await pilot.pause(app.READ_AHEAD_SHOWN_AFTER_S + 0.2)   # past the moment a long one is said
        await send_and_wait(pilot, app)
        await pilot.press("ctrl+n")                             # a new chat is read ahead too
        await until(pilot, lambda: len(engine.reads) >= 2)
        await pilot.pause(app.READ_AHEAD_SHOWN_AFTER_S + 0.2)
        assert not app.session.reading_ahead
    assert "ready" in shown and "reading…" not in shown


async def test_a_key_typed_after_enter_before_the_message_is_taken_stays_in_the_prompt():
    """Enter posts the message; a key typed before the app takes it is the start of the next
    message, not part of the one sent (the soak test found it erased)."""
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        prompt = app.query_one(PromptInput)
        prompt.text = "hi"
        prompt.post_message(PromptInput.Send("hi"))      # Enter, not taken yet
        prompt.text = "hix"                             # the next key, typed meanwhile
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == "hi"
        assert prompt.text == "x"
        await pilot.press("y")                          # the cursor is after what was kept
        assert prompt.text == "xy"
