"""Chat templates from the GGUF, rendered in a sandbox.

The template string comes from the model file (``tokenizer.chat_template``),
which is untrusted: it is rendered with Jinja2's immutable sandbox, so it
cannot reach Python internals, mutate objects or import anything.

Nor can it hang or exhaust the process that renders it: see :mod:`speculators.template_sandbox`.

>>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
...                  "{% if add_generation_prompt %}<assistant>{% endif %}", bos_token="<s>")
>>> t.render([{"role": "user", "content": "hi"}])
'<user>hi<assistant>'
"""

from __future__ import annotations

from datetime import date
from typing import Any, Sequence

from jinja2 import TemplateError

# A model that ships no chat template is a base (pretrained) model: it was
# never taught turn tokens, but it continues a plain transcript well -- too
# well: left alone it writes the user's next line and its own next answer,
# turn after turn, until the token limit. The reply ends where the model
# starts any new turn (FALLBACK_STOP), after a newline ("\nUser: ...") or
# mid-line ("...complete? User: I'd love..."; with "User :" too). The labels
# are matched with their capital and colon and after whitespace, so ordinary
# text that merely mentions a user ("the user: ...", "User accounts", "Users:",
# print("User:", name)) is not cut. The engine cuts a stop string from the
# reply and never shows it while it forms; the whitespace before it goes with
# it, so "...complete? User:" ends the reply at "...complete?".
# A base model follows a request only as well as the transcript shows it how: without worked
# exchanges the 270M default model answered a copy request ("Repeat this list exactly: ...") with
# a remark about it -- 1 of 30 sampled replies copied the text (tools/bench_copy.py). The
# exchanges below show it copy requests asked in several ways, ordinary questions between them:
# a list, a paragraph of several sentences (it tended to stop after the first), a saying changed
# on purpose (it tended to "correct" a familiar phrase), code, and a last question, so that what
# follows the examples is an answer, not a copy of the last example. No example's wording comes
# back in replies: an earlier set's "Repeat after me:" and "Keep calm and carry on" did. With the
# app's default min-p (app.config.DEFAULT_MIN_P) 50 of 60 copy requests (two sets of ten, three
# seeds) are copied, 49 with accepted drafts (85 of 100 over five seeds), and ordinary questions
# get answers (27 of 27).
FALLBACK_SCENE = "A conversation between a curious user and a helpful, knowledgeable assistant."
FALLBACK_RULE = (
    FALLBACK_SCENE + " The assistant "
    "answers questions in a few sentences. When the user asks it to repeat, copy or quote a text, "
    "the assistant writes out that text exactly, word for word, and nothing else.\n\n"
)
#: worked exchanges, shown where the context has room for them (see MIN_CTX_FOR_EXAMPLES)
FALLBACK_EXAMPLES = (
    "User: Repeat this list exactly: bread, milk, eggs, butter, cheese.\n"
    "Assistant: bread, milk, eggs, butter, cheese.\n"
    "User: What is the largest planet?\n"
    "Assistant: Jupiter is the largest planet in the solar system.\n"
    "User: Quote the following paragraph: The train leaves at six from platform two. Tickets are sold on board. "
    "The last stop is Glasgow Central, where the line ends.\n"
    "Assistant: The train leaves at six from platform two. Tickets are sold on board. The last stop is Glasgow "
    "Central, where the line ends.\n"
    "User: How many legs does a spider have?\n"
    "Assistant: A spider has eight legs.\n"
    "User: Repeat this sentence word for word: an apple a day keeps the dentist and the baker away.\n"
    "Assistant: an apple a day keeps the dentist and the baker away.\n"
    "User: Copy the following code exactly:\ndef greet(name):\n    return \"Hello, \" + name\n\nprint(greet(\"Ada\"))\n"
    "Assistant: def greet(name):\n    return \"Hello, \" + name\n\nprint(greet(\"Ada\"))\n"
    "User: Why do leaves fall in autumn?\n"
    "Assistant: Trees drop their leaves to save water and energy through the cold months.\n"
)
FALLBACK_PREAMBLE = FALLBACK_RULE + FALLBACK_EXAMPLES
#: the exchanges take ~250 tokens of every prompt: only in contexts of at least this size
MIN_CTX_FOR_EXAMPLES = 2048
FALLBACK_TEMPLATE = (
    "{{ bos_token }}"
    "{% if not messages or messages[0].role != 'system' %}" + FALLBACK_RULE
    + "{% if worked_examples %}" + FALLBACK_EXAMPLES + "{% endif %}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}\n\n"
    "{% elif m.role == 'user' %}User: {{ m.content }}\n"
    "{% else %}Assistant: {{ m.content | trim }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_LABELS = ("User", "Assistant")
FALLBACK_STOP = tuple(f"{ws}{label}{colon}" for label in FALLBACK_LABELS
                      for ws in ("\n", " ", "\t") for colon in (":", " :"))


from .template_sandbox import (  # noqa: E402  (after the constants the sandbox does not use)
    BUDGET, MAX_CHARS, BoundedEnvironment, Budget, ChatTemplateError, ChatTemplateLimitError, exceeded,
    raise_exception,
)

__all__ = ["ChatTemplate", "ChatTemplateError", "ChatTemplateLimitError", "FALLBACK_TEMPLATE",
           "FALLBACK_STOP", "MIN_CTX_FOR_EXAMPLES"]


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.source = source or FALLBACK_TEMPLATE
        self.is_fallback = source is None
        #: stop strings a reply needs with this template (the transcript's next turn)
        self.stop_strings: tuple[str, ...] = FALLBACK_STOP if source is None else ()
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
        try:
            self._template = env.compile_bounded(self.source)
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template does not parse: {e}") from None

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
               worked_examples: bool = True) -> str:
        """``worked_examples``: the fallback transcript's example exchanges (a model's own
        template ignores it). Within the module's bounds (:class:`ChatTemplateLimitError`)."""
        messages = list(messages)
        budget = Budget(len(messages))
        token = BUDGET.set(budget)
        chunks = self._template.generate(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            worked_examples=worked_examples,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            out: list[str] = []
            size = 0
            for chunk in chunks:
                size += len(chunk)
                if size > MAX_CHARS:
                    exceeded(f"the limit of {MAX_CHARS:,} characters of output")
                budget.step(0)
                out.append(chunk)
            return "".join(out)
        except ChatTemplateError:
            raise
        except Exception as e:  # SecurityError, TemplateError, TypeError...
            raise ChatTemplateError(f"the model's chat template failed: {e}") from None
        finally:
            chunks.close()
            BUDGET.reset(token)
