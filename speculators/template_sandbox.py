"""The sandbox chat templates are rendered in: Jinja2's immutable sandbox, with bounds.

A template comes from the model file and is untrusted. Nor can it hang or exhaust the process that renders it: every value a template
makes is measured *before* it is made, and one rendering has bounds
(:class:`ChatTemplateLimitError` names the one exceeded):

- no string or list it makes, prints or passes on is over :data:`MAX_CHARS`
  characters: a list counts as the text it prints as (its items', as often as
  it holds them), so ``'x' * 10**11``, ``[s] * n``, ``a ~ b``, ``a + b``,
  ``'%*s' % (n, s)``, ``s.center(n)``, ``s | replace(a, b)``, ``l | join(s)``,
  ``{% set %}`` blocks and macro results are refused before Python builds them;
- its output is at most :data:`MAX_CHARS` characters;
- ``range()`` has at most :data:`MAX_RANGE` items, and a number made by ``*``
  or ``**`` at most :data:`MAX_INT_BITS` bits;
- at most :data:`MAX_STEPS` steps (loop turns, calls of macros, methods,
  filters and functions), and :data:`STEPS_PER_PAIR` more for each pair of
  messages (some templates look back over the conversation at each message:
  Gemma 4's takes ~0.5 n² steps for n messages), and :data:`TIME_LIMIT_S`
  seconds, checked at each step and each piece of output.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import re
import string
import time
import types
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Callable, Iterable, NoReturn

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

class ChatTemplateError(ValueError):
    pass


class ChatTemplateLimitError(ChatTemplateError):
    """A chat template went past one of the bounds of a rendering (the message names it)."""


def raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the conversation: {message}")


# --------------------------------------------------------------------------- the bounds

#: characters in any one value a template makes (a list: the text it prints as), and in its output
#: (~1M tokens: more than any context; a conversation's template output is about its own size)
MAX_CHARS = 4 * 1024 * 1024
#: loop turns and calls (macros, methods, filters, functions) in one rendering, and more for each
#: pair of messages (a template quadratic in the conversation's length renders a long one)
MAX_STEPS = 500_000
STEPS_PER_PAIR = 4
#: items of one ``range()`` (Jinja's own sandbox bound) and of one ``batch``/``slice``
MAX_RANGE = 100_000
#: bits of a number a template makes with ``*`` or ``**``
MAX_INT_BITS = 4096
#: levels of nesting of a value that is measured (lists in lists...)
MAX_DEPTH = 200
#: seconds of one rendering (what no step counts: a backstop)
TIME_LIMIT_S = 30.0


def exceeded(limit: str) -> NoReturn:
    raise ChatTemplateLimitError(f"the model's chat template exceeded {limit}")


def _check_size(n: int, what: str) -> None:
    if n > MAX_CHARS:
        exceeded(f"the limit of {MAX_CHARS:,} characters for one value ({what})")


class Budget:
    """One rendering's steps, time and measured containers."""

    def __init__(self, n_messages: int = 0) -> None:
        self.steps = 0
        self.max_steps = MAX_STEPS + STEPS_PER_PAIR * n_messages * n_messages
        self.n_messages = n_messages
        self.deadline = time.monotonic() + TIME_LIMIT_S
        #: measured containers by id, kept referenced (an id is not reused while it is here)
        self.sizes: dict[int, tuple[Any, int]] = {}
        self.kept_items = 0

    def keep(self, value: Any, size: int) -> None:
        """Remember a container's size: the conversation's messages, measured at each call that
        is handed one; not a namespace (it changes), and no more than :data:`MAX_CHARS` items in
        all (what is kept stays in memory until the rendering ends)."""
        n = len(value) if hasattr(value, "__len__") else MAX_CHARS
        if not isinstance(value, Namespace) and self.kept_items + n <= MAX_CHARS:
            self.kept_items += n
            self.sizes[id(value)] = (value, size)

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            exceeded(f"the limit of {self.max_steps:,} steps (loop turns and calls) in rendering "
                      f"{self.n_messages} message{'s' * (self.n_messages != 1)}")
        if time.monotonic() > self.deadline:
            exceeded(f"the time limit of {TIME_LIMIT_S:g} s for one rendering")


