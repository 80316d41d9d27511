"""A chat template cannot hang or exhaust the process that renders it (speculators.template's bounds),
and real templates render exactly as in Jinja's sandbox.

The hostile templates run in a child process with a memory ceiling and a time-out, so that a
template that is not stopped fails the test instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from speculators import template_sandbox as T
from speculators.template import FALLBACK_TEMPLATE, ChatTemplate, ChatTemplateError

ROOT = Path(__file__).resolve().parent.parent
MSGS = [{"role": "user", "content": "Hi"}]

CONFINED = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.path.insert(0, {root!r})
from speculators.template import ChatTemplate, ChatTemplateError
source = sys.stdin.read()
t0 = time.monotonic()
try:
    ChatTemplate(source).render([{{"role": "user", "content": "Hi"}}])
    out = {{"error": None, "type": None}}
except ChatTemplateError as e:
    out = {{"error": str(e), "type": type(e).__name__}}
except MemoryError:
    out = {{"error": "MemoryError", "type": "MemoryError"}}
out["seconds"] = time.monotonic() - t0
print(json.dumps(out))
"""


def render_confined(source: str, timeout: float = 60) -> dict:
    """Render ``source`` in a child limited to 2 GiB: what it raised, and how long it took."""
    p = subprocess.run([sys.executable, "-c", CONFINED.format(root=str(ROOT))], input=source, text=True,
                       capture_output=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def assert_refused(source: str, limit: str, seconds: float = 2.0) -> None:
    out = render_confined(source)
    assert out["type"] == "ChatTemplateLimitError", out
    assert out["error"].startswith("the model's chat template exceeded ") and limit in out["error"], out
    assert out["seconds"] < seconds, out


# --------------------------------------------------------------------------- hostile templates

@pytest.mark.parametrize("source, limit", [
    ("{{ 'x' * 10**11 }}", "characters for one value (the result of *)"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
], ids=["string-times-a-huge-number", "nested-range-loops"])
def test_the_issues_templates_fail_fast_naming_the_limit(source, limit):
    assert_refused(source, limit)


@pytest.mark.parametrize("source, limit", [
    # a string doubled in a namespace, by ~ and by +
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "the result of ~"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "the result of +"),
    # a list holding one big string many times, printed or stringified
    ("{% set b = 'x' * 4000000 %}{{ [b, b, b, b, b, b, b, b] }}", "a printed value"),
    ("{% set b = 'x' * 4000000 %}{{ [b, b] | string | length }}", "the input of |string"),
    ("{% set b = 'x' * 1000000 %}{{ ([b] * 100) | join }}", "the result of *"),
    ("{% set b = 'x' * 1000000 %}{{ [b, b, b, b, b] | join }}", "|join"),
    ("{{ (range(50000) | list) | join('y' * 1000) }}", "|join"),
    # a {% set %} block or a macro filled by a loop
    ("{% set x %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}{{ x | length }}",
     "a block's text"),
    # widths and padding
    ("{{ '%*s' % (10**10, 'x') }}", "the result of %"),
    ("{{ '%99999999999s' % 'x' }}", "the result of %"),
    ("{{ '{:>99999999999}'.format(1) }}", "str.format()"),
    ("{{ '{:{w}}'.format('x', w=10**10) }}", "str.format()"),
    ("{{ 'x'.center(10**10) }}", "str.center()'s width"),
    ("{{ 'x' | center(10**10) }}", "|center's width"),
    ("{{ ('x' * 1000000).replace('x', 'y' * 100) }}", "str.replace()"),
    ("{{ ('x' * 1000000) | replace('x', 'y' * 100) }}", "|replace"),
    ("{{ ('a\\n' * 1000000) | indent(100) }}", "|indent"),
    ("{{ ('\\t' * 1000000).expandtabs(100) }}", "str.expandtabs()"),
    # numbers, ranges and output
    ("{{ 9 ** 99999999 }}", "bits for a number"),
    ("{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
     "bits for a number"),
    ("{% for i in range(10**9) %}{% endfor %}", "items for range()"),
    ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "characters of output"),
    # exponential recursion through a macro
    ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", "steps"),
])
def test_other_ways_to_exhaust_the_renderer_are_refused(source, limit):
    assert_refused(source, limit, seconds=T.TIME_LIMIT_S)     # refused, by a bound below the time limit


def test_a_limit_error_is_a_chat_template_error():
    with pytest.raises(ChatTemplateError, match="exceeded the limit of 100,000 items for range"):
        ChatTemplate("{% for i in range(100001) %}{% endfor %}").render(MSGS)


