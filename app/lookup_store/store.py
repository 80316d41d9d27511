"""The lookup store itself: loading, learning, merging, pruning and saving the caches.

Holds :class:`LookupStore`, the :class:`Learner` that tells what is new in a
conversation, and the functions that judge a file on load (used, moved aside
or kept unread), compare it with what was last read or written, and prune a
cache to its size cap (the rules are in the package doc, :mod:`app.lookup_store`).
Touches the files of one cache folder (and explicit cache paths) only under the
folder's lock; never a file the person named except to read it or save the
dynamic cache to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from speculators.base import common_prefix
from speculators.ngram_cache import (
    NGRAM_MAX, NGRAM_MIN, SOURCE_NAMES, CorruptCacheError, LookupCacheError, LookupFileRefused, NgramCache,
    NgramCacheSpeculator, check_vocab, read_lookup_file,
)

from ..fileutil import atomic_write_bytes
from .corpus import build_static_cache
from .errors import BuildCancelled, LockTimeout, LookupStoreError
from .fingerprint import folder_for_fingerprint, tokenizer_fingerprint
from .layout import DYNAMIC_NAME, LOCK_NAME, STATIC_NAME, record_model
from .lock import FileLock
from .results import BuildResult, CacheInfo, SaveResult

log = logging.getLogger("draftlight.lookup")

#: default size cap of the dynamic cache file
DEFAULT_MAX_BYTES = 32 << 20
#: pruning goes down to this fraction of the cap (so that not every save prunes)
PRUNE_TO = 0.9
#: a temp file of an interrupted save older than this is removed
_STALE_TMP_S = 3600.0
#: how many learned sequences are remembered to find what is new
_RECENT = 8


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
        """Note the model in meta.json (:func:`~app.lookup_store.layout.record_model`)."""
        record_model(self.folder, self.fingerprint, model)

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

    def _put_back(self, pending: NgramCache) -> None:
        """A save that failed gives its entries back to the delta (with what was learned meanwhile),
        to be written by the next save."""
        with self._lock:
            pending.merge(self.delta)
            self.delta = pending

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
                self._put_back(pending)
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
            self._put_back(pending)
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
