"""Up in the empty prompt recalls what was sent, the newest first, also after a restart
(the prompt's history comes from the saved chats, over every chat)."""

from __future__ import annotations

from app.ui.widgets import PromptInput

from .test_ui_app import make_app, ready, send_and_wait


async def test_up_recalls_the_newest_message_after_a_restart():
    app, _ = make_app()
    async with app.run_test() as pilot:
        await send_and_wait(pilot, app, "oldest, in the first chat")
        app.action_new_chat()
        await send_and_wait(pilot, app, "middle")
        await send_and_wait(pilot, app, "newest")
    # a new app (a restart) on the same history file
    app2, _ = make_app()
    async with app2.run_test() as pilot:
        await ready(pilot, app2)
        prompt = app2.query_one(PromptInput)
        prompt.focus()
        await pilot.pause()
        assert prompt.text == ""
        await pilot.press("up")
        assert prompt.text == "newest"
        await pilot.press("up")
        assert prompt.text == "middle"
        await pilot.press("up")
        assert prompt.text == "oldest, in the first chat"
        await pilot.press("up")                 # the oldest is where it stops
        assert prompt.text == "oldest, in the first chat"
        await pilot.press("down", "down")
        assert prompt.text == "newest"
        await pilot.press("down")
        assert prompt.text == ""
        # and what is recalled is sent as it stands
        await pilot.press("up", "enter")
        await pilot.pause()
        assert app2.session.turns and app2.session.turns[0].text == "newest"
