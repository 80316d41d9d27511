"""Lookup caches that learn: draftlight's persistent static and dynamic n-gram caches.

The ``ngram-cache`` speculator drafts from three caches (see
:mod:`speculators.ngram_cache`): the current context, a *dynamic* cache of
what earlier replies contained and a *static* cache built from a text
corpus. llama.cpp's server only reads the last two; this module keeps them
on disk and lets the dynamic one grow with use.

Where
    ``paths.lookup_dir() / <fingerprint[:16]> /`` with ``static.bin`` and
    ``dynamic.bin`` (llama.cpp's lookup file format), ``meta.json`` (the
    fingerprint and the models seen with it, for ``draftlight lookup info``)
    and ``.lock``. The fingerprint is a SHA-256 of the model's vocabulary
    (every token's text, the vocabulary type and size), so models sharing a
    tokenizer share caches and different tokenizers never mix. Computing it
    reads all token texts (~0.3 s for 262k tokens); it is remembered per
    model file (path, size, mtime) in ``lookup_dir()/fingerprints.json``.
    Explicit ``--lookup-cache-static`` / ``--lookup-cache-dynamic`` paths
    replace the folder's files, as in llama.cpp.

When
    :meth:`LookupStore.for_model` (or :meth:`LookupStore.load`) reads both
    files. A missing file is an empty cache (a missing *explicit* static
    file is an error, as in llama.cpp). A file is read whole only once its
    size and first bytes show it can be a cache of a size this machine can
    load (a text corpus, a GGUF model or a multi-GB file costs one 4 KiB
    read), and with a model its token ids must all lie in the vocabulary
    (an id outside it would abort llama.cpp when drafted). A malformed file
    is never used half-way:

    * an *explicit* file (``--lookup-cache-static`` / ``--lookup-cache-dynamic``
      or the config's paths: the person's own file) is never renamed, moved,
      changed or deleted; :class:`LookupCacheError` says what is wrong with it;
    * the folder's own damaged file is moved aside to ``<name>.corrupt``
      (``.corrupt.1``, ... if taken; never deleted), a warning is returned and
      kept in :attr:`LookupStore.warnings`, and drafting goes on with an empty
      cache. One that is only too big to load here is kept in place (and a
      save refuses to write over it).

    After each reply the application calls :meth:`LookupStore.learn` with
    the conversation's tokens (prompt + reply) and then :meth:`LookupStore.save`
    (safe to call from a worker thread; :meth:`save_async` starts one).

What is learned after a reply
    llama.cpp's lookup example merges its context cache into the dynamic
    cache at exit: the n-grams (sizes ``NGRAM_MIN..NGRAM_MAX``) of prompt +
    reply. draftlight does not read the speculator's context cache for this:
    that cache never resets between replies (reference behaviour) and is
    updated per drafting stretch, so merging it after every reply would add
    earlier replies again and again. Instead :meth:`learn` counts the
    n-grams of the token sequence itself, but only those *ending after the
    longest prefix already learned* (compared with the last few sequences
    learned in this process). The first reply of a conversation therefore
    adds exactly what ``llama-lookup`` would add (the whole prompt + reply);
    later turns of the same chat add only the new user message and reply; a
    regenerated reply adds only the new reply. Each token position of a
    conversation is counted once.

    Learned n-grams go at once into :attr:`dynamic` (the object the
    speculator drafts from, so later replies of this session benefit) and
    into a *delta* cache of what this process added since it last saved.

Saving, and two processes
    :meth:`save` takes an exclusive lock on ``.lock`` (``fcntl.flock``;
    ``msvcrt.locking`` on Windows; a lock directory elsewhere). If the file
    on disk is still the one this process last read or wrote (same inode,
    size and mtime), the in-memory dynamic cache *is* disk + delta and is
    written as is; otherwise the file is read again, the delta is merged
    into what the other process wrote, and that is written (and becomes the
    in-memory cache, plus anything learned meanwhile). Writes are atomic
    (temp file in the folder, fsync, rename): a process killed while saving
    leaves the old file or the new one. Temp files left by killed writers
    are removed when older than an hour.

Size cap
    When the dynamic cache would exceed ``max_bytes`` (default
    :data:`DEFAULT_MAX_BYTES`, 32 MiB: about a million entries; the file is
    parsed in Python, ~0.25 s per MiB) it is pruned to 90 % of the cap by
    dropping the entries (n-gram, next token) with the lowest counts first;
    among equal counts the oldest (first seen earliest) go first.

For the application's settings pane
    :meth:`LookupStore.info` (sizes, entry counts),
    :meth:`LookupStore.contribution` (drafted/accepted per cache, from the
    running speculator), :meth:`LookupStore.build_static` (from files,
    with progress and cancel) and :meth:`LookupStore.clear_dynamic`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from speculators.base import common_prefix
from speculators.ngram_cache import (
    NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC, N_DRAFT, SOURCE_NAMES, CorruptCacheError, LookupCacheError,
    LookupFileRefused, NgramCache, NgramCacheSpeculator, check_vocab, ngram_cache_draft, read_lookup_file,
)

from . import paths
from .fileutil import atomic_write_bytes, atomic_write_text

log = logging.getLogger("draftlight.lookup")

__all__ = [
    "DEFAULT_MAX_BYTES", "PRUNE_TO", "STATIC_NAME", "DYNAMIC_NAME", "META_NAME", "LOCK_NAME",
    "LookupStore", "LookupStoreError", "LockTimeout", "BuildCancelled", "FileLock",
    "CacheInfo", "FolderInfo", "SaveResult", "BuildResult", "SimStats",
    "tokenizer_fingerprint", "compute_fingerprint", "folder_for_fingerprint", "open_vocab", "read_meta",
    "prune_cache", "move_aside", "scan_file", "list_folders", "remove_folder",
    "build_static_cache", "simulate_drafting", "learn_tokens", "Learner",
]

#: default size cap of the dynamic cache file
DEFAULT_MAX_BYTES = 32 << 20
#: pruning goes down to this fraction of the cap (so that not every save prunes)
PRUNE_TO = 0.9
STATIC_NAME = "static.bin"
DYNAMIC_NAME = "dynamic.bin"
META_NAME = "meta.json"
LOCK_NAME = ".lock"
FINGERPRINTS_NAME = "fingerprints.json"
#: a temp file of an interrupted save older than this is removed
_STALE_TMP_S = 3600.0
#: how many learned sequences are remembered to find what is new
_RECENT = 8


class LookupStoreError(Exception):
    """A lookup cache could not be saved or changed (the message says why)."""


class LockTimeout(LookupStoreError):
    """Another process held the cache folder's lock for too long."""


