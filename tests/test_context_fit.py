"""Fitting the conversation into the context (:mod:`app.session.context_fit`): pure logic, no
model and no Textual (the engine only counts prompt tokens: one per word, three per message)."""

from __future__ import annotations

import pytest

from app.errors import describe
from app.session import ContextOverflow, fit_to_context
from app.session.context_fit import system_tokens
from app.ui.scripted import ScriptedEngine


class CountingEngine(ScriptedEngine):
    """Scripted engine whose prompt has one token per word (the n_ctx is the config's)."""

    def __init__(self, n_ctx: int, **kw):
        super().__init__([(None, [" ok"])], **kw)
        self.config.n_ctx = n_ctx

    def prompt_tokens(self, messages=None, text=None, raw=False):
        messages = list(messages or [])
        self.requests.append(messages)
        n = sum(len(m["content"].split()) + 3 for m in messages)
        return [1] * n


def words(n: int, w: str = "word") -> str:
    return " ".join([w] * n)


def test_rolling_window_drops_the_oldest_whole_turns_and_keeps_the_system_prompt():
    eng = CountingEngine(n_ctx=100)
    msgs = [{"role": "system", "content": "be brief"}]
    for i in range(6):
        msgs += [{"role": "user", "content": words(8, f"q{i}")}, {"role": "assistant", "content": words(8, f"a{i}")}]
    msgs.append({"role": "user", "content": words(8, "last")})
    prompt, cut = fit_to_context(eng, msgs, max_tokens=20, policy="rolling")
    kept = eng.requests[-1]
    assert kept[0]["role"] == "system" and kept[-1]["content"].startswith("last")
    assert kept[1]["role"] == "user"   # never starts with a reply whose question was dropped
    assert len(prompt) + 20 <= 100
    first_kept, n_dropped = cut
    assert n_dropped == 13 - (len(kept) - 1) and first_kept == n_dropped
    # the most that fits: keeping one more exchange would not
    assert len(eng.prompt_tokens(messages=[kept[0]] + msgs[1 + n_dropped - 2:])) + 20 > 100


def test_truncate_middle_keeps_the_first_exchange():
    eng = CountingEngine(n_ctx=100)
    msgs = []
    for i in range(6):
        msgs += [{"role": "user", "content": words(8, f"q{i}")}, {"role": "assistant", "content": words(8, f"a{i}")}]
    msgs.append({"role": "user", "content": words(8, "last")})
    prompt, cut = fit_to_context(eng, msgs, max_tokens=20, policy="truncate-middle")
    kept = eng.requests[-1]
    assert kept[0]["content"].startswith("q0") and kept[1]["content"].startswith("a0")
    assert kept[2]["role"] == "user" and kept[-1]["content"].startswith("last")
    assert len(prompt) + 20 <= 100 and cut[1] > 0


def test_stop_policy_and_a_message_too_long_for_the_context_say_what_would_fit():
    eng = CountingEngine(n_ctx=100)
    msgs = [{"role": "user", "content": words(30)}, {"role": "assistant", "content": words(30)},
            {"role": "user", "content": words(40)}]
    with pytest.raises(ContextOverflow, match="start a new chat"):
        fit_to_context(eng, msgs, max_tokens=20, policy="stop")
    with pytest.raises(ContextOverflow) as e:
        fit_to_context(eng, [{"role": "user", "content": words(300)}], max_tokens=20, policy="rolling")
    msg = describe(e.value)
    assert "needs 303 tokens" in msg and "holds 100" in msg and "-c 512" in msg


def test_the_stop_policy_lets_a_conversation_without_room_for_a_reply_run_into_the_full_context():
    """Under ``stop`` nothing is dropped: a prompt that fits but leaves less than the reply's room
    is sent as it is (the reply stops when the context is full); only a full context refuses."""
    eng = CountingEngine(n_ctx=100)
    msgs = [{"role": "user", "content": words(40)}, {"role": "assistant", "content": words(40)},
            {"role": "user", "content": words(5)}]            # 94 tokens: under 99, over 100 - 20
    prompt, cut = fit_to_context(eng, msgs, max_tokens=20, policy="stop")
    assert len(prompt) == 94 and cut is None
    prompt, cut = fit_to_context(eng, msgs, max_tokens=20, policy="rolling")
    assert cut == (2, 2) and len(prompt) == 8                 # the old exchange went, the question stays


def test_the_system_prompt_is_counted_as_the_prefix_it_shares_with_the_whole_prompt():
    eng = CountingEngine(n_ctx=100)
    system = {"role": "system", "content": words(4)}
    assert system_tokens(eng, [system, {"role": "user", "content": "hi"}]) == 7
    assert system_tokens(eng, [{"role": "user", "content": "hi"}]) == 1     # just BOS
