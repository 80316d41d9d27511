"""GGUF models already on disk, for the draft model picker.

:func:`find_gguf_models` looks in the usual places and describes each file
from its header alone (architecture, size, name, vocabulary size, the
model-based speculative types it supports); nothing is loaded. Where it
looks, in this order (:func:`search_dirs`):

* draftlight's own models folder (``app.paths.models_dir()``);
* LM Studio: ``~/.lmstudio/models`` (or the ``downloadsFolder`` of
  ``~/.lmstudio/settings.json``) and the older ``~/.cache/lm-studio/models``;
* llama.cpp's cache: ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp`` (``~/Library/Caches/llama.cpp`` on macOS,
  ``%LOCALAPPDATA%/llama.cpp`` on Windows);
* the Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``. Its
  ``models--org--name/snapshots/<rev>/`` entries are symlinks into
  ``blobs/``; they are followed, broken ones skipped, and a blob reachable
  from several snapshots is listed once;
* any ``extra_dirs`` the caller passes.

The same file reached twice (a symlink, a shared folder) is listed once,
under the first place it was found. Of a split model
(``name-00001-of-00003.gguf``) only the first part is listed, with the
size of all parts. Multimodal projector files (``mmproj``, architecture
``clip``) are left out: they can never draft.

:meth:`ModelCandidate.compatibility_with` applies llama.cpp's vocabulary
check (see :mod:`speculators.compat`) to the file's metadata and a target
(a loaded model or a path); its verdict and message are those that
``check_compatible`` gives for the loaded pair.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from speculators.compat import Compatibility, VocabSummary, compatibility, vocab_of_gguf, vocab_of_model
from speculators.gguf_detect import GGUFError, gguf_summary
from speculators.types import SpecType

from . import paths

__all__ = ["ModelCandidate", "SearchDir", "find_gguf_models", "search_dirs"]

SOURCE_APP = "draftlight"
SOURCE_LMSTUDIO = "LM Studio"
SOURCE_LLAMACPP = "llama.cpp"
SOURCE_HF = "Hugging Face"
SOURCE_EXTRA = "folder"

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
#: architectures that are never language models
_NOT_LM = frozenset({"clip"})
#: directory walk limits (a cache folder can be large)
MAX_DEPTH = 8
MAX_FILES = 2000


@dataclass(frozen=True)
class SearchDir:
    path: Path
    source: str


@dataclass
class ModelCandidate:
    """One GGUF model found on disk."""

    path: Path
    source: str
    size: int
    architecture: str | None = None
    name: str | None = None
    file_type: str | None = None
    vocab_size: int | None = None
    block_count: int | None = None
    readable: bool = True
    error: str | None = None
    #: ``org/name`` for the Hugging Face cache, ``publisher/folder`` for LM Studio
    repo: str | None = None
    n_parts: int = 1
    spec_types: list[SpecType] = field(default_factory=list)

    @property
    def display_name(self) -> str:
        return self.name or self.path.name

    def compatibility_with(self, target) -> Compatibility:
        """llama.cpp's vocabulary check of this file against ``target``.

        ``target`` is a loaded :class:`speculators.llama.Model` or a GGUF
        path. No weights are loaded: the file's vocabulary is read from its
        metadata. The target's vocabulary is cached between calls.
        """
        if not self.readable:
            return Compatibility(False, "unreadable", f"cannot read the file: {self.error}")
        return compatibility(_target_vocab(target), self.path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "source": self.source, "size": self.size,
            "architecture": self.architecture, "name": self.name, "file_type": self.file_type,
            "vocab_size": self.vocab_size, "block_count": self.block_count,
            "readable": self.readable, "error": self.error, "repo": self.repo,
            "n_parts": self.n_parts, "spec_types": [t.value for t in self.spec_types],
        }


# -- the target's vocabulary, cached -------------------------------------------------

_target_lock = threading.Lock()
_target_cache: tuple[tuple, VocabSummary] | None = None


def _target_vocab(target) -> VocabSummary:
    """The target's vocabulary summary, from the loaded model or its file (cached)."""
    global _target_cache
    if isinstance(target, VocabSummary):
        return target
    if hasattr(target, "vocab") and hasattr(target, "info"):
        import ctypes
        key: tuple = ("model", ctypes.cast(target.ptr, ctypes.c_void_p).value, target.path)
        make = lambda: vocab_of_model(target)  # noqa: E731
    else:
        p = os.fspath(target)
        try:
            st = os.stat(p)
            key = ("file", os.path.realpath(p), st.st_size, st.st_mtime_ns)
        except OSError:
            key = ("file", p)
        make = lambda: vocab_of_gguf(p)  # noqa: E731
    with _target_lock:
        if _target_cache is not None and _target_cache[0] == key:
            return _target_cache[1]
    try:
        v = make()
    except (GGUFError, ValueError, OSError):
        # let compatibility() report the reason
        return target
    with _target_lock:
        _target_cache = (key, v)
    return v


# -- where to look ------------------------------------------------------------------------

def _env_path(env: Mapping[str, str], var: str) -> Path | None:
    v = env.get(var)
    return Path(v).expanduser() if v else None


