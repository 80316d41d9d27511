"""What the model files on this machine allow: which speculator types can be used now, the draft
models on disk, and the devices a model was loaded with.

It reads GGUF headers (cached per path), the engine it is given (its model's path, its chain's
skipped types, its devices) and :mod:`app.model_discovery`; it changes nothing. The settings pane
shows what it returns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from speculators.descriptor import Have, descriptors
from speculators.types import LiveMapping, SpecType


_TYPES_CACHE: dict[str, tuple[str | None, list[str]]] = {}


def gguf_kind(path: str | None) -> tuple[str | None, list[str]]:
    """(architecture, model-based spec types the file supports), from its header; cached."""
    if not path:
        return None, []
    key = str(path)
    if key not in _TYPES_CACHE:
        try:
            from speculators.gguf_detect import types_from_info, read_gguf
            info = read_gguf(key, tensors=True)
            _TYPES_CACHE[key] = (info.architecture, [t.value for t in types_from_info(info)])
        except Exception:
            _TYPES_CACHE[key] = (None, [])
    return _TYPES_CACHE[key]


def model_has_mtp(engine: Any) -> bool:
    path = getattr(getattr(engine, "model", None), "path", None)
    return SpecType.DRAFT_MTP.value in gguf_kind(path)[1]


def registered_types() -> set[str]:
    """Types the speculators package implements."""
    from speculators.chain import implemented_types
    return {t.value for t in implemented_types()}


#: how the settings pane names the drafter a type needs (its descriptor's ``drafter_label``)
_DRAFTER_LABEL: Mapping[SpecType, str] = LiveMapping(
    lambda: {d.type: d.drafter_label for d in descriptors() if d.drafter_label})


def availability(engine: Any, draft_model: str | None) -> dict[str, str | None]:
    """For each type, why it cannot be used now (None: it can): what its descriptor needs."""
    skipped = dict(getattr(getattr(engine, "chain", None), "skipped", {}) or {})
    impl = registered_types()
    arch, drafter_types = gguf_kind(draft_model) if draft_model and Path(draft_model).is_file() else (None, [])
    target_path = getattr(getattr(engine, "model", None), "path", None)
    have = Have(target_types=frozenset(gguf_kind(target_path)[1]), draft_model=draft_model or None,
                draft_arch=arch, draft_types=frozenset(drafter_types))
    out: dict[str, str | None] = {}
    for d in descriptors():
        reason: str | None = None
        if impl is not None and d.name not in impl:
            reason = "not implemented in this version of draftlight"
        else:
            reason = d.needs.missing(d, have)
        if reason is None and d.name in skipped:
            reason = skipped[d.name]
        out[d.name] = reason
    return out


def discover_draft_models(engine: Any) -> list[tuple[str, str]] | None:
    """Draft-model candidates on disk as (path, note), from app.model_discovery (None: no picker)."""
    try:
        from ..model_discovery import find_gguf_models
    except Exception:
        return None
    target = getattr(engine, "model", None)
    target_path = str(getattr(target, "path", "") or "")
    out: list[tuple[str, str]] = []
    for c in find_gguf_models():
        if target_path and os.path.realpath(c.path) == os.path.realpath(target_path):
            continue
        note = c.display_name
        if c.size:
            note += f" · {c.size / 2**20:.0f} MiB"
        if c.spec_types:
            note += " · " + ", ".join(t.value for t in c.spec_types)
        try:
            # the loaded model where this process has it, else its file (the runner holds the model)
            ref = target if hasattr(target, "ptr") else target_path
            verdict = c.compatibility_with(ref) if ref else None
        except Exception as e:  # a file that cannot be checked is shown with why
            verdict = None
            note += f" · {e}"
        if verdict is not None:
            note += " · compatible" if verdict.ok else f" · ✗ {verdict.reason}"
        out.append((str(c.path), note))
    return out


def devices_text(devices: Any) -> str:
    """The devices the model was loaded with (RPC servers' included), with their memory then.

    >>> from speculators.devices import Device
    >>> print(devices_text([Device("CPU", "Xeon", "CPU", 2 << 30, 4 << 30),
    ...                     Device("RPC0", "10.0.0.2:50052", "RPC", 1 << 30, 8 << 30, "10.0.0.2:50052")]))
    Devices when the model was loaded (names for the fields above):
      CPU      Xeon · 2,048 MiB free of 4,096 MiB
      RPC0     on 10.0.0.2:50052 · 1,024 MiB free of 8,192 MiB
    """
    if not devices:
        return "Devices: shown once the model is loaded."
    lines = ["Devices when the model was loaded (names for the fields above):"]
    for d in devices:
        where = f"on {d.endpoint}" if d.endpoint else d.description
        lines.append(f"  {d.name:<8} {where} · {d.memory_text()}")
    return "\n".join(lines)
