"""The ``ngram-cache`` speculator and llama.cpp's lookup-cache files.

This mirrors three pieces of llama.cpp:

* ``common/ngram-cache.{h,cpp}``: the n-gram cache (an n-gram of up to
  four tokens, padded with -1, mapped to the counts of the tokens seen
  after it), its update, merge, save and load, and the drafting rule
  ``common_ngram_cache_draft`` with its lax/strict thresholds;
* ``common_speculative_impl_ngram_cache`` of ``common/speculative.cpp``:
  a context cache grown from the conversation, plus an optional *dynamic*
  cache (earlier generations) and *static* cache (a text corpus, built by
  ``llama-lookup-create``), drafting at most 8 tokens;
* the lookup-cache file format, read and written byte for byte.

A worked example. In ``1 2 3 1 2 3 1`` the 4-gram ``(1, 2, 3, 1)`` was
followed by ``2`` once, which is enough for a 4-gram under the lax
(context) thresholds; then ``(2, 3, 1, 2)`` gives ``3``, and so on:

>>> ctx = NgramCache()
>>> inp = [1, 2, 3, 1, 2, 3, 1]
>>> ctx.update(inp, NGRAM_MIN, NGRAM_MAX, len(inp))
>>> ctx[(2, 3, 1)]
{2: 1}
>>> ngram_cache_draft(inp, [inp[-1]], 3, NGRAM_MIN, NGRAM_MAX, ctx, NgramCache(), NgramCache())
[1, 2, 3, 1]

The draft list starts with the last sampled token (as in llama.cpp) and
grows by the drafted tokens: ``2 3 1``.

Tie-breaking. llama.cpp keeps counts in ``std::unordered_map`` and, when
two candidates score the same, the one met first while iterating wins; it
also saves entries in iteration order. The C++ standard leaves that order
unspecified; this module reproduces the order of GNU libstdc++ (what
llama.cpp gets when built with GCC, checked against GCC 12), computed
from the order in which keys were first inserted. See :func:`stl_order`.
"""

from __future__ import annotations

import codecs
import itertools
import os
import stat
import sys
import time
from array import array
from typing import Callable, Hashable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .base import DraftRequest, Speculator
from .chain import register
from .descriptor import NGRAM, Flag, Nothing, SpecDescriptor, Setting, declare
from .params import SpecParams
from .types import SpecType

__all__ = [
    "CorruptCacheError", "NotALookupCacheError", "VocabMismatchError", "LookupFileRefused",
    "LookupCacheError", "NgramCache", "NgramCacheSpeculator",
    "LLAMA_TOKEN_NULL", "NGRAM_MIN", "NGRAM_MAX", "NGRAM_STATIC", "N_DRAFT",
    "DRAFT_MIN_SAMPLE_SIZE_LAX", "DRAFT_MIN_PERCENT_LAX",
    "DRAFT_MIN_SAMPLE_SIZE_STRICT", "DRAFT_MIN_PERCENT_STRICT",
    "ngram_cache_draft", "ngram_key", "stl_order", "load_lookup_cache", "SOURCE_NAMES",
    "MAX_FILE_BYTES", "LOAD_MEMORY_FACTOR", "load_limit", "check_lookup_head", "read_lookup_file",
    "vocab_violations", "check_vocab",
]

#: ``LLAMA_TOKEN_NULL``: the padding of n-grams shorter than four tokens.
LLAMA_TOKEN_NULL = -1
#: ``LLAMA_NGRAM_MIN`` / ``LLAMA_NGRAM_MAX``: n-gram sizes of the context
#: and dynamic caches. ``LLAMA_NGRAM_MAX`` is also the stored n-gram width.
NGRAM_MIN = 1
NGRAM_MAX = 4
#: ``LLAMA_NGRAM_STATIC``: the n-gram size of static caches.
NGRAM_STATIC = 2
#: Draft length of the speculator (``create_state_ngram_cache``).
N_DRAFT = 8

# If the sample size or the share of the best candidate is below these,
# the n-gram is skipped (index: position in the list of n-gram sizes,
# i.e. n-gram size - ngram_min). Context cache: lax; dynamic: strict;
# static (2-grams, index NGRAM_STATIC - 1): lax.
DRAFT_MIN_SAMPLE_SIZE_LAX = (2, 2, 1, 1)
DRAFT_MIN_PERCENT_LAX = (66, 50, 50, 50)
DRAFT_MIN_SAMPLE_SIZE_STRICT = (4, 3, 2, 2)
DRAFT_MIN_PERCENT_STRICT = (75, 66, 66, 66)

Ngram = tuple  # four ints, padded with LLAMA_TOKEN_NULL

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
#: ``common_token_hash_function``'s multiplier (Fibonacci hashing).
_FIB = 11400714819323198485
_PAD = tuple((LLAMA_TOKEN_NULL,) * (NGRAM_MAX - n) for n in range(NGRAM_MAX + 1))
#: int32 words of one record header in a file: 4 tokens + the entry count.
_HEADER_WORDS = NGRAM_MAX + 1


class CorruptCacheError(ValueError):
    """A lookup-cache file (or byte string) is not a valid cache."""


class NotALookupCacheError(CorruptCacheError):
    """The file is plainly not a lookup cache (text, a GGUF model, a size no cache can have),
    as told from its size and first bytes before it is read whole."""


class VocabMismatchError(CorruptCacheError):
    """A valid cache holding token ids outside the model's vocabulary: built for another model
    (or damaged). Such ids must never reach llama.cpp, which aborts on them.

    ``n_bad`` entries (n-gram, token) hold such an id; ``n_vocab`` is the vocabulary's size.
    """

    def __init__(self, message: str, n_bad: int, n_vocab: int):
        super().__init__(message)
        self.n_bad = n_bad
        self.n_vocab = n_vocab


class LookupFileRefused(CorruptCacheError):
    """A lookup file that is not read at all: not a regular file (a folder, a device, a pipe),
    or too big to load on this machine (:func:`load_limit`).

    Nothing is known about its contents, so it is never "damaged": whoever moves damaged
    caches aside must catch this one first and leave the file where it is.
    """


class LookupCacheError(ValueError):
    """An explicitly configured lookup cache cannot be read.

    ``path`` is the file, ``kind`` ``"static"`` or ``"dynamic"``; the
    original exception is chained as ``__cause__``.
    """

    def __init__(self, path: str, kind: str, reason: str):
        super().__init__(f"failed to read {kind} lookup cache {path!r}: {reason}")
        self.path = path
        self.kind = kind
        self.reason = reason


