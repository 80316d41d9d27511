"""Enter sends; Shift+Enter and Ctrl+J put a new line in the prompt instead (README, keys:
"Enter · Shift+Enter or Ctrl+J | send · new line")."""

from __future__ import annotations

import pytest

from app.ui.widgets import PromptInput

from .test_ui_app import SCRIPT_TEXT, make_app, ready, until


@pytest.mark.parametrize("newline", ["shift+enter", "ctrl+j"])
async def test_shift_enter_and_ctrl_j_insert_a_new_line_and_enter_sends(newline):
    app, engine = make_app()
    async with app.run_test() as pilot:
        await ready(pilot, app)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("a", newline, "b", newline)
        assert prompt.text == "a\nb\n"
        # at the cursor, not at the end
        await pilot.press("c", "left", newline)
        assert prompt.text == "a\nb\n\nc"
        assert prompt.cursor_location == (3, 0)
        # nothing was sent meanwhile
        await pilot.pause()
        assert not app._views() and not engine.requests and app.session.chat_id is None
        await pilot.press("enter")
        await until(pilot, lambda: app.job is None and len(app._views()) == 2)
        assert app._views()[0].text == "a\nb\n\nc" and app._views()[1].text == SCRIPT_TEXT
        assert engine.requests[-1][-1] == {"role": "user", "content": "a\nb\n\nc"}
        assert prompt.text == ""
