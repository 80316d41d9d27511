"""The chat session without Textual: a queue stands in for the UI thread.

The scripted engine covers the conversation logic; the real default model
covers what only a real engine can show (the lookup caches learning).
"""

from __future__ import annotations

import queue
import threading
import time

import pytest

from app import config as config_mod
from app import session as sess
from app.errors import UserError
from app.figures import ReplyFigures
from app.session import ChatSession, SessionError
from app.storage import History
from app.ui.scripted import ScriptedEngine
from speculators.events import FinishEvent, StepEvent
from speculators.params import SpecParams

from .test_context_fit import CountingEngine, words

SCRIPT = [
    ("ngram-mod", [" Hello", " world", "!"]),
    (None, [" How"]),
    ("ngram-simple", [" are", " you", " today", "?"]),
]
SCRIPT_TEXT = "Hello world! How are you today?"


def make_session(tmp_path, engine=None, spec="ngram-mod,ngram-simple", **kw):
    engine = engine or ScriptedEngine(SCRIPT)
    cfg = config_mod.Config()
    cfg.spec = SpecParams.from_types(spec) if spec else SpecParams()
    for k, v in kw.items():
        setattr(cfg, k, v)
    q: queue.Queue = queue.Queue()
    s = ChatSession(cfg, post=q.put, engine_factory=lambda m, sp, p: engine,
                    history=History(tmp_path / "history.sqlite3"), persist_config=False)
    return s, q, engine


def drain(s: ChatSession, q: queue.Queue, until, timeout: float = 10.0) -> list:
    """Apply events on this (the owner) thread until ``until()``; returns what was applied."""
    seen = []
    deadline = time.monotonic() + timeout
    while not until():
        try:
            ev = q.get(timeout=0.05)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; events so far: {[type(e).__name__ for e in seen]}")
            continue
        s.apply(ev)
        seen.append(ev)
    return seen


def loaded(tmp_path, **kw):
    s, q, engine = make_session(tmp_path, **kw)
    s.load()
    drain(s, q, lambda: s.engine is not None)
    return s, q, engine


def test_a_reply_streams_into_one_record_per_token_shared_with_storage(tmp_path):
    s, q, engine = loaded(tmp_path)
    reply = s.send("hi")
    events = drain(s, q, lambda: s.job is None)
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "ReplyDone" and "ReplyProgress" in kinds
    # the reply never begins with the transcript's space; the text is its tokens' text
    assert reply.text == SCRIPT_TEXT == "".join(t.text for t in reply.tokens)
    assert [(t.drafted_by, t.draft_pos) for t in reply.tokens[:3]] == [("ngram-mod", 0), ("ngram-mod", 1), (None, None)]
    # the engine's own TokenEvent records are what the turn holds (no copies in other shapes)
    assert all(type(t).__name__ == "TokenEvent" for t in reply.tokens)
    stored = s.history.load_chat(s.chat_id).messages
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].content == SCRIPT_TEXT and stored[1].status == "done"
    assert [t.to_dict() for t in stored[1].tokens] == [t.to_dict() for t in reply.tokens]
    # one definition of the figures: 8 tokens shown, 5 of them accepted drafts
    f = ReplyFigures.from_reply(reply.tokens, reply.stats)
    assert (f.n_tokens, f.n_drafted, f.n_accepted, f.n_accepted_past) == (8, 5, 5, 0)
    assert s.stats.totals.n_tokens == 8 and s.stats.shown_by == {"ngram-mod": 2, "ngram-simple": 3}
    assert s.sent_messages() == ["hi"]
    s.close()


def test_tokens_signal_once_while_the_owner_is_busy(tmp_path):
    """The thread posts one ReplyProgress until the owner has applied it: tokens coalesce."""
    s, q, engine = loaded(tmp_path, engine=ScriptedEngine([(None, [f" w{i}"]) for i in range(200)]))
    s.send("go")
    s.job.thread.join(5)   # the owner did not look while all 200 tokens arrived
    pending = []
    while not q.empty():
        pending.append(q.get())
    assert sum(isinstance(e, sess.ReplyProgress) for e in pending) == 1
    for e in pending:
        s.apply(e)
    assert len(s.turns[-1].tokens) == 200 and s.job is None
    s.close()


def test_accepted_tokens_past_the_reply_are_named_not_hidden(tmp_path):
    class PastStop(ScriptedEngine):
        def generate(self, *a, **kw):
            for ev in super().generate(*a, **kw):
                if isinstance(ev, FinishEvent):
                    ev.result.stats.n_drafted += 4
                    ev.result.stats.n_accepted += 3   # verified beyond a stop string
                yield ev
    s, q, engine = loaded(tmp_path, engine=PastStop(SCRIPT))
    reply = s.send("hi")
    drain(s, q, lambda: s.job is None)
    f = ReplyFigures.from_reply(reply.tokens, reply.stats)
    assert (f.n_accepted, f.n_accepted_shown, f.n_accepted_past) == (8, 5, 3)
    assert "accepted 8 (89%: 5 in the reply, 3 past its end)" in f.footer()
    s.close()