#: the rendering under way in this thread (None: compiling, where nothing loops)
BUDGET: ContextVar[Budget | None] = ContextVar("chat_template_budget", default=None)


def _step(n: int = 1) -> None:
    budget = BUDGET.get()
    if budget is not None:
        budget.step(n)


_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def _parts(value: Any) -> Iterable[Any] | None:
    """What a container prints: its items (a mapping's keys and values); None: not a container."""
    if isinstance(value, Mapping):
        return itertools.chain.from_iterable(value.items())
    if isinstance(value, Namespace):
        return itertools.chain.from_iterable(object.__getattribute__(value, "_Namespace__attrs").items())
    if isinstance(value, (list, tuple, set, frozenset, *_VIEWS)):
        return value
    return None


def _size(value: Any, depth: int = 0) -> int:
    """About how many characters ``value`` prints as: a string its length, a container its items'
    (each time it holds them); counted no further than past :data:`MAX_CHARS`."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if type(value) is _SizedList:
        return value.chars
    parts = _parts(value)
    if parts is None:
        return 32            # a number, None, a macro, a loop...: a short repr
    budget = BUDGET.get()
    if budget is not None and id(value) in budget.sizes:
        return budget.sizes[id(value)][1]
    if depth > MAX_DEPTH:
        exceeded(f"the limit of {MAX_DEPTH} levels of nesting")
    total = 2
    for i, item in enumerate(parts):
        total += _size(item, depth + 1) + 2
        if total > MAX_CHARS:
            break
        if budget is not None and i % 4096 == 4095:
            budget.step(0)          # the time limit, in a long list
    if budget is not None:
        budget.keep(value, total)
    return total


def _nodes_deep(value: Any, depth: int = 0) -> int:
    """The sum over a value's containers and items of their depth (what indenting it costs);
    only for values whose :func:`_size` passed (so a bounded walk)."""
    parts = _parts(value)
    if parts is None:
        return depth
    if depth > MAX_DEPTH:
        exceeded(f"the limit of {MAX_DEPTH} levels of nesting")
    _step(0)
    return depth + sum(_nodes_deep(item, depth + 1) for item in parts)


def _checked_int(n: Any, what: str, limit: int | None = None) -> int:
    limit = MAX_CHARS if limit is None else limit
    if isinstance(n, int) and n > limit:
        exceeded(f"the limit of {limit:,} for {what}")
    return n if isinstance(n, int) else 0


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_RANGE:
        exceeded(f"the limit of {MAX_RANGE:,} items for range()")
    return r


_DIGITS = re.compile(r"\d+")
#: a printf-style field's width and precision
_PRINTF_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")


def _check_format(text: str, values: Iterable[Any], what: str, printf: bool, named: bool) -> None:
    """``text % values`` or ``text.format(*values)``: its length, the values (each as often as a
    field may name it: ``named``) and the widest width or precision a field asks for, per field."""
    values = list(values)
    sizes = [_size(v) for v in values]
    if printf:
        fields = list(_PRINTF_FIELD.finditer(text))
        specs = [d for m in fields for d in m.groups() if d]
        widths_given = "*" in specs                             # ``%*d``
    else:
        try:
            fields = [(name, spec or "") for _, name, spec, _ in string.Formatter().parse(text) if name is not None]
        except ValueError:
            fields = []             # str.format itself says what is wrong with it
        specs = [spec for _, spec in fields]
        named = named or any(name for name, _ in fields)       # ``{0}``, ``{x}``: a value again
        widths_given = any("{" in spec for spec in specs)       # ``{:{w}}``
    numbers = [MAX_CHARS + 1 if len(d) > 9 else int(d) for spec in specs for d in _DIGITS.findall(spec)]
    if widths_given:          # a width taken from the values: any number among them may be one
        numbers += [v for v in values if isinstance(v, int)]
    spread = len(fields) * max(sizes, default=0) if named else sum(sizes)
    _check_size(len(text) + spread + len(fields) * max(numbers, default=0), what)


def _format_values(right: Any) -> Iterable[Any]:
    if isinstance(right, tuple):
        return right
    if isinstance(right, Mapping):
        return right.values()
    return (right,)


def _replaced_size(s: str, old: str, new: str, count: Any = -1) -> int:
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(0, len(new) - len(old))


def _check_repeat(left: Any, right: Any) -> int | None:
    """``seq * n``, ``n * seq`` and ``n * m``; the result's size where it is a sequence."""
    if isinstance(left, int) and not isinstance(right, int):
        left, right = right, left
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            exceeded(f"the limit of {MAX_INT_BITS:,} bits for a number")
    elif isinstance(left, (str, list, tuple)) and isinstance(right, int):
        size = _size(left) * max(right, 0)
        _check_size(size, "the result of *")
        return size
    return None


