"""Tokenizer fingerprints: which cache folder a model's caches live in.

A SHA-256 of the model's vocabulary (see the package doc), remembered in this
process and in ``<lookup_dir>/fingerprints.json`` per model file. Reads a loaded
model's token texts; reads and writes only ``fingerprints.json`` (under its lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path

from .. import paths
from ..fileutil import atomic_write_text
from .errors import LockTimeout
from .layout import FINGERPRINTS_NAME
from .lock import FileLock

_FP_MEMO: dict[tuple, str] = {}
_FP_LOCK = threading.Lock()


def _file_key(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def _token_bytes_raw(model, i: int) -> bytes:
    vocab = getattr(model, "vocab", None)
    if vocab is not None:
        import llama_cpp as lc
        b = lc.llama_vocab_get_text(vocab, i)
        return b or b""
    return model.token_text(i).encode("utf-8", "surrogatepass")


def compute_fingerprint(model) -> str:
    """SHA-256 of the vocabulary: type, size, every token's text (uncached)."""
    info = getattr(model, "info", None)
    vtype = int(getattr(info, "vocab_type", 0)) if info is not None else 0
    n = int(model.n_vocab)
    h = hashlib.sha256(b"draftlight-vocab-v1\0")
    h.update(vtype.to_bytes(4, "little", signed=True))
    h.update(n.to_bytes(8, "little"))
    for i in range(n):
        b = _token_bytes_raw(model, i)
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.hexdigest()


def tokenizer_fingerprint(model, root: str | os.PathLike | None = None) -> str:
    """The tokenizer fingerprint of a loaded model (hex SHA-256), memoized.

    Remembered in this process and in ``<root>/fingerprints.json`` keyed by
    the model file's real path, size and mtime, so the ~0.3 s of reading a
    262k vocabulary is paid once per model file.
    """
    key = _file_key(getattr(model, "path", None))
    if key is not None:
        with _FP_LOCK:
            fp = _FP_MEMO.get(key)
        if fp:
            return fp
    rootp = Path(root) if root is not None else paths.lookup_dir()
    memo_file = rootp / FINGERPRINTS_NAME
    memo: dict = {}
    if key is not None:
        with contextlib.suppress(OSError, ValueError):
            memo = json.loads(memo_file.read_text())
            e = memo.get(key[0])
            if isinstance(e, dict) and e.get("size") == key[1] and e.get("mtime_ns") == key[2] \
                    and isinstance(e.get("fingerprint"), str):
                with _FP_LOCK:
                    _FP_MEMO[key] = e["fingerprint"]
                return e["fingerprint"]
    fp = compute_fingerprint(model)
    if key is not None:
        with _FP_LOCK:
            _FP_MEMO[key] = fp
        with contextlib.suppress(OSError, ValueError, LockTimeout):
            with FileLock(rootp / (FINGERPRINTS_NAME + ".lock"), timeout=5.0):
                try:
                    memo = json.loads(memo_file.read_text())
                    if not isinstance(memo, dict):
                        memo = {}
                except (OSError, ValueError):
                    memo = {}
                memo = {k: v for k, v in memo.items() if os.path.exists(k)}
                memo[key[0]] = {"size": key[1], "mtime_ns": key[2], "fingerprint": fp}
                atomic_write_text(memo_file, json.dumps(memo, indent=1, sort_keys=True))
    return fp


def folder_for_fingerprint(fp: str, root: str | os.PathLike | None = None) -> Path:
    return (Path(root) if root is not None else paths.lookup_dir()) / fp[:16]