def test_the_time_limit_stops_a_slow_rendering(monkeypatch):
    monkeypatch.setattr(T, "TIME_LIMIT_S", 0.05)
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="exceeded the time limit of 0.05 s"):
        ChatTemplate("{% for i in range(100000) %}{{ (i|string).center(5) }}{% endfor %}").render(MSGS)
    assert time.monotonic() - t0 < 2


def test_the_step_limit_grows_with_the_conversation():
    """A template that looks back over the messages at each message renders a long conversation;
    the same loops over nothing but a range are stopped."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(801)]
    quadratic = "{% for m in messages %}{% for n in messages %}{% endfor %}{{ m.content }}{% endfor %}"
    assert ChatTemplate(quadratic).render(msgs) == "".join(m["content"] for m in msgs)
    over_range = "{% for m in range(801) %}{% for n in range(801) %}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="steps"):
        ChatTemplate(over_range).render(MSGS)


# --------------------------------------------------------------------------- real templates

GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

QWEN25 = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

#: what templates use, all at once: namespaces, macros, set blocks, ~, %, str.format, filters
FEATURES = """{%- set ns = namespace(n=0, roles=[]) -%}
{%- macro turn(m, i) -%}[{{ '%03d' % i }}|{{ '{}:{:>6}'.format(m.role, m.role | length) }}]{{ m.content | trim | replace('  ', ' ') }}{%- endmacro -%}
{%- set header -%}{{ bos_token }}{{ (messages | map(attribute='role') | unique | list) | tojson(indent=2) }}{%- endset -%}
{{ header | indent(2) }}
{% for m in messages if m.content %}{% set ns.n = ns.n + 1 %}{% set ns.roles = ns.roles + [m.role] %}
{{ turn(m, loop.index) }}{{ ' (last)' if loop.last }}{{ '*' * (loop.index % 3) }} {{ ('x' ~ loop.length) | center(9) }}
{%- endfor %}
{{ ns.n }} {{ ns.roles | join(', ') }} {{ ns.roles | count }} {{ dict(a=1, b=[1, 2]) | dictsort | list }}
{{ range(3) | list }} {{ (range(10) | batch(4) | list) | length }} {{ messages[-1].content[:5] | upper }} {{ 7 // 2 }} {{ 2 ** 10 }}
{%- if add_generation_prompt %}{{ eos_token }}{% endif %}"""

DEEPSEEK_R1 = """{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}{%- set ns.system_prompt = message['content'] -%}{%- endif -%}
{%- endfor -%}{{bos_token}}{{ns.system_prompt}}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}{%- set ns.is_tool = false -%}{{'<|User|>' + message['content']}}{%- endif -%}
  {%- if message['role'] == 'assistant' and message['content'] is not none -%}
    {%- set content = message['content'] -%}
    {%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}
    {{'<|Assistant|>' + content + '<|end of sentence|>'}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and not ns.is_tool -%}{{'<|Assistant|><think>\\n'}}{%- endif %}"""


def conversations() -> list[list[dict]]:
    long = "Copy this paragraph, please.  It has  doubled spaces. " * 4000      # ~220k characters
    tool_call = {"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "f", "arguments": {"x": [1, 2], "y": "z"}}}]}
    return [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>hm</think> Hello! "},
         {"role": "user", "content": long}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather?"}, tool_call,
         {"role": "tool", "content": "sunny"}, {"role": "user", "content": "thanks"}],
        [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20} for i in range(601)],
    ]


def jinja_sandbox_render(source: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The same template as Jinja's plain immutable sandbox renders it (ChatTemplate's options)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals["raise_exception"] = T.raise_exception
    env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
    return env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          worked_examples=True, bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("source", [GEMMA2, QWEN25, DEEPSEEK_R1, FEATURES, FALLBACK_TEMPLATE],
                         ids=["gemma-2", "qwen-2.5", "deepseek-r1", "features", "fallback"])
def test_real_templates_render_as_in_jinjas_sandbox(source):
    rendered = 0
    for messages in conversations():
        try:
            expected = jinja_sandbox_render(source, messages)
        except Exception:            # e.g. Gemma 2 refuses a system message: so must we
            with pytest.raises(ChatTemplateError):
                ChatTemplate(source, "<s>", "</s>").render(messages)
            continue
        assert ChatTemplate(source, "<s>", "</s>").render(messages) == expected
        rendered += 1
    assert rendered >= 2