def _wrap32(x: int) -> int:
    """``x`` as a two's-complement int32, as C++ ``int`` arithmetic wraps in practice."""
    if _INT32_MIN <= x <= _INT32_MAX:
        return x
    return ((x - _INT32_MIN) & _U32) + _INT32_MIN


def ngram_key(tokens: Iterable[int]) -> Ngram:
    """The stored form of an n-gram: the first four tokens, padded with -1.

    >>> ngram_key([7, 8])
    (7, 8, -1, -1)
    """
    t = tuple(int(x) for x in tokens)[:NGRAM_MAX]
    return t + _PAD[len(t)]


# ---------------------------------------------------------------------------
# libstdc++ std::unordered_map iteration order
# ---------------------------------------------------------------------------

#: Bucket counts a default-constructed libstdc++ ``unordered_map`` goes
#: through as single elements are inserted: 13 at the first insertion,
#: then ``_Prime_rehash_policy::_M_next_bkt(2 * n)`` each time the element
#: count would exceed the bucket count (max load factor 1). Read off GCC
#: 12's libstdc++.
_STL_BUCKETS = (
    13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229,
    172933, 351061, 712697, 1447153, 2938679, 5967347, 12117689, 24607243,
    49969847, 101473717, 206062531, 418451333, 849749479, 1725587117,
    3504151727, 8589934583,
)


def _token_hash(token: int) -> int:
    """``std::hash<int>``: the value, converted to ``size_t``."""
    return token & _U64


def _ngram_hash(ngram: Ngram) -> int:
    """``common_ngram_hash_function``: XOR of ``token * 11400714819323198485``."""
    h = 0
    for t in ngram:
        h ^= ((t & _U64) * _FIB) & _U64
    return h


def stl_order(keys: Sequence[Hashable], hash_fn: Callable[[Hashable], int] = _token_hash) -> list:
    """Iteration order of a libstdc++ ``unordered_map`` filled with ``keys``.

    ``keys`` are distinct and listed in the order they were first inserted
    into a default-constructed map (nothing erased). libstdc++ keeps one
    singly linked list: a key whose bucket is empty goes to the front of
    the list, any other key to the front of its bucket's run; a rehash
    walks the old list and re-inserts every node by the same rule. So
    each stretch between rehashes amounts to inserting (old order + new
    keys) into an empty table, where the result lists buckets by when they
    were first used, latest first, and each bucket's keys latest first.

    >>> stl_order([1, 2, 3])         # three buckets of 13: latest first
    [3, 2, 1]
    >>> stl_order([1, 14, 2])        # 14 shares bucket 1 with 1
    [2, 14, 1]
    """
    n = len(keys)
    if n <= 1:
        return list(keys)
    order: list[tuple[int, Hashable]] = []
    start = 0
    for nb in _STL_BUCKETS:
        end = n if n < nb else nb
        groups: dict[int, list] = {}
        for item in order:
            b = item[0] % nb
            g = groups.get(b)
            if g is None:
                groups[b] = [item]
            else:
                g.append(item)
        for k in keys[start:end]:
            item = (hash_fn(k), k)
            b = item[0] % nb
            g = groups.get(b)
            if g is None:
                groups[b] = [item]
            else:
                g.append(item)
        order = [item for g in reversed(groups.values()) for item in reversed(g)]
        start = end
        if end == n:
            break
    else:  # pragma: no cover - more keys than any machine can hold
        raise OverflowError("too many keys for the libstdc++ bucket table")
    return [k for _, k in order]


def _stl_perm_np(codes: "np.ndarray") -> "np.ndarray":
    """:func:`stl_order` with numpy, for many keys: hash codes (uint64, in
    insertion order) -> insertion indices in iteration order."""
    n = len(codes)
    order = np.empty(0, dtype=np.int64)
    start = 0
    for nb in _STL_BUCKETS:
        end = n if n < nb else nb
        seq = np.concatenate([order, np.arange(start, end, dtype=np.int64)])
        buckets = codes[seq] % np.uint64(nb)
        # where each bucket was first used, latest first; within, latest first
        _, first, inverse = np.unique(buckets, return_index=True, return_inverse=True)
        m = len(seq)
        rank = first[inverse.reshape(-1)].astype(np.int64) * m + np.arange(m, dtype=np.int64)
        order = seq[np.argsort(-rank)]
        start = end
        if end == n:
            return order
    raise OverflowError("too many keys for the libstdc++ bucket table")  # pragma: no cover


def _part_order(part: Mapping[int, int]) -> list[int]:
    """:func:`stl_order` of a part's tokens, with the common small cases fast."""
    n = len(part)
    if n <= 2:
        return list(reversed(part))  # one bucket or two: latest first either way
    if n <= _STL_BUCKETS[0]:  # no rehash after the first: 13 buckets
        groups: dict[int, list[int]] = {}
        for t in part:
            b = t % 13 if t >= 0 else (t & _U64) % 13
            g = groups.get(b)
            if g is None:
                groups[b] = [t]
            else:
                g.append(t)
        return [t for g in reversed(groups.values()) for t in reversed(g)]
    return stl_order(list(part), _token_hash)


# ---------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    tmp = None
    for attempt in range(100):
        cand = os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            # 0o666 & ~umask, like the C++ ofstream
            fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        tmp = cand
        break
    if tmp is None:  # pragma: no cover
        raise OSError(f"cannot create a temporary file next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable where the platform allows
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)


