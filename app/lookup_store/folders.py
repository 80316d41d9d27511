"""The cache folders as a whole: listing them (``lookup info``) and removing one (``lookup clear``).

Reads every folder under the lookup directory; :func:`remove_folder` deletes one
folder's files under its lock (so no save is cut in half).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from speculators.ngram_cache import NGRAM_MAX, CorruptCacheError

from .. import paths
from .layout import DYNAMIC_NAME, LOCK_NAME, STATIC_NAME, read_meta
from .lock import FileLock
from .results import FolderInfo
def scan_file(path: str | os.PathLike) -> tuple[int, int]:
    """(n-grams, entries) of a lookup file by hopping its record headers.

    Cheaper than loading; checks the record structure (not duplicates).
    Raises :class:`CorruptCacheError` when the structure is broken.
    """
    data = np.fromfile(os.fspath(path), dtype="<i4")
    size = os.path.getsize(path)
    if size % 4:
        raise CorruptCacheError(f"{path}: size {size} is not a multiple of 4")
    n = len(data)
    p = 0
    ngrams = entries = 0
    nts = data  # local alias
    while p < n:
        if n - p < NGRAM_MAX + 1:
            raise CorruptCacheError(f"{path}: truncated record at byte {4 * p}")
        nt = int(nts[p + NGRAM_MAX])
        if nt <= 0 or p + NGRAM_MAX + 1 + 2 * nt > n:
            raise CorruptCacheError(f"{path}: bad record at byte {4 * p}")
        ngrams += 1
        entries += nt
        p += NGRAM_MAX + 1 + 2 * nt
    return ngrams, entries


def list_folders(root: str | os.PathLike | None = None) -> list[FolderInfo]:
    """Every cache folder under ``root`` (default ``paths.lookup_dir()``)."""
    rootp = Path(root) if root is not None else paths.lookup_dir()
    out: list[FolderInfo] = []
    if not rootp.is_dir():
        return out
    for d in sorted(p for p in rootp.iterdir() if p.is_dir()):
        meta = read_meta(d)
        files = {}
        for name in (STATIC_NAME, DYNAMIC_NAME):
            p = d / name
            if not p.exists():
                continue
            info = {"bytes": p.stat().st_size, "ngrams": None, "entries": None, "error": None}
            try:
                info["ngrams"], info["entries"] = scan_file(p)
            except (CorruptCacheError, OSError) as e:
                info["error"] = str(e)
            files[name] = info
        corrupt = sorted(p.name for p in d.iterdir() if ".corrupt" in p.name)
        models = [{"path": k, **v} for k, v in sorted((meta.get("models") or {}).items())]
        out.append(FolderInfo(os.fspath(d), meta.get("fingerprint"), meta.get("n_vocab"), models, files, corrupt))
    return out


def remove_folder(folder: str | os.PathLike, timeout: float = 60.0) -> None:
    """Delete a cache folder (under its lock, so no save is cut in half)."""
    import shutil
    folder = Path(folder)
    lock = folder / LOCK_NAME
    with FileLock(lock, timeout=timeout):
        for p in folder.iterdir():
            if p.name == LOCK_NAME:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    with contextlib.suppress(OSError):
        lock.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()
