"""The settings pane's form, apart from Textual: its fields, how a field's text is read and shown, and
what is wrong with a value.

It holds the tables of fields (each speculator type's from its descriptor, the sampling and model
ones), :func:`parse_value`, :func:`format_value` and :func:`field_hint` (by the field's kind name, a
key of :data:`speculators.param_kinds.KINDS`), the context-size notes, and the checks that find
every out-of-range value at once. It reads the declarations and the parameter defaults, and looks
only whether a named file exists; it loads no model and builds no widget (the Textual screen is
:mod:`app.ui.screens.settings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from speculators.descriptor import descriptors
from speculators.param_kinds import KINDS
from speculators.params import ParamError, SpecParams
from speculators.sampling import SamplingParams
from speculators.types import LiveMapping, SpecType

from .config import default_sampling
from .options import ModelOptions, check_placement


#: each type's one line (its descriptor's ``info``), in priority order
SPEC_INFO: Mapping[SpecType, str] = LiveMapping(lambda: {d.type: d.info for d in descriptors()})

#: (key, label, kind) — key is "section.name" of SpecParams / "sampling.x" / "model.x"
Field = tuple[str, str, str]

#: each type's fields (its descriptor's ``fields``), for the types that have some
SPEC_FIELDS: Mapping[SpecType, list[Field]] = LiveMapping(
    lambda: {d.type: [(f.key, f.label, f.kind) for f in d.fields] for d in descriptors() if d.fields})

#: the spec fields' own hints (the others say their default)
_SPEC_HINTS: Mapping[str, str] = LiveMapping(
    lambda: {f.key: f.hint for d in descriptors() for f in d.fields if f.hint})

SAMPLING_FIELDS: list[Field] = [
    ("sampling.temperature", "temperature", "float"),
    ("sampling.top_k", "top-k", "int"),
    ("sampling.top_p", "top-p", "float"),
    ("sampling.min_p", "min-p", "float"),
    ("sampling.seed", "seed", "seed"),
]

OVERFLOW_CHOICES: list[tuple[str, str]] = [
    ("rolling", "Rolling window: leave out the oldest messages (the system prompt stays)"),
    ("truncate-middle", "Truncate the middle: keep the first exchange, leave out the ones after it"),
    ("stop", "Stop: say so, and let me start a new chat or raise the context size"),
]

MODEL_FIELDS: list[Field] = [
    ("model.model", "model file", "path"),
    ("model.ctx_size", "context size", "int"),
    ("model.n_gpu_layers", "GPU layers", "ngl"),
    ("model.threads", "threads", "optint"),
    ("model.rpc", "RPC servers", "str"),
    ("model.device", "devices", "str"),
    ("model.tensor_split", "tensor split", "str"),
    ("chat.max_tokens", "max reply tokens", "int"),
]

#: the Server group's fields (the switch that starts serving is the pane's own)
SERVE_FIELDS: list[Field] = [
    ("serve.port", "port", "int"),
]

_DEFAULT_SPEC = SpecParams()
_DEFAULT_SAMPLING = default_sampling()


def get_dotted(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def set_dotted(obj: Any, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    setattr(obj, parts[-1], value)


def format_value(value: Any, kind: str) -> str:
    """How a value shows in a field of kind ``kind`` (a name in :data:`~speculators.param_kinds.KINDS`)."""
    return KINDS[kind].format(value)


def parse_value(text: str, kind: str) -> Any:
    """Parse a field; raises ValueError with a short message."""
    return KINDS[kind].parse(text)


def field_hint(key: str, kind: str) -> str:
    """The note beside a field whose value is valid: its own hint, else what its kind says of its default."""
    section, name = key.split(".", 1)
    if section == "sampling":
        d = getattr(_DEFAULT_SAMPLING, name)
    elif section == "model":
        return {"model.model": "empty: the embedded default model",
                "model.ctx_size": "default 4096 · 0: the model's own",
                "model.n_gpu_layers": "auto, all or a number",
                "model.threads": "empty: physical cores",
                "model.rpc": "HOST:PORT,… · trusted networks only",
                "model.device": "empty: all below · none: CPU only",
                "model.tensor_split": "e.g. 3,1 · empty: by free memory"}.get(key, "")
    elif section == "chat":
        return "default 1024"
    elif section == "serve":
        return "default 8080 (llama-server's) · 127.0.0.1 only"
    else:
        d = get_dotted(_DEFAULT_SPEC, key)
    if key in _SPEC_HINTS:
        return _SPEC_HINTS[key]
    return KINDS[kind].hint(d)


def field_error(key: str, kind: str, value: Any) -> str | None:
    """What is wrong with a field's parsed value beyond what the parameters' own ``validate()``
    checks (None: nothing): the model options, the reply length, and files that must exist."""
    section, name = key.split(".", 1)
    if section == "model":
        if name == "ctx_size" and value < 0:
            return "must be >= 0"
        if name == "threads" and value is not None and value < 1:
            return "must be at least 1 (empty: automatic)"
        if name == "n_gpu_layers" and value < -1:
            return "must be -1 (auto) or more"
        if name == "model" and value and not Path(value).is_file():
            return "no such file"
        if name in ("rpc", "tensor_split") and value:
            try:
                check_placement(ModelOptions(**{name: value}))
            except ParamError as e:
                return e.message
        return None
    if section == "chat":
        return "must be at least 1" if value < 1 else None
    if section == "serve":
        return "a port from 1 to 65535" if not 1 <= value <= 65535 else None
    if section != "sampling" and kind == "path" and name in ("lookup_cache_static", "model") \
            and value and not Path(value).is_file():
        return "no such file"
    return None


@dataclass
class SettingsResult:
    spec: SpecParams
    sampling: SamplingParams
    model: ModelOptions
    max_tokens: int
    overflow: str = "rolling"
    #: the Server group: serve the model over HTTP on 127.0.0.1 (None: the pane did not say), on this port
    serve: bool | None = None
    serve_port: int | None = None


#: llama.cpp makes a context a multiple of this (llama_context pads n_ctx: -c 128 gives 256)
CTX_PAD = 256


def ctx_in_use(asked: int, n_ctx_train: int = 0) -> int | None:
    """The context size llama.cpp makes of ``-c asked`` (None: not known here, for 0 without the
    model's own)::

        >>> [ctx_in_use(n) for n in (128, 256, 300, 4096)]
        [256, 256, 512, 4096]
        >>> ctx_in_use(0, 32768), ctx_in_use(0)
        (32768, None)
    """
    n = asked or n_ctx_train
    return -(-n // CTX_PAD) * CTX_PAD if n > 0 else None


def ctx_hint(asked: int | None, in_use: int | None) -> str:
    """The note beside the context size: the size in use, and why it is not the one asked for.

    >>> ctx_hint(128, 256)
    'asked for 128: llama.cpp rounds up to a multiple of 256'
    >>> print(ctx_hint(4096, 4096))
    in use · default 4096 · 0: the model's own
    >>> ctx_hint(300, None)
    'llama.cpp will use 512 (a multiple of 256)'
    """
    if in_use is not None and asked is not None and asked != in_use:
        if asked == 0:
            return "0 asked for the model's own"
        return f"asked for {asked}: llama.cpp rounds up to a multiple of {CTX_PAD}"
    if in_use is not None:
        return "in use · " + field_hint("model.ctx_size", "int")
    if asked and ctx_in_use(asked) != asked:
        return f"llama.cpp will use {ctx_in_use(asked)} (a multiple of {CTX_PAD})"
    return field_hint("model.ctx_size", "int")


def collect_errors(spec: SpecParams, sampling: SamplingParams) -> dict[str, str]:
    """Every out-of-range value (validate() stops at the first; reset it and go on)."""
    errors: dict[str, str] = {}
    s = spec.copy()
    for _ in range(64):
        try:
            s.validate()
            break
        except ParamError as e:
            errors.setdefault(e.field, e.message)
            if "." in e.field:
                try:
                    set_dotted(s, e.field, get_dotted(_DEFAULT_SPEC, e.field))
                    continue
                except AttributeError:
                    pass
            break
    sm = dataclasses.replace(sampling)
    for _ in range(8):
        try:
            sm.validate()
            break
        except ParamError as e:
            errors.setdefault(f"sampling.{e.field}", e.message)
            try:
                setattr(sm, e.field, getattr(_DEFAULT_SAMPLING, e.field))
            except AttributeError:
                break
    return errors