def test_stop_keeps_the_text_and_saves_it_as_stopped(tmp_path):
    gate = threading.Event()
    s, q, engine = loaded(tmp_path, engine=ScriptedEngine(SCRIPT, gate=gate))
    reply = s.send("hi")
    drain(s, q, lambda: reply.text == "Hello world!")
    s.stop()
    drain(s, q, lambda: s.job is None)
    assert (reply.text, reply.finish, reply.status) == ("Hello world!", "cancelled", "cancelled")
    m = s.history.load_chat(s.chat_id).messages[-1]
    assert (m.content, m.status) == ("Hello world!", "cancelled")
    s.close()


def test_regenerate_edit_new_resume_and_delete(tmp_path):
    s, q, engine = loaded(tmp_path)
    s.send("first")
    drain(s, q, lambda: s.job is None)
    s.regenerate()
    drain(s, q, lambda: s.job is None)
    assert [t.role for t in s.turns] == ["user", "assistant"]
    assert len(s.history.load_chat(s.chat_id).messages) == 2
    text, gone = s.edit_last()
    assert text == "first" and len(gone) == 2 and s.turns == []
    assert s.history.load_chat(s.chat_id).messages == []
    with pytest.raises(SessionError, match="no message of yours"):
        s.edit_last()
    s.send("again")
    drain(s, q, lambda: s.job is None)
    cid = s.chat_id
    s.new_chat()
    assert s.turns == [] and s.chat_id is None
    s.resume(cid)
    assert [t.text for t in s.turns] == ["again", SCRIPT_TEXT]
    assert s.turns[1].tokens[0].drafted_by == "ngram-mod"
    s.rename(cid, "Renamed")
    assert s.title == "Renamed"
    assert s.delete(cid) is True and s.chat_id is None
    with pytest.raises(SessionError, match="no longer exists"):
        s.resume(cid)
    s.close()


def test_a_failed_reply_leaves_the_chat_usable(tmp_path):
    engine = ScriptedEngine(SCRIPT, fail="the prompt has 9000 tokens but the context holds 4096")
    s, q, _ = loaded(tmp_path, engine=engine)
    reply = s.send("too long")
    drain(s, q, lambda: s.job is None)
    assert reply.error and "context holds 4096" in reply.error
    engine.fail = None
    s.send("short")
    drain(s, q, lambda: s.job is None)
    # the message that could not be answered is not sent again
    assert engine.requests[-1] == [{"role": "user", "content": "short"}]
    assert s.turns[-1].text == SCRIPT_TEXT
    s.close()


def test_sending_while_writing_or_without_a_model_says_why(tmp_path):
    gate = threading.Event()
    s, q, engine = make_session(tmp_path, engine=ScriptedEngine(SCRIPT, gate=gate))
    with pytest.raises(SessionError, match="no model is loaded"):
        s.send("hi")
    s.load()
    assert s.send("early") is None and s.queued == "early"   # sent once the model is ready
    drain(s, q, lambda: s.engine is not None)
    s.send("hi")
    with pytest.raises(SessionError, match="still being written"):
        s.send("again")
    gate.set()
    drain(s, q, lambda: s.job is None)
    with pytest.raises(UserError):
        s.send("   ")
    s.close()


def test_settings_rebuild_the_chain_or_reload_the_model(tmp_path):
    s, q, engine = loaded(tmp_path)
    cfg = s.config
    new = SpecParams.from_types("ngram-simple")
    assert s.apply_settings(new, cfg.sampling, cfg.model, cfg.max_tokens) == "rebuild"
    drain(s, q, lambda: engine.set_spec_calls >= 2)
    assert s.active_types == ["ngram-simple"]
    m = config_mod.ModelOptions(**cfg.model.__dict__)
    m.ctx_size = 2048
    assert s.apply_settings(new, cfg.sampling, m, cfg.max_tokens, overflow="stop") == "reload"
    drain(s, q, lambda: s.engine is not None)
    assert s.config.overflow == "stop" and s.saved_config.model.ctx_size == 2048
    s.close()
    assert engine.closed


# -- the context -----------------------------------------------------------------------------

def test_a_chat_that_outgrows_a_small_context_keeps_getting_replies(tmp_path):
    eng = CountingEngine(n_ctx=120)
    s, q, _ = loaded(tmp_path, engine=eng, max_tokens=16)
    trimmed = []
    for i in range(12):
        s.send(words(10, f"m{i}"))
        trimmed += [e for e in drain(s, q, lambda: s.job is None) if isinstance(e, sess.ContextTrimmed)]
        assert s.turns[-1].text == "ok" and not s.turns[-1].error
    assert trimmed and s.context_start > 0
    # the history keeps every turn; the model saw the latest ones
    assert len(s.history.load_chat(s.chat_id).messages) == 24
    assert eng.requests[-1][-1]["content"].startswith("m11")
    too_long = s.send(words(200))
    drain(s, q, lambda: s.job is None)
    assert too_long.error and "raise the context size" in too_long.error
    s.send("still here")
    drain(s, q, lambda: s.job is None)
    assert s.turns[-1].text == "ok"
    s.close()


# -- the lookup caches, on the real default model ----------------------------------------------

