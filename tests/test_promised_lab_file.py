"""``draftlight lab -f FILE``: the chat app, straight into the Lab on that file's text (README,
*Headless use*); a file that is not there is one clear line and a non-zero exit, never a traceback.

The app needs a terminal: the good case runs the command (``app.cli.main``) with the terminal
checks answered yes and the app it builds driven by Textual's pilot on the scripted engine; the
missing file runs the real command on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Input

from app import cmd_chat
from app.cli import main
from app.ui.lab import LabScreen

from .test_ui_app import SCRIPT, make_app, until

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Repeat this list exactly: bread, milk, eggs, butter, cheese, bread, milk, eggs."


async def test_lab_dash_f_opens_the_lab_on_the_files_text(tmp_path, monkeypatch):
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPT + "\n", encoding="utf-8")
    _, engine = make_app(SCRIPT, spec="ngram-simple")          # the scripted engine the app will load
    built = []
    real_make_app = cmd_chat.make_app

    def make(args, settings=None, **kw):
        app = real_make_app(args, settings, engine_factory=lambda m, sp, p: engine, **kw)
        built.append((app, kw))
        app.run = lambda *a, **k: 0        # the pilot runs it below (there is no terminal here)
        return app
    monkeypatch.setattr(cmd_chat, "make_app", make)
    monkeypatch.setattr(cmd_chat, "_quit_on_signals", lambda app, grace_s=None: None)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert main(["lab", "-f", str(f), "--spec-type", "ngram-simple"]) == 0
    [(app, kw)] = built
    assert kw == {"open_lab": True, "lab_prompt_file": str(f)}
    del app.run
    async with app.run_test(size=(120, 50)) as pilot:
        # the Lab opens by itself once the model is loaded, with the file as its prompt
        await until(pilot, lambda: isinstance(app.screen, LabScreen), timeout=10)
        await pilot.pause()
        lab = app.screen
        assert lab.query_one("#lab-file", Input).value == str(f)
        lab.query_one("#lab-rounds", Input).value = "1"
        lab.query_one("#lab-tokens", Input).value = "16"
        await pilot.press("ctrl+r")
        await until(pilot, lambda: lab.report is not None and not lab.running, timeout=20)
        # the model got the file's text as the person's message (no chat was open)
        assert engine.requests[-1] == [{"role": "user", "content": PROMPT}]
        assert app.history.lab_runs()[0].prompt == PROMPT
        assert not app.session.turns           # the chat itself is untouched


def test_lab_dash_f_with_a_missing_file_is_one_clear_line(tmp_path):
    missing = tmp_path / "no-such-prompt.txt"
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONUNBUFFERED="1", TERM="xterm-256color")
    proc = subprocess.Popen([sys.executable, "-m", "app", "lab", "-f", str(missing)], stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, cwd=ROOT, env=env, start_new_session=True)
    os.close(slave)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("draftlight lab -f MISSING did not stop: the app started instead of saying the file is missing")
    finally:
        os.close(master)
    text = err.decode("utf-8", "replace")
    assert proc.returncode == 1, text
    assert text.strip().splitlines() == [f"draftlight: error: file not found: {missing}"]
    assert "Traceback" not in text
