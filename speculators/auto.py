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

from .params import SpecParams
from .types import NGRAM_TYPES, PRIORITY, SpecType


class AutoChoice(NamedTuple):
    """One type under ``auto``: its name, whether it is used, and why (or why not)."""

    name: str
    used: bool
    reason: str


#: why each n-gram type is worth having (they cost next to nothing when cold)
_NGRAM_REASONS = {
    SpecType.NGRAM_SIMPLE: "always available: repeats what followed the last n-gram of the conversation",
    SpecType.NGRAM_MAP_K: "always available: map from n-gram to its continuation",
    SpecType.NGRAM_MAP_K4V: "always available: n-gram map with up to 4 continuations",
    SpecType.NGRAM_MOD: "always available: hashed n-gram pool shared across replies (long copies)",
    SpecType.NGRAM_CACHE: "always available: this conversation plus the learned lookup caches",
}

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


def target_has_mtp(model_path: str | None) -> bool:
    """Whether the target GGUF has MTP heads (``draft-mtp`` can draft from the target itself)."""
    return SpecType.DRAFT_MTP in _types_in_gguf(model_path)[0]


def auto_plan(params: SpecParams | None = None, model_path: str | None = None) -> list[AutoChoice]:
    """What ``auto`` uses for ``model_path`` with ``params`` (its draft model), in priority order."""
    params = params or SpecParams.auto()
    draft_path = params.draft.model or None
    target_types, _ = _types_in_gguf(model_path)
    draft_types, draft_arch = _types_in_gguf(draft_path)
    name = os.path.basename(draft_path) if draft_path else ""
    out: list[AutoChoice] = []
    for t in PRIORITY:
        if t in NGRAM_TYPES:
            out.append(AutoChoice(t.value, True, _NGRAM_REASONS[t]))
            continue
        used, why = False, ""
        if t is SpecType.DRAFT_MTP:
            if SpecType.DRAFT_MTP in target_types:
                used, why = True, "the model has multi-token-prediction heads"
            elif draft_path and SpecType.DRAFT_MTP in draft_types:
                used, why = True, f"the draft model {name} has multi-token-prediction heads"
            else:
                why = "the model has no multi-token-prediction heads"
        elif not draft_path:
            why = "no draft model is set"
        elif draft_arch is None:
            why = f"the draft model {name} cannot be read"
        elif t is SpecType.DRAFT_SIMPLE:
            if draft_types or (draft_arch or "").lower() == "eagle3":
                why = f"the draft model {name} is a {(draft_arch or '?')} drafter, not an ordinary model"
            else:
                used, why = True, f"draft model {name}"
        elif t is SpecType.DRAFT_EAGLE3:
            used = (draft_arch or "").lower() == "eagle3"
            why = f"EAGLE-3 drafter {name}" if used else f"the draft model {name} is not an EAGLE-3 drafter"
        elif t in (SpecType.DRAFT_DFLASH, SpecType.DRAFT_DSPARK):
            used = t in draft_types
            label = "DFlash" if t is SpecType.DRAFT_DFLASH else "DSpark"
            why = f"{label} drafter {name}" if used else f"the draft model {name} is not a {label} drafter"
        out.append(AutoChoice(t.value, used, why))
    return out


def auto_plan_for_resources(params: SpecParams, resources: dict) -> list[AutoChoice]:
    """:func:`auto_plan` for the chain being built (the target from ``resources``).

    A draft model passed as a resource (already loaded by the caller) counts
    as configured.
    """
    model = resources.get("model")
    path = getattr(model, "path", None)
    plan = auto_plan(params, str(path) if path else None)
    if resources.get("draft_model") is not None and not params.draft.model:
        plan = [AutoChoice(c.name, True, "the draft model passed in") if c.name == SpecType.DRAFT_SIMPLE.value
                else c for c in plan]
    return plan


def uses_type(params: SpecParams, t: SpecType) -> bool:
    """Whether ``params`` may use ``t`` (explicitly, or as an n-gram type under auto)."""
    if t in params.types:
        return True
    return params.is_auto and t in NGRAM_TYPES