class NgramCache:
    """n-gram -> {following token: times seen} (``common_ngram_cache``).

    n-grams are 4-tuples padded with -1 (use :func:`ngram_key`, or index
    with a shorter tuple). Both levels remember the order in which keys
    were first inserted; that order decides llama.cpp's tie-breaks and the
    order of a saved file (see :func:`stl_order`), so it is part of the
    state, though not of equality.

    >>> c = NgramCache()
    >>> c.update([5, 6, 5, 7], 1, 2, 4)
    >>> c[(5,)], c[(6, 5)]
    ({6: 1, 7: 1}, {7: 1})
    >>> len(c), c.n_entries, c.total_count
    (4, 5, 5)
    >>> other = NgramCache()
    >>> other.add((5,), 6, 3)
    >>> c.merge(other)
    >>> c[(5,)]
    {6: 4, 7: 1}
    >>> NgramCache.from_bytes(c.to_bytes()) == c
    True
    """

    __slots__ = ("_map",)

    def __init__(self) -> None:
        self._map: dict[Ngram, dict[int, int]] = {}

    # -- building ------------------------------------------------------------
    def update(self, tokens: Sequence[int], ngram_min: int, ngram_max: int, nnew: int,
               print_progress: bool = False) -> None:
        """``common_ngram_cache_update``: count the n-grams ending in the last ``nnew`` tokens.

        For every n-gram size ``s`` in ``ngram_min..ngram_max`` and every
        position ``i`` from ``max(len(tokens) - nnew, s)`` to the end, the
        token ``tokens[i]`` is counted after the n-gram ``tokens[i-s:i]``.
        ``tokens`` may only have been appended to since the last call.
        """
        if ngram_min < 1 or ngram_max > NGRAM_MAX:
            raise ValueError(f"n-gram sizes must lie within 1..{NGRAM_MAX}, got {ngram_min}..{ngram_max}")
        inp_size = len(tokens)
        if ngram_max < ngram_min or nnew <= 0 or inp_size == 0:
            return
        # Only tokens from the earliest n-gram start onwards are read.
        lo = max(0, min(max(inp_size - nnew, s) - s for s in range(ngram_min, ngram_max + 1)))
        seq = [int(t) for t in tokens[lo:]]
        m = self._map
        n_todo = inp_size * (ngram_max - ngram_min + 1)
        n_done = 0
        t_start = time.monotonic()
        for size in range(ngram_min, ngram_max + 1):
            pad = _PAD[size]
            i_start = max(inp_size - nnew, size) - lo
            for i in range(i_start, inp_size - lo):
                key = tuple(seq[i - size:i]) + pad
                token = seq[i]
                part = m.get(key)
                if part is None:
                    m[key] = {token: 1}
                else:
                    part[token] = part.get(token, 0) + 1
                if print_progress:
                    n_done += 1
                    if n_done % 10_000_000 == 0:
                        elapsed = time.monotonic() - t_start
                        eta = int((n_todo - n_done) * elapsed / n_done)
                        print(f"common_ngram_cache_update: {n_done}/{n_todo} done, "
                              f"ETA: {eta // 60:02d}:{eta % 60:02d}", file=sys.stderr)

    def add(self, ngram: Sequence[int], token: int, count: int = 1) -> None:
        """Count ``token`` after ``ngram`` ``count`` more times (``count`` > 0)."""
        if count <= 0:
            raise ValueError("count must be positive")
        key = ngram_key(ngram)
        token = int(token)
        part = self._map.get(key)
        if part is None:
            self._map[key] = {token: int(count)}
        else:
            part[token] = part.get(token, 0) + int(count)

    def merge(self, other: "NgramCache") -> None:
        """``common_ngram_cache_merge``: add ``other``'s counts to this cache.

        ``other`` is walked in llama.cpp's iteration order, so new keys
        enter this cache in the order the C++ would insert them.
        """
        m = self._map
        for key in other._stl_keys():
            part = other._map[key]
            mine = m.get(key)
            if mine is None:
                m[key] = dict(part)  # a copy keeps the insertion order
                continue
            tokens = _part_order(part) if len(part) > 1 else part
            for token in tokens:
                mine[token] = mine.get(token, 0) + part[token]

    def copy(self) -> "NgramCache":
        c = NgramCache()
        c._map = {k: dict(v) for k, v in self._map.items()}
        return c

    def clear(self) -> None:
        """Forget everything.

        The contents are swapped for a fresh dict rather than emptied in
        place, so a draft running in another thread keeps reading the old
        contents undisturbed.
        """
        self._map = {}

    def replace_contents(self, other: "NgramCache") -> None:
        """Take over ``other``'s contents (no copy: ``other`` must not be used after).

        Like :meth:`clear`, a swap that a concurrent draft never sees half-way;
        a speculator holding this cache drafts from the new contents from its
        next draft on.
        """
        self._map = other._map
        other._map = {}

    @property
    def file_size(self) -> int:
        """Bytes the cache takes in a lookup file: 20 per n-gram + 8 per entry."""
        return 4 * _HEADER_WORDS * len(self._map) + 8 * self.n_entries

    # -- reading ---------------------------------------------------------------
    def __len__(self) -> int:
        """Number of distinct n-grams."""
        return len(self._map)

    @property
    def n_entries(self) -> int:
        """Number of (n-gram, token) pairs."""
        return sum(len(p) for p in self._map.values())

    @property
    def total_count(self) -> int:
        """Sum of all counts: how many n-gram occurrences were recorded."""
        return sum(sum(p.values()) for p in self._map.values())

    def __contains__(self, ngram: object) -> bool:
        try:
            return ngram_key(ngram) in self._map  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False

    def __getitem__(self, ngram: Sequence[int]) -> dict[int, int]:
        """A copy of the counts after ``ngram``, or KeyError."""
        return dict(self._map[ngram_key(ngram)])

    def get(self, ngram: Sequence[int], default=None):
        part = self._map.get(ngram_key(ngram))
        return default if part is None else dict(part)

    def ngrams(self) -> Iterator[Ngram]:
        """n-grams in insertion order."""
        return iter(self._map)

    def items(self) -> Iterator[tuple[Ngram, dict[int, int]]]:
        """``(ngram, counts)`` in insertion order (the counts are copies)."""
        for k, v in self._map.items():
            yield k, dict(v)

    def entries(self) -> Iterator[tuple[Ngram, int, int]]:
        """Every ``(ngram, token, count)``, in insertion order."""
        for k, part in self._map.items():
            for t, c in part.items():
                yield k, t, c

    def to_dict(self) -> dict[Ngram, dict[int, int]]:
        return {k: dict(v) for k, v in self._map.items()}

    def __eq__(self, other: object) -> bool:
        """Same n-grams with the same counts (insertion order is ignored)."""
        if not isinstance(other, NgramCache):
            return NotImplemented
        return self._map == other._map

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NgramCache({len(self)} n-grams, {self.n_entries} entries, {self.total_count} counts)"

    def _stl_keys(self) -> list[Ngram]:
        """The n-grams in the order llama.cpp (GCC build) iterates them."""
        keys = list(self._map)
        if len(keys) < 512:
            return stl_order(keys, _ngram_hash)
        tok = np.fromiter(itertools.chain.from_iterable(keys), dtype=np.int64, count=NGRAM_MAX * len(keys))
        codes = np.bitwise_xor.reduce(tok.reshape(-1, NGRAM_MAX).astype(np.uint64) * np.uint64(_FIB), axis=1)
        return [keys[i] for i in _stl_perm_np(codes).tolist()]

    # -- files -------------------------------------------------------------------
    def to_bytes(self, order: str = "stl") -> bytes:
        """The cache in llama.cpp's lookup file format (see :meth:`save`)."""
        if order == "stl":
            keys = self._stl_keys()
        elif order == "insertion":
            keys = list(self._map)
        else:
            raise ValueError(f"order must be 'stl' or 'insertion', not {order!r}")
        words: list[int] = []
        ext = words.extend
        for key in keys:
            part = self._map[key]
            if not part:
                raise ValueError(f"n-gram {key} has no tokens")
            ext(key)
            words.append(len(part))
            tokens = _part_order(part) if order == "stl" and len(part) > 1 else part
            for t in tokens:
                c = part[t]
                if c <= 0 or c > _INT32_MAX:
                    raise ValueError(f"count {c} of token {t} after n-gram {key} does not fit a positive int32")
                words.append(t)
                words.append(c)
        return _pack_words(words)

    def save(self, path: str | os.PathLike, order: str = "stl") -> None:
        """Write the cache as llama.cpp's ``common_ngram_cache_save`` does, atomically.

        The file is a bare sequence of records, little-endian, no header::

            int32 ngram[4]      tokens, padded with -1
            int32 ntokens       > 0
            ntokens x (int32 token, int32 count > 0)

        ``order="stl"`` writes records (and tokens within a record) in the
        order a GCC build of llama.cpp iterates its maps, which gives the
        very bytes llama.cpp would write for the same history;
        ``order="insertion"`` keeps insertion order, so a loaded file is
        written back unchanged. The data goes to a temporary file in the
        same directory, is flushed and fsynced, and replaces ``path``.
        """
        atomic_write(path, self.to_bytes(order))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, source: str = "<bytes>") -> "NgramCache":
        """Parse llama.cpp's lookup format; raise :class:`CorruptCacheError` on any flaw.

        Stricter than the C++ (which asserts on non-positive counts and cut
        entries, but silently drops a trailing partial n-gram and keeps the
        first of duplicated n-grams or tokens): every byte must belong to a
        complete, valid record, and duplicates are refused. Nothing is
        returned unless the whole input is valid.
        """
        data = bytes(data)
        size = len(data)
        n_words, rem = divmod(size, 4)
        w = _unpack_words(data[: 4 * n_words])
        m: dict[Ngram, dict[int, int]] = {}
        p = 0
        while p < n_words:
            off = 4 * p
            if n_words - p < _HEADER_WORDS:
                raise CorruptCacheError(
                    f"{source}: truncated record at byte {off}: {size - off} bytes left, "
                    f"an n-gram and its token count need {4 * _HEADER_WORDS}")
            key = tuple(w[p:p + NGRAM_MAX])
            nt = w[p + NGRAM_MAX]
            if nt <= 0:
                raise CorruptCacheError(
                    f"{source}: n-gram {key} at byte {off} has a token count of {nt} (must be > 0)")
            q = p + _HEADER_WORDS
            if n_words - q < 2 * nt:
                raise CorruptCacheError(
                    f"{source}: entry cut in the middle: n-gram {key} at byte {off} declares {nt} "
                    f"tokens ({8 * nt} bytes) but only {size - 4 * q} bytes follow")
            tokens = w[q:q + 2 * nt:2]
            counts = w[q + 1:q + 2 * nt:2]
            if min(counts) <= 0:
                j = next(j for j, c in enumerate(counts) if c <= 0)
                raise CorruptCacheError(
                    f"{source}: token {tokens[j]} after n-gram {key} (byte {4 * (q + 2 * j)}) "
                    f"has a count of {counts[j]} (must be > 0)")
            part = dict(zip(tokens, counts))
            if len(part) != nt:
                raise CorruptCacheError(
                    f"{source}: n-gram {key} at byte {off} lists a token more than once")
            if key in m:
                raise CorruptCacheError(f"{source}: n-gram {key} appears twice (again at byte {off})")
            m[key] = part
            p = q + 2 * nt
        if rem:
            raise CorruptCacheError(
                f"{source}: truncated: {rem} stray bytes after the last complete record "
                f"(file size {size} is not a multiple of 4)")
        c = cls()
        c._map = m
        return c

    @classmethod
    def load(cls, path: str | os.PathLike, n_vocab: int | None = None) -> "NgramCache":
        """``common_ngram_cache_load``, validating the whole file first.

        An empty file is an empty cache. OSError if it cannot be read,
        :class:`CorruptCacheError` if it is not a valid cache: refused before it is
        read whole when its size or first bytes rule it out (:func:`read_lookup_file`),
        and, given ``n_vocab``, when it holds a token id outside ``0..n_vocab-1``
        (:func:`check_vocab`).
        """
        source = os.fspath(path)
        data, _ = read_lookup_file(source)
        cache = cls.from_bytes(data, source=source)
        if n_vocab is not None:
            check_vocab(cache, n_vocab, source)
        return cache


