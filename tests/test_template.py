"""Chat templates from model files are untrusted: rendered in a sandbox."""

import re

import pytest

from speculators.engine import ReplyBuilder
from speculators.template import FALLBACK_STOP, ChatTemplate, ChatTemplateError

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("evil", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch /tmp/pwned') }}",
    "{% set x = messages.append(1) %}{{ x }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
])
def test_templates_cannot_reach_python(evil, tmp_path):
    t = ChatTemplate(evil)
    with pytest.raises(ChatTemplateError):
        t.render(MSGS)


def test_a_template_that_does_not_parse_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")


def test_raise_exception_from_a_template_is_reported():
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render(MSGS)


def test_models_without_a_template_chat_through_a_transcript():
    t = ChatTemplate(None, bos_token="<bos>")
    assert t.is_fallback and t.stop_strings == FALLBACK_STOP
    out = t.render(MSGS + [{"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"}])
    assert out == "<bos>Be brief.\n\nUser: Hi\nAssistant: Hello!\nUser: Bye\nAssistant:"
    # without a system prompt, a preamble sets the scene: a description, then worked exchanges
    # that show the base model a copy request answered by the text itself
    from speculators.template import FALLBACK_PREAMBLE
    assert ChatTemplate(None).render([{"role": "user", "content": "Hi"}]) == FALLBACK_PREAMBLE + "User: Hi\nAssistant:"
    lines = FALLBACK_PREAMBLE.splitlines()
    asks = [i for i, ln in enumerate(lines) if ln.startswith("User: Repeat this list exactly: ")]
    assert asks and lines[asks[0] + 1] == "Assistant: " + lines[asks[0]].split("exactly: ", 1)[1]


class _WordModel:
    """Tokens as a base model splits text: a word with its leading space, or a newline."""

    def __init__(self):
        self.pieces: list[str] = ["<eos>"]

    def tokenize(self, text: str) -> list[int]:
        out = []
        for piece in re.findall(r"\n|[ \t]?[^\s:]+|[ \t]?:|[ \t]", text):
            self.pieces.append(piece)
            out.append(len(self.pieces) - 1)
        return out

    def is_eog(self, t):
        return t == 0

    def token_bytes(self, t):
        return self.pieces[t].encode()


def _reply(text: str, max_tokens: int = 200) -> tuple[str, str | None, list[str]]:
    """Feed ``text`` through the engine's ReplyBuilder with the transcript's stop strings."""
    m = _WordModel()
    rb = ReplyBuilder(m, ChatTemplate(None).stop_strings, max_tokens)
    shown, reason = "", None
    seen = []
    for tok in m.tokenize(text):
        out, reason = rb.add(tok, None, None)
        shown += "".join(e.text for e in out)
        seen.append(shown)
        if reason:
            break
    if reason is None:
        shown += "".join(e.text for e in rb.finish(None))
    assert shown == rb.text
    return shown, reason, seen


@pytest.mark.parametrize("generated, reply", [
    # a new turn on its own line, either label, with or without a blank line
    ("Sure, here they are.\nUser: thanks\nAssistant: ok", "Sure, here they are."),
    ("Hi!\nAssistant: Hi!\nAssistant: Hi!", "Hi!"),
    ("Done.\n\nUser: next question", "Done.\n"),
    ("Done.\nUser : next question", "Done."),
    # mid-line, after the end of a sentence (seen with the default model)
    ("Is the list complete? User: I'd love to see the list. Assistant: Do you know", "Is the list complete?"),
    ("Here you go. Assistant: anything else?", "Here you go."),
    ("Fine!  Assistant : more", "Fine! "),
    ("Tabbed.\tUser: x", "Tabbed."),
])
def test_the_transcript_ends_a_reply_where_the_model_starts_a_new_turn(generated, reply):
    text, reason, seen = _reply(generated)
    assert (text, reason) == (reply, "stop_string")
    # the label never shows, not even while it forms
    assert not any(label in s for s in seen for label in ("User", "Assistant"))


@pytest.mark.parametrize("ordinary", [
    "The user: the person who runs the program.",
    "User accounts live in /etc/passwd. Users: alice, bob.",
    'print("User:", name)',
    "An assistant: someone who helps. Assistants: people who help.",
    "Ask the User's manager.\nUsername: alice",
    "SuperUser:root and Assistant-Manager: Bob",
])
def test_ordinary_text_that_mentions_a_user_is_not_cut(ordinary):
    text, reason, _ = _reply(ordinary)
    assert (text, reason) == (ordinary, None)


def test_the_transcript_stop_strings_are_turn_labels_after_whitespace():
    stops = ChatTemplate(None).stop_strings
    assert stops == FALLBACK_STOP
    for label in ("User", "Assistant"):
        for ws in ("\n", " "):
            assert f"{ws}{label}:" in stops and f"{ws}{label} :" in stops
    for s in stops:
        assert s[0].isspace() and s.endswith(":") and s.strip().rstrip(" :") in ("User", "Assistant")
    # the transcript's own labels are exactly what the stop strings end at
    out = ChatTemplate(None).render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                     {"role": "user", "content": "c"}])
    assert "\nUser:" in out and out.endswith("\nAssistant:")
    # a model with its own template needs none
    assert ChatTemplate("{{ messages[0].content }}").stop_strings == ()