class BuildCancelled(Exception):
    """:func:`build_static_cache` was cancelled; nothing was written."""


# ---------------------------------------------------------------------------
# Locking
# ---------------------------------------------------------------------------

try:  # pragma: no cover - platform dependent
    import fcntl as _fcntl
except ImportError:  # pragma: no cover
    _fcntl = None
try:  # pragma: no cover
    import msvcrt as _msvcrt
except ImportError:
    _msvcrt = None


class FileLock:
    """An exclusive inter-process lock on ``path`` (created if missing).

    ``fcntl.flock`` where available (released by the OS when the process
    dies, so a killed holder never wedges the folder), ``msvcrt.locking``
    on Windows, otherwise a lock directory ``path + ".d"`` that is taken
    over when older than ``stale_s``. Not re-entrant; threads of one
    process exclude each other too (each acquisition opens its own file).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), ".lock")
    >>> with FileLock(p):
    ...     pass
    """

    def __init__(self, path: str | os.PathLike, timeout: float = 60.0, poll: float = 0.02,
                 stale_s: float = 300.0):
        self.path = os.fspath(path)
        self.timeout = timeout
        self.poll = poll
        self.stale_s = stale_s
        self._fd: int | None = None
        self._dir: str | None = None

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        deadline = time.monotonic() + self.timeout
        if _fcntl is not None or _msvcrt is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                while True:
                    try:
                        if _fcntl is not None:
                            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
                        else:  # pragma: no cover - Windows
                            os.lseek(fd, 0, os.SEEK_SET)
                            _msvcrt.locking(fd, _msvcrt.LK_NBLCK, 1)
                        break
                    except OSError as e:
                        if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                            raise
                        if time.monotonic() >= deadline:
                            raise LockTimeout(f"the lookup cache lock {self.path} is held by another "
                                              f"process (waited {self.timeout:.0f} s)") from None
                        time.sleep(self.poll)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return
        d = self.path + ".d"  # pragma: no cover - fallback
        while True:  # pragma: no cover
            try:
                os.mkdir(d)
                self._dir = d
                return
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(d).st_mtime > self.stale_s:
                        os.rmdir(d)
                        continue
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"the lookup cache lock {d} is held by another process") from None
                time.sleep(self.poll)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if _fcntl is not None:
                    _fcntl.flock(fd, _fcntl.LOCK_UN)
                elif _msvcrt is not None:  # pragma: no cover
                    os.lseek(fd, 0, os.SEEK_SET)
                    _msvcrt.locking(fd, _msvcrt.LK_UNLCK, 1)
            finally:
                os.close(fd)
        if self._dir is not None:  # pragma: no cover
            d, self._dir = self._dir, None
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

_MISSING = ("missing",)


