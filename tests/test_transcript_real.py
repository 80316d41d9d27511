"""The default model chats through a plain transcript; its replies end where it starts a new turn.

Gemma 3 270M (the embedded default) is a base model without a chat template:
left alone it writes the user's next line and its own next answer, turn after
turn, to the token limit. The transcript's stop strings end the reply there.
Greedy decoding, so every run sees the same text.
"""

from __future__ import annotations

import re

import pytest

from speculators.sampling import SamplingParams
from speculators.template import FALLBACK_SCENE

GREEDY = SamplingParams(temperature=0.0)
LABEL = re.compile(r"(?:^|\s)(?:User|Assistant)\s?:")
HISTORY = [
    {"role": "user", "content": "Hi! Can you help me with a question?"},
    {"role": "assistant", "content": "Of course! What would you like to know?"},
]
OLD_STOP = ("\nUser:",)  # what the transcript stopped at before


@pytest.fixture
def eng(q4_engine):
    assert q4_engine.template.is_fallback, "the default model is expected to chat through the transcript"
    return q4_engine


@pytest.mark.parametrize("question", [
    "Can you list five museums in Paris?",
    "Repeat this code: print('hi')",
    "Is the list complete?",
])
def test_a_reply_never_runs_into_the_next_turn(eng, question):
    prompt = eng.prompt_tokens(HISTORY + [{"role": "user", "content": question}])
    r = eng.run(prompt, max_tokens=200, sampling=GREEDY, stop=eng.template.stop_strings)
    assert r.text.strip() and not LABEL.search(r.text), r.text
    assert r.finish_reason in ("stop_string", "stop"), (r.finish_reason, r.text)
    assert len(r.tokens) < 60, f"{len(r.tokens)} tokens: {r.text!r}"


def _ends_at_a_label(eng, prompt):
    """The reply with the transcript's stop strings, and what the model writes next without them."""
    r = eng.run(prompt, max_tokens=200, sampling=GREEDY, stop=eng.template.stop_strings)
    assert r.text.strip() and not LABEL.search(r.text), r.text
    assert (r.finish_reason, len(r.tokens) < 30) == ("stop_string", True), (r.finish_reason, r.text)
    more = eng.run(prompt, max_tokens=len(r.tokens) + 4, sampling=GREEDY)
    assert more.text.startswith(r.text) and LABEL.match(more.text[len(r.text):]), more.text
    return r


def test_repeated_assistant_lines_end_the_reply(eng):
    """The "repeat the code" run-on: line after line of "Assistant: print('hi')", to the limit."""
    # the transcript as the template wrote it when the defect was seen (the scene alone, no
    # worked exchanges): the model's run-on there is what the stop strings must end
    prompt = eng.prompt_tokens(text=FALLBACK_SCENE + "\n\nUser: Repeat this code: print('hi')\n"
                               "Assistant: print('hi')\nAssistant: print('hi')\nAssistant:", raw=True)
    r = _ends_at_a_label(eng, prompt)
    old = eng.run(prompt, max_tokens=len(r.tokens) + 12, sampling=GREEDY, stop=OLD_STOP)
    assert old.finish_reason == "length" and "\nAssistant:" in old.text  # the defect, before


def test_a_turn_started_mid_line_ends_the_reply(eng):
    """"...complete? User: I'd love to see the list. Assistant: ...": turns on one line."""
    text = (FALLBACK_SCENE + "\n\nUser: Hi! Assistant: Hello! "
            "User: Can you list five museums in Paris? Assistant:")
    prompt = eng.prompt_tokens(text=text, raw=True)
    r = _ends_at_a_label(eng, prompt)
    old = eng.run(prompt, max_tokens=len(r.tokens) + 12, sampling=GREEDY, stop=OLD_STOP)
    assert " User:" in old.text  # the defect, before
