"""The n-gram statistics table: ``common_ngram_cache`` of llama.cpp's ``common/ngram-cache``,
n-gram -> {following token: times seen}, with its update, merge, and save/load through the
lookup file format (:mod:`.file_format`, :mod:`.file_checks`). Knows nothing of drafting."""

from __future__ import annotations

import os
import sys
import time
from typing import Iterator, Sequence

from .file_checks import check_vocab, read_lookup_file
from .file_format import _HEADER_WORDS, atomic_write, decode_records, encode_records
from .keys import _PAD, NGRAM_MAX, Ngram, ngram_key
from .stl_order import _part_order, ngram_order


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
        return ngram_order(list(self._map))

    # -- files -------------------------------------------------------------------
    def to_bytes(self, order: str = "stl") -> bytes:
        """The cache in llama.cpp's lookup file format (see :meth:`save`)."""
        if order == "stl":
            keys = self._stl_keys()
        elif order == "insertion":
            keys = list(self._map)
        else:
            raise ValueError(f"order must be 'stl' or 'insertion', not {order!r}")
        return encode_records(self._map, keys, stl=order == "stl")

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
        m = decode_records(data, source)
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
