"""What the top bar, the settings pane (F3) and the statistics panel (F4) say agrees with the
configuration that runs; the context size shown is the one llama.cpp uses; colouring (F5) and
the Markdown/plain view (F6) are independent. Pilot tests on the scripted engine (one real-model
test pins llama.cpp's context rounding)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app import config as config_mod
from app.settings_form import ctx_in_use
from app.ui.widgets import Legend, StatsPanel, TopBar, align_offsets
from speculators.controller_stats import ControllerStats
from tests.test_ui_app import SCRIPT, make_app, open_settings, ready, send_and_wait, until

#: a reply drafted by two of Automatic's types (the scripted chain under auto runs the n-gram types)
AUTO_SCRIPT = [
    ("ngram-cache", ["Hello", " world", "!"]),
    (None, [" How"]),
    ("ngram-simple", [" are", " you", " today", "?"]),
]
LOOKUP = {"folder": "/tmp/lookup", "caches": {"static": {"exists": False}, "dynamic": {"exists": True, "entries": 7,
                                                                                     "file_bytes": 100}},
          "sources": {"context": {"accepted": 2, "drafted": 3}}, "pending_entries": 0}


def stats_text(app) -> str:
    """F4's text, without the explanation of its terms at the end."""
    return str(app.query_one(StatsPanel).body.render()).partition("What the terms mean")[0]


def bar_text(app) -> str:
    return str(app.query_one(TopBar).render())


async def apply_settings(pilot, app, engine, *, auto: bool, types: tuple[str, ...] = ()) -> None:
    from textual.widgets import Switch
    calls = engine.set_spec_calls
    await open_settings(pilot, app)
    screen = app.screen
    screen.query_one("#sw-auto", Switch).value = auto
    await pilot.pause()
    for t in types:
        screen.query_one(f"#sw-{t}", Switch).value = True
    await pilot.pause()
    await pilot.press("ctrl+s")
    await until(pilot, lambda: engine.set_spec_calls > calls and app.screen is not screen)
    await pilot.pause()


# -- F3 ------------------------------------------------------------------------------------------

async def test_the_settings_text_follows_the_automatic_switch_and_the_manual_types():
    from textual.widgets import Switch
    app, engine = make_app(spec="auto")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        screen = app.screen
        plan = lambda: str(screen.query_one("#auto-plan").render())        # noqa: E731
        status = lambda: str(screen.query_one("#s-status").render())       # noqa: E731
        assert plan().startswith("uses: ngram-simple") and status() == "speculation: automatic"
        screen.query_one("#sw-auto", Switch).value = False
        await pilot.pause()
        await pilot.pause()
        # the text and the status line say the same: nothing runs, and Automatic's picks are gone
        assert status() == "speculation: off"
        assert "Automatic is off" in plan() and "no speculation" in plan() and "uses: ngram-simple" not in plan()
        screen.query_one("#sw-ngram-mod", Switch).value = True
        screen.query_one("#sw-ngram-map-k", Switch).value = True
        await pilot.pause()
        await pilot.pause()
        assert status() == "speculation: ngram-map-k, ngram-mod"
        assert "uses ngram-map-k, ngram-mod" in plan() and "ngram-simple" not in plan()
        screen.query_one("#sw-auto", Switch).value = True
        await pilot.pause()
        await pilot.pause()
        assert status() == "speculation: automatic" and plan().startswith("uses: ngram-simple")


async def test_a_manual_configuration_opens_with_its_own_types_in_the_text():
    app, engine = make_app(spec="ngram-mod")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        plan = str(app.screen.query_one("#auto-plan").render())
        assert plan == "Automatic is off: speculation uses ngram-mod (switched on below)"


# -- F4 and the top bar -------------------------------------------------------------------------

