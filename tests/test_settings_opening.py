"""The settings pane (F3) opens without holding the UI thread (issue 49): it paints its frame and
first group at once and mounts the rest one group per turn of the UI loop, so keys pressed while it
opens are answered (Esc closes it, Ctrl+S applies once the form is whole) and no single turn lays
out more than a few dozen widgets."""

from __future__ import annotations

from textual import events
from textual.containers import VerticalScroll
from textual.widgets import Switch

from app.ui.screens import SettingsScreen
from tests.test_ui_app import make_app, open_settings, ready, until


def closes(monkeypatch) -> list:
    """What the settings pane closed with, each time (None: cancelled; else what was applied)."""
    seen: list = []
    close = SettingsScreen._close

    def recording(self, result):
        seen.append(result)
        return close(self, result)
    monkeypatch.setattr(SettingsScreen, "_close", recording)
    return seen


async def while_it_opens(pilot, app, key: str) -> SettingsScreen:
    """F3, then ``key`` as soon as the pane is up and before its form is whole."""
    app.post_message(events.Key("f3", None))
    await until(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.is_mounted)
    screen = app.screen
    assert not screen.ready          # (the rest of the form is still to come)
    app.post_message(events.Key(key, None))
    return screen


async def test_each_turn_of_the_ui_loop_mounts_a_small_group_of_the_pane(monkeypatch):
    sizes: list[int] = []
    mount_all = VerticalScroll.mount_all

    def counting(self, widgets, *a, **kw):
        widgets = list(widgets)
        sizes.append(sum(1 + len(list(w.walk_children())) for w in widgets))
        return mount_all(self, widgets, *a, **kw)
    monkeypatch.setattr(VerticalScroll, "mount_all", counting)
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        await open_settings(pilot, app)
        screen = app.screen
        assert isinstance(screen, SettingsScreen) and screen.ready
        # the whole form is there once it is ready: every type's switch, in priority order
        switches = [s.id for s in screen.query(Switch)]
        assert switches[0] == "sw-auto" and len(switches) == 1 + len(screen.reasons)
        assert str(screen.query_one("#s-status").render()).startswith("speculation:")
        assert not screen.query_one("#s-apply").disabled
    # built in many small groups after the first (composed with the frame), not all at once.
    # (Children of a FieldRow are composed when it mounts: counted as the row's 4 widgets.)
    assert len(sizes) >= 10, sizes
    assert max(sizes) <= 40, sizes


async def test_esc_while_the_pane_opens_closes_it_and_mounts_nothing_more(monkeypatch):
    seen = closes(monkeypatch)
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        main, calls = app.screen, engine.set_spec_calls
        screen = await while_it_opens(pilot, app, "escape")
        await until(pilot, lambda: seen and app.screen is main)
        await pilot.pause(0.2)
        assert seen == [None] and app.screen is main
        # Esc was taken between two groups, not once the form was whole: the rest never mounted
        assert not screen.ready
        assert engine.set_spec_calls == calls
        # and it opens whole the next time
        await open_settings(pilot, app)
        assert app.screen.query_one("#sw-auto", Switch).value is False


async def test_ctrl_s_while_the_pane_opens_applies_the_form_once_it_is_whole(monkeypatch):
    seen = closes(monkeypatch)
    app, engine = make_app(spec="ngram-mod")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        main = app.screen
        await while_it_opens(pilot, app, "ctrl+s")
        await until(pilot, lambda: seen and app.screen is main)
        # applied once whole, as it was opened: the same speculation
        assert len(seen) == 1 and seen[0] is not None
        assert [t.value for t in seen[0].spec.types] == ["ngram-mod"]
        assert [t.value for t in app.config.spec.types] == ["ngram-mod"]
        # a change made once the form is whole is what Ctrl+S applies
        await open_settings(pilot, app)
        app.screen.query_one("#sw-ngram-simple", Switch).value = True
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen is main)
        assert [t.value for t in app.config.spec.types] == ["ngram-simple", "ngram-mod"]


async def test_a_build_s_progress_and_end_reach_a_pane_still_opening():
    """A static build started in an earlier pane may report to a pane that is still mounting its
    groups: its lookup section is not there yet, and nothing fails (the soak's crash: NoMatches)."""
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, app)
        app.post_message(events.Key("f3", None))
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.is_mounted)
        screen = app.screen
        assert not screen.ready and not screen.query("#lc-progress")
        screen.show_build_progress(3, 10, "saved chats")
        assert "learning from saved chats" in str(screen.query_one("#s-status").render())
        screen.show_build_done({"entries": 1234}, None, None)
        assert "static cache built: 1,234 entries" in str(screen.query_one("#s-status").render())
        await until(pilot, lambda: screen.ready)
        assert app.is_running and not screen.query_one("#lc-progress").display
