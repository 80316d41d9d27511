"""The model reads the conversation ahead after a system-prompt or speculation change (README,
*The chat*: "once it is loaded, and when you open or start a chat, change the system prompt or
the speculation, it reads the conversation as it stands while you read and type").

A scripted engine with a read-ahead (``warm``) records what it was given to read: the
conversation as it stands, the new system prompt included, on the new speculation's chain."""

from __future__ import annotations

import queue
import time

from app.session import ReadAhead, SpecApplied
from app.ui.scripted import ScriptedEngine
from speculators.params import SpecParams

from .test_session import SCRIPT, SCRIPT_TEXT, drain, make_session


class ReadingEngine(ScriptedEngine):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        #: per read-ahead: the messages it read, and the speculation the engine had then
        self.read: list[tuple[list[dict], list[str]]] = []

    def prompt_tokens(self, messages=None, text=None, raw=False) -> list[int]:
        self.asked = list(messages or [])
        return super().prompt_tokens(messages, text, raw)

    def warm(self, prompt, cancel=None) -> int:
        self.read.append((self.asked, [t.value for t in self.spec.types]))
        return len(prompt)


def settle(s, q: queue.Queue) -> list:
    """Let a read-ahead under way finish and apply what it said; the ReadAhead events."""
    if s.warming is not None:
        s.warming.join(10)
        assert not s.warming.is_alive()
    seen = []
    while not q.empty():
        ev = q.get()
        s.apply(ev)
        seen.append(ev)
    return [(e.reading, e.tokens) for e in seen if isinstance(e, ReadAhead)]


def test_a_system_prompt_or_speculation_change_has_the_conversation_read_again(tmp_path):
    engine = ReadingEngine(SCRIPT)
    s, q, _ = make_session(tmp_path, engine=engine, spec="ngram-mod,ngram-simple")
    try:
        s.load()
        drain(s, q, lambda: s.engine is not None)
        said = settle(s, q)
        assert len(engine.read) == 1 and engine.read[0][0] == []      # loaded: the empty chat's start
        assert said == [(True, 0), (False, 1)]
        s.send("hello")
        drain(s, q, lambda: s.job is None)
        settle(s, q)
        n = len(engine.read)
        chat = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": SCRIPT_TEXT}]

        # F7: a new system prompt is read ahead with the conversation
        s.set_system_prompt("Be brief.")
        said = settle(s, q)
        assert len(engine.read) == n + 1, engine.read
        system = [{"role": "system", "content": "Be brief."}]
        assert engine.read[-1][0] == system + chat
        tokens = len(engine.prompt_tokens(messages=system + chat))
        assert said == [(True, 0), (False, tokens)] and not s.reading_ahead

        # F3: another speculation; once its chain is built, the conversation is read on it
        spec = SpecParams.from_types("ngram-mod")
        c = s.config
        assert s.apply_settings(spec, c.sampling, c.model, c.max_tokens) == "rebuild"
        drain_until_spec_applied(s, q)
        said = settle(s, q)
        assert len(engine.read) == n + 2, engine.read
        assert engine.read[-1] == (system + chat, ["ngram-mod"])
        assert said == [(True, 0), (False, tokens)]
    finally:
        s.close()


def drain_until_spec_applied(s, q: queue.Queue, timeout: float = 10.0) -> None:
    """Apply events until the new chain's SpecApplied is applied (which starts the read-ahead)."""
    deadline = time.monotonic() + timeout
    seen: list = []
    while not any(isinstance(e, SpecApplied) for e in seen):
        try:
            ev = q.get(timeout=0.05)
        except queue.Empty:
            assert time.monotonic() < deadline, f"no SpecApplied: {[type(e).__name__ for e in seen]}"
            continue
        s.apply(ev)
        seen.append(ev)

