"""The chat loads its model again where a new speculation needs it loaded another way.

The load plan (``speculators.engine.load_plan``: the target's MTP layers, recurrent-state
snapshots) is worked out from the speculation when the model is loaded. A hybrid target loaded
for the n-gram types has neither; switching the chat to ``draft-mtp`` in the settings must not
leave it rolling back through checkpoints and replays (or loading a second copy of the model for
the heads): the session loads it again, through the runner, as ``bench`` and ``generate`` would
load it for that speculation. On the default model (a transformer) no speculation changes the
load, and a change only rebuilds the chain.
"""

from __future__ import annotations

import queue
import time

import pytest

from app import config as config_mod
from app import session as sess
from app.options import ModelOptions
from app.runner import RunnerEngine
from app.session import ChatSession
from app.storage import History
from speculators.params import SpecParams
from tests.hidden_models import hidden_models_dir, qwen35_mtp_path  # noqa: F401  (session fixtures)
from tests.test_session import drain

pytestmark = pytest.mark.slow


def _mtp_spec() -> SpecParams:
    spec = SpecParams.from_types("draft-mtp")
    spec.draft.n_max = 4
    spec.draft.p_min = 0.0
    return spec


def _session(tmp_path, model, spec: SpecParams) -> tuple[ChatSession, queue.Queue]:
    cfg = config_mod.Config()
    cfg.model = ModelOptions(model=str(model), ctx_size=512, threads=1)
    cfg.spec = spec
    cfg.sampling.temperature = 0.0
    cfg.max_tokens = 24
    q: queue.Queue = queue.Queue()
    s = ChatSession(cfg, post=q.put, history=History(tmp_path / "h.sqlite3"), persist_config=False,
                    lookup_root=tmp_path / "lookup", use_lookup_store=False)
    s.load()
    drain(s, q, lambda: s.engine is not None or s.load_error is not None, timeout=120)
    assert s.load_error is None, s.load_error
    return s, q


def _apply(s: ChatSession, q: queue.Queue, spec: SpecParams) -> tuple[str, list]:
    """Apply ``spec`` as the settings pane does; returns the outcome and the events up to the
    one that ends it (EngineReady after a reload, SpecApplied after a rebuild), applied."""
    c = s.config
    outcome = s.apply_settings(spec, c.sampling, c.model, c.max_tokens)
    end = sess.EngineReady if outcome == "reload" else sess.SpecApplied
    events: list = []
    deadline = time.monotonic() + 120
    while not any(isinstance(e, end) for e in events):
        assert time.monotonic() < deadline, [type(e).__name__ for e in events]
        try:
            ev = q.get(timeout=0.05)
        except queue.Empty:
            continue
        s.apply(ev)
        events.append(ev)
    return outcome, events


def test_switching_a_hybrid_chat_to_draft_mtp_loads_it_again_with_heads_and_snapshots(tmp_path, qwen35_mtp_path):
    s, q = _session(tmp_path, qwen35_mtp_path, SpecParams.from_types("ngram-mod"))
    try:
        eng = s.engine
        assert isinstance(eng, RunnerEngine)
        assert eng.model.is_hybrid and not eng.model.load_mtp and eng.n_rs_seq == 0
        # another n-gram type needs the same load: the chain is rebuilt in the same runner
        outcome, _ = _apply(s, q, SpecParams.from_types("ngram-simple"))
        assert outcome == "rebuild" and s.engine is eng
        # draft-mtp needs the heads and draft.n_max snapshots: loaded again, in a fresh runner
        outcome, events = _apply(s, q, _mtp_spec())
        assert outcome == "reload"
        assert any(isinstance(e, sess.EngineReady) for e in events)
        eng2 = s.engine
        assert eng2 is not eng and eng2.model.load_mtp and eng2.n_rs_seq == 4
        assert [x.name for x in eng2.chain.speculators] == ["draft-mtp"]
        reply = s.send("hello world")
        drain(s, q, lambda: s.job is None, timeout=120)
        assert reply.error is None and reply.text
        # back to an n-gram type: the heads and snapshots are not kept for nothing
        outcome, _ = _apply(s, q, SpecParams.from_types("ngram-mod"))
        assert outcome == "reload"
        assert not s.engine.model.load_mtp and s.engine.n_rs_seq == 0
    finally:
        s.close()


def test_on_a_transformer_no_speculation_loads_the_model_again(tmp_path, default_model_path):
    s, q = _session(tmp_path, default_model_path, SpecParams.from_types("ngram-mod"))
    try:
        eng = s.engine
        for spec in (_mtp_spec(), SpecParams.auto(), SpecParams()):
            outcome, _ = _apply(s, q, spec)
            assert outcome == "rebuild" and s.engine is eng, spec.types
    finally:
        s.close()