async def test_after_automatic_is_switched_off_and_on_f4_and_the_bar_describe_what_runs(monkeypatch):
    app, engine = make_app(AUTO_SCRIPT, spec="auto")
    # under the manual configuration the replies are drafted by ngram-mod
    engine.script = lambda messages: AUTO_SCRIPT if engine.spec.is_auto else SCRIPT[:2]
    monkeypatch.setattr(app.session, "lookup_figures", lambda: LOOKUP)
    async with app.run_test(size=(140, 60)) as pilot:
        await send_and_wait(pilot, app)
        # what Automatic's controller decided in that reply (the scripted engine has no controller)
        app.session.stats.controller = ControllerStats(n_steps=3, n_drafted=2)
        await pilot.press("f4")
        await pilot.pause()
        text = stats_text(app)
        assert "Automatic: ngram-simple" in text and "Automatic speculation: what it decided" in text
        assert "Lookup caches (ngram-cache)" in text and "■ ngram-cache" in text
        assert "Earlier in this session" not in text
        assert "auto: ngram-simple" in bar_text(app) or "auto: 5 speculators" in bar_text(app)

        await apply_settings(pilot, app, engine, auto=False, types=("ngram-mod",))
        text = stats_text(app)
        head, _, earlier = text.partition("Earlier in this session (not in use now)")
        # the running configuration: ngram-mod by hand; no controller, no lookup caches
        assert "Speculation: ngram-mod" in head
        assert "Automatic" not in head and "Lookup caches" not in head and "ngram-cache" not in head
        assert "No speculator has run yet." in head
        # what ran before is there, said to be earlier, without its full figures
        assert "Automatic's controller: off now" in earlier
        assert "ngram-cache" in earlier and "ngram-simple" in earlier and "calls b/g/a" not in earlier
        bar = bar_text(app)
        assert "ngram-mod" in bar and "auto:" not in bar

        await send_and_wait(pilot, app)      # a reply under the manual configuration
        head = stats_text(app).partition("Earlier in this session")[0]
        assert "Speculation: ngram-mod" in head and "No speculator has run yet." not in head
        assert "■ ngram-mod" in head and "ngram-cache" not in head

        await apply_settings(pilot, app, engine, auto=True)
        text = stats_text(app)
        head, _, earlier = text.partition("Earlier in this session (not in use now)")
        assert "Automatic: ngram-simple" in head and "Automatic speculation: what it decided" in head
        assert "■ ngram-cache" in head and "Lookup caches (ngram-cache)" in head
        assert "ngram-cache" not in earlier and "controller" not in earlier
        assert "auto:" in bar_text(app)


# -- the context size ---------------------------------------------------------------------------

async def test_the_settings_show_the_context_size_in_use_and_messages_name_it():
    app, engine = make_app(spec="ngram-mod")
    app.config.model.ctx_size = 128
    engine.ctx = SimpleNamespace(n_ctx=256)      # what llama.cpp makes of -c 128
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        field = app.screen.query_one("#f-model--ctx_size")
        assert field.value == "256"
        note = lambda: str(field.parent.query_one(".f-note").render())      # noqa: E731
        assert "asked for 128" in note() and "256" in note()
        field.value = "300"
        await pilot.pause()
        assert "llama.cpp will use 512" in note()
        field.value = "256"
        await pilot.pause()
        assert "asked for 128" in note()
        await pilot.press("ctrl+s")       # shown as it runs: not a change, no reload
        await pilot.pause()
        assert len(app.factory_calls) == 1 and app.config.model.ctx_size == 128
        # a paste too long for the context is refused with the size in use
        assert app.send("word " * 400)
        await until(pilot, lambda: app.job is None)
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert any("the context holds 256" in m for m in messages), messages
        assert "the context holds 256" in app._views()[-1].error


@pytest.mark.slow
def test_llama_cpp_rounds_the_context_up_as_the_settings_say(default_model_path):
    from app.options import ModelOptions
    from app.runtime import open_engine
    from speculators.params import SpecParams
    eng = open_engine(ModelOptions(model=str(default_model_path), ctx_size=128, threads=2), SpecParams())
    try:
        assert eng.ctx.n_ctx == ctx_in_use(128) == 256
    finally:
        eng.close()


# -- F5 and F6 ----------------------------------------------------------------------------------

def coloured_markdown_spans(app, reply) -> dict[str, str]:
    """The text of each coloured run in the reply's Markdown blocks -> its colour (hex)."""
    from textual.widgets._markdown import MarkdownBlock
    out = {}
    for block in reply._markdown.query(MarkdownBlock):
        for span in block._content.spans:
            style = span.style
            if hasattr(style, "foreground") and style.foreground is not None and style.meta.get("by"):
                out[block._content.plain[span.start:span.end]] = style.foreground.hex.lower()
    return out


