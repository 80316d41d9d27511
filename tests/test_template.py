"""Chat templates from model files are untrusted: rendered in a sandbox."""

import pytest

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
    # without a system prompt, a short preamble sets the scene
    assert ChatTemplate(None).render([{"role": "user", "content": "Hi"}]).endswith("\n\nUser: Hi\nAssistant:")