@pytest.mark.slow
def test_the_chat_learns_the_dynamic_lookup_cache_and_a_new_session_finds_it(tmp_path, default_model_path):
    from app.options import ModelOptions

    def real(opts, spec, progress):
        from speculators.engine import Engine, EngineConfig
        return Engine(str(default_model_path), EngineConfig(n_ctx=1024, n_threads=2), SpecParams())

    def session():
        cfg = config_mod.Config()
        cfg.model = ModelOptions(model=str(default_model_path), ctx_size=1024)
        cfg.spec = SpecParams.from_types("ngram-cache")
        cfg.sampling.temperature = 0.0
        cfg.max_tokens = 48
        q: queue.Queue = queue.Queue()
        s = ChatSession(cfg, post=q.put, engine_factory=real, history=History(tmp_path / "h.sqlite3"),
                        persist_config=False, lookup_root=tmp_path / "lookup")
        s.load()
        drain(s, q, lambda: s.engine is not None, timeout=120)
        return s, q

    s, q = session()
    assert s.store is not None and s.active_types == ["ngram-cache"]
    dyn = s.store.dynamic_path
    assert not dyn.exists()
    prompts = ["List the days of the week.", "List the days of the week again, please."]
    for p in prompts:
        s.send(p)
        saved = drain(s, q, lambda: s.lookup_last_save is not None and s.job is None, timeout=120)
        s.lookup_last_save = None
        assert any(isinstance(e, sess.ReplyDone) for e in saved)
    assert dyn.exists()
    size1 = dyn.stat().st_size
    fig = s.lookup_figures()
    assert fig["caches"]["dynamic"]["entries"] > 0 and set(fig["sources"]) == {"context", "dynamic", "static"}
    s.close()
    # a new session (a restart) loads what the first one learned
    s2, q2 = session()
    assert s2.store.dynamic.n_entries == fig["caches"]["dynamic"]["entries"]
    s2.send("Name the days of the week.")
    drain(s2, q2, lambda: s2.lookup_last_save is not None and s2.job is None, timeout=120)
    assert dyn.stat().st_size > size1
    # the settings pane's "build static cache from saved chats", with progress
    s2.build_static_cache(None)
    built = drain(s2, q2, lambda: s2._build_cancel is None, timeout=120)
    done = [e for e in built if isinstance(e, sess.StaticBuilt)][-1]
    assert done.error is None and done.info["entries"] > 0
    assert any(isinstance(e, sess.StaticBuildProgress) for e in built)
    assert s2.store.static_path.exists() and s2.lookup_figures()["caches"]["static"]["entries"] == done.info["entries"]
    # a file that is not there: the build reports it, the static cache stays as it was
    s2.build_static_cache([str(tmp_path / "missing.txt")])
    failed = drain(s2, q2, lambda: s2._build_cancel is None, timeout=60)
    assert [e for e in failed if isinstance(e, sess.StaticBuilt)][-1].error
    assert s2.lookup_figures()["caches"]["static"]["entries"] == done.info["entries"]
    s2.close()


class _Store:
    opened: list = []

    def __init__(self):
        self.closed = False
        _Store.opened.append(self)

    def resources(self):
        return {}

    def close(self):
        self.closed = True


class _EngineWithCaches(ScriptedEngine):
    """Opens lookup caches as the runner does; building a chain takes a moment."""

    def open_store(self, spec, root):
        return _Store(), []

    def set_spec(self, params, resources=None):
        time.sleep(0.05)
        return super().set_spec(params, resources)


def test_two_quick_speculation_changes_open_the_lookup_caches_once(tmp_path):
    _Store.opened = []
    s, q, engine = loaded(tmp_path, engine=_EngineWithCaches(SCRIPT), spec="ngram-mod")
    assert s.store is None and _Store.opened == []
    s.config.spec = SpecParams.from_types("ngram-cache,ngram-mod")
    s.rebuild_chain()
    s.rebuild_chain()          # before the first change reached the owner
    n_applied = 0
    deadline = time.monotonic() + 5
    while n_applied < 2:
        ev = q.get(timeout=max(0.01, deadline - time.monotonic()))
        s.apply(ev)
        n_applied += isinstance(ev, sess.SpecApplied)
    open_ = [st for st in _Store.opened if not st.closed]
    assert len(open_) == 1 and s.store is open_[0]
    s.close()


def test_a_streaming_reply_is_saved_from_a_copy_taken_under_its_lock(tmp_path):
    s, q, engine = loaded(tmp_path, engine=ScriptedEngine([(None, [f" w{i}"]) for i in range(300)],
                                                          tokens_per_s=3000))
    live_lists = []
    real = s.history.update_message

    def spy(msg_id, **kw):
        job = s.job
        if job is not None and "tokens" in kw:
            live_lists.append(kw["tokens"] is job.turn.tokens)
        return real(msg_id, **kw)
    s.history.update_message = spy
    s.SAVE_EVERY_S = 0.0
    s.send("go")
    drain(s, q, lambda: s.job is None)
    assert live_lists and not any(live_lists)
    assert len(s.history.load_chat(s.chat_id).messages[-1].tokens) == 300
    s.close()