async def test_f6_switches_the_layout_and_leaves_the_colours_to_f5():
    app, engine = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        reply = await send_and_wait(pilot, app)
        mod = app.draft_styles["ngram-mod"].foreground.hex.lower()
        simple = app.draft_styles["ngram-simple"].foreground.hex.lower()
        assert reply.body.display and reply.body.coloured and reply._markdown is None   # plain by default
        await pilot.press("f6")                      # Markdown: still coloured
        await until(pilot, lambda: reply._markdown is not None and coloured_markdown_spans(app, reply))
        assert app.colouring and reply._markdown.display and not reply.body.display
        assert coloured_markdown_spans(app, reply) == {"Hello world": mod, " are you today": simple}
        assert "drafted by" in str(app.query_one(Legend).render())
        await pilot.press("f5")                      # colouring off, Markdown stays
        await until(pilot, lambda: not coloured_markdown_spans(app, reply))
        assert reply._markdown.display and not app.colouring
        assert "colouring off · markdown view" in str(app.query_one(Legend).render())
        await pilot.press("f6")                      # plain, still uncoloured
        assert reply.body.display and not reply._markdown.display and not reply.body.coloured
        await pilot.press("f5")
        assert reply.body.coloured
        saved = config_mod.load()
        assert saved.ui_get("colouring") is True and saved.ui_get("off_view") == "plain"
        await pilot.press("f6")                      # and a new reply in the Markdown view is coloured too
        reply2 = await send_and_wait(pilot, app, "again")
        # (the Markdown view is built block by block: wait for the whole reply, not its first run)
        want = {"Hello world": mod, " are you today": simple}
        await until(pilot, lambda: reply2._markdown is not None and coloured_markdown_spans(app, reply2) == want)
        assert coloured_markdown_spans(app, reply2) == want


def test_markdown_text_is_matched_back_to_its_source():
    src = "# Title\n\nSome **bold** and `code`,\na [link](http://x.org/a) end.\n\n> quoted *text*"
    shown = ["Title", "Some bold and code, a link end.", "quoted text"]
    for text in shown:
        offs = align_offsets(text, src[src.index(text[:4]):])
        base = src.index(text[:4])
        got = "".join(src[base + o] if o is not None else "?" for o in offs)
        assert got.replace("\n", " ") == text


# -- the welcome screen's starter requests ----------------------------------------------------------
# (Alt+digit is no key in a real terminal: xterm and tmux send ESC and the digit, which Textual
# reads as a typed "™"; the starters are a list that Down, Up and Enter work, in any terminal)

def starters_shown(app) -> list[str]:
    """The starter list's lines as they are on screen."""
    from app.ui.widgets import StarterList
    ol = app.query_one(StarterList)
    return ["".join(seg.text for seg in ol.render_line(y)).rstrip() for y in range(ol.size.height)]