def _sig(path: Path):
    """What identifies one version of a file cheaply: inode, size, mtime (or _MISSING)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _MISSING
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _digest(data: bytes | None) -> bytes | None:
    return None if data is None else hashlib.blake2b(data, digest_size=16).digest()


def _still(path: Path, state) -> bool:
    """Is ``path`` still the version recorded in ``state`` = (sig, digest)?

    The cheap signature first; when it matches, the contents' digest too
    (an inode number can be reused and mtimes are coarse on some file
    systems). Reading is cheap next to parsing.
    """
    if state is None:
        return False
    sig, digest = state
    if _sig(path) != sig:
        return False
    if sig is _MISSING:
        return True
    try:
        with open(path, "rb") as f:
            return _digest(f.read()) == digest
    except OSError:
        return False


def move_aside(path: str | os.PathLike) -> Path:
    """Rename a damaged ``path`` to ``<path>.corrupt`` (``.corrupt.1``, ... if taken)."""
    path = Path(path)
    target = path.with_name(path.name + ".corrupt")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt.{n}")
    os.replace(path, target)
    return target


def _cleanup_tmp(folder: Path, names: Iterable[str]) -> None:
    """Remove temp files of saves that were killed (older than an hour)."""
    now = time.time()
    for name in names:
        for p in folder.glob(f".{name}.*.tmp"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > _STALE_TMP_S:
                    p.unlink()


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


def _read_cache(path: Path, kind: str, explicit: bool, warnings: list[str], n_vocab: int | None = None,
                saving: bool = False) -> NgramCache:
    """:func:`_read_cache_state` without the state."""
    return _read_cache_state(path, kind, explicit, warnings, n_vocab, saving)[0]


def _read_cache_state(path: Path, kind: str, explicit: bool, warnings: list[str], n_vocab: int | None = None,
                      saving: bool = False):
    """Load ``path`` -> (cache, (sig, digest) of what is on disk afterwards).

    The file is read whole only once its size and first bytes pass
    (:func:`~speculators.ngram_cache.read_lookup_file`), and, given ``n_vocab``,
    no token id outside ``0..n_vocab-1`` is let through (such ids abort llama.cpp).

    Rules, by whose file it is:

    * missing: an empty cache (an error for an explicit static file);
    * an *explicit* file (one the person named: ``--lookup-cache-*``, config) that
      is not a usable cache raises :class:`LookupCacheError` saying why, and is
      never renamed, moved, changed or deleted;
    * the app's own file in its folder, damaged (not a cache, bad records, ids
      outside the vocabulary): moved aside to ``.corrupt``, a warning added, empty;
    * a file refused unread (too big to load here, not a regular file) or one that
      cannot be read: kept where it is, a warning added, empty; while ``saving``
      (where going on would write over it) :class:`LookupStoreError` instead.
    """
    try:
        data, st = read_lookup_file(path)
        cache = NgramCache.from_bytes(data, source=os.fspath(path))
        if n_vocab is not None:
            check_vocab(cache, n_vocab, os.fspath(path))
        return cache, ((st.st_ino, st.st_size, st.st_mtime_ns), _digest(data))
    except FileNotFoundError as e:
        if explicit and kind == "static":
            raise LookupCacheError(os.fspath(path), kind, e.strerror or "not found") from e
        return NgramCache(), (_MISSING, None)
    except LookupFileRefused as e:
        if explicit:
            raise LookupCacheError(os.fspath(path), kind, f"{_reason(e, path)}; the file was left as it is") from e
        return _kept_unread(path, kind, _reason(e, path), warnings, saving)
    except CorruptCacheError as e:
        if explicit:
            raise LookupCacheError(os.fspath(path), kind, f"{_reason(e, path)}; the file was left as it is") from e
        try:
            aside = move_aside(path)
        except OSError as e2:  # pragma: no cover - e.g. read-only folder
            msg = (f"the {kind} lookup cache {path} is damaged ({_reason(e, path)}) and could not be moved "
                   f"aside ({e2.strerror or e2}); an empty cache is used")
            if saving:
                raise LookupStoreError(msg) from e2
        else:
            msg = (f"the {kind} lookup cache {path} was damaged ({_reason(e, path)}); it was moved to "
                   f"{aside.name} and an empty {kind} cache is used")
        log.warning(msg)
        warnings.append(msg)
        return NgramCache(), (_sig(path), None)
    except OSError as e:
        if explicit:
            raise LookupCacheError(os.fspath(path), kind, e.strerror or str(e)) from e
        return _kept_unread(path, kind, f"it cannot be read: {e.strerror or e}", warnings, saving)


def _reason(e: BaseException, path: Path) -> str:
    """An error's message less the ``"<path>: "`` it begins with (the caller names the file)."""
    msg, prefix = str(e), f"{os.fspath(path)}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def _kept_unread(path: Path, kind: str, why: str, warnings: list[str], saving: bool):
    """The app's own cache file could not be loaded but is not known to be damaged: it stays.

    Loading goes on with an empty cache (state None: a later save reads the file again
    first); a save raises instead, so that the file is never written over.
    """
    if saving:
        raise LookupStoreError(f"the {kind} lookup cache {path} is kept as it is and not written over ({why}); "
                               f"move it away to let a new one be saved")
    msg = f"the {kind} lookup cache {path} is not used ({why}); it is kept as it is and an empty cache is used"
    log.warning(msg)
    warnings.append(msg)
    return NgramCache(), None


# ---------------------------------------------------------------------------
# Pruning
# ---------------------------------------------------------------------------


def prune_cache(cache: NgramCache, max_bytes: int, target: float = PRUNE_TO) -> tuple[NgramCache, int]:
    """A cache whose file fits ``max_bytes``: the rarest entries dropped.

    Returns ``(cache, 0)`` unchanged when it fits; otherwise a new cache
    holding at most ``target * max_bytes`` bytes and the number of entries
    removed. Entries go in order of count, then age (first inserted first);
    an n-gram whose last entry goes is dropped with it (20 bytes more).

    >>> c = NgramCache()
    >>> c.add((1,), 2, 5); c.add((1,), 3, 1); c.add((4,), 5, 1)
    >>> c.file_size
    64
    >>> small, removed = prune_cache(c, 40, target=1.0)
    >>> small.to_dict(), removed
    ({(1, -1, -1, -1): {2: 5}}, 2)
    """
    size = cache.file_size
    if size <= max_bytes:
        return cache, 0
    goal = int(max_bytes * target)
    items = list(cache.items())
    n_tok = np.fromiter((len(p) for _, p in items), dtype=np.int64, count=len(items))
    counts = np.fromiter((c for _, p in items for c in p.values()), dtype=np.int64, count=int(n_tok.sum()))
    owner = np.repeat(np.arange(len(items), dtype=np.int64), n_tok)
    order = np.argsort(counts, kind="stable")  # stable: equal counts keep insertion (age) order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    last_rank = np.zeros(len(items), dtype=np.int64)
    np.maximum.at(last_rank, owner, rank)
    freed = np.full(len(order), 8, dtype=np.int64)
    freed[last_rank] += 4 * (NGRAM_MAX + 1)
    cum = np.cumsum(freed)
    m = int(np.searchsorted(cum, size - goal, side="left")) + 1
    m = min(m, len(order))
    keep = np.ones(len(order), dtype=bool)
    keep[order[:m]] = False
    out = NgramCache()
    j = 0
    for key, part in items:
        for tok, c in part.items():
            if keep[j]:
                out.add(key, tok, c)
            j += 1
    return out, m