def _check_sum(left: Any, right: Any) -> int | None:
    """``a + b`` of two sequences: the result's size."""
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        size = _size(left) + _size(right)
        _check_size(size, "the result of +")
        return size
    return None


class _SizedList(list):
    """A list a template made with ``+`` or ``*``, which knows its :func:`_size` (a list a loop
    grows item by item is not walked again at each turn). Prints, compares and serializes as a
    list; the sandbox keeps it unchanged as any list."""

    __slots__ = ("chars",)

    def __init__(self, items: Iterable[Any], chars: int) -> None:
        super().__init__(items)
        self.chars = chars


def _sized(value: Any, size: int | None) -> Any:
    return _SizedList(value, size) if size is not None and type(value) is list else value


def _check_power(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
            and (left.bit_length() - 1) * right > MAX_INT_BITS:
        exceeded(f"the limit of {MAX_INT_BITS:,} bits for a number")


# what some filters and str methods make, predicted from their arguments (a filter's by name,
# as inspect.signature binds them): each raises where the result would be past a bound

def _filter_center(a: dict) -> None:
    _check_size(_size(a["value"]) + _checked_int(a.get("width", 80), "|center's width"), "|center")


def _filter_indent(a: dict) -> None:
    s, width = str(a["s"]), a.get("width", 4)
    pad = _checked_int(width, "|indent's width") if isinstance(width, int) else len(str(width))
    _check_size(len(s) + (s.count("\n") + 1) * pad, "|indent")


def _filter_replace(a: dict) -> None:
    _check_size(_replaced_size(str(a["s"]), str(a["old"]), str(a["new"]), a.get("count")), "|replace")


def _filter_format(a: dict) -> None:
    kwargs = a.get("kwargs") or {}
    values = kwargs.values() if kwargs else a.get("args") or ()
    _check_format(str(a["value"]), values, "|format", printf=True, named=bool(kwargs))


def _filter_wordwrap(a: dict) -> None:
    s, wrap = str(a["s"]), a.get("wrapstring")
    _check_size(len(s) + (len(s) + 1) * len(str(wrap if wrap is not None else "\n")), "|wordwrap")


def _filter_tojson(a: dict) -> None:
    indent = a.get("indent")
    pad = _checked_int(indent, "|tojson's indent") if isinstance(indent, int) else len(str(indent or ""))
    if pad:
        _check_size(_size(a["value"]) + pad * _nodes_deep(a["value"]), "|tojson")


def _filter_pprint(a: dict) -> None:
    _check_size(_size(a["value"]) + _nodes_deep(a["value"]), "|pprint")


def _filter_urlize(a: dict) -> None:
    extra = sum(len(str(a.get(k) or "")) for k in ("target", "rel"))
    s = str(a["value"])
    _check_size(3 * len(s) + (len(s) // 2 + 1) * (extra + 64), "|urlize")


def _filter_counts(name: str, param: str) -> Callable[[dict], None]:
    def check(a: dict) -> None:
        _checked_int(a.get(param), f"|{name}'s {param}", MAX_RANGE)
    return check


_FILTER_CHECKS: dict[str, Callable[[dict], None]] = {
    "center": _filter_center, "indent": _filter_indent, "replace": _filter_replace,
    "format": _filter_format, "wordwrap": _filter_wordwrap, "tojson": _filter_tojson,
    "pprint": _filter_pprint, "urlize": _filter_urlize,
    "batch": _filter_counts("batch", "linecount"), "slice": _filter_counts("slice", "slices"),
}


def _bounded_filter(name: str, f: Callable) -> Callable:
    """``f`` (a filter), its input and arguments measured and its result predicted first."""
    check = _FILTER_CHECKS.get(name)
    sig = inspect.signature(f) if check is not None or name == "join" else None

    @functools.wraps(f)          # keeps Jinja's pass_context/pass_eval_context mark
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _step()
        for v in itertools.chain(args, kwargs.values()):
            _check_size(_size(v), f"the input of |{name}")
        if name == "join":
            args, kwargs = _join_input(sig, args, kwargs)
        elif check is not None:
            try:
                named = sig.bind(*args, **kwargs).arguments
            except TypeError:
                named = None         # the filter itself says what is wrong with its arguments
            if named is not None:
                check(named)
        return f(*args, **kwargs)

    return bounded


def _join_input(sig: inspect.Signature, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``|join``: its items listed (an iterator is read once) and the result predicted."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    items = bound.arguments.get("value", ())
    items = items if isinstance(items, (str, list, tuple)) else list(items)
    bound.arguments["value"] = items
    sep = len(str(bound.arguments.get("d", "")))
    _check_size(sum(_size(i) for i in items) + sep * max(len(items) - 1, 0), "|join")
    return bound.args, bound.kwargs


def _check_str_method(method: Any, args: tuple, kwargs: dict) -> tuple:
    """A str method's result predicted (the padding, tab, replace and join ones); the arguments
    to call it with (``join``'s iterator listed)."""
    name, s = method.__name__, method.__self__
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _check_size(max(len(s), _checked_int(args[0], f"str.{name}()'s width")), f"str.{name}()")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        _check_size(len(s) + s.count("\t") * _checked_int(size, "str.expandtabs()'s tab size"), "str.expandtabs()")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_size(_replaced_size(s, args[0], args[1], args[2] if len(args) > 2 else -1), "str.replace()")
    elif name == "join" and args:
        items = args[0] if isinstance(args[0], (str, list, tuple)) else list(args[0])
        _check_size(sum(_size(i) for i in items) + len(s) * max(len(items) - 1, 0), "str.join()")
        args = (items, *args[1:])
    return args


class _Bounded(NodeTransformer):
    """The template's tree, each loop's iterable and each ``~`` through the environment's checks."""

    @staticmethod
    def _call(name: str, args: list, lineno: int) -> nodes.Call:
        return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._call("loop_turns", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return self._call("joined", list(node.nodes), node.lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the bounds of this module."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=finalize, **options)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.globals["range"] = _bounded_range
        self.globals.pop("lipsum", None)     # paragraphs of filler text: no chat needs them

    def compile_bounded(self, source: str) -> Any:
        tree = _Bounded().visit(self.parse(source))
        tree.set_environment(self)
        return self.from_string(tree)

    def concat(self, parts: Iterable[str]) -> str:           # {% set %} blocks, macros' results
        parts = parts if isinstance(parts, list) else list(parts)
        _check_size(sum(map(len, parts)), "a block's text")
        return "".join(parts)

    def loop_turns(self, iterable: Any) -> Any:
        for item in iterable:
            _step()
            yield item

    def joined(self, *parts: Any) -> str:                    # ``a ~ b``
        _check_size(sum(_size(p) for p in parts), "the result of ~")
        return "".join(map(str, parts))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _step()
        size = None
        if operator == "*":
            size = _check_repeat(left, right)
        elif operator == "+":
            size = _check_sum(left, right)
        elif operator == "%" and isinstance(left, str):
            _check_format(left, _format_values(right), "the result of %", printf=True,
                          named=isinstance(right, Mapping))
        elif operator == "**":
            _check_power(left, right)
        return _sized(super().call_binop(context, operator, left, right), size)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _step()
        for v in itertools.chain(args, kwargs.values()):
            _check_size(_size(v), "an argument")
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(getattr(__obj, "__self__", None), str):
            args = _check_str_method(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        text, is_map = value.__self__, value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            values = _format_values(args[0]) if is_map and args else itertools.chain(args, kwargs.values())
            _check_format(text, values, f"str.{value.__name__}()", printf=False, named=is_map or bool(kwargs))
            return fmt(*args, **kwargs)

        return functools.update_wrapper(bounded, fmt)


def finalize(value: Any) -> Any:
    """Every ``{{ value }}``: measured before it is printed."""
    _check_size(_size(value), "a printed value")
    return value


