"""Where a cache folder's files live: their names and ``meta.json``.

Holds the file names of a tokenizer's cache folder, :func:`read_meta` and
:func:`record_model`. Reads and writes ``meta.json`` (under the folder's lock) only.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from pathlib import Path

from ..fileutil import atomic_write_text
from .lock import FileLock

STATIC_NAME = "static.bin"
DYNAMIC_NAME = "dynamic.bin"
META_NAME = "meta.json"
LOCK_NAME = ".lock"
FINGERPRINTS_NAME = "fingerprints.json"


def read_meta(folder: str | os.PathLike) -> dict:
    try:
        meta = json.loads((Path(folder) / META_NAME).read_text())
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def record_model(folder: Path, fingerprint: str | None, model) -> None:
    """Note ``model`` in ``folder``'s meta.json (name, path, description, first and last seen),
    with the tokenizer ``fingerprint``, under the folder's lock."""
    folder.mkdir(parents=True, exist_ok=True)
    path = os.path.realpath(getattr(model, "path", "") or "")
    with FileLock(folder / LOCK_NAME, timeout=5.0):
        meta = read_meta(folder)
        models = meta.setdefault("models", {})
        now = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
        entry = models.get(path)
        if entry is not None and entry.get("last_seen") == now and meta.get("fingerprint") == fingerprint:
            return
        desc = ""
        with contextlib.suppress(Exception):
            desc = model.meta("general.name") or model.description() or ""
        models[path] = {"name": os.path.basename(path), "description": desc or (entry or {}).get("description", ""),
                        "first_seen": (entry or {}).get("first_seen", now), "last_seen": now}
        meta["fingerprint"] = fingerprint
        meta["n_vocab"] = int(getattr(model, "n_vocab", 0) or 0)
        with contextlib.suppress(Exception):
            meta["vocab_type"] = int(model.info.vocab_type)
        atomic_write_text(folder / META_NAME, json.dumps(meta, indent=1, sort_keys=True))
