"""Chat templates from the GGUF, rendered in a sandbox.

The template string comes from the model file (``tokenizer.chat_template``),
which is untrusted: it is rendered with Jinja2's immutable sandbox, so it
cannot reach Python internals, mutate objects or import anything.

>>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
...                  "{% if add_generation_prompt %}<assistant>{% endif %}", bos_token="<s>")
>>> t.render([{"role": "user", "content": "hi"}])
'<user>hi<assistant>'
"""

from __future__ import annotations

from datetime import date
from typing import Any, Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model ships no template: a plain, readable transcript.
FALLBACK_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}\n\n"
    "{% elif m.role == 'user' %}User: {{ m.content }}\n"
    "{% else %}Assistant: {{ m.content }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


# Gemma's turn format, for Gemma GGUFs that ship without a template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{% set ns.system = m.content %}"
    "{% else %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{% if m.role == 'user' and ns.system %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}"
    "{{ m.content | trim }}<end_of_turn>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def builtin_template_for(special_tokens: set[str]) -> str | None:
    """A built-in template for models without one, chosen by their special tokens."""
    if {"<start_of_turn>", "<end_of_turn>"} <= special_tokens:
        return GEMMA_TEMPLATE
    return None


class ChatTemplateError(ValueError):
    pass


def _raise(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the conversation: {message}")


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.source = source or FALLBACK_TEMPLATE
        self.is_fallback = source is None
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template does not parse: {e}") from None

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # SecurityError, TemplateError, TypeError...
            raise ChatTemplateError(f"the model's chat template failed: {e}") from None