async def test_down_from_the_empty_prompt_picks_a_starter_and_enter_sends_exactly_it():
    from app.ui.app import ACTIONS, STARTERS, DraftlightApp
    from app.ui.widgets import PromptInput, StarterList
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        starters = app.query_one(StarterList)
        prompt = app.query_one(PromptInput)
        text = str(app.query_one("#welcome-text").render())
        assert "↓ to pick one, Enter to send it" in text and "Alt+" not in text
        assert starters_shown(app) == [f"› {st.text}" for st in STARTERS]   # (120 columns: no wrap)
        assert starters.display and app.focused is prompt
        assert starters.highlighted is None            # no highlight until the list has the keys
        # no key of their own (Alt+digit never reaches an app in a terminal); in the palette
        assert not any(a.keys for a in ACTIONS if a.action.startswith("starter("))
        assert not any(b.action.startswith("starter") or "alt+" in b.key for b in DraftlightApp.BINDINGS)
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {f"Starter {i}" for i in range(1, len(STARTERS) + 1)} <= titles
        await pilot.press("down")
        assert app.focused is starters and starters.highlighted == 0
        await pilot.press("down", "down")
        assert starters.highlighted == 2
        await pilot.press("down", "down", "down")      # the list ends at its last request
        assert starters.highlighted == len(STARTERS) - 1
        await pilot.press("up")
        assert starters.highlighted == len(STARTERS) - 2 == 2
        await pilot.press("enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == STARTERS[2].text
        assert engine.requests[-1][-1] == {"role": "user", "content": STARTERS[2].text}
        assert len(engine.requests) == 1
        assert not app.query_one("#welcome").display
        assert app.focused is prompt and prompt.text == ""
        # with a conversation on screen the starters are gone: Down stays in the prompt
        await pilot.press("down")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.focused is prompt and len(engine.requests) == 1
        assert "Starter 1" not in {c.title for c in app.get_system_commands(app.screen)}
        app.action_new_chat()          # an empty chat: back again, and Tab reaches them too
        await pilot.pause()
        assert app.query_one("#welcome").display and app.focused is prompt
        await pilot.press("tab")
        assert app.focused is starters and starters.highlighted == 0
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == STARTERS[1].text
        assert len(engine.requests) == 2


async def test_esc_up_past_the_first_and_typing_go_back_to_the_prompt():
    from app.ui.widgets import PromptInput, StarterList
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        starters = app.query_one(StarterList)
        prompt = app.query_one(PromptInput)
        await pilot.press("down", "down")
        assert app.focused is starters and starters.highlighted == 1
        await pilot.press("escape")
        assert app.focused is prompt and starters.highlighted is None
        await pilot.press("down")
        assert app.focused is starters and starters.highlighted == 0
        await pilot.press("up")                        # up past the first
        assert app.focused is prompt
        await pilot.press("down")
        await pilot.press(*"hi")                       # typing goes to the prompt
        assert app.focused is prompt and prompt.text == "hi"
        await pilot.press("down")                      # a prompt with text: Down stays there
        assert app.focused is prompt
        await pilot.press("enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == "hi" and len(engine.requests) == 1


async def test_down_walks_the_sent_messages_first_then_reaches_the_starters():
    from app.ui.widgets import PromptInput, StarterList
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await send_and_wait(pilot, app, "earlier")
        app.action_new_chat()
        await pilot.pause()
        prompt, starters = app.query_one(PromptInput), app.query_one(StarterList)
        await pilot.press("up")
        assert prompt.text == "earlier" and app.focused is prompt
        await pilot.press("down")                      # back to the empty prompt
        assert prompt.text == "" and app.focused is prompt
        await pilot.press("down")
        assert app.focused is starters


async def test_without_speculation_there_are_no_starters_to_reach():
    from app.ui.widgets import PromptInput, StarterList
    app, _ = make_app(spec="")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        assert not app.query_one(StarterList).display
        await pilot.press("down")
        assert isinstance(app.focused, PromptInput)
        await pilot.press("tab")
        assert not isinstance(app.focused, StarterList)


async def test_clicking_a_starter_sends_it():
    from app.ui.app import STARTERS
    from app.ui.widgets import PromptInput, StarterList
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        starters = app.query_one(StarterList)
        row = next(i for i, line in enumerate(starters_shown(app)) if STARTERS[3].text in line)
        await pilot.click(starters, offset=(12, row))
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == STARTERS[3].text
        assert [m["content"] for m in engine.requests[-1] if m["role"] == "user"] == [STARTERS[3].text]
        assert isinstance(app.focused, PromptInput)
        await pilot.press("right")
        await pilot.pause()
        app.action_new_chat()
        await pilot.pause()
        assert "run 1/2" not in str(app.query_one(Legend).render())


async def test_keys_that_arrive_together_go_where_the_person_meant_them():
    """A terminal may deliver several keys at once (typed ahead, pasted, a script's): the ones
    after the move into the list (or back out) reach the list (or the prompt), in order."""
    from textual import events
    from app.ui.app import STARTERS
    from app.ui.widgets import PromptInput, StarterList

    def at_once(*keys: tuple[str, str | None]) -> None:
        for key, char in keys:
            app.post_message(events.Key(key, char))

    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        prompt, starters = app.query_one(PromptInput), app.query_one(StarterList)
        prompt.sent = ["earlier"]                             # a message sent in an earlier chat
        at_once(("down", None), ("escape", None), ("h", "h"), ("i", "i"))
        await until(pilot, lambda: prompt.text == "hi")
        assert app.focused is prompt and not engine.requests
        prompt.text = ""
        at_once(("down", None), ("x", "x"), ("y", "y"))       # typing from the list: in order
        await until(pilot, lambda: prompt.text == "xy")
        assert app.focused is prompt
        prompt.text = ""
        at_once(("down", None), ("up", None), ("up", None))    # Up past the first, Up: history
        await until(pilot, lambda: prompt.text == "earlier")
        assert app.focused is prompt
        prompt.text = ""
        at_once(("down", None), ("down", None), ("down", None), ("up", None), ("enter", None))
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert [r[-1]["content"] for r in engine.requests] == [STARTERS[1].text]
        assert app.focused is prompt and prompt.text == ""
        assert starters.highlighted is None