# ---------------------------------------------------------------------------
# Checks before and after loading a file
# ---------------------------------------------------------------------------

#: a lookup file larger than this is never loaded, whatever the memory: the file is parsed in
#: Python (~0.25 s per MiB), so 1 GiB already takes minutes
MAX_FILE_BYTES = 1 << 30
#: memory a loaded cache takes per byte of its file, with room to spare (the reading and
#: parsing peak measured about 18 bytes per byte of a file of one-entry records, the cache itself 16)
LOAD_MEMORY_FACTOR = 32
#: the first bytes of a GGUF file (a model, not a cache)
GGUF_MAGIC = b"GGUF"
#: how much of a file is read to tell what it is
_SNIFF_BYTES = 4096


def _available_memory() -> int | None:
    """Bytes of memory this process could still take, as far as can be told cheaply (None: unknown).

    Linux: ``MemAvailable`` of ``/proc/meminfo``, less where a cgroup (v2) limit leaves less;
    elsewhere the free physical pages.
    """
    avail = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as f:
            cap = f.read().strip()
        if cap != b"max":
            with open("/sys/fs/cgroup/memory.current", "rb") as f:
                used = int(f.read().strip())
            avail = min(avail, max(0, int(cap) - used))
    except (OSError, ValueError):
        pass
    return avail


