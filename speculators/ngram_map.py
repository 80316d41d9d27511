"""ngram-map-k / ngram-map-k4v: n-gram lookup with per-key statistics.

A Python rendering of llama.cpp's ``common_ngram_map`` (``common/ngram-map.cpp``):

* a hash table ``key_map`` (2**18 slots, 32-bit LCG hash of the key n-gram)
  from n-gram to one position in the history where it starts, filled in
  lazily by :meth:`NgramMapState.draft`, first writer wins;
* a list of *keys*: n-grams that were matched at least once, each with a
  hit counter and up to four *values* (the m-grams seen after the key,
  with their counts and the number of tokens the target accepted the last
  time that value was drafted).

``key_only`` (ngram-map-k) drafts the m-gram after the matched key at
once. Otherwise (ngram-map-k4v) the key needs ``min_hits`` hits, and the
most frequent value must occur at least twice as often as all other values
together.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import DraftRequest, Speculator
from .chain import register
from .descriptor import NGRAM, Nothing, SpecDescriptor, declare
from .params import NgramMapParams, SpecParams
from .ngram_simple import TokenHistory, find_ngrams, ngram_map_options, slot_winners
from .types import SpecType

__all__ = ["NgramMap", "NgramMapKey", "NgramMapState", "NgramMapValue", "ngram_map_hash"]

#: multiplier of the 32-bit LCG hash of n-grams (LCG_FACTOR)
LCG_FACTOR = 2654435761
#: slots in the hash -> n-gram position table (COMMON_NGRAM_HASH_MAP_SIZE)
HASH_MAP_SIZE = 262144
#: values remembered per key (COMMON_NGRAM_MAX_VALUES)
MAX_VALUES = 4
#: saturation of key and value counters (COMMON_NGRAM_MAX_VALUE_COUNT)
MAX_VALUE_COUNT = 16380

_U32 = 0xFFFFFFFF
#: below this many new positions, fill key_map with a plain loop
_VECTOR_FROM = 16


def _int16(x: int) -> int:
    """The value of ``(int16_t) x`` (after ``(uint16_t)``)."""
    x &= 0xFFFF
    return x - 0x10000 if x >= 0x8000 else x


def ngram_map_hash(tokens: Sequence[int], start: int, length: int) -> int:
    """``common_ngram_map_hash``: 32-bit LCG hash of ``tokens[start:start+length]``.

    >>> ngram_map_hash([1, 2], 0, 2) == (1 * LCG_FACTOR + 2) % 2**32
    True
    """
    h = 0
    for i in range(start, start + length):
        h = (h * LCG_FACTOR + tokens[i]) & _U32
    return h


def _hash_windows(arr: np.ndarray, lo: int, hi: int, n: int) -> np.ndarray:
    """Hashes of the n-grams starting at lo..hi (ascending), as uint32."""
    span = hi - lo + 1
    f = np.uint32(LCG_FACTOR)
    h = np.zeros(span, dtype=np.uint32)
    for i in range(n):
        # int64 -> uint32 wraps modulo 2**32, as the C++ conversion does
        h = h * f + arr[lo + i: lo + i + span].astype(np.uint32)
    return h


class NgramMapValue:
    """``common_ngram_map_value``: one m-gram seen after a key."""

    __slots__ = ("value_idx", "value_num", "n_accepted")

    def __init__(self, value_idx: int = 0, value_num: int = 0, n_accepted: int = -1):
        self.value_idx = value_idx    # start of the m-gram in the history (0: unused slot)
        self.value_num = value_num    # occurrences after the key
        self.n_accepted = n_accepted  # tokens accepted when last drafted (-1: unused)

    def copy(self) -> "NgramMapValue":
        return NgramMapValue(self.value_idx, self.value_num, self.n_accepted)

    def __repr__(self) -> str:
        return f"NgramMapValue({self.value_idx}, {self.value_num}, {self.n_accepted})"


class NgramMapKey:
    """``common_ngram_map_key``: statistics of one key n-gram."""

    __slots__ = ("key_idx", "stat_idx", "key_num", "values")

    def __init__(self, key_idx: int, m: int):
        self.key_idx = key_idx  # a position of the key in the history
        self.stat_idx = 0       # value statistics are counted up to here
        self.key_num = 0        # number of draft calls that matched this key
        # a new key's slots are unused but start with n_accepted = m
        self.values = [NgramMapValue(0, 0, m) for _ in range(MAX_VALUES)]

    def __repr__(self) -> str:
        return f"NgramMapKey(key_idx={self.key_idx}, stat_idx={self.stat_idx}, " \
               f"key_num={self.key_num}, values={self.values})"


class NgramMapState:
    """``common_ngram_map`` with ``begin`` / ``draft`` / ``accept``.

    Worked example (map-k, ``n=2``, ``m=2``). The history needs at least
    ``2n + m = 6`` tokens; the key is the last history token plus the
    sampled one, searched backwards from ``len - n - m - 1``:

    >>> st = NgramMapState(size_key=2, size_value=2, key_only=True, min_hits=1)
    >>> st.begin([])
    >>> hist = [0, 1, 2, 3, 4, 5, 6, 1]
    >>> st.draft(hist, 2)        # key [1, 2] found at position 1
    [3, 4]
    >>> st.keys[0].key_idx, st.keys[0].key_num
    (1, 1)
    >>> st.accept(1)             # the target took one token of that draft...
    >>> st.draft(hist, 2)        # ...so this key now drafts just one
    [3]

    The same history with ``key_only=False`` (map-k4v) and ``min_hits=2``:
    the first hit only counts.

    >>> st = NgramMapState(2, 2, key_only=False, min_hits=2)
    >>> st.begin([])
    >>> st.draft(hist, 2), st.draft(hist, 2)
    ([], [3, 4])
    >>> st.keys[0].values[0]     # (value_idx, value_num, n_accepted)
    NgramMapValue(3, 1, 2)
    >>> st.draft(hist, 2)        # statistics restart at stat_idx inclusive,
    [3, 4]
    >>> st.keys[0].values[0]     # so the occurrence at 1 counts again
    NgramMapValue(3, 2, 2)
    """

    def __init__(self, size_key: int, size_value: int, key_only: bool, min_hits: int,
                 hash_map_size: int = HASH_MAP_SIZE):
        self.size_key = size_key
        self.size_value = size_value
        self.key_only = key_only
        self.min_hits = min_hits
        self.keys: list[NgramMapKey] = []
        #: tokens at the start of the previous generation
        self.size_last_begin = 0
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0
        #: history length at the last check (draft or begin)
        self.idx_last_check = 0
        #: hash of a key n-gram -> one position where it starts (0: none)
        # np.full (not zeros) touches the pages now rather than in the first draft
        #: (a small size only serves to test collisions)
        self.key_map = np.full(hash_map_size, 0, dtype=np.uint32)
        #: positions up to this one were offered to key_map
        self.key_map_last_idx = 0
        self._hist = TokenHistory()
        self._key_idx_cache: np.ndarray | None = None

    # -- begin -------------------------------------------------------------
    def begin(self, tokens: Sequence[int]) -> None:
        """``common_ngram_map_begin``: forget what lies past a shrunken history.

        Only when the new prompt is shorter than the history seen last
        (e.g. a reasoning block was dropped) are key_map entries, keys and
        values at or after the cleanup index removed.
        """
        size_begin = len(tokens)
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            kv = self.size_key + self.size_value
            cleanup = size_begin - kv if size_begin > kv else 0

        if size_begin < self.idx_last_check:
            km = self.key_map
            km[(km != 0) & (km >= cleanup)] = 0
            self.key_map_last_idx = (cleanup - 1) & _U32 if cleanup > 0 else 0

        if size_begin < self.idx_last_check and self.keys:
            kept: list[NgramMapKey] = []
            for key in self.keys:
                if key.key_idx >= cleanup:
                    continue
                if not self.key_only:
                    vals = key.values
                    for j in range(MAX_VALUES - 1, -1, -1):
                        if vals[j].value_idx != 0 and vals[j].value_idx >= cleanup:
                            # shift the later values left; the last slot is
                            # cleared but keeps its n_accepted
                            for k in range(j, MAX_VALUES - 1):
                                vals[k] = vals[k + 1].copy()
                            last = vals[MAX_VALUES - 1]
                            last.value_idx = 0
                            last.value_num = 0
                    if vals[0].value_idx == 0:
                        continue
                kept.append(key)
            self.keys = kept
            self._key_idx_cache = None

        self.idx_last_check = size_begin
        self.size_last_begin = size_begin
        # not part of the reference: warm the history mirror for draft()
        self._hist.sync(tokens)

    # -- draft -------------------------------------------------------------
    def _fill_key_map(self, lst: list[int], arr: np.ndarray, ranges: list[tuple[int, int]]) -> None:
        """Offer the n-grams at each range (descending, ranges in order) to
        key_map; a slot keeps the first position written to it."""
        n = self.size_key
        km = self.key_map
        total = sum(hi - lo + 1 for lo, hi in ranges if hi >= lo)
        if total == 0:
            return
        if total < _VECTOR_FROM:
            for lo, hi in ranges:
                for j in range(hi, lo - 1, -1):
                    slot = ngram_map_hash(lst, j, n) % len(km)
                    if km[slot] == 0:
                        km[slot] = j
            return
        pos_parts, slot_parts = [], []
        for lo, hi in ranges:
            if hi < lo:
                continue
            pos_parts.append(np.arange(hi, lo - 1, -1, dtype=np.int64))
            slot_parts.append((_hash_windows(arr, lo, hi, n) % np.uint32(len(km)))[::-1])
        pos = np.concatenate(pos_parts)
        slots = np.concatenate(slot_parts)
        first = slot_winners(slots, "first")
        uniq = slots[first]
        free = km[uniq] == 0
        km[uniq[free]] = pos[first[free]]

    def _key_positions(self) -> np.ndarray:
        if self._key_idx_cache is None or len(self._key_idx_cache) != len(self.keys):
            self._key_idx_cache = np.fromiter((k.key_idx for k in self.keys), dtype=np.int64,
                                              count=len(self.keys))
        return self._key_idx_cache

    def _find_key(self, lst: list[int], arr: np.ndarray, key: list[int]) -> int:
        """Index of the first key whose n-gram (in the current history) is ``key``."""
        n = self.size_key
        cur_len = len(lst)
        if len(self.keys) <= 8:
            for i, k in enumerate(self.keys):
                if lst[k.key_idx: k.key_idx + n] == key:
                    return i
            return -1
        kpos = self._key_positions()
        # a key past the history's end cannot match (C++ would read out of bounds)
        cand = np.flatnonzero(kpos + n <= cur_len)
        for j in range(n):
            if cand.size == 0:
                return -1
            cand = cand[arr[kpos[cand] + j] == key[j]]
        return int(cand[0]) if cand.size else -1

    def draft(self, tokens: Sequence[int], sampled: int) -> list[int]:
        """``common_ngram_map_draft``: the draft after ``tokens + [sampled]``."""
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0

        cur_len = len(tokens)
        n = self.size_key
        m = self.size_value
        if cur_len < 2 * n + m:
            return []
        if cur_len >= _U32:
            raise RuntimeError(f"ngram-map: history length exceeds UINT32_MAX: {cur_len}")
        if self.idx_last_check > cur_len:
            raise RuntimeError(f"ngram-map: idx_last_check > cur_len: {self.idx_last_check} > {cur_len}"
                               " (history shrank without begin())")
        self.idx_last_check = cur_len

        lst, arr = self._hist.sync(tokens)
        key = lst[cur_len - n + 1: cur_len]
        key.append(int(sampled))

        if self.size_last_begin > cur_len:
            raise RuntimeError(f"ngram-map: size_last_begin > cur_len: {self.size_last_begin} > {cur_len}")

        lim = cur_len - n - m - 1           # last position a key may start at
        slb = self.size_last_begin
        kml = self.key_map_last_idx
        km = self.key_map

        # 1. the hash table (positions up to key_map_last_idx)
        match_pos = 0
        idx_key = int(km[ngram_map_hash(key, 0, n) % len(km)])
        if idx_key != 0 and idx_key < lim and lst[idx_key: idx_key + n] == key:
            match_pos = idx_key
        # 2. the prompt part not yet hashed: (kml, slb - n - m - 1], descending
        first_range = (kml + 1, slb - n - m - 1) if slb > n + m + 1 else (1, 0)
        if match_pos == 0:
            j = self._rfind(arr, key, *first_range)
            if j > 0:
                match_pos = j
        # 3. the generated part not yet hashed: (max(slb, kml), lim], descending
        second_range = (max(slb, kml) + 1, lim)
        if match_pos == 0:
            j = self._rfind(arr, key, *second_range)
            if j > 0:
                match_pos = j

        # hash the n-grams just searched linearly, in the same order
        self._fill_key_map(lst, arr, [first_range, second_range])
        self.key_map_last_idx = max(lim & _U32, kml)

        if match_pos == 0:
            return []

        # statistics of the key
        key_offset = self._find_key(lst, arr, key)
        if key_offset < 0:
            self.keys.append(NgramMapKey(match_pos, m))
            key_offset = len(self.keys) - 1
        ck = self.keys[key_offset]
        ck.key_num = min(ck.key_num + 1, MAX_VALUE_COUNT)

        if self.key_only:
            # simple mode: the m-gram after the match, shortened to what was
            # accepted the last time this key drafted; min_hits is not used
            n_draft = min(m, ck.values[0].n_accepted)
            self.last_draft_created = True
            self.last_draft_key_idx = key_offset
            self.last_draft_value_idx = 0
            return lst[match_pos + n: match_pos + n + max(0, n_draft)]

        if ck.key_num < self.min_hits:
            return []

        # count the m-grams after every occurrence of the key in
        # [stat_idx, match_pos] (stat_idx itself is counted again)
        vals = ck.values
        self._count_values(lst, arr, vals, find_ngrams(arr, key, ck.stat_idx, match_pos))
        ck.stat_idx = match_pos

        max_occur, slot_max = 0, 0
        for v in range(MAX_VALUES):
            if vals[v].value_num > max_occur:
                max_occur, slot_max = vals[v].value_num, v
        sum_occur = sum(vals[v].value_num for v in range(MAX_VALUES) if v != slot_max)
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []  # no value dominates

        # NB: as in the reference, the tokens drafted are those after
        # match_pos; slot_max only decides the length (via n_accepted)
        n_draft = min(m, vals[slot_max].n_accepted)
        self.last_draft_created = True
        self.last_draft_key_idx = key_offset
        self.last_draft_value_idx = slot_max
        return lst[match_pos + n: match_pos + n + max(0, n_draft)]

    @staticmethod
    def _rfind(arr: np.ndarray, key: list[int], lo: int, hi: int) -> int:
        found = find_ngrams(arr, key, lo, hi)
        return int(found[-1]) if found.size else 0

    def _count_values(self, lst: list[int], arr: np.ndarray, vals: list[NgramMapValue],
                      occ: np.ndarray) -> None:
        """Count the m-gram after each key occurrence ``occ`` (ascending).

        Per occurrence, in order: the first slot that is empty (it takes the
        m-gram) or holds the same m-gram gets one more count; with four other
        m-grams in the slots the occurrence is not counted.
        """
        n, m = self.size_key, self.size_value
        if len(occ) <= _VECTOR_FROM:
            for i in occ.tolist():
                vb = i + n
                mgram = lst[vb: vb + m]
                for v in range(MAX_VALUES):
                    slot = vals[v]
                    if slot.value_idx == 0:
                        slot.value_idx = vb
                        slot.value_num = 0
                        slot.n_accepted = m
                    elif mgram != lst[slot.value_idx: slot.value_idx + m]:
                        continue
                    slot.value_num = min(slot.value_num + 1, MAX_VALUE_COUNT)
                    break
            return
        # Vectorised: for each slot, where in the history its m-gram occurs;
        # an occurrence matches a slot iff its m-gram starts at one of those.
        cur_len = len(lst)
        value_starts = occ + n
        where: dict[int, np.ndarray] = {}

        def positions(v: int) -> np.ndarray:
            if v not in where:
                vidx = vals[v].value_idx
                if vidx + m > cur_len:  # cut off: equals no full m-gram
                    where[v] = np.zeros(0, dtype=np.intp)
                else:
                    where[v] = find_ngrams(arr, lst[vidx: vidx + m], 0, cur_len - m)
            return where[v]

        start = 0
        while start < len(value_starts):
            empty = next((v for v in range(MAX_VALUES) if vals[v].value_idx == 0), None)
            rem = value_starts[start:]
            which = np.full(len(rem), -1, dtype=np.int64)
            for v in reversed(range(MAX_VALUES if empty is None else empty)):
                which[np.isin(rem, positions(v))] = v  # earlier slots overwrite later
            miss = np.flatnonzero(which < 0)
            stop = miss[0] if (empty is not None and miss.size) else len(rem)
            hits = which[:stop]
            counts = np.bincount(hits[hits >= 0], minlength=MAX_VALUES)
            for v in range(MAX_VALUES):
                if counts[v]:
                    vals[v].value_num = min(vals[v].value_num + int(counts[v]), MAX_VALUE_COUNT)
            if stop == len(rem):
                break
            # this occurrence's m-gram is new: it takes the first empty slot
            slot = vals[empty]  # type: ignore[index]
            slot.value_idx = int(rem[stop])
            slot.value_num = 1
            slot.n_accepted = m
            where.pop(empty, None)  # type: ignore[arg-type]
            start += int(stop) + 1

    # -- accept ------------------------------------------------------------
    def accept(self, n_accepted: int) -> None:
        """``common_ngram_map_accept``: remember how much of the last draft was taken."""
        if not self.last_draft_created:
            return
        if not 0 <= self.last_draft_key_idx < len(self.keys):
            return  # keys were dropped by begin() since that draft
        key = self.keys[self.last_draft_key_idx]
        key.values[self.last_draft_value_idx].n_accepted = _int16(n_accepted)


class NgramMap(Speculator):
    """``ngram-map-k`` (``key_only=True``) or ``ngram-map-k4v`` speculator.

    ``n_max`` is ``size_m``. Accepts reported for another speculator's
    draft are ignored. Example (map-k, n=2, m=3):

    >>> s = NgramMap(size_n=2, size_m=3, min_hits=1, key_only=True)
    >>> s.name
    'ngram-map-k'
    >>> s.begin([])
    >>> hist = [0, 1, 2, 3, 4, 5, 6, 7, 1]
    >>> s.draft(DraftRequest(prompt=hist, id_last=2, pos0=9))
    [3, 4, 5]
    >>> s.accept(0, is_other=True)    # someone else's draft: ignored
    >>> s.accept(2, is_other=False)
    >>> s.draft(DraftRequest(prompt=hist, id_last=2, pos0=9))
    [3, 4]
    """

    def __init__(self, size_n: int, size_m: int, min_hits: int, key_only: bool):
        super().__init__(n_max=size_m)
        self.type = SpecType.NGRAM_MAP_K if key_only else SpecType.NGRAM_MAP_K4V  # type: ignore[misc]
        self.map = NgramMapState(size_n, size_m, key_only, min_hits)
        self.context_key = size_n      # keys are positions of the history: a hit is a repeat in it
        #: how much of the last draft was verified, when the controller cut it
        self._cut: int | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        self.map.begin(prompt)

    def draft(self, req: DraftRequest) -> list[int]:
        self._cut = None
        return self.map.draft(req.prompt, req.id_last)

    def draft_cut(self, n_kept: int) -> None:
        """Only ``n_kept`` tokens of the draft are verified (the adaptive controller's cut).

        A key remembers how much of its draft was accepted and drafts no more next time. A
        rejection inside the cut is what llama.cpp would have seen too (the same first
        mismatch), so it is remembered; a cut draft accepted whole says nothing about the
        tokens that were left out, so the key keeps what it had::

            >>> s = NgramMap(size_n=2, size_m=3, min_hits=1, key_only=True)
            >>> s.begin([])
            >>> hist = [0, 1, 2, 3, 4, 5, 6, 7, 1]
            >>> s.draft(DraftRequest(prompt=hist, id_last=2, pos0=9))
            [3, 4, 5]
            >>> s.draft_cut(1); s.accept(1, is_other=False)     # verified [3]: accepted
            >>> s.draft(DraftRequest(prompt=hist, id_last=2, pos0=9))
            [3, 4, 5]
            >>> s.draft_cut(2); s.accept(1, is_other=False)     # verified [3, 4]: 4 rejected
            >>> s.draft(DraftRequest(prompt=hist, id_last=2, pos0=9))
            [3]
        """
        super().draft_cut(n_kept)
        self._cut = n_kept

    def accept(self, n_accepted: int, is_other: bool) -> None:
        if is_other:
            return
        cut, self._cut = self._cut, None
        if cut is not None and n_accepted >= cut:
            return
        self.map.accept(n_accepted)


def _make(p: NgramMapParams, key_only: bool) -> NgramMap:
    return NgramMap(size_n=p.size_n, size_m=p.size_m, min_hits=p.min_hits, key_only=key_only)


declare(SpecDescriptor(
    name="ngram-map-k", rank=20, kind=NGRAM,
    info="map from n-gram to its continuation",
    needs=Nothing("always available: map from n-gram to its continuation"),
    **ngram_map_options("ngram-map-k", "ngram_map_k")))
declare(SpecDescriptor(
    name="ngram-map-k4v", rank=30, kind=NGRAM,
    info="n-gram map with up to 4 continuations",
    needs=Nothing("always available: n-gram map with up to 4 continuations"),
    **ngram_map_options("ngram-map-k4v", "ngram_map_k4v")))


@register(SpecType.NGRAM_MAP_K)
def _make_ngram_map_k(params: SpecParams, resources: dict) -> Speculator:
    return _make(params.ngram_map_k, key_only=True)


@register(SpecType.NGRAM_MAP_K4V)
def _make_ngram_map_k4v(params: SpecParams, resources: dict) -> Speculator:
    return _make(params.ngram_map_k4v, key_only=False)