# ---------------------------------------------------------------------------
# Fingerprints and vocab-only models
# ---------------------------------------------------------------------------

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


def _vocab_model_class():
    from speculators.llama import Model, ModelError, VocabInfo, _last_errors, backend_init, check_gguf_file
    import llama_cpp as lc

    class VocabModel(Model):
        """A GGUF loaded with ``vocab_only``: tokenize, token texts, no weights."""

        def __init__(self, path: str | os.PathLike):  # noqa: D401 - no super().__init__: no weights
            backend_init()
            self.path = os.fspath(path)
            check_gguf_file(self.path)
            params = lc.llama_model_default_params()
            params.vocab_only = True
            params.n_gpu_layers = 0
            ptr = lc.llama_model_load_from_file(self.path.encode(), params)
            if not ptr:
                why = _last_errors()
                raise ModelError(f"cannot load the vocabulary of {self.path}" + (f": {why}" if why else ""))
            self.ptr = ptr
            self.vocab = v = lc.llama_model_get_vocab(ptr)
            self.info = VocabInfo(
                n_vocab=lc.llama_vocab_n_tokens(v), bos=lc.llama_vocab_bos(v), eos=lc.llama_vocab_eos(v),
                eot=lc.llama_vocab_eot(v), add_bos=bool(lc.llama_vocab_get_add_bos(v)),
                add_eos=bool(lc.llama_vocab_get_add_eos(v)), vocab_type=int(lc.llama_vocab_type(v)))
            self.n_vocab = self.info.n_vocab
            self.is_recurrent = self.is_hybrid = False
            self.load_mtp = False
            self._piece_cache = {}
            self._eog_known = {}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    return VocabModel


_VOCAB_CLS = None


def open_vocab(path: str | os.PathLike):
    """Load only the vocabulary of a GGUF model (fast; no weights).

    The object has ``tokenize``, ``token_text``, ``n_vocab``, ``info``,
    ``path`` and ``close`` like :class:`speculators.llama.Model`, and is a
    context manager.
    """
    global _VOCAB_CLS
    if _VOCAB_CLS is None:
        _VOCAB_CLS = _vocab_model_class()
    return _VOCAB_CLS(path)


def __getattr__(name: str):  # VocabModel, created lazily (imports llama_cpp)
    if name == "VocabModel":
        global _VOCAB_CLS
        if _VOCAB_CLS is None:
            _VOCAB_CLS = _vocab_model_class()
        return _VOCAB_CLS
    raise AttributeError(name)


# ---------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------


def learn_tokens(cache: NgramCache, tokens: Sequence[int], start: int = 0) -> None:
    """Count in ``cache`` the n-grams (sizes 1..4) of ``tokens`` that end at
    positions ``>= start`` (``start=0``: all of them, as ``llama-lookup``'s
    context cache holds at exit)."""
    n = len(tokens)
    if n - start > 0:
        cache.update(tokens, NGRAM_MIN, NGRAM_MAX, n - start)


class Learner:
    """Remembers the last sequences learned, to tell what is new in the next.

    >>> lr = Learner()
    >>> lr.new_from([1, 2, 3])          # a new conversation: all of it
    0
    >>> lr.new_from([1, 2, 3, 4, 5])    # the same conversation, one turn on
    3
    >>> lr.new_from([1, 2, 9])          # a regenerated reply
    2
    """

    def __init__(self, keep: int = _RECENT):
        self.keep = keep
        self._recent: list[list[int]] = []

    def new_from(self, tokens: Sequence[int]) -> int:
        """Index of the first position not learned yet; records ``tokens`` as learned."""
        tokens = [int(t) for t in tokens]
        best, best_i = 0, -1
        for i, seq in enumerate(self._recent):
            k = common_prefix(seq, tokens)
            if k > best:
                best, best_i = k, i
        if best_i >= 0 and best >= len(self._recent[best_i]):
            del self._recent[best_i]  # superseded by its continuation
        self._recent.append(tokens)
        del self._recent[:-self.keep]
        return best

    def clear(self) -> None:
        self._recent.clear()


# ---------------------------------------------------------------------------
# Results and information
# ---------------------------------------------------------------------------


@dataclass
class CacheInfo:
    """One cache of a store (what the settings pane shows)."""

    path: str
    exists: bool
    file_bytes: int          #: size of the file on disk (0 when missing)
    ngrams: int              #: n-grams held in memory
    entries: int             #: (n-gram, token) pairs held in memory
    memory_bytes: int        #: its size as a file (20 B per n-gram + 8 B per entry)
    explicit: bool = False   #: given by --lookup-cache-* rather than the folder


@dataclass
class SaveResult:
    path: str
    skipped: bool = False          #: nothing new to save
    file_bytes: int = 0
    ngrams: int = 0
    entries: int = 0
    added_entries: int = 0         #: learned since the previous save (delta entries)
    pruned_entries: int = 0
    merged_other: bool = False     #: the file had changed on disk (another process) and was merged
    warnings: list[str] = field(default_factory=list)


