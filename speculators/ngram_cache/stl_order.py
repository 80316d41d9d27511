"""The iteration order of GNU libstdc++'s ``std::unordered_map``, which decides llama.cpp's
tie-breaks and the record order of the files it saves (what llama.cpp gets when built with GCC,
checked against GCC 12). Computed from the order in which keys were first inserted; pure
functions over keys and hashes."""

from __future__ import annotations

import itertools
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from .keys import _U64, NGRAM_MAX, Ngram

#: ``common_token_hash_function``'s multiplier (Fibonacci hashing).
_FIB = 11400714819323198485

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
        # the old order re-inserted (a rehash), then the keys inserted since
        for item in itertools.chain(order, ((hash_fn(k), k) for k in keys[start:end])):
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



def ngram_order(keys: list[Ngram]) -> list[Ngram]:
    """The n-grams ``keys`` (in insertion order) in the order llama.cpp (GCC build) iterates them;
    numpy for many keys, :func:`stl_order` for few."""
    if len(keys) < 512:
        return stl_order(keys, _ngram_hash)
    tok = np.fromiter(itertools.chain.from_iterable(keys), dtype=np.int64, count=NGRAM_MAX * len(keys))
    codes = np.bitwise_xor.reduce(tok.reshape(-1, NGRAM_MAX).astype(np.uint64) * np.uint64(_FIB), axis=1)
    return [keys[i] for i in _stl_perm_np(codes).tolist()]