def _lmstudio_dirs(home: Path) -> list[Path]:
    out = []
    settings = home / ".lmstudio" / "settings.json"
    try:
        data = json.loads(settings.read_text(encoding="utf-8"))
        folder = data.get("downloadsFolder") if isinstance(data, dict) else None
        if isinstance(folder, str) and folder:
            out.append(Path(folder).expanduser())
    except (OSError, ValueError):
        pass
    out += [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    return out


def _llamacpp_dir(env: Mapping[str, str], home: Path, platform: str) -> Path:
    p = _env_path(env, "LLAMA_CACHE")
    if p:
        return p
    if platform == "win32":
        base = _env_path(env, "LOCALAPPDATA") or home / "AppData" / "Local"
    elif platform == "darwin":
        base = home / "Library" / "Caches"
    else:
        base = _env_path(env, "XDG_CACHE_HOME") or home / ".cache"
    return base / "llama.cpp"


def _hf_hub_dir(env: Mapping[str, str], home: Path) -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        p = _env_path(env, var)
        if p:
            return p
    p = _env_path(env, "HF_HOME")
    if p:
        return p / "hub"
    base = _env_path(env, "XDG_CACHE_HOME") or home / ".cache"
    return base / "huggingface" / "hub"


def search_dirs(extra_dirs: Iterable[str | os.PathLike] = (), *, env: Mapping[str, str] | None = None,
                home: Path | None = None, platform: str | None = None,
                app_models_dir: Path | None = None) -> list[SearchDir]:
    """The folders :func:`find_gguf_models` looks in, in order (existing or not)."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else Path(home)
    platform = sys.platform if platform is None else platform
    dirs = [SearchDir(app_models_dir if app_models_dir is not None else paths.models_dir(), SOURCE_APP)]
    dirs += [SearchDir(p, SOURCE_LMSTUDIO) for p in _lmstudio_dirs(home)]
    dirs.append(SearchDir(_llamacpp_dir(env, home, platform), SOURCE_LLAMACPP))
    dirs.append(SearchDir(_hf_hub_dir(env, home), SOURCE_HF))
    dirs += [SearchDir(Path(p).expanduser(), SOURCE_EXTRA) for p in extra_dirs]
    return dirs


# -- the scan ------------------------------------------------------------------------------------

def _walk_gguf(root: Path, budget: list[int]) -> Iterable[Path]:
    """``.gguf`` files under ``root`` (file symlinks followed, directory symlinks not)."""
    root_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=lambda e: None):
        d = Path(dirpath)
        if len(d.parts) - root_depth >= MAX_DEPTH:
            dirnames[:] = []
        # an HF-layout cache: blobs hold the same files as snapshots, nameless
        dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and
                             not (n == "blobs" and d.name.startswith("models--")))
        for fn in sorted(filenames):
            if not fn.lower().endswith(".gguf"):
                continue
            if budget[0] <= 0:
                return
            budget[0] -= 1
            yield d / fn


def _repo_of(path: Path, root: Path, source: str) -> str | None:
    try:
        rel = path.relative_to(root).parts
    except ValueError:
        return None
    for part in rel:
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/")
    if source == SOURCE_LMSTUDIO and len(rel) >= 3:
        return f"{rel[0]}/{rel[1]}"
    return None


def _describe(path: Path, source: str, root: Path) -> ModelCandidate | None:
    m = _SPLIT_RE.match(path.name)
    n_parts, size = 1, None
    if m:
        if int(m.group("no")) != 1:
            return None  # listed with its first part
        n_parts = int(m.group("count"))
        size = 0
        for i in range(1, n_parts + 1):
            part = path.with_name(f"{m.group('stem')}-{i:05d}-of-{m.group('count')}.gguf")
            try:
                size += part.stat().st_size
            except OSError:
                pass
    s = gguf_summary(path)
    if s.architecture in _NOT_LM or path.name.lower().startswith("mmproj"):
        return None
    return ModelCandidate(
        path=path, source=source, size=size if size is not None else s.size_bytes,
        architecture=s.architecture, name=s.name, file_type=s.file_type, vocab_size=s.vocab_size,
        block_count=s.block_count, readable=s.readable, error=s.error,
        repo=_repo_of(path, root, source), n_parts=n_parts, spec_types=list(s.spec_types))


def find_gguf_models(extra_dirs: Iterable[str | os.PathLike] = (), *,
                     dirs: Iterable[SearchDir] | None = None, **where) -> list[ModelCandidate]:
    """GGUF models in the usual places (see the module docstring), described from their headers.

    ``dirs`` replaces the usual places; ``where`` (``env``, ``home``,
    ``platform``, ``app_models_dir``) changes how they are found - both
    for tests. Unreadable files are listed with ``readable=False`` and the
    reason, so the picker can say why they cannot be used.
    """
    search = list(dirs) if dirs is not None else search_dirs(extra_dirs, **where)
    seen: set[str] = set()
    out: list[ModelCandidate] = []
    budget = [MAX_FILES]
    for sd in search:
        root = sd.path
        try:
            if not root.is_dir():
                continue
        except OSError:
            continue
        for path in _walk_gguf(root, budget):
            try:
                if not path.is_file():  # a broken symlink
                    continue
                real = os.path.realpath(path)
            except OSError:
                continue
            if real in seen:
                continue
            seen.add(real)
            c = _describe(path, sd.source, root)
            if c is not None:
                out.append(c)
    return out