@dataclass
class FolderInfo:
    """A cache folder, for ``lookup info``."""

    path: str
    fingerprint: str | None
    n_vocab: int | None
    models: list[dict]
    files: dict          #: name -> {"bytes", "ngrams", "entries", "error"}
    corrupt: list[str]   #: names of files moved aside


@dataclass
class BuildResult:
    path: str | None
    files: int
    tokens: int
    ngrams: int
    entries: int
    file_bytes: int
    seconds: float


# ---------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------


class LookupStore:
    """The static and dynamic lookup caches of one tokenizer (see the module doc).

    Typical use::

        store = LookupStore.for_model(engine.model)          # loads both files
        for w in store.warnings: show(w)
        engine.set_spec(spec, resources=store.resources())    # ngram-cache drafts from them
        ... reply = engine.run(prompt)
        store.learn(prompt + reply.tokens)                    # at the end of each reply
        store.save_async()                                    # or store.save() in a worker
        ...
        store.close()                                         # final save

    Thread safety: :meth:`learn`, :meth:`save`, :meth:`clear_dynamic`,
    :meth:`build_static` and :meth:`info` may be called from different
    threads. Drafting reads :attr:`dynamic` without a lock, so call
    :meth:`learn` when no generation is running (the end of a reply);
    :meth:`save` never mutates the cache in place (it swaps contents).
    """

    def __init__(self, folder: str | os.PathLike, *, static_path: str | os.PathLike | None = None,
                 dynamic_path: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 model=None, fingerprint: str | None = None, lock_timeout: float = 60.0):
        self.folder = Path(folder)
        self.static_explicit = bool(static_path)
        self.dynamic_explicit = bool(dynamic_path)
        self.static_path = Path(static_path) if static_path else self.folder / STATIC_NAME
        self.dynamic_path = Path(dynamic_path) if dynamic_path else self.folder / DYNAMIC_NAME
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = int(max_bytes)
        self.model = model
        self.fingerprint = fingerprint
        self.lock_timeout = lock_timeout
        #: the caches the speculator drafts from (shared objects; contents swapped, never rebound)
        self.static = NgramCache()
        self.dynamic = NgramCache()
        #: what this process learned since its last successful save
        self.delta = NgramCache()
        #: warnings from loading and saving (damaged files moved aside, ...)
        self.warnings: list[str] = []
        self._learner = Learner()
        self._lock = threading.RLock()       # in-memory state
        self._io_lock = threading.Lock()     # one save / build / clear at a time in this process
        #: (sig, digest) of the dynamic file for which dynamic == file + delta holds (None: unknown)
        self._disk_state = None
        self.loaded = False

    # -- construction ------------------------------------------------------------
    @classmethod
    def for_model(cls, model, *, static_path=None, dynamic_path=None, max_bytes: int = DEFAULT_MAX_BYTES,
                  root: str | os.PathLike | None = None, load: bool = True, **kw) -> "LookupStore":
        """The store of ``model``'s tokenizer (folder created, model recorded in meta.json), loaded."""
        fp = tokenizer_fingerprint(model, root)
        folder = folder_for_fingerprint(fp, root)
        store = cls(folder, static_path=static_path, dynamic_path=dynamic_path, max_bytes=max_bytes,
                    model=model, fingerprint=fp, **kw)
        with contextlib.suppress(OSError, LockTimeout):
            store._record_model(model)
        if load:
            store.load()
        return store

    def _lock_path(self) -> Path:
        if self.dynamic_explicit:
            return self.dynamic_path.with_name(self.dynamic_path.name + ".lock")
        return self.folder / LOCK_NAME

    def _file_lock(self) -> FileLock:
        return FileLock(self._lock_path(), timeout=self.lock_timeout)

    def _record_model(self, model) -> None:
        """Note the model in meta.json (name, path, description, last seen)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = os.path.realpath(getattr(model, "path", "") or "")
        with FileLock(self.folder / LOCK_NAME, timeout=5.0):
            meta = read_meta(self.folder)
            models = meta.setdefault("models", {})
            now = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
            entry = models.get(path)
            if entry is not None and entry.get("last_seen") == now and meta.get("fingerprint") == self.fingerprint:
                return
            desc = ""
            with contextlib.suppress(Exception):
                desc = model.meta("general.name") or model.description() or ""
            models[path] = {"name": os.path.basename(path), "description": desc or (entry or {}).get("description", ""),
                            "first_seen": (entry or {}).get("first_seen", now), "last_seen": now}
            meta["fingerprint"] = self.fingerprint
            meta["n_vocab"] = int(getattr(model, "n_vocab", 0) or 0)
            with contextlib.suppress(Exception):
                meta["vocab_type"] = int(model.info.vocab_type)
            atomic_write_text(self.folder / META_NAME, json.dumps(meta, indent=1, sort_keys=True))

    # -- loading ---------------------------------------------------------------
    @property
    def n_vocab(self) -> int | None:
        """The model's vocabulary size: loaded caches must name no token id outside
        ``0..n_vocab-1`` (None without a model: ids are not checked)."""
        n = getattr(self.model, "n_vocab", None)
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def load(self) -> list[str]:
        """(Re)read both files; returns the warnings of this load.

        Anything learned and not yet saved is kept (merged on top).
        Raises :class:`LookupCacheError` for a missing explicit static file and
        for an explicit file that is not a usable cache for this model (left as it is).
        """
        warnings: list[str] = []
        if not self.dynamic_explicit or not self.static_explicit:
            self.folder.mkdir(parents=True, exist_ok=True)
        with self._io_lock, self._file_lock():
            _cleanup_tmp(self.dynamic_path.parent, [self.dynamic_path.name])
            n_vocab = self.n_vocab
            static = _read_cache(self.static_path, "static", self.static_explicit, warnings, n_vocab)
            dynamic, state = _read_cache_state(self.dynamic_path, "dynamic", self.dynamic_explicit, warnings,
                                               n_vocab)
            with self._lock:
                self.static.replace_contents(static)
                dynamic.merge(self.delta)
                self.dynamic.replace_contents(dynamic)
                self._disk_state = state
                self.warnings.extend(warnings)
                self.loaded = True
        return warnings

    def resources(self) -> dict:
        """What :meth:`speculators.engine.Engine.set_spec` takes for ngram-cache."""
        return {"lookup_static": self.static, "lookup_dynamic": self.dynamic}

    # -- learning ----------------------------------------------------------------
    def learn(self, tokens: Sequence[int]) -> int:
        """Learn a conversation's tokens (prompt + reply) after a reply; see the module doc.

        Returns the number of new token positions counted. Call it when no
        generation is running: the speculator reads :attr:`dynamic`.
        """
        with self._lock:
            start = self._learner.new_from(tokens)
            n_new = len(tokens) - start
            if n_new > 0:
                learn_tokens(self.dynamic, tokens, start)
                learn_tokens(self.delta, tokens, start)
            return max(0, n_new)

    @property
    def pending_entries(self) -> int:
        """Entries learned and not saved yet."""
        with self._lock:
            return self.delta.n_entries

    # -- saving ------------------------------------------------------------------
    def save(self) -> SaveResult:
        """Write the dynamic cache (merged with what other processes wrote), atomically.

        Blocking (up to the lock timeout plus a load of the file); call it
        from a worker thread in a UI. On failure nothing learned is lost
        (it stays pending for the next save) and :class:`LookupStoreError`
        is raised.
        """
        path = self.dynamic_path
        with self._io_lock:
            with self._lock:
                if len(self.delta) == 0:
                    return SaveResult(os.fspath(path), skipped=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with self._file_lock():
                    return self._save_locked()
            except LookupStoreError:
                raise
            except LookupCacheError as e:
                raise LookupStoreError(f"cannot save the dynamic lookup cache: {e}") from e
            except OSError as e:
                raise LookupStoreError(f"cannot save the dynamic lookup cache {path}: "
                                       f"{e.strerror or e}") from e

    def _save_locked(self) -> SaveResult:
        path = self.dynamic_path
        warnings: list[str] = []
        fast = _still(path, self._disk_state)
        with self._lock:
            if fast:
                # dynamic == file + delta: write it (pruned if too big)
                pending = self.delta
                self.delta = NgramCache()
                added = pending.n_entries
                out, pruned = prune_cache(self.dynamic, self.max_bytes)
                data = out.to_bytes("insertion")
                n_ngrams, n_entries = len(out), out.n_entries
        if fast:
            try:
                atomic_write_bytes(path, data)
            except BaseException:
                with self._lock:
                    pending.merge(self.delta)
                    self.delta = pending
                raise
            new_state = (_sig(path), _digest(data))
            with self._lock:
                if pruned:
                    out.merge(self.delta)
                    self.dynamic.replace_contents(out)
                self._disk_state = new_state
            return SaveResult(os.fspath(path), file_bytes=len(data), ngrams=n_ngrams, entries=n_entries,
                              added_entries=added, pruned_entries=pruned)
        # the file changed under us: read it, add our delta, write
        disk = _read_cache(path, "dynamic", self.dynamic_explicit, warnings, self.n_vocab, saving=True)
        with self._lock:
            pending = self.delta
            self.delta = NgramCache()
        added = pending.n_entries
        try:
            disk.merge(pending)
            disk, pruned = prune_cache(disk, self.max_bytes)
            data = disk.to_bytes("insertion")
            atomic_write_bytes(path, data)
        except BaseException:
            with self._lock:
                pending.merge(self.delta)
                self.delta = pending
            raise
        new_state = (_sig(path), _digest(data))
        n_ngrams, n_entries = len(disk), disk.n_entries
        with self._lock:
            disk.merge(self.delta)
            self.dynamic.replace_contents(disk)
            self._disk_state = new_state
            self.warnings.extend(warnings)
        return SaveResult(os.fspath(path), file_bytes=len(data), ngrams=n_ngrams, entries=n_entries,
                          added_entries=added, pruned_entries=pruned, merged_other=True, warnings=warnings)

    def save_async(self, on_done: Callable[[SaveResult | BaseException], None] | None = None) -> threading.Thread:
        """:meth:`save` in a new (non-daemon) thread; ``on_done`` gets the result or the exception."""
        def work():
            try:
                r: SaveResult | BaseException = self.save()
            except BaseException as e:  # noqa: BLE001 - handed to the callback
                log.warning("%s", e)
                r = e
            if on_done is not None:
                on_done(r)
        t = threading.Thread(target=work, name="draftlight-lookup-save")
        t.start()
        return t

    def close(self) -> SaveResult | None:
        """Save what is pending (on exit)."""
        if self.pending_entries:
            return self.save()
        return None

    # -- the settings pane --------------------------------------------------------
    def info(self) -> dict[str, CacheInfo]:
        """``{"static": CacheInfo, "dynamic": CacheInfo}``: sizes and entry counts."""
        out = {}
        with self._lock:
            for kind, cache, p, explicit in (("static", self.static, self.static_path, self.static_explicit),
                                             ("dynamic", self.dynamic, self.dynamic_path, self.dynamic_explicit)):
                try:
                    fb = os.path.getsize(p)
                    exists = True
                except OSError:
                    fb, exists = 0, False
                n_entries = cache.n_entries
                out[kind] = CacheInfo(os.fspath(p), exists, fb, len(cache), n_entries,
                                      4 * (NGRAM_MAX + 1) * len(cache) + 8 * n_entries, explicit)
        return out

    @staticmethod
    def contribution(chain_or_engine) -> dict[str, dict[str, int]]:
        """Drafted / accepted tokens per cache of the running ngram-cache speculator.

        ``{"context": {"drafted": d, "accepted": a}, "dynamic": ..., "static": ...}``,
        counted since the chain was built (``Engine.set_spec``); all zero
        when ngram-cache is not in the chain.
        """
        chain = getattr(chain_or_engine, "chain", chain_or_engine)
        out = {name: {"drafted": 0, "accepted": 0} for name in SOURCE_NAMES}
        for s in getattr(chain, "speculators", []) or []:
            if isinstance(s, NgramCacheSpeculator):
                for name in SOURCE_NAMES:
                    out[name]["drafted"] += s.source_drafted.get(name, 0)
                    out[name]["accepted"] += s.source_accepted.get(name, 0)
        return out

    def clear_dynamic(self) -> None:
        """Forget the dynamic cache: the file is removed, memory and pending emptied."""
        with self._io_lock:
            with self._file_lock():
                try:
                    os.unlink(self.dynamic_path)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise LookupStoreError(f"cannot remove {self.dynamic_path}: {e.strerror or e}") from e
                with self._lock:
                    self.dynamic.clear()
                    self.delta = NgramCache()
                    self._disk_state = (_MISSING, None)

    def build_static(self, files: Sequence[str | os.PathLike], progress: Callable[[int, int, str], None] | None = None,
                     cancel: Callable[[], bool] | None = None, model=None) -> BuildResult:
        """Build the static cache from text files and install it (file + memory).

        ``progress(done_bytes, total_bytes, file_name)`` is called as text is
        read; ``cancel()`` returning True stops it with :class:`BuildCancelled`
        and nothing is written. The running speculator drafts from the new
        static cache from its next draft on.
        """
        model = model or self.model
        if model is None:
            raise LookupStoreError("building a static cache needs the model's vocabulary")
        t0 = time.monotonic()
        cache, n_tokens = build_static_cache(model, files, progress, cancel)
        data = cache.to_bytes("stl")
        if cancel is not None and cancel():
            raise BuildCancelled()
        with self._io_lock, self._file_lock():
            atomic_write_bytes(self.static_path, data)
        n_ngrams, n_entries = len(cache), cache.n_entries
        with self._lock:
            self.static.replace_contents(cache)
        return BuildResult(os.fspath(self.static_path), len(files), n_tokens, n_ngrams, n_entries, len(data),
                           time.monotonic() - t0)


# ---------------------------------------------------------------------------
# Static caches (lookup-create) and simulation (lookup-stats)
# ---------------------------------------------------------------------------

#: text is tokenized in pieces of about this many characters (cut at a
#: line break) so that progress shows and cancel works on big files
_CHUNK_CHARS = 4 << 20


def _chunks(text: str, size: int = _CHUNK_CHARS) -> Iterable[str]:
    i, n = 0, len(text)
    while i < n:
        j = min(n, i + size)
        if j < n:
            k = text.rfind("\n", i, j)
            if k > i:
                j = k + 1
        yield text[i:j]
        i = j


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _hex2(a: int, b: int) -> int | None:
    """``strtol`` of the two characters ``a b`` in base 16 when it reads both (leading white
    space or a sign allowed), else None."""
    if b not in _HEX:
        return None
    if a in _HEX:
        return int(bytes((a, b)), 16)
    if a in b" \t\n\v\f\r+":
        return int(bytes((b,)), 16)
    if a == ord("-"):
        return -int(bytes((b,)), 16)
    return None


def process_escapes(data: bytes) -> bytes:
    r"""llama.cpp's escape processing of a prompt (``string_process_escapes``, on by default:
    ``--escape``): ``\n``, ``\r``, ``\t``, ``\'``, ``\"``, ``\\`` and ``\xHH`` become what they
    name; any other backslash stays as it is.

    >>> process_escapes(rb'a\nb \"q\" \\n \x41\x4 \q \\')
    b'a\nb "q" \\n A\\x4 \\q \\'
    >>> process_escapes(rb'\x 9\x-1\xg1')
    b'\t\xff\\xg1'
    """
    if b"\\" not in data:
        return data
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if c != 0x5C or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = data[i + 1]
        rep = _ESCAPES.get(e)
        val = _hex2(data[i + 2], data[i + 3]) if rep is None and e == ord("x") and i + 3 < n else None
        if rep is not None:
            out += rep
            i += 2
        elif val is not None:
            out.append(val & 0xFF)   # as C's char(strtol(...))
            i += 4
        else:
            out += data[i:i + 2]
            i += 2
    return bytes(out)


def read_prompt_text(path: str | os.PathLike) -> str:
    r"""A text file as llama.cpp's ``-f``/``--file`` reads a prompt: the bytes as they are
    (no newline translation), less one trailing ``\n`` (``common/arg.cpp`` pops it), then with
    its escapes processed (:func:`process_escapes`), as llama.cpp's tools do by default.

    ``llama-lookup-create -f`` and ``llama-lookup-stats -f`` read their corpus this way,
    so counting the final newline would add one n-gram occurrence that they do not have,
    and a corpus that holds a written ``\n`` (a backslash and an n) would give other n-grams.
    """
    data = Path(path).read_bytes()
    if data.endswith(b"\n"):
        data = data[:-1]
    return process_escapes(data).decode("utf-8", "replace")


def build_static_cache(model, files: Sequence[str | os.PathLike],
                       progress: Callable[[int, int, str], None] | None = None,
                       cancel: Callable[[], bool] | None = None) -> tuple[NgramCache, int]:
    """``llama-lookup-create`` over several files: (cache, tokens read).

    Each file is tokenized as lookup-create tokenizes its prompt (BOS added
    when the model adds one, special tokens parsed) and its 2-grams
    (``LLAMA_NGRAM_STATIC``) counted; n-grams do not span files. Each file is read
    as ``-f`` reads it (:func:`read_prompt_text`: one trailing newline dropped). Files over
    4 Mi characters are tokenized in pieces cut at line breaks (the only
    difference from one call, and only at those cuts). For a single small
    file the result, saved, is byte for byte what lookup-create writes.
    """
    files = [Path(f) for f in files]
    total = 0
    for f in files:
        total += os.path.getsize(f)
    done = 0
    cache = NgramCache()
    n_tokens = 0
    for f in files:
        if cancel is not None and cancel():
            raise BuildCancelled()
        text = read_prompt_text(f)
        carry: list[int] = []
        first = True
        fsize = os.path.getsize(f)
        n_chars = max(1, len(text))
        consumed = 0
        for piece in _chunks(text):
            if cancel is not None and cancel():
                raise BuildCancelled()
            toks = model.tokenize(piece, add_special=first, parse_special=True)
            first = False
            n_tokens += len(toks)
            seq = carry + toks
            if toks:
                cache.update(seq, NGRAM_STATIC, NGRAM_STATIC, len(toks))
            carry = seq[-NGRAM_STATIC:]
            consumed += len(piece)
            if progress is not None:
                progress(done + fsize * consumed // n_chars, total, f.name)
        done += fsize
        if progress is not None:
            progress(done, total, f.name)
    return cache, n_tokens


@dataclass
class SimStats:
    """What ``lookup stats`` reports (llama-lookup-stats' numbers)."""

    n_draft: int
    n_ctx: int
    n_input: int
    n_predict: int
    n_drafted: int
    n_accept: int
    t_draft_ms: float

    @property
    def accept_rate(self) -> float | None:
        return self.n_accept / self.n_drafted if self.n_drafted else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accept_rate"] = self.accept_rate
        return d


def simulate_drafting(tokens: Sequence[int], static: NgramCache | None = None, dynamic: NgramCache | None = None,
                      n_draft: int = N_DRAFT, n_ctx: int = 4096, include_tail: bool = True,
                      progress: Callable[[int, int, str], None] | None = None) -> SimStats:
    """``llama-lookup-stats``: drafting simulated over a known text.

    The text is cut into chunks of ``n_ctx`` tokens; each is "generated"
    token by token from its first token, drafting with
    :func:`~speculators.ngram_cache.ngram_cache_draft` (context, dynamic and
    static caches) and accepting the drafted tokens that match the text;
    after each chunk the context cache is merged into the dynamic cache and
    cleared. ``dynamic`` itself is not changed (a copy is used).

    llama.cpp skips the last, partial chunk (and so any text shorter than
    its context); ``include_tail=True`` (the default here) simulates it too.

    >>> simulate_drafting([1, 2, 3] * 4, n_ctx=64).n_accept
    6
    """
    tokens = [int(t) for t in tokens]
    static = static if static is not None else NgramCache()
    dyn = dynamic.copy() if dynamic is not None else NgramCache()
    n_input = len(tokens)
    n_drafted = n_accept = n_predict = 0
    t_draft = 0.0
    i_start = 0
    while True:
        if include_tail:
            if i_start >= n_input:
                break
        elif not i_start + n_ctx < n_input:
            break
        inp = tokens[i_start:i_start + n_ctx]
        L = len(inp)
        ctx = NgramCache()
        pseudo = [inp[0]]
        while len(pseudo) < L:
            t0 = time.perf_counter()
            draft = ngram_cache_draft(pseudo, [pseudo[-1]], n_draft, NGRAM_MIN, NGRAM_MAX, ctx, dyn, static)
            t_draft += time.perf_counter() - t0
            n_drafted += len(draft) - 1
            for j in range(1, len(draft)):
                if len(pseudo) >= L or inp[len(pseudo)] != draft[j]:
                    break
                n_accept += 1
                pseudo.append(inp[len(pseudo)])
                ctx.update(pseudo, NGRAM_MIN, NGRAM_MAX, 1)
            if len(pseudo) < L:
                pseudo.append(inp[len(pseudo)])
                ctx.update(pseudo, NGRAM_MIN, NGRAM_MAX, 1)
        n_predict += L
        dyn.merge(ctx)
        i_start += n_ctx
        if progress is not None:
            progress(min(i_start, n_input), n_input, "simulate")
    return SimStats(n_draft, n_ctx, n_input, n_predict, n_drafted, n_accept, t_draft * 1000)


# ---------------------------------------------------------------------------
# Folders (lookup info / clear)
# ---------------------------------------------------------------------------


def read_meta(folder: str | os.PathLike) -> dict:
    try:
        meta = json.loads((Path(folder) / META_NAME).read_text())
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


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
