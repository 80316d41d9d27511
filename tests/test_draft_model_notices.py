"""A draft model that cannot be used is said, not swallowed: under Automatic a warning names the
file and the reason; an explicit draft-simple fails with an error that says "draft model"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def generate(model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "generate", "-m", str(model), "-p", "Hi", "-n", "4",
                           "--temp", "0", "-t", "2", "--no-config", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ), cwd=Path(__file__).parent.parent)


def test_generate_under_automatic_warns_about_a_draft_model_it_cannot_read(tmp_path, default_model_path):
    junk = tmp_path / "small.gguf"
    junk.write_text("not a model")
    r = generate(default_model_path, "-md", str(junk))
    assert r.returncode == 0, r.stderr
    warn = [l for l in r.stderr.splitlines() if "draft model" in l]
    assert len(warn) == 1 and warn[0].startswith("draftlight: warning: the draft model " + str(junk))
    assert "Automatic goes on without it" in warn[0]
    # a draft model it can use: no warning
    ok = generate(default_model_path, "-md", str(default_model_path))
    assert ok.returncode == 0 and "draft model" not in ok.stderr, ok.stderr


def test_an_explicit_draft_simple_with_a_missing_draft_model_says_draft_model(tmp_path, default_model_path):
    r = generate(default_model_path, "--spec-type", "draft-simple", "-md", str(tmp_path / "missing.gguf"))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "the draft model cannot be used: model file not found" in lines[0], r.stderr


async def test_the_chat_under_automatic_says_the_draft_model_is_not_used(tmp_path, default_model_path):
    from app import config as config_mod
    from app.options import ModelOptions
    from app.storage import History
    from app.ui.app import DraftlightApp
    from speculators.params import SpecParams
    junk = tmp_path / "small.gguf"
    junk.write_text("not a model")
    cfg = config_mod.Config()
    cfg.model = ModelOptions(model=str(default_model_path), ctx_size=512, threads=2)
    cfg.spec = SpecParams.auto()
    cfg.spec.draft.model = str(junk)
    app = DraftlightApp(cfg, history=History(tmp_path / "h.sqlite3"), persist_config=False,
                        lookup_root=str(tmp_path / "lookup"))
    async with app.run_test() as pilot:
        deadline = time.monotonic() + 120
        msgs: list[str] = []
        while time.monotonic() < deadline:
            msgs = [n.message for n in app._notifications]
            if any("draft model" in m for m in msgs):
                break
            await pilot.pause(0.1)
        hit = [m for m in msgs if "draft model" in m]
        assert hit and str(junk) in hit[0] and "cannot be read" in hit[0], msgs


async def test_the_chat_under_automatic_with_synthetic_acceptance_says_its_controller_is_off(tmp_path,
                                                                                            default_model_path):
    from app import config as config_mod
    from app.options import ModelOptions
    from app.storage import History
    from app.ui.app import DraftlightApp
    from speculators.params import SpecParams
    cfg = config_mod.Config()
    cfg.model = ModelOptions(model=str(default_model_path), ctx_size=512, threads=2)
    cfg.spec = SpecParams.auto(synth_len=2.5)
    app = DraftlightApp(cfg, history=History(tmp_path / "h.sqlite3"), persist_config=False,
                        lookup_root=str(tmp_path / "lookup"))
    async with app.run_test() as pilot:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and app.state != "ready":
            await pilot.pause(0.1)
        assert app.state == "ready"
        await pilot.pause(0.2)
        hit = [n.message for n in app._notifications if "controller is off" in n.message]
        assert len(hit) == 1 and "synthetic acceptance" in hit[0], [n.message for n in app._notifications]
        # settings applied again with the same spec: not said a second time
        app.session.rebuild_chain()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("Speculation:" in n.message for n in app._notifications):
            await pilot.pause(0.1)
        await pilot.pause(0.2)
        assert sum("controller is off" in n.message for n in app._notifications) == 1
