"""F7's system prompt is stored with its chat and is back when the chat is resumed (README, keys:
"F7 | system prompt"; F2: "saved chats (SQLite): resume ...").

Each chat keeps the system prompt it was given last, also after a restart whose config names
another one, and the model gets it again in the resumed chat's next reply."""

from __future__ import annotations

from .test_session import drain, loaded


def test_the_system_prompt_is_kept_with_each_chat_and_back_on_resume(tmp_path):
    s, q, engine = loaded(tmp_path)
    s.send("first chat")
    drain(s, q, lambda: s.job is None)
    first = s.chat_id
    s.set_system_prompt("  Answer in French.  ")      # after the chat began (created without one)
    assert s.system_prompt == "Answer in French."
    s.new_chat()
    s.send("second chat")
    drain(s, q, lambda: s.job is None)
    second = s.chat_id
    s.set_system_prompt("Answer in German.")
    assert second != first
    s.close()

    # a restart: a new session on the same history, its config with no system prompt (the tests'
    # sessions do not write config.toml, so nothing but the chats can bring the prompts back)
    s2, q2, engine2 = loaded(tmp_path)
    try:
        assert s2.system_prompt == ""
        s2.resume(first)
        assert s2.system_prompt == "Answer in French."
        assert s2.conversation()[0] == {"role": "system", "content": "Answer in French."}
        s2.send("and again")
        drain(s2, q2, lambda: s2.job is None)
        assert engine2.requests[-1][0] == {"role": "system", "content": "Answer in French."}
        assert [m["content"] for m in engine2.requests[-1][1:]][-1] == "and again"
        s2.resume(second)
        assert s2.system_prompt == "Answer in German."
        assert s2.history.load_chat(first).system_prompt == "Answer in French."
        assert s2.history.load_chat(second).system_prompt == "Answer in German."
    finally:
        s2.close()
