"""``--spec-type auto``: the speculative types this model can use, and why.

Automatic speculation takes every n-gram type (they need nothing but the
text) and the model-based types this model and its settings make possible,
all under the adaptive controller (:mod:`speculators.controller`), which
verifies a draft only where it is expected to pay:

* ``draft-mtp`` when the target's GGUF has multi-token-prediction heads
  (llama.cpp's type detection: the NextN tensor in its last block), or the
  configured draft model is such a file;
* ``draft-eagle3`` / ``draft-dflash`` / ``draft-dspark`` when the configured
  draft model is such a drafter;
* ``draft-simple`` when the configured draft model is an ordinary model
  (its vocabulary is checked when the chain is built);
* nothing model-based otherwise.

Each type's descriptor says what it needs and what to say about it
(:mod:`speculators.descriptor`: ``needs``); a type declared later takes
part too.

:func:`auto_plan` answers without a loaded engine (GGUF headers only), for
a settings pane; a built chain keeps its own answer in
``SpeculatorChain.auto_plan``, where a type that failed to build says why.

>>> [(c.name, c.used) for c in auto_plan(model_path=None)][:5]
[('ngram-simple', True), ('ngram-map-k', True), ('ngram-map-k4v', True), ('ngram-mod', True), ('ngram-cache', True)]
>>> c = auto_plan(model_path=None)[5]
>>> c.name, c.used, c.reason
('draft-simple', False, 'no draft model is set')
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .descriptor import Have, descriptors
from .params import SpecParams
from .types import NGRAM_TYPES, LiveMapping, SpecType


class AutoChoice(NamedTuple):
    """One type under ``auto``: its name, whether it is used, and why (or why not)."""

    name: str
    used: bool
    reason: str


#: why each n-gram type is worth having (they cost next to nothing when cold): their descriptors' say
_NGRAM_REASONS = LiveMapping(lambda: {d.type: d.needs.auto(d, Have())[1] for d in descriptors() if d.is_ngram})

_detect_cache: dict[tuple, tuple[list[SpecType], str | None]] = {}


def _types_in_gguf(path: str | None) -> tuple[list[SpecType], str | None]:
    """(model-based types the file supports, its architecture) from its header; cached per file."""
    if not path:
        return [], None
    try:
        st = os.stat(path)
    except OSError:
        return [], None
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    hit = _detect_cache.get(key)
    if hit is None:
        from .gguf_detect import GGUFError, read_gguf, types_from_info
        try:
            info = read_gguf(path, tensors=True)
            hit = (list(types_from_info(info)), info.architecture)
        except (GGUFError, OSError):
            hit = ([], None)
        if len(_detect_cache) > 16:
            _detect_cache.clear()
        _detect_cache[key] = hit
    return list(hit[0]), hit[1]


def target_types(model_path: str | None) -> list[SpecType]:
    """The model-based types the target GGUF supports by itself (draft-mtp: its MTP heads)."""
    return _types_in_gguf(model_path)[0]


def auto_plan(params: SpecParams | None = None, model_path: str | None = None,
              draft_passed: bool = False) -> list[AutoChoice]:
    """What ``auto`` uses for ``model_path`` with ``params`` (its draft model), in priority order.

    ``draft_passed``: a loaded draft model is passed to the chain (counts when none is configured).
    """
    params = params or SpecParams.auto()
    draft_path = params.draft.model or None
    target_types, _ = _types_in_gguf(model_path)
    draft_types, draft_arch = _types_in_gguf(draft_path)
    have = Have(target_types=frozenset(t.value for t in target_types), draft_model=draft_path,
                draft_arch=draft_arch, draft_types=frozenset(t.value for t in draft_types),
                draft_passed=draft_passed)
    out: list[AutoChoice] = []
    for d in descriptors():
        used, why = d.needs.auto(d, have)
        out.append(AutoChoice(d.name, used, why))
    return out


def auto_plan_for_resources(params: SpecParams, resources: dict) -> list[AutoChoice]:
    """:func:`auto_plan` for the chain being built (the target from ``resources``).

    A draft model passed as a resource (already loaded by the caller) counts
    as configured.
    """
    model = resources.get("model")
    path = getattr(model, "path", None)
    return auto_plan(params, str(path) if path else None,
                     draft_passed=resources.get("draft_model") is not None)


def uses_type(params: SpecParams, t: SpecType) -> bool:
    """Whether ``params`` may use ``t`` (explicitly, or as an n-gram type under auto)."""
    if t in params.types:
        return True
    return params.is_auto and t in NGRAM_TYPES
