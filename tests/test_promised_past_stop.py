"""Draft tokens accepted past the reply's end count as accepted, and the footer says how many.

README, *The chat*: "draft tokens the model accepted past the reply's end (beyond a stop
string) still count as accepted, and the footer says how many were". On the real engine (the
F16 copy of the default model, greedy): the person asks a second time for the passage the
model already quoted. The model copies it again, and at its end writes the transcript's next
``User:`` line, which is a stop string. ``ngram-simple`` (llama.cpp's defaults, no controller)
drafts that line too, because it followed the first copy in the conversation, so the verify
accepts draft tokens beyond the stop string in the step the reply ends in.

The expected figures come from the same engine run without a stop string: the steps up to and
including the one in which the stop string is completed give the accepted count, and the
drafted tokens in the reply's part of it give the count shown in the reply.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass

import pytest

from app import config as config_mod
from app.figures import ReplyFigures, pct, reply_footer
from app.session import ChatSession
from app.storage import History, chat_to_markdown
from speculators.events import STOP_STRING, FinishEvent, StepEvent
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from .prompts import PROMPTS, TEXT
from .test_session import drain

GREEDY = SamplingParams(temperature=0.0)
ASK = PROMPTS[1]            # "Quote the following text exactly, word for word:\n\n" + TEXT
MESSAGES = [{"role": "user", "content": ASK}, {"role": "assistant", "content": TEXT},
            {"role": "user", "content": ASK}]
SPEC = "ngram-simple"
MAX_TOKENS = 200

pytestmark = pytest.mark.slow


@dataclass
class Expected:
    accepted: int           # accepted draft tokens through the step that completed the stop string
    shown: int              # of those, the ones in the reply
    reply_ids: list[int]
    reply_text: str

    @property
    def past(self) -> int:
        return self.accepted - self.shown


def _spec() -> SpecParams:
    sp = SpecParams.from_types(SPEC)
    assert not sp.adaptive_on       # a fixed type: drafts are not cut at the reply's end
    return sp


@pytest.fixture(scope="module")
def expected(f16_engine) -> Expected:
    """The reply and its counts, read off the same greedy run without a stop string."""
    eng = f16_engine
    stops = tuple(eng.template.stop_strings)
    assert "\nUser:" in stops
    eng.set_spec(_spec())
    events = list(eng.generate(eng.prompt_tokens(messages=MESSAGES), max_tokens=MAX_TOKENS, sampling=GREEDY))
    steps = [e for e in events if isinstance(e, StepEvent)]
    text, starts, owner, tokens = "", [], [], []
    end_step = cut = None
    for k, e in enumerate(steps):
        for t in e.tokens:
            starts.append(len(text))
            text += t.text
            owner.append(k)
            tokens.append(t)
            hits = [text.find(s) for s in stops if s in text]
            if hits:
                end_step, cut = k, min(hits)
                break
        if end_step is not None:
            break
    assert end_step is not None, f"no stop string in the reply: {text!r}"
    n_reply = sum(1 for s in starts if s < cut)     # the tokens the reply keeps (the last one cut short)
    accepted = sum(e.n_accepted for e in steps[1:end_step + 1])
    shown = sum(1 for t in tokens[:n_reply] if t.drafted_by)
    return Expected(accepted, shown, [t.id for t in tokens[:n_reply]], text[:cut])


def test_the_engine_counts_drafts_accepted_past_a_stop_string(f16_engine, expected):
    eng = f16_engine
    eng.set_spec(_spec())
    events = list(eng.generate(eng.prompt_tokens(messages=MESSAGES), max_tokens=MAX_TOKENS, sampling=GREEDY,
                               stop=tuple(eng.template.stop_strings)))
    res = events[-1].result
    assert isinstance(events[-1], FinishEvent) and res.finish_reason == STOP_STRING
    # the reply is the passage, copied again, and nothing of the next "User:" line
    assert res.text.strip() == TEXT and res.text == expected.reply_text
    assert res.tokens == expected.reply_ids
    # the step the reply ended in had draft tokens accepted beyond the stop string
    assert expected.past > 0, expected
    assert res.stats.n_accepted == expected.accepted
    assert sum(1 for b in res.drafted_by if b) == expected.shown
    tokens = [t for e in events if isinstance(e, StepEvent) for t in e.tokens]
    f = ReplyFigures.from_reply(tokens, res.stats.to_dict())
    assert (f.n_tokens, f.n_accepted, f.n_accepted_shown, f.n_accepted_past) == \
        (len(expected.reply_ids), expected.accepted, expected.shown, expected.past)
    said = (f"accepted {expected.accepted} ({pct(expected.accepted / res.stats.n_drafted)}: "
            f"{expected.shown} in the reply, {expected.past} past its end)")
    assert said in reply_footer(tokens, res.stats.to_dict(), res.finish_reason)


class _Shared:
    """The session-wide F16 engine as the chat's engine: the chat may not close it, and it has no
    read-ahead (every reply reads its prompt afresh, as the expected figures' run did)."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        if name == "warm":
            raise AttributeError(name)
        return getattr(self._engine, name)

    def close(self) -> None:
        pass


def test_the_chat_footer_store_and_export_say_how_many_were_past_the_end(tmp_path, f16_engine, expected):
    history = History(tmp_path / "history.sqlite3")
    chat_id = history.create_chat(title="quote")
    history.add_message(chat_id, "user", ASK)
    history.add_message(chat_id, "assistant", TEXT)
    cfg = config_mod.Config()
    cfg.spec = _spec()
    cfg.sampling = GREEDY
    cfg.max_tokens = MAX_TOKENS
    q: queue.Queue = queue.Queue()
    s = ChatSession(cfg, post=q.put, engine_factory=lambda m, sp, p: _Shared(f16_engine), history=history,
                    persist_config=False, use_lookup_store=False)
    try:
        s.load()
        drain(s, q, lambda: s.engine is not None or s.load_error is not None, timeout=60)
        assert s.load_error is None, s.load_error
        s.resume(chat_id)
        assert s.conversation() + [{"role": "user", "content": ASK}] == MESSAGES
        reply = s.send(ASK)
        drain(s, q, lambda: s.job is None, timeout=600)
        assert reply.error is None and reply.finish == STOP_STRING
        assert reply.text == TEXT and [t.id for t in reply.tokens] == expected.reply_ids
        assert expected.past > 0, expected
        said = (f"accepted {expected.accepted} ({pct(expected.accepted / reply.stats['n_drafted'])}: "
                f"{expected.shown} in the reply, {expected.past} past its end)")
        f = ReplyFigures.from_reply(reply.tokens, reply.stats)
        assert (f.n_accepted, f.n_accepted_shown, f.n_accepted_past) == \
            (expected.accepted, expected.shown, expected.past)
        assert said in f.footer()
        # the session's totals (F4) count them the same way
        assert (s.stats.totals.n_accepted, s.stats.totals.n_accepted_shown) == (expected.accepted, expected.shown)
        # the saved reply says the same when the chat is opened again, and so does its export
        stored = history.load_chat(chat_id).messages[-1]
        g = ReplyFigures.from_reply(stored.tokens, stored.stats)
        assert (g.n_accepted, g.n_accepted_shown, g.n_accepted_past) == \
            (expected.accepted, expected.shown, expected.past)
        assert said in chat_to_markdown(history.load_chat(chat_id))
    finally:
        s.close()