def load_limit() -> int:
    """The largest lookup file loaded now: :data:`MAX_FILE_BYTES`, less where the memory
    available is less than :data:`LOAD_MEMORY_FACTOR` times that."""
    avail = _available_memory()
    if avail is None:
        return MAX_FILE_BYTES
    return min(MAX_FILE_BYTES, avail // LOAD_MEMORY_FACTOR)


def _looks_like_text(head: bytes, whole: bool) -> bool:
    """No NUL byte and valid UTF-8 (a character cut at the end of ``head`` allowed unless ``whole``)."""
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    except UnicodeDecodeError:
        return False
    return True


def _human_bytes(n: int) -> str:
    """``123 bytes``, ``4.0 KiB``, ..., ``8.0 GiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover


def check_lookup_head(head: bytes, size: int, source: str = "<file>") -> None:
    r"""Rule a file out as a lookup cache from its size and first bytes, or let it pass.

    ``head`` is the first ``min(size, 4096)`` bytes. Raises :class:`NotALookupCacheError`,
    saying what the file is where that can be told, when:

    * it begins with the GGUF magic (a model);
    * it is text: no NUL byte and valid UTF-8 (every lookup file has a NUL byte in its first four:
      the first token id is below 2**24);
    * it is larger than ``head`` (so reading it whole costs more than this look) and its size is
      not a multiple of 4 (the format is 4-byte integers), or its first record is malformed: an
      n-gram not of 1 to 4 ids >= 0 padded with -1, a token count <= 0, or more entries than the
      file holds. (A file within ``head`` is left to the full parse, as cheap and more precise.)

    A file that passes may still be damaged further on: the full parse decides.

    >>> check_lookup_head(b"", 0)                                  # empty: an empty cache
    >>> check_lookup_head(b"GGUF\x03\0\0\0", 6 << 30, "m.gguf")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.NotALookupCacheError: m.gguf: not a ... cache: it is a GGUF model file (6.0 GiB)
    >>> check_lookup_head(b"once upon a time", 16, "c.txt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.NotALookupCacheError: c.txt: not a llama.cpp lookup cache: it is text ...
    >>> one = b"\x07\0\0\0" + b"\xff" * 12 + b"\1\0\0\0" + b"\x08\0\0\0\1\0\0\0"  # (7,) -> {8: 1}
    >>> check_lookup_head(one, len(one))                # a whole file: the parse decides
    >>> check_lookup_head(one, 8 << 30)                 # plausible (its size is for the caller to judge)
    >>> check_lookup_head(one, (8 << 30) + 2, "big.bin")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.NotALookupCacheError: big.bin: ...: its size (8589934594 bytes) is not a multiple of 4 ...
    """
    def refuse(what: str) -> NotALookupCacheError:
        return NotALookupCacheError(f"{source}: not a llama.cpp lookup cache: {what}")

    if head.startswith(GGUF_MAGIC):
        raise refuse(f"it is a GGUF model file ({_human_bytes(size)})")
    if size == 0:
        return
    if _looks_like_text(head, whole=len(head) >= size):
        raise refuse("it is text (to draft from a text corpus, build a static cache from it with "
                     "'draftlight lookup create FILE')")
    if len(head) >= size:
        return
    if size % 4:
        raise refuse(f"its size ({size} bytes) is not a multiple of 4 (the format is 4-byte integers)")
    if len(head) < 4 * _HEADER_WORDS:
        raise refuse(f"only {len(head)} of its {size} bytes could be read")
    w = _unpack_words(head[:4 * _HEADER_WORDS])
    key, nt = w[:NGRAM_MAX], w[NGRAM_MAX]
    n_real = next((i for i, t in enumerate(key) if t == LLAMA_TOKEN_NULL), NGRAM_MAX)
    if n_real == 0 or any(t < 0 for t in key[:n_real]) or any(t != LLAMA_TOKEN_NULL for t in key[n_real:]):
        raise refuse(f"its first record does not begin with an n-gram (read {tuple(key)})")
    if nt <= 0 or 4 * (_HEADER_WORDS + 2 * nt) > size:
        raise refuse(f"its first record declares {nt} tokens, which a file of {size} bytes cannot hold")


def read_lookup_file(path: str | os.PathLike, max_bytes: int | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of a lookup file and its ``fstat``, read whole only once cheap checks pass.

    Before more than 4 KiB is read: it must be a regular file (a folder, a device such as
    ``/dev/zero`` or a pipe is refused with :class:`LookupFileRefused`), pass
    :func:`check_lookup_head` (else :class:`NotALookupCacheError`), and be no larger than
    ``max_bytes`` (default :func:`load_limit`; else :class:`LookupFileRefused`). So pointing a
    cache path at a multi-GB model or corpus costs one small read, never the machine's memory.
    OSError (FileNotFoundError, ...) as ``open`` raises it.
    """
    source = os.fspath(path)
    if not stat.S_ISREG(os.stat(source).st_mode):   # before open: opening a pipe would block
        raise LookupFileRefused(f"{source}: not a regular file")
    with open(source, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):             # replaced in between
            raise LookupFileRefused(f"{source}: not a regular file")
        size = st.st_size
        head = f.read(_SNIFF_BYTES)
        check_lookup_head(head, size, source)
        limit = load_limit() if max_bytes is None else max_bytes
        if size > limit:
            raise LookupFileRefused(
                f"{source}: {_human_bytes(size)} is more than a lookup cache can be loaded with here "
                f"(at most {_human_bytes(limit)}: {LOAD_MEMORY_FACTOR} bytes of memory per byte of file, "
                f"no more than {_human_bytes(MAX_FILE_BYTES)})")
        if len(head) >= size:
            return head, st
        f.seek(0)
        return f.read(), st


def vocab_violations(cache: NgramCache, n_vocab: int) -> tuple[int, int | None]:
    """(entries that name a token outside the vocabulary, one such id) of ``cache``.

    An entry (n-gram, next token) is bad when its next token is not in ``0..n_vocab-1`` or its
    n-gram is not 1 to 4 such ids padded with -1. The id given is the largest out of range (the
    smallest when all are negative); None when only the padding is wrong.

    >>> c = NgramCache()
    >>> c.add((1, 2), 3); c.add((1, 2), 70_000); c.add((9,), 4); c.add((5, 70_001), 6)
    >>> vocab_violations(c, 32_000)
    (2, 70001)
    >>> vocab_violations(c, 100_000)
    (0, None)
    """
    m = cache._map
    if not m:
        return 0, None
    keys = np.fromiter(itertools.chain.from_iterable(m), dtype=np.int64,
                       count=NGRAM_MAX * len(m)).reshape(-1, NGRAM_MAX)
    sizes = np.fromiter(map(len, m.values()), dtype=np.int64, count=len(m))
    toks = np.fromiter(itertools.chain.from_iterable(m.values()), dtype=np.int64, count=int(sizes.sum()))
    pad = keys == LLAMA_TOKEN_NULL
    key_in = (keys >= 0) & (keys < n_vocab)
    key_bad = ~(key_in | pad).all(axis=1) | pad[:, 0] | (pad[:, :-1] & ~pad[:, 1:]).any(axis=1)
    tok_bad = (toks < 0) | (toks >= n_vocab)
    n_bad = int((tok_bad | np.repeat(key_bad, sizes)).sum())
    if not n_bad:
        return 0, None
    out = np.concatenate([keys[~(key_in | pad)], toks[tok_bad]])
    if not len(out):
        return n_bad, None
    return n_bad, int(out.max()) if out.max() >= n_vocab else int(out.min())


def check_vocab(cache: NgramCache, n_vocab: int, source: str = "<cache>") -> None:
    """Raise :class:`VocabMismatchError` when ``cache`` names a token outside ``0..n_vocab-1``.

    Such a cache was built for another vocabulary (or is damaged); a drafted id out of range
    would reach llama.cpp, which aborts the process on it.

    >>> c = NgramCache(); c.add((1,), 5)
    >>> check_vocab(c, 4, "x.bin")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.VocabMismatchError: x.bin: 1 of its 1 entries name token ids outside ... (such as 5): ...
    """
    n_bad, example = vocab_violations(cache, n_vocab)
    if n_bad:
        such = f" (such as {example})" if example is not None else " (misplaced -1 padding)"
        raise VocabMismatchError(
            f"{source}: {n_bad} of its {cache.n_entries} entries name token ids outside this model's "
            f"vocabulary of {n_vocab} tokens{such}: it was built for another model's vocabulary, "
            f"or is damaged", n_bad, n_vocab)


def _pack_words(words: list[int]) -> bytes:
    try:
        a = array("i", words)
    except OverflowError as e:
        raise ValueError(f"a token or count does not fit an int32: {e}") from None
    if a.itemsize != 4:  # pragma: no cover - exotic platforms
        import struct
        return struct.pack(f"<{len(words)}i", *words)
    if sys.byteorder != "little":  # pragma: no cover
        a.byteswap()
    return a.tobytes()


def _unpack_words(data: bytes) -> list[int]:
    a = array("i")
    if a.itemsize != 4:  # pragma: no cover
        import struct
        return list(struct.unpack(f"<{len(data) // 4}i", data))
    a.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        a.byteswap()
    return a.tolist()


# ---------------------------------------------------------------------------
# Drafting
# ---------------------------------------------------------------------------

_EMPTY: dict[int, int] = {}


def _try_draft_primary(nc: dict, ngrams: list, part_static: dict,
                       min_sample_size: Sequence[int], min_percent: Sequence[int]) -> int:
    """``try_draft`` for the context/dynamic cache, weighed by the static counts."""
    for i in range(len(ngrams) - 1, -1, -1):
        key = ngrams[i]
        if key is None:
            continue
        part = nc.get(key)
        if part is None:
            continue
        best = 0          # max_count_primary * max_count_static
        best_cp = 0       # max_count_primary
        best_tok = LLAMA_TOKEN_NULL
        total = 0
        tie = False
        for tok, cp in part.items():
            cs = part_static.get(tok)
            cs = 1 if cs is None else _wrap32(100 * cs)
            prod = _wrap32(cp * cs)
            if prod > best:
                best, best_cp, best_tok, tie = prod, cp, tok, False
            elif prod == best and prod > 0:
                tie = True
            total += cp
        total = _wrap32(total)
        if total < min_sample_size[i]:
            continue
        threshold = _wrap32(min_percent[i] * total)
        if tie:
            # Equal scores: llama.cpp keeps the first met in its map's
            # iteration order. Only look it up when it can matter.
            def score(tok: int) -> int:
                cs = part_static.get(tok)
                return _wrap32(part[tok] * (1 if cs is None else _wrap32(100 * cs)))
            tied = [t for t in part if score(t) == best]
            if any(_wrap32(100 * part[t]) >= threshold for t in tied):
                best_tok = next(t for t in _part_order(part) if score(t) == best)
                best_cp = part[best_tok]
            # else: whichever wins, the share check below fails
        if _wrap32(100 * best_cp) < threshold:
            continue
        if best_tok != LLAMA_TOKEN_NULL:
            return best_tok
    return LLAMA_TOKEN_NULL


def _try_draft_static(part_static: dict | None) -> int:
    """``try_draft`` from the static cache alone (lax thresholds of a 2-gram)."""
    if part_static is None:
        return LLAMA_TOKEN_NULL
    best = 0
    best_tok = LLAMA_TOKEN_NULL
    total = 0
    tie = False
    for tok, c in part_static.items():
        if c > best:
            best, best_tok, tie = c, tok, False
        elif c == best and c > 0:
            tie = True
        total += c
    total = _wrap32(total)
    if total < DRAFT_MIN_SAMPLE_SIZE_LAX[NGRAM_STATIC - 1]:
        return LLAMA_TOKEN_NULL
    if _wrap32(100 * best) < _wrap32(DRAFT_MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total):
        return LLAMA_TOKEN_NULL
    if tie:
        best_tok = next(t for t in _part_order(part_static) if part_static[t] == best)
    return best_tok


#: what drafted each token, as recorded by ``_draft_tail(..., sources=[])``
SOURCE_CONTEXT, SOURCE_DYNAMIC, SOURCE_STATIC = 0, 1, 2
SOURCE_NAMES = ("context", "dynamic", "static")


def _draft_tail(tail: list[int], inp_size: int, draft: list[int], n_draft: int,
                ngram_min: int, ngram_max: int,
                ctx: dict, dyn: dict, sta: dict, sources: list[int] | None = None) -> None:
    # ``tail`` holds the last tokens of the input (at least the last
    # max(ngram_max, NGRAM_STATIC) when there are that many); drafted
    # tokens are appended to it, so every n-gram is a suffix of it.
    # ``sources``, when given, receives one SOURCE_* per drafted token.
    off = inp_size - len(tail)
    sizes = range(ngram_min, ngram_max + 1)
    while len(draft) - 1 < n_draft:
        n = len(tail)
        total_len = off + n
        part_static = sta.get((tail[n - 2], tail[n - 1], LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL))
        ngrams = [
            # An n-gram reaching before the first token: llama.cpp reads out
            # of bounds there (undefined behaviour); we treat it as unseen.
            (tuple(tail[n - s:]) + _PAD[s]) if total_len >= s else None
            for s in sizes
        ]
        ps = _EMPTY if part_static is None else part_static
        src = SOURCE_CONTEXT
        tok = _try_draft_primary(ctx, ngrams, ps, DRAFT_MIN_SAMPLE_SIZE_LAX, DRAFT_MIN_PERCENT_LAX)
        if tok == LLAMA_TOKEN_NULL:
            src = SOURCE_DYNAMIC
            tok = _try_draft_primary(dyn, ngrams, ps, DRAFT_MIN_SAMPLE_SIZE_STRICT, DRAFT_MIN_PERCENT_STRICT)
        if tok == LLAMA_TOKEN_NULL:
            src = SOURCE_STATIC
            tok = _try_draft_static(part_static)
        if tok == LLAMA_TOKEN_NULL:
            break
        draft.append(tok)
        tail.append(tok)
        if sources is not None:
            sources.append(src)


def _check_sizes(ngram_min: int, ngram_max: int) -> None:
    if ngram_min < 1 or ngram_max > NGRAM_MAX or ngram_max < ngram_min:
        raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max <= {NGRAM_MAX}, got {ngram_min}..{ngram_max}")


def ngram_cache_draft(inp: Sequence[int], draft: list[int], n_draft: int, ngram_min: int, ngram_max: int,
                      nc_context: NgramCache, nc_dynamic: NgramCache, nc_static: NgramCache) -> list[int]:
    """``common_ngram_cache_draft``: extend ``draft`` by up to ``n_draft`` tokens.

    ``inp`` is every token so far, ending with the last sampled one;
    ``draft`` must hold exactly that token and is extended in place (and
    returned). Each step looks at the n-grams ending at the current end of
    ``inp + draft[1:]``, longest first, and drafts the most frequent next
    token of the first that passes its thresholds: the context cache with
    the lax ones, then the dynamic cache with the strict ones, both with
    candidates weighed by the static cache's counts after the last two
    tokens (x100 when present, x1 when not); failing both, the static
    2-gram alone under the lax thresholds. Drafting stops at the first step
    where nothing qualifies.

    >>> ctx, dyn, sta = NgramCache(), NgramCache(), NgramCache()
    >>> sta.add((4, 5), 6, 2); sta.add((5, 6), 7, 1); sta.add((5, 6), 8, 1)
    >>> ngram_cache_draft([4, 5], [5], 8, 1, 4, ctx, dyn, sta)
    [5, 6, 8]

    Here ``(5, 6)`` is a tie at 50 %; libstdc++ iterates 8 before 7.
    """
    if len(draft) != 1:
        raise ValueError("draft must hold exactly the last sampled token")
    _check_sizes(ngram_min, ngram_max)
    inp_size = len(inp)
    if inp_size < NGRAM_STATIC:
        return draft
    keep = max(ngram_max, NGRAM_STATIC)
    tail = [int(t) for t in inp[inp_size - keep:]] if inp_size > keep else [int(t) for t in inp]
    _draft_tail(tail, inp_size, draft, n_draft, ngram_min, ngram_max,
                nc_context._map, nc_dynamic._map, nc_static._map)
    return draft


# ---------------------------------------------------------------------------
# The speculator
# ---------------------------------------------------------------------------


def load_lookup_cache(path: str | os.PathLike, kind: str, n_vocab: int | None = None) -> NgramCache:
    """Load an explicitly configured cache or raise :class:`LookupCacheError`.

    The file is only read (never moved or changed); given ``n_vocab`` it must not name a token
    outside the vocabulary (:func:`check_vocab`).
    """
    try:
        return NgramCache.load(path, n_vocab)
    except (OSError, CorruptCacheError) as e:
        reason = _reason_of(e, path) if isinstance(e, CorruptCacheError) else (e.strerror or str(e))
        raise LookupCacheError(os.fspath(path), kind, reason) from e


class NgramCacheSpeculator(Speculator):
    """``common_speculative_impl_ngram_cache`` for one sequence.

    At each draft the context cache is updated with the tokens of the
    prompt it has not seen yet plus ``id_last`` (n-grams of sizes 1..4
    *within that new stretch only*, exactly as llama.cpp does), then up to
    ``n_draft`` (8) tokens are drafted by :func:`ngram_cache_draft` from the
    context, dynamic and static caches. ``begin``, ``process`` and
    ``accept`` do nothing, as in llama.cpp.

    >>> spec = NgramCacheSpeculator()
    >>> history = [10, 11, 12, 13] * 3
    >>> spec.draft(DraftRequest(prompt=history, id_last=10, pos0=len(history)))
    [11, 12, 13, 10, 11, 12, 13, 10]
    >>> spec.context_cache[(12, 13, 10)]
    {11: 2}

    ``context_cache``, ``dynamic_cache`` and ``static_cache`` are public so
    that the application can, at the end, merge the context cache into the
    dynamic one and save it (``lookup``'s flow)::

        spec.dynamic_cache.merge(spec.context_cache)
        spec.dynamic_cache.save(path)

    ``source_drafted`` / ``source_accepted`` (draftlight's addition) count,
    per cache (``"context"``, ``"dynamic"``, ``"static"``), the drafted
    tokens each cache proposed and how many of them the target accepted
    (counted when the chain reports the acceptance of this speculator's
    draft). Drafting itself is unchanged.
    """

    type = SpecType.NGRAM_CACHE

    def __init__(self, n_draft: int = N_DRAFT, static_cache: NgramCache | None = None,
                 dynamic_cache: NgramCache | None = None):
        super().__init__(n_max=n_draft)
        self.n_draft = n_draft
        self.context_cache = NgramCache()
        self.dynamic_cache = dynamic_cache if dynamic_cache is not None else NgramCache()
        self.static_cache = static_cache if static_cache is not None else NgramCache()
        #: number of tokens (prompt + id_last) the context cache has seen
        self.cache_size = 0
        #: where the segment prepare() began, until a draft ends it (see :meth:`prepare`)
        self._seg_start: int | None = None
        #: per cache: drafted tokens it proposed / of those, accepted
        self.source_drafted = dict.fromkeys(SOURCE_NAMES, 0)
        self.source_accepted = dict.fromkeys(SOURCE_NAMES, 0)
        self._last_sources: list[int] = []

    @classmethod
    def from_params(cls, params: SpecParams, n_vocab: int | None = None) -> "NgramCacheSpeculator":
        """Build it, loading ``lookup_cache_static`` / ``lookup_cache_dynamic`` when set.

        A path that is set but cannot be read or is corrupt raises
        :class:`LookupCacheError` (llama.cpp aborts there), as does, given the
        model's ``n_vocab``, a cache naming a token outside its vocabulary.
        """
        nc = params.ngram_cache
        static = load_lookup_cache(nc.lookup_cache_static, "static", n_vocab) if nc.lookup_cache_static else None
        dynamic = (load_lookup_cache(nc.lookup_cache_dynamic, "dynamic", n_vocab)
                   if nc.lookup_cache_dynamic else None)
        return cls(N_DRAFT, static_cache=static, dynamic_cache=dynamic)

    def prepare(self, prompt: Sequence[int]) -> None:
        """While the target reads the prompt (Automatic's controller calls it; a fixed type never
        does): the context cache takes the prompt in now instead of at the first draft, which
        then adds the rest of the same segment (the n-grams ending at its own tokens, keys
        reaching back into the prompt): the same counts as without it, and the reply's first
        step no longer pays for the prompt (~0.6 ms for a 330-token chat transcript).

        >>> a, b = NgramCacheSpeculator(), NgramCacheSpeculator()
        >>> prompt = [5, 6, 7, 5, 6, 8, 5, 6]
        >>> a.prepare(prompt)
        >>> da, db = a.draft(DraftRequest(prompt, 7, 8, 4)), b.draft(DraftRequest(prompt, 7, 8, 4))
        >>> a.context_cache == b.context_cache and da == db and a.cache_size == b.cache_size == 9
        True
        """
        n = len(prompt)
        start = self.cache_size
        if start >= n:
            return
        seg, lo = self._segment(start)
        self.context_cache.update([int(t) for t in prompt[lo:n]], NGRAM_MIN, NGRAM_MAX, n - start)
        self.cache_size = n
        self._seg_start = seg

    def _segment(self, start: int) -> tuple[int, int]:
        """(where the segment that tokens from ``start`` on continue began, the first token an
        update of them must read: their n-grams' keys reach back into the segment)."""
        seg = start if self._seg_start is None else self._seg_start
        return seg, max(seg, start - NGRAM_MAX)

    def draft(self, req: DraftRequest) -> list[int]:
        prompt = req.prompt
        n_prompt = len(prompt)
        id_last = int(req.id_last)
        if self.cache_size < n_prompt + 1:
            start = self.cache_size
            # the new tokens are one segment with what prepare() took in (its last tokens reach
            # into the keys of the new ones), as they would have been without it
            _, lo = self._segment(start)
            self._seg_start = None
            tokens_new = [int(t) for t in prompt[lo:]]
            tokens_new.append(id_last)
            self.context_cache.update(tokens_new, NGRAM_MIN, NGRAM_MAX, n_prompt + 1 - start)
            self.cache_size = n_prompt + 1
        inp_size = n_prompt + 1
        if inp_size < NGRAM_STATIC:
            return []
        # The n-grams only ever reach the last NGRAM_MAX tokens: no copy of
        # the whole history is needed.
        tail = [int(t) for t in prompt[max(0, n_prompt - (NGRAM_MAX - 1)):]]
        tail.append(id_last)
        # Drafting is greedy, so stopping at the caller's limit gives the
        # same prefix that the chain would cut the full draft to.
        n_draft = self.n_draft if req.n_max <= 0 else min(self.n_draft, req.n_max)
        result = [id_last]
        sources: list[int] = []
        _draft_tail(tail, inp_size, result, n_draft, NGRAM_MIN, NGRAM_MAX,
                    self.context_cache._map, self.dynamic_cache._map, self.static_cache._map, sources)
        self._last_sources = sources
        return result[1:]

    def accept(self, n_accepted: int, is_other: bool) -> None:
        if is_other:
            return
        sources, self._last_sources = self._last_sources, []
        for i, src in enumerate(sources):
            name = SOURCE_NAMES[src]
            self.source_drafted[name] += 1
            if i < n_accepted:
                self.source_accepted[name] += 1


declare(SpecDescriptor(
    name="ngram-cache", rank=50, kind=NGRAM,
    info="lookup caches: a static and a dynamic file",
    needs=Nothing("always available: this conversation plus the learned lookup caches"),
    section="ngram_cache", n_max=lambda p: N_DRAFT,
    flags=(Flag(("-lcs", "--lookup-cache-static"), "lookup_cache_static", "ngram_cache.lookup_cache_static", "str",
                "static lookup cache for ngram-cache", "FNAME"),
           Flag(("-lcd", "--lookup-cache-dynamic"), "lookup_cache_dynamic", "ngram_cache.lookup_cache_dynamic",
                "str", "dynamic lookup cache for ngram-cache", "FNAME")),
    fields=(Setting("ngram_cache.lookup_cache_static", "static cache file", "path", "optional, must exist"),
            Setting("ngram_cache.lookup_cache_dynamic", "dynamic cache file", "path",
                    "optional; learns as you chat"))))


@register(SpecType.NGRAM_CACHE)
def _create(params: SpecParams, resources: dict) -> Speculator:
    """Build the speculator; caches passed in ``resources`` win over params' paths.

    ``resources["lookup_static"]`` / ``resources["lookup_dynamic"]``, when
    present and not None, are :class:`NgramCache` objects used as they are
    (shared, not copied: the application's lookup store keeps learning into
    its dynamic cache and the speculator sees it). A cache not passed is
    loaded from ``params.ngram_cache`` as before, checked against the vocabulary
    of ``resources["model"]`` when there is one.
    """
    static = resources.get("lookup_static")
    dynamic = resources.get("lookup_dynamic")
    n_vocab = _vocab_size(resources.get("model"))
    if static is None and dynamic is None:
        return NgramCacheSpeculator.from_params(params, n_vocab)
    nc = params.ngram_cache
    if static is None and nc.lookup_cache_static:
        static = load_lookup_cache(nc.lookup_cache_static, "static", n_vocab)
    if dynamic is None and nc.lookup_cache_dynamic:
        dynamic = load_lookup_cache(nc.lookup_cache_dynamic, "dynamic", n_vocab)
    return NgramCacheSpeculator(N_DRAFT, static_cache=static, dynamic_cache=dynamic)


def _reason_of(e: BaseException, path: str | os.PathLike) -> str:
    """An error's message less the ``"<path>: "`` it begins with (the caller names the file)."""
    msg, prefix = str(e), f"{os.fspath(path)}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def _vocab_size(model) -> int | None:
    """A model's vocabulary size, or None where there is no model (or it has no such number)."""
    n = getattr(model, "n_vocab", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
