"""The chat says when synthetic acceptance is on (README, *Headless use*: "Synthetic acceptance
(``--spec-synth-*``) is for benchmarking: the output is then marked not valid, and under it
``auto`` runs without the adaptive controller (...; ``generate``, ``bench`` and the chat say so)").

The real chat: the app with its runner process on the default model, Automatic with a synthetic
acceptance length. Once the model is loaded the chat says the controller is off; each reply's
figures say they are synthetic, as stored and exported."""

from __future__ import annotations

import pytest

from app import config as config_mod
from app.options import ModelOptions
from app.ui.app import DraftlightApp
from speculators.params import SpecParams

from .test_ui_app import until

CONTROLLER_OFF = "The adaptive controller is off under synthetic acceptance"


@pytest.mark.slow
async def test_the_chat_says_synthetic_acceptance_is_on(default_model_path):
    cfg = config_mod.Config()
    cfg.model = ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2)
    cfg.spec = SpecParams.auto(synth_len=2.5)
    cfg.sampling.temperature = 0.0
    cfg.max_tokens = 24
    app = DraftlightApp(cfg, persist_config=False)        # the real chat: its engine in a runner
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None or app.session.load_error is not None, timeout=180)
        assert app.session.load_error is None, app.session.load_error
        await pilot.pause()
        said = [n.message for n in app._notifications]
        assert any(m.startswith(CONTROLLER_OFF) for m in said), said
        assert app.send("Repeat exactly: red, green, blue, red, green, blue.")
        await until(pilot, lambda: app.job is None, timeout=180)
        await pilot.pause()
        reply = app._views()[-1]
        assert reply.role == "assistant" and reply.text
        assert app.session.turns[-1].stats["synthetic"] is True
        assert "synthetic acceptance" in str(reply.foot.render())
        stored = app.history.load_chat(app.chat_id)
        assert stored.messages[-1].stats["synthetic"] is True
        from app.storage import chat_to_markdown
        assert "synthetic acceptance" in chat_to_markdown(stored)
