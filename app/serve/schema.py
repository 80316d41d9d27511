"""What a request asks for, read and checked: a :class:`Job`, or an :class:`~app.serve.errors.ApiError`.

The rule (the package's docstring says it too): a field this server does not
know is ignored (llama-server takes dozens of extra sampling fields, and clients
send them); a field it knows with a value of the wrong type or out of range is a
400 that names it; a field it knows but does not implement (``n`` above 1,
``logprobs``, ``tools``, penalties, ...) is accepted at its neutral value and a
400 otherwise, never silently ignored, since it would change the answer.
``null`` is the same as leaving a field out.

    >>> j = parse_chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 3,
    ...                 "temperature": 0, "stop": "\\n", "stream": True,
    ...                 "stream_options": {"include_usage": True}, "mirostat": 2}, SamplingParams())
    >>> (j.messages, j.max_tokens, j.sampling.seed, j.sampling.temperature, j.stop, j.stream, j.include_usage)
    ([{'role': 'user', 'content': 'Hi'}], 8, 3, 0.0, ['\\n'], True, True)
    >>> parse_chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "8"}, SamplingParams())
    Traceback (most recent call last):
    ...
    app.serve.errors.ApiError: max_tokens: expected a whole number, got a string
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from speculators.sampling import DEFAULT_SEED, SamplingParams

from .errors import ApiError

#: OpenAI's roles and what the chat template gets for them (``developer`` is OpenAI's newer name
#: for ``system``)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass
class Job:
    """One generation, as a request asks for it."""

    kind: str                              #: "chat", "completions" (OpenAI's) or "completion" (llama.cpp's)
    messages: list[dict] | None = None     #: chat: through the model's template (or the plain transcript)
    text: str | None = None                #: a raw prompt
    tokens: list[int] | None = None        #: a prompt given as token ids (llama.cpp's /completion)
    max_tokens: int | None = None          #: None: until the context is full (llama.cpp's n_predict -1)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    return_tokens: bool = False            #: /completion: the token ids in ``tokens``


# ---------------------------------------------------------------------------
# the body
# ---------------------------------------------------------------------------

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_body(raw: bytes) -> dict:
    """The request's JSON object (NaN and Infinity are not JSON: refused too).

    >>> parse_body(b'{"a": 1}')
    {'a': 1}
    >>> parse_body(b'{"a": NaN}')
    Traceback (most recent call last):
    ...
    app.serve.errors.ApiError: the body is not valid JSON: NaN is not JSON
    >>> parse_body(b'[1]')
    Traceback (most recent call last):
    ...
    app.serve.errors.ApiError: the body must be a JSON object, got an array
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError.invalid("the body is not UTF-8 text") from None
    if not text.strip():
        raise ApiError.invalid("the body is empty: expected a JSON object")
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise ApiError.invalid(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError.invalid(f"the body must be a JSON object, got {_kind(body)}")
    return body


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "a whole number"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


# ---------------------------------------------------------------------------
# fields
# ---------------------------------------------------------------------------

class _Fields:
    """Typed access to the body's fields (a wrong type is a 400 naming the field)."""

    def __init__(self, body: dict):
        self.body = body

    def get(self, name: str) -> Any:
        return self.body.get(name)

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def _bad(self, name: str, want: str) -> ApiError:
        return ApiError.invalid(f"expected {want}, got {_kind(self.body[name])}", param=name)

    def boolean(self, name: str, default: bool = False) -> bool:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(name, "true or false")
        return v

    def integer(self, name: str) -> int | None:
        v = self.body.get(name)
        if v is None:
            return None
        if isinstance(v, float) and v.is_integer() and not isinstance(v, bool):
            v = int(v)                   # 8.0 is a whole number (JavaScript clients send it so)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(name, "a whole number")
        return v

    def number(self, name: str) -> float | None:
        v = self.body.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._bad(name, "a number")
        if not math.isfinite(v):
            raise ApiError.invalid("must be a finite number", param=name)
        return float(v)

    def string(self, name: str) -> str | None:
        v = self.body.get(name)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self._bad(name, "a string")
        return v

    def obj(self, name: str) -> dict | None:
        v = self.body.get(name)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self._bad(name, "an object")
        return v

    def stops(self, name: str = "stop") -> list[str]:
        """OpenAI's ``stop``: a string or an array of strings."""
        v = self.body.get(name)
        if v is None:
            return []
        if isinstance(v, str):
            return [v] if v else []
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise self._bad(name, "a string or an array of strings")
        if len(v) > MAX_STOPS:
            raise ApiError.invalid(f"at most {MAX_STOPS} stop strings, got {len(v)}", param=name)
        return [s for s in v if s]

    def neutral(self, name: str, ok: Callable[[Any], bool], what: str) -> None:
        """A field this server knows but does not implement: only its neutral value passes."""
        v = self.body.get(name)
        if v is not None and not ok(v):
            raise ApiError.invalid(f"draftlight serve does not support it (only {what})", param=name)


#: stop strings per request (each is searched for at every token)
MAX_STOPS = 16


def _zero(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0


def _empty(v: Any) -> bool:
    return v in ([], {}, "")


def _check_unsupported(f: _Fields, kind: str) -> None:
    f.neutral("n", lambda v: v == 1 and not isinstance(v, bool), "1")
    f.neutral("best_of", lambda v: v == 1 and not isinstance(v, bool), "1")
    f.neutral("presence_penalty", _zero, "0")
    f.neutral("frequency_penalty", _zero, "0")
    f.neutral("repeat_penalty", lambda v: v == 1 and not isinstance(v, bool), "1")
    f.neutral("logit_bias", _empty, "an empty object")
    f.neutral("tools", _empty, "no tools")
    f.neutral("functions", _empty, "no functions")
    f.neutral("n_probs", _zero, "0")
    f.neutral("ignore_eos", lambda v: v is False, "false")
    f.neutral("echo", lambda v: v is False, "false")
    f.neutral("suffix", _empty, "an empty string")
    f.neutral("grammar", _empty, "an empty grammar")
    f.neutral("json_schema", _empty, "no schema")
    if kind == "chat":
        f.neutral("logprobs", lambda v: v is False, "false")
        f.neutral("top_logprobs", _zero, "0")
        f.neutral("response_format", lambda v: isinstance(v, dict) and v.get("type") == "text",
                  '{"type": "text"}')
    else:
        f.neutral("logprobs", _zero, "0")


def _sampling(f: _Fields, defaults: SamplingParams) -> SamplingParams:
    s = dataclasses.replace(defaults)
    for name in ("temperature", "top_p", "min_p"):
        v = f.number(name)
        if v is not None:
            setattr(s, name, v)
    top_k = f.integer("top_k")
    if top_k is not None:
        s.top_k = top_k
    seed = f.integer("seed")
    if seed is not None:
        s.seed = DEFAULT_SEED if seed == -1 else seed       # -1: a random seed (llama.cpp's)
    from speculators.params import ParamError
    try:
        s.validate()
    except ParamError as e:
        name, msg = e.field, e.message
        if name == "seed":
            msg = "must be within [0, 4294967295], or -1 for a random seed"
        raise ApiError.invalid(msg, param=name) from None
    return s


def _max_tokens(f: _Fields, names: Sequence[str], default: int | None, unlimited: int | None = None) -> int | None:
    for name in names:
        v = f.integer(name)
        if v is None:
            continue
        if unlimited is not None and v == unlimited:
            return None
        if v < 1:
            more = f" ({unlimited} for no limit)" if unlimited is not None else ""
            raise ApiError.invalid(f"must be at least 1{more}, got {v}", param=name)
        return v
    return default


def _stream(f: _Fields) -> tuple[bool, bool]:
    stream = f.boolean("stream")
    opts = f.obj("stream_options")
    include = False
    if opts is not None:
        v = opts.get("include_usage")
        if v is not None and not isinstance(v, bool):
            raise ApiError.invalid(f"expected true or false, got {_kind(v)}", param="stream_options.include_usage")
        include = bool(v)
    return stream, include


# ---------------------------------------------------------------------------
# the three kinds of request
# ---------------------------------------------------------------------------

def _content(v: Any, where: str) -> str:
    """A message's content: a string, null, or OpenAI's array of text parts."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        out = []
        for i, part in enumerate(v):
            if not isinstance(part, dict):
                raise ApiError.invalid(f"expected a content part object, got {_kind(part)}",
                                       param=f"{where}.content[{i}]")
            if part.get("type") != "text":
                raise ApiError.invalid(f"only text parts are supported, got type {part.get('type')!r}",
                                       param=f"{where}.content[{i}].type")
            text = part.get("text")
            if not isinstance(text, str):
                raise ApiError.invalid(f"expected a string, got {_kind(text)}", param=f"{where}.content[{i}].text")
            out.append(text)
        return "".join(out)
    raise ApiError.invalid(f"expected a string or an array of text parts, got {_kind(v)}",
                           param=f"{where}.content")


def _messages(f: _Fields) -> list[dict]:
    if "messages" not in f.body or f.body["messages"] is None:
        raise ApiError.invalid("required: the conversation, a list of {role, content} objects", param="messages")
    msgs = f.body["messages"]
    if not isinstance(msgs, list):
        raise ApiError.invalid(f"expected an array of messages, got {_kind(msgs)}", param="messages")
    if not msgs:
        raise ApiError.invalid("the conversation is empty", param="messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError.invalid(f"expected a message object, got {_kind(m)}", param=where)
        role = m.get("role")
        if not isinstance(role, str):
            raise ApiError.invalid(f"expected a string, got {_kind(role)}", param=f"{where}.role")
        if role not in ROLES:
            raise ApiError.invalid(f"unsupported role {role!r} (system, developer, user or assistant)",
                                   param=f"{where}.role")
        if m.get("tool_calls"):
            raise ApiError.invalid("tool calls are not supported", param=f"{where}.tool_calls")
        out.append({"role": ROLES[role], "content": _content(m.get("content"), where)})
    return out


def parse_chat(body: dict, defaults: SamplingParams, max_tokens: int | None = None) -> Job:
    """OpenAI's ``POST /v1/chat/completions``."""
    f = _Fields(body)
    _check_unsupported(f, "chat")
    messages = _messages(f)
    stream, include = _stream(f)
    return Job("chat", messages=messages,
               max_tokens=_max_tokens(f, ("max_completion_tokens", "max_tokens"), max_tokens),
               sampling=_sampling(f, defaults), stop=f.stops(), stream=stream, include_usage=include,
               model=f.string("model"))


def _prompt(f: _Fields, tokens_ok: bool) -> tuple[str | None, list[int] | None]:
    """``prompt``: a string, an array of one string, or (``tokens_ok``) an array of token ids."""
    if "prompt" not in f.body or f.body["prompt"] is None:
        raise ApiError.invalid("required: the text to continue", param="prompt")
    p = f.body["prompt"]
    if isinstance(p, str):
        return p, None
    if isinstance(p, list):
        if len(p) == 1 and isinstance(p[0], str):
            return p[0], None
        if p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            if not tokens_ok:
                raise ApiError.invalid("expected a string", param="prompt")
            return None, list(p)
        if len(p) > 1 and all(isinstance(t, (str, list)) for t in p):
            raise ApiError.invalid("one prompt per request: draftlight serve does not batch prompts",
                                   param="prompt")
        raise ApiError.invalid("expected a string" + (" or an array of token ids" if tokens_ok else ""),
                               param="prompt")
    raise ApiError.invalid(f"expected a string, got {_kind(p)}", param="prompt")


def parse_completions(body: dict, defaults: SamplingParams, max_tokens: int | None = None) -> Job:
    """OpenAI's ``POST /v1/completions`` (a raw prompt: no chat template). OpenAI's default
    ``max_tokens`` is 16; llama-server's is its ``-n`` (no limit): this server's ``-n``."""
    f = _Fields(body)
    _check_unsupported(f, "completions")
    text, tokens = _prompt(f, tokens_ok=True)
    stream, include = _stream(f)
    return Job("completions", text=text, tokens=tokens, max_tokens=_max_tokens(f, ("max_tokens",), max_tokens),
               sampling=_sampling(f, defaults), stop=f.stops(), stream=stream, include_usage=include,
               model=f.string("model"))


def parse_completion(body: dict, defaults: SamplingParams, max_tokens: int | None = None) -> Job:
    """llama.cpp's ``POST /completion``: ``n_predict`` (-1: no limit; ``max_tokens`` too)."""
    f = _Fields(body)
    _check_unsupported(f, "completion")
    text, tokens = _prompt(f, tokens_ok=True)
    f.boolean("cache_prompt", True)          # known: the prefix is always reused
    return Job("completion", text=text, tokens=tokens,
               max_tokens=_max_tokens(f, ("n_predict", "max_tokens"), max_tokens, unlimited=-1),
               sampling=_sampling(f, defaults), stop=f.stops(), stream=f.boolean("stream"),
               return_tokens=f.boolean("return_tokens"), model=f.string("model"))
