"""End to end: the real installed ``draftlight`` serves its model from the chat, in tmux.

The chat on the default model (ngram-mod, as tests/test_ui_e2e_tmux.py runs it), F9 opens the
Server screen, Ctrl+T serves on the port remembered in config.toml (a free one); the ``openai``
client asks for a copy, and the screen shows the request's row and its reply with ngram-mod's
drafted tokens in ngram-mod's colour, read from the terminal (``capture-pane -e``); the chat's top
bar says "serving :PORT"; the app quits cleanly while serving.
"""

from __future__ import annotations

import re
import shutil

import pytest

from app import config as config_mod

from .test_ui_e2e_tmux import COPY_PROMPT, NGRAM_MOD_SGR, Tmux, _args
from .test_ui_server import ask_in_thread, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

pytest.importorskip("openai")
pytest.importorskip("aiohttp")


@pytest.fixture
def tmux(tmp_path):
    t = Tmux(tmp_path, width=140, height=40)      # the table's every column
    yield t
    t.close()


def test_the_server_screen_shows_a_served_reply_coloured(tmux, tmp_path, default_model_path):
    port = free_port()
    cfg = config_mod.Config()
    cfg.ui["serve_port"] = port
    config_mod.save(cfg)
    tmux.start(_args(default_model_path, "-n", "64"), tmp_path / "pid")
    tmux.wait_for(r"ready\s*$")
    tmux.keys("F9")
    tmux.wait_for(rf"Not serving · Ctrl\+T serves the model on 127\.0\.0\.1:{port}")
    tmux.keys("C-t")
    url = f"http://127.0.0.1:{port}"
    tmux.wait_for(re.escape(f"Serving on {url}"))

    t, answer = ask_in_thread(url, COPY_PROMPT, max_tokens=48)
    t.join(timeout=180)
    assert not t.is_alive(), "the served request did not end:\n" + tmux.screen()
    assert "error" not in answer, answer.get("error")
    text = answer["r"].choices[0].message.content
    # the row: endpoint and how it ended
    screen = tmux.wait_for(r"/v1/chat/completions\s+(stop|length)\s")
    # the reply, as the client got it (its first words: the view wraps the rest), coloured
    first = " ".join(text.split()[:3])
    screen = tmux.wait_for(re.escape(first))
    coloured = tmux.screen(escapes=True)
    reply_lines = [ln for ln in coloured.splitlines() if "▌" in ln and NGRAM_MOD_SGR in ln]
    assert reply_lines, "no ngram-mod coloured tokens on the Server screen:\n" + screen
    assert re.search(r"ngram-mod \d+", screen), screen            # the row's "by"
    # back to the chat: the top bar says the model is served
    tmux.keys("Escape")
    tmux.wait_for(rf"serving :{port}")
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=30)
