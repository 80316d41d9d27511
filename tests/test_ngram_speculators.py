"""ngram-simple, ngram-map-k / -k4v and ngram-mod against llama.cpp's logic.

Two kinds of tests:

* hand-worked sequences: the expected values are derived in the comments
  from the reference C++ (common/ngram-map.cpp, common/ngram-mod.cpp,
  common/speculative.cpp), not from this code;
* differential property tests against ``Oracle*`` classes below: literal,
  loop-by-loop transliterations of the C++ (slow, no numpy, no caching),
  checking the vectorised implementation on random histories, including
  hash collisions (small tables) and history rewrites at ``begin``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speculators.base import DraftRequest
from speculators.chain import SpeculatorChain
from speculators.ngram_map import NgramMap, NgramMapKey, NgramMapState, NgramMapValue
from speculators.ngram_mod import TABLE_SIZE, NgramMod, NgramModTable
from speculators.ngram_simple import NgramSimple, TokenHistory, find_ngrams, ngram_simple_draft
from speculators.params import NgramMapParams, NgramModParams, SpecParams
from speculators.types import SpecType, parse_types

U32 = 2**32
U64 = 2**64
LCG = 2654435761
MOD_MUL = 6364136223846793005


def req(prompt, id_last, n_max=-1):
    return DraftRequest(prompt=list(prompt), id_last=id_last, pos0=len(prompt), n_max=n_max)


def map_slot(ngram, size=262144):
    """Closed form of common_ngram_map_hash: sum t_k F^(n-1-k) mod 2^32, then % size."""
    n = len(ngram)
    return sum(t * pow(LCG, n - 1 - k, U32) for k, t in enumerate(ngram)) % U32 % size


def mod_slot(ngram, size=TABLE_SIZE):
    """Closed form of common_ngram_mod::idx (size_t arithmetic: mod 2^64)."""
    n = len(ngram)
    return sum(t * pow(MOD_MUL, n - 1 - k, U64) for k, t in enumerate(ngram)) % U64 % size


def assert_distinct_slots(ngrams, slot=map_slot):
    """The hand-worked map examples assume no key_map collisions: check it."""
    slots = {tuple(g): slot(g) for g in ngrams}
    assert len(set(slots.values())) == len(slots), slots


# =====================================================================
# Oracles: literal transliterations of the reference loops
# =====================================================================

def oracle_simple(n, m, tokens, sampled):
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = [tokens[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]
    match_pos = 0
    j = cur_len - n - 1
    while j > 0:
        if all(tokens[j + k] == pattern[k] for k in range(len(pattern))):
            match_pos = j
            break
        j -= 1
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return [tokens[match_pos + n + j] for j in range(copy_max)]


class OracleMap:
    def __init__(self, n, m, key_only, min_hits, hsize=262144):
        self.n, self.m, self.key_only, self.min_hits = n, m, key_only, min_hits
        self.keys = []  # [key_idx, stat_idx, key_num, [[value_idx, value_num, n_accepted] x4]]
        self.key_map = [0] * hsize
        self.size_last_begin = 0
        self.last = (False, 0, 0)
        self.idx_last_check = 0
        self.kml = 0

    def h(self, toks, start):
        x = 0
        for i in range(self.n):
            x = (x * LCG + toks[start + i]) % U32
        return x % len(self.key_map)

    @staticmethod
    def eq(inp, a, b, length):
        # an index past the end counts as a mismatch (C++ would read out of bounds)
        return all(a + j < len(inp) and b + j < len(inp) and inp[a + j] == inp[b + j]
                   for j in range(length))

    def begin(self, tokens):
        n, m = self.n, self.m
        size_begin = len(tokens)
        c = self.size_last_begin
        if c > size_begin:
            c = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            for i, v in enumerate(self.key_map):
                if v != 0 and v >= c:
                    self.key_map[i] = 0
            self.kml = c - 1 if c > 0 else 0
        if size_begin < self.idx_last_check and self.keys:
            i = len(self.keys) - 1
            while i >= 0:
                key = self.keys[i]
                if key[0] >= c:
                    del self.keys[i]
                    i -= 1
                    continue
                if not self.key_only:
                    vals = key[3]
                    for j in range(3, -1, -1):
                        if vals[j][0] != 0 and vals[j][0] >= c:
                            for k in range(j, 3):
                                vals[k] = list(vals[k + 1])
                            vals[3][0] = 0
                            vals[3][1] = 0
                    if vals[0][0] == 0:
                        del self.keys[i]
                i -= 1
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin

    def draft(self, inp, sampled):
        n, m = self.n, self.m
        self.last = (False, 0, 0)
        cur_len = len(inp)
        if cur_len < 2 * n + m:
            return []
        assert self.idx_last_check <= cur_len
        self.idx_last_check = cur_len
        key = [inp[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]

        def matches(j):
            return all(j + k < cur_len and inp[j + k] == key[k] for k in range(n))

        match_pos = 0
        assert self.size_last_begin <= cur_len
        idx_key = self.key_map[self.h(key, 0)]
        if idx_key != 0 and idx_key < cur_len - n - m - 1 and matches(idx_key):
            match_pos = idx_key
        slb = self.size_last_begin
        if match_pos == 0 and slb > n + m + 1:
            j = slb - n - m - 1
            while j > self.kml:
                if matches(j):
                    match_pos = j
                    break
                j -= 1
        if match_pos == 0:
            j = cur_len - n - m - 1
            while j > slb and j > self.kml:
                if matches(j):
                    match_pos = j
                    break
                j -= 1
        if slb > n + m + 1:
            j = slb - n - m - 1
            while j > self.kml:
                hh = self.h(inp, j)
                if self.key_map[hh] == 0:
                    self.key_map[hh] = j
                j -= 1
        j = cur_len - n - m - 1
        while j > slb and j > self.kml:
            hh = self.h(inp, j)
            if self.key_map[hh] == 0:
                self.key_map[hh] = j
            j -= 1
        self.kml = max(cur_len - n - m - 1, self.kml)
        if match_pos == 0:
            return []
        key_offset = len(self.keys)
        for i, k in enumerate(self.keys):
            if matches(k[0]):
                key_offset = i
                break
        if key_offset == len(self.keys):
            self.keys.append([match_pos, 0, 0, [[0, 0, m] for _ in range(4)]])
        ck = self.keys[key_offset]
        ck[2] = min(ck[2] + 1, 16380)
        if self.key_only:
            nd = min(m, ck[3][0][2])
            self.last = (True, key_offset, 0)
            return [inp[match_pos + n + i] for i in range(nd)]
        if ck[2] < self.min_hits:
            return []
        for i in range(ck[1], match_pos + 1):
            if not matches(i):
                continue
            vb = i + n
            idx_value = -1
            for v in range(4):
                vv = ck[3][v]
                if vv[0] == 0:
                    vv[0], vv[1], vv[2] = vb, 0, m
                    idx_value = v
                    break
                if self.eq(inp, vb, vv[0], m):
                    idx_value = v
                    break
            if idx_value >= 0:
                ck[3][idx_value][1] = min(ck[3][idx_value][1] + 1, 16380)
        ck[1] = match_pos
        max_occur, slot_max = 0, 0
        for v in range(4):
            if ck[3][v][1] > max_occur:
                max_occur, slot_max = ck[3][v][1], v
        sum_occur = sum(ck[3][v][1] for v in range(4) if v != slot_max)
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []
        nd = min(m, ck[3][slot_max][2])
        self.last = (True, key_offset, slot_max)
        return [inp[match_pos + n + i] for i in range(nd)]

    def accept(self, n_accepted):
        if not self.last[0] or self.last[1] >= len(self.keys):
            return
        self.keys[self.last[1]][3][self.last[2]][2] = n_accepted


class OracleMod:
    def __init__(self, n, n_max, n_min, size):
        self.n, self.n_max, self.n_min = n, n_max, n_min
        self.entries = [-1] * size
        self.used = 0
        self.i_last = 0
        self.n_draft_last = 0
        self.n_low = 0

    def idx(self, toks, start):
        r = 0
        for i in range(self.n):
            r = (r * MOD_MUL + toks[start + i]) % U64
        return r % len(self.entries)

    def add(self, toks, start):
        i = self.idx(toks, start)
        if self.entries[i] == -1:
            self.used += 1
        self.entries[i] = toks[start + self.n]

    def reset(self):
        self.entries = [-1] * len(self.entries)
        self.used = 0

    def begin(self, prompt):
        self.i_last = 0
        self.n_draft_last = 0
        if len(prompt) < self.n:
            return
        for i in range(len(prompt) - self.n):
            self.add(prompt, i)
        self.i_last = len(prompt) - self.n
        if self.used / len(self.entries) > 0.25:
            self.reset()

    def draft(self, prompt, id_last):
        n = self.n
        self.n_draft_last = 0
        cur_len = len(prompt)
        if cur_len < n:
            return []
        if self.i_last + 32 < cur_len:
            for i in range(self.i_last, cur_len - n):
                self.add(prompt, i)
            self.i_last = cur_len - n
        result = [0] * (n + self.n_max)
        for i in range(n - 1):
            result[i] = prompt[cur_len - n + 1 + i]
        result[n - 1] = id_last
        for i in range(self.n_max):
            token = self.entries[self.idx(result, i)]
            if token == -1:
                if i < self.n_min:
                    return []
                result = result[: n + i]
                break
            result[n + i] = token
        out = result[n:]
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted, is_other):
        if is_other:
            return
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


def map_state(st_: NgramMapState):
    keys = [[k.key_idx, k.stat_idx, k.key_num,
             [[v.value_idx, v.value_num, v.n_accepted] for v in k.values]] for k in st_.keys]
    return keys, st_.key_map.tolist(), st_.key_map_last_idx, st_.idx_last_check, st_.size_last_begin


def oracle_map_state(o: OracleMap):
    return o.keys, o.key_map, o.kml, o.idx_last_check, o.size_last_begin


# =====================================================================
# helpers
# =====================================================================

def test_token_history_mirrors_appends_and_rewrites():
    h = TokenHistory()
    seq = [random.Random(1).randrange(100) for _ in range(3000)]
    for L in (0, 1, 5, 5, 1500, 2999, 3000):
        lst, arr = h.sync(seq[:L])
        assert lst == seq[:L] and arr.tolist() == seq[:L]
    changed = list(seq)
    changed[10] = 999  # an old token changes: must be noticed
    lst, arr = h.sync(changed)
    assert arr[10] == 999 and lst == changed
    lst, arr = h.sync(tuple(seq[:7]))  # shorter, other sequence type
    assert arr.tolist() == seq[:7]
    lst, arr = h.sync(np.array(seq[:9]))
    assert lst == seq[:9] and arr.tolist() == seq[:9]


def test_find_ngrams_all_positions():
    a = np.array([7] * 10)
    assert find_ngrams(a, [7, 7, 7], 0, 7).tolist() == list(range(8))
    assert find_ngrams(a, [7, 7, 7], 2, 4).tolist() == [2, 3, 4]
    assert find_ngrams(a, [7, 8], 0, 8).tolist() == []
    assert find_ngrams(a, [7], 5, 4).tolist() == []


# =====================================================================
# ngram-simple
# =====================================================================

class TestNgramSimple:
    def test_empty_and_short_history(self):
        # The reference needs cur_len > n + m + 1.
        assert ngram_simple_draft(2, 2, [], 1) == []
        assert ngram_simple_draft(2, 2, [1, 2, 3, 1, 2], 3) == []  # 5 <= 2+2+1
        s = NgramSimple(2, 2)
        assert s.draft(req([], 1)) == []

    def test_no_match(self):
        # n=2, pattern [8, 9] occurs nowhere
        assert ngram_simple_draft(2, 2, [1, 2, 3, 4, 5, 6, 8], 9) == []

    def test_latest_match_wins(self):
        # hist  0  1  2  3   4   5  6  7   8   9  10   (n=2, m=2, sampled 2)
        #       0  1  2  10  11  1  2  20  21  5  1
        # pattern = [hist[10], 2] = [1, 2]; j = 11-2-1 = 8 down to 1:
        # j=5 matches first (j=1 would too) -> copy_max = min(2, 11-7) = 2
        hist = [0, 1, 2, 10, 11, 1, 2, 20, 21, 5, 1]
        assert ngram_simple_draft(2, 2, hist, 2) == [20, 21]
        assert NgramSimple(2, 2).draft(req(hist, 2)) == [20, 21]

    def test_position_zero_is_never_a_match(self):
        # pattern [1, 2] occurs only at position 0 -> "no match"
        assert ngram_simple_draft(2, 2, [1, 2, 3, 4, 5, 6, 7, 1], 2) == []

    def test_current_position_is_skipped(self):
        # pattern [1, 1]; the search starts at j = 8-2-1 = 5, so the
        # occurrence at j=6 (the tail itself) is not considered -> nothing.
        assert ngram_simple_draft(2, 2, [8, 4, 5, 6, 7, 9, 1, 1], 1) == []

    def test_copy_max_below_n_rejects_without_fallback(self):
        # n=3, m=5; hist 0 1 2 3 4 5 6 7 8 9 10 11
        #                 0 1 2 3 4 5 6 1 2 3 1  2   sampled 3 -> pattern [1, 2, 3]
        # j from 12-3-1 = 8: j=8 [3,1,2] no, j=7 [1,2,3] yes (first hit)
        # copy_max = min(5, 12 - 10) = 2 < 3 -> [] (the hit at 1 is not tried)
        assert ngram_simple_draft(3, 5, [0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 1, 2], 3) == []
        # without the late copy only the hit at 1 remains:
        # copy_max = min(5, 12 - 4) = 5 -> hist[4:9]
        assert ngram_simple_draft(3, 5, [0, 1, 2, 3, 4, 5, 6, 9, 9, 9, 1, 2], 3) == [4, 5, 6, 9, 9]

    def test_draft_runs_into_the_tail(self):
        # n=3, m=5, pattern [1,2,3] found at 4 -> hist[7:12], crossing into
        # the tokens that form the pattern itself
        hist = [0, 7, 8, 9, 1, 2, 3, 4, 5, 6, 1, 2]
        assert ngram_simple_draft(3, 5, hist, 3) == [4, 5, 6, 1, 2]

    def test_n_equal_one(self):
        # n=1: pattern = [sampled]; j from 6-1-1 = 4: hist[4] == 1 ->
        # copy_max = min(2, 6 - 5) = 1 >= 1 -> [9]
        assert ngram_simple_draft(1, 2, [5, 1, 7, 8, 1, 9], 1) == [9]

    def test_eog_tokens_are_plain_tokens(self):
        eos = 151645
        hist = [0, 3, eos, 4, 5, 9, 9, 3]
        # pattern [3, eos] found at 1 -> copy_max = min(2, 8-3) = 2
        assert ngram_simple_draft(2, 2, hist, eos) == [4, 5]

    def test_n_max_is_size_m_and_accept_is_noop(self):
        s = NgramSimple(3, 7)
        assert s.n_max == 7 and s.type is SpecType.NGRAM_SIMPLE
        s.accept(3, False)

    @settings(max_examples=300, deadline=None)
    @given(st.integers(1, 4), st.integers(1, 5), st.integers(2, 4), st.data())
    def test_matches_oracle(self, n, m, alpha, data):
        hist = data.draw(st.lists(st.integers(0, alpha - 1), max_size=120))
        sampled = data.draw(st.integers(0, alpha - 1))
        s = NgramSimple(n, m)
        # grow the same list through the cache, as the generation loop does
        for L in sorted({0, len(hist) // 3, len(hist) // 2, len(hist)}):
            assert s.draft(req(hist[:L], sampled)) == oracle_simple(n, m, hist[:L], sampled)


# =====================================================================
# ngram-map-k / k4v
# =====================================================================

class TestNgramMapK:
    def test_hash_wraps_like_uint32(self):
        from speculators.ngram_map import _hash_windows, ngram_map_hash
        toks = [-1, -5, 2**31 - 1, -2**31, 7, 0, 3]
        # negative tokens enter modulo 2^32 (int32 -> unsigned long -> uint32)
        assert ngram_map_hash([-1], 0, 1) == U32 - 1
        assert ngram_map_hash(toks, 1, 3) == map_slot(toks[1:4], U32)
        vec = _hash_windows(np.array(toks, dtype=np.int64), 0, 4, 3).tolist()
        assert vec == [map_slot(toks[i:i + 3], U32) for i in range(5)]

    def test_too_short_history_touches_nothing(self):
        # needs cur_len >= 2n + m = 7 (n=2, m=3)
        st_ = NgramMapState(2, 3, key_only=True, min_hits=1)
        st_.begin([])
        assert st_.draft([1, 2, 3, 1, 2, 3], 1) == []
        assert st_.idx_last_check == 0 and not st_.key_map.any() and st_.keys == []

    def test_empty_history(self):
        s = NgramMap(2, 3, 1, key_only=True)
        s.begin([])
        assert s.draft(req([], 5)) == []

    def test_no_match(self):
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin([])
        assert st_.draft([0, 1, 2, 3, 4, 5, 6], 9) == []
        assert st_.keys == [] and not st_.last_draft_created

    def test_key_map_first_entry_beats_newer_occurrences(self):
        # n=2, m=1, begin([]) so size_last_begin = 0.
        # draft 1: hist1 = 0 1 2 3 9 9 9 1 (len 8), sampled 2 -> key [1, 2]
        #   lim = 8-2-1-1 = 4; key_map empty; range 2 is j = 4..1 descending:
        #   j=1 matches -> draft hist1[3:4] = [3]; j = 4,3,2,1 are hashed
        #   and key_map_last_idx = 4.
        ngrams = [[9, 9], [3, 9], [2, 3], [1, 2]]
        assert_distinct_slots(ngrams)
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin([])
        hist1 = [0, 1, 2, 3, 9, 9, 9, 1]
        assert st_.draft(hist1, 2) == [3]
        assert sorted(v for v in st_.key_map.tolist() if v) == [1, 2, 3, 4]
        assert st_.key_map[map_slot([1, 2])] == 1 and st_.key_map_last_idx == 4
        # draft 2: hist2 adds "2 5 1 2 6 7 1": [1, 2] now also at 7 and 10.
        #   The hash lookup finds 1 (1 < lim = 15-4 = 11, tokens verified),
        #   so the linear searches are skipped: the draft is still [3].
        hist2 = hist1 + [2, 5, 1, 2, 6, 7, 1]
        assert st_.draft(hist2, 2) == [3]
        assert st_.key_map_last_idx == 11
        # a fresh map searches linearly from j = 11 down: j = 10 -> [6]
        fresh = NgramMapState(2, 1, key_only=True, min_hits=1)
        fresh.begin([])
        assert fresh.draft(hist2, 2) == [6]

    def test_prompt_tail_gap_is_never_searched(self):
        # begin(prompt of 8): size_last_begin = 8, n=2, m=1 -> n+m+1 = 4.
        # Range 1 is j = 8-4 = 4 down to 1; range 2 is j > 8 up to lim.
        # The only [1, 2] is at 5: in neither range -> no draft.
        prompt = [0, 3, 3, 3, 3, 1, 2, 7]
        hist = prompt + [3, 3, 3, 1]          # len 12, lim = 12-4 = 8
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin(prompt)
        assert st_.draft(hist, 2) == []
        # with begin([]) the whole history is range 2 -> j=5 -> hist[7:8]
        st2 = NgramMapState(2, 1, key_only=True, min_hits=1)
        st2.begin([])
        assert st2.draft(hist, 2) == [7]

    def test_accept_shortens_and_zero_disables_the_key(self):
        # n=2, m=3: hist 0 1 2 7 8 9 5 5 1 (len 9 >= 7), sampled 2
        # lim = 9-6 = 3, j=1 matches -> draft hist[3:6]; the key's value 0
        # starts with n_accepted = m = 3. (The later drafts find 1 through
        # key_map, which also holds [7, 8] from 3 and [2, 7] from 2.)
        assert_distinct_slots([[7, 8], [2, 7], [1, 2]])
        s = NgramMap(2, 3, 1, key_only=True)
        s.begin([])
        hist = [0, 1, 2, 7, 8, 9, 5, 5, 1]
        assert s.draft(req(hist, 2)) == [7, 8, 9]
        s.accept(3, is_other=True)          # not our draft: ignored
        assert s.map.keys[0].values[0].n_accepted == 3
        s.accept(2, is_other=False)
        assert s.draft(req(hist, 2)) == [7, 8]   # min(m, 2)
        assert s.map.keys[0].key_num == 2
        s.accept(0, is_other=False)
        # min(m, 0) = 0 tokens; the draft is still "created" (accept would
        # update it) but empty, so the chain moves on - forever for this key
        assert s.draft(req(hist, 2)) == []
        assert s.map.last_draft_created and s.map.keys[0].key_num == 3

    def test_key_only_ignores_min_hits(self):
        st_ = NgramMapState(2, 1, key_only=True, min_hits=5)
        st_.begin([])
        assert st_.draft([0, 1, 2, 3, 9, 9, 9, 1], 2) == [3]

    def test_shrinking_begin_drops_keys_and_hashes(self):
        # n=2, m=1. A = 0..9 (len 10); begin(A) -> size_last_begin = 10.
        A = list(range(10))
        assert_distinct_slots([[j, j + 1] for j in range(1, 7)])
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin(A)
        # draft a: A+[1] (len 11), key [1,2]; lim = 7; range 1 = j 6..1
        #   (10-4 = 6): j=1 matches -> key 0 at 1, draft A[3:4] = [3];
        #   hashes 6..1 stored; range 2 = j 11..7 is empty; kml = 7.
        assert st_.draft(A + [1], 2) == [3]
        # draft b: A+[1,2,5] (len 13), key [5,6]: key_map has 5 (< lim 9)
        #   -> key 1 at 5, draft [7]. kml = 9, idx_last_check = 13.
        assert st_.draft(A + [1, 2, 5], 6) == [7]
        assert [k.key_idx for k in st_.keys] == [1, 5]
        # begin(A[:7]): 7 < idx_last_check 13; size_last_begin 10 > 7 so
        # cleanup = 7 - n - m = 4: hashes >= 4 and keys at >= 4 go,
        # key_map_last_idx = 3.
        st_.begin(A[:7])
        assert [k.key_idx for k in st_.keys] == [1]
        assert sorted(v for v in st_.key_map.tolist() if v) == [1, 2, 3]
        assert st_.key_map_last_idx == 3
        assert st_.size_last_begin == 7 and st_.idx_last_check == 7

    def test_shrink_from_last_begin_drops_everything_generated(self):
        # begin([]) then a draft at len 8: size_last_begin = 0. A begin with
        # 6 tokens (< idx_last_check 8) cleans up from size_last_begin = 0:
        # every hash and key goes.
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin([])
        assert st_.draft([0, 1, 2, 3, 9, 9, 9, 1], 2) == [3]
        st_.begin([0, 1, 2, 3, 9, 9])
        assert st_.keys == [] and not st_.key_map.any() and st_.key_map_last_idx == 0

    def test_growing_begin_keeps_everything(self):
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin([])
        assert st_.draft([0, 1, 2, 3, 9, 9, 9, 1], 2) == [3]
        before = st_.key_map.copy()
        st_.begin([0, 1, 2, 3, 9, 9, 9, 1, 2, 4])   # 10 >= 8: no cleanup
        assert len(st_.keys) == 1 and (st_.key_map == before).all()
        assert st_.size_last_begin == 10

    def test_history_shrinking_without_begin_raises(self):
        st_ = NgramMapState(2, 1, key_only=True, min_hits=1)
        st_.begin([])
        st_.draft([0, 1, 2, 3, 9, 9, 9, 1], 2)
        with pytest.raises(RuntimeError):
            st_.draft([0, 1, 2, 3, 9, 9, 9], 1)   # GGML_ABORT in the reference


class TestNgramMapK4V:
    def test_min_hits(self):
        # n=2, m=1, min_hits=3, hist 0 1 2 3 9 9 9 1, key [1, 2] at 1.
        # key_num counts every draft call that matched: 1, 2 -> no draft; 3 ->
        # statistics over [0, 1]: one occurrence (1), value [3] -> draft [3].
        st_ = NgramMapState(2, 1, key_only=False, min_hits=3)
        st_.begin([])
        hist = [0, 1, 2, 3, 9, 9, 9, 1]
        assert st_.draft(hist, 2) == []
        assert st_.keys[0].key_num == 1 and st_.keys[0].values[0].value_idx == 0
        assert st_.draft(hist, 2) == []
        assert st_.draft(hist, 2) == [3]
        assert st_.keys[0].key_num == 3 and st_.keys[0].stat_idx == 1
        v = st_.keys[0].values[0]
        assert (v.value_idx, v.value_num, v.n_accepted) == (3, 1, 1)

    def test_no_dominant_value_then_statistics_on_accept(self):
        # n=2, m=1, hist 0 1 2 5 1 2 6 9 9 1 (len 10), sampled 2, begin([]):
        # lim = 6; linear search 6..1 finds j=4 -> new key at 4, key_num 1.
        # Statistics over [0, 4]: [1,2] at 1 -> value [5] (slot 0, idx 3);
        # at 4 -> value [6] differs -> slot 1 (idx 6). Counts 1/1:
        # max 1 (slot 0), others 1, 1 < 2*1 -> no draft.
        assert_distinct_slots([[6, 9], [2, 6], [1, 2], [5, 1], [2, 5]])
        st_ = NgramMapState(2, 1, key_only=False, min_hits=1)
        st_.begin([])
        hist = [0, 1, 2, 5, 1, 2, 6, 9, 9, 1]
        assert st_.draft(hist, 2) == []
        assert not st_.last_draft_created
        vals = st_.keys[0].values
        assert [(v.value_idx, v.value_num) for v in vals] == [(3, 1), (6, 1), (0, 0), (0, 0)]
        # Append "2 5 1": [1, 2] also at 10 (followed by 5). The hashes were
        # stored descending (6..1), so key_map holds 4 for [1, 2], not 1;
        # lookup gives match_pos = 4 (< lim 9). Statistics restart at
        # stat_idx = 4 inclusive: the value after 4 ([6]) counts again ->
        # slot 1 = 2. max 2 (slot 1), others 1: 2 >= 2 -> draft after 4.
        hist2 = hist + [2, 5, 1]
        assert st_.draft(hist2, 2) == [6]
        assert [(v.value_idx, v.value_num) for v in vals] == [(3, 1), (6, 2), (0, 0), (0, 0)]
        assert st_.last_draft_value_idx == 1
        st_.accept(0)                    # stored in slot 1's n_accepted
        assert vals[1].n_accepted == 0 and vals[0].n_accepted == 1
        # again: slot 1 = 3, dominant, but min(m, 0) = 0 tokens
        assert st_.draft(hist2, 2) == []
        assert st_.last_draft_created and vals[1].value_num == 3

    def test_draft_comes_from_match_pos_not_from_the_winning_value(self):
        # n=2, m=1, hist 0 1 2 5 1 2 5 1 2 6 9 9 1 (len 13), sampled 2.
        # lim = 9: linear search 9..1 finds j=7. Statistics over [0, 7]:
        # at 1 -> [5] slot 0; at 4 -> [5] slot 0 (2); at 7 -> [6] slot 1 (1).
        # max 2 (slot 0), others 1: 2 >= 2 -> draft. The reference copies
        # the tokens after match_pos (7), i.e. [6] - not slot 0's [5].
        st_ = NgramMapState(2, 1, key_only=False, min_hits=1)
        st_.begin([])
        hist = [0, 1, 2, 5, 1, 2, 5, 1, 2, 6, 9, 9, 1]
        assert st_.draft(hist, 2) == [6]
        assert st_.last_draft_value_idx == 0
        assert [(v.value_idx, v.value_num) for v in st_.keys[0].values][:2] == [(3, 2), (9, 1)]

    def test_fifth_value_is_not_counted(self):
        # n=1, m=1; history 0 1 2 1 3 1 4 1 5 1 6 7 7 1.
        # Take sampled 1 -> key [1] (n=1: key = [sampled]). len 14,
        # lim = 14-1-1-1 = 11. Linear search 11..1: hist[9] = 1 -> match 9.
        # Occurrences of [1] in [0, 9]: 1 3 5 7 9 -> values [2] [3] [4] [5]
        # fill the four slots; [6] after 9 finds no slot and is dropped.
        # Counts 1/1/1/1: max 1, others 3 -> no draft.
        st_ = NgramMapState(1, 1, key_only=False, min_hits=1)
        st_.begin([])
        hist = [0, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 7, 7, 1]
        assert st_.draft(hist, 1) == []
        vals = st_.keys[0].values
        assert [(v.value_idx, v.value_num) for v in vals] == [(2, 1), (4, 1), (6, 1), (8, 1)]

    def test_shrinking_begin_shifts_values(self):
        # White-box: one key at 1 with values (idx, num, n_acc)
        #   (6,2,3) (2,1,4) (8,1,5) (0,0,7), cleanup index 5.
        # Reference loop j = 3..0: j=3 unused; j=2 (8 >= 5): shift left,
        #   slot 3 cleared (idx, num = 0; n_acc 7 kept) -> (6,2,3)(2,1,4)(0,0,7)(0,0,7)
        # j=1 keeps (2 < 5); j=0 (6 >= 5): shift -> (2,1,4)(0,0,7)(0,0,7)(0,0,7)
        # values[0] is used -> the key stays. A second key whose only value
        # is at 7 loses it and is deleted.
        st_ = NgramMapState(2, 1, key_only=False, min_hits=1)
        k1 = NgramMapKey(1, 1)
        k1.values = [NgramMapValue(6, 2, 3), NgramMapValue(2, 1, 4), NgramMapValue(8, 1, 5),
                     NgramMapValue(0, 0, 7)]
        k2 = NgramMapKey(2, 1)
        k2.values = [NgramMapValue(7, 1, 1)] + [NgramMapValue(0, 0, 1) for _ in range(3)]
        st_.keys = [k1, k2]
        st_.size_last_begin, st_.idx_last_check = 5, 20
        st_.begin(list(range(12)))   # 12 < 20, cleanup = size_last_begin = 5
        assert len(st_.keys) == 1
        assert [(v.value_idx, v.value_num, v.n_accepted) for v in st_.keys[0].values] == \
            [(2, 1, 4), (0, 0, 7), (0, 0, 7), (0, 0, 7)]

    def test_types_and_n_max(self):
        assert NgramMap(3, 9, 1, key_only=True).type is SpecType.NGRAM_MAP_K
        s = NgramMap(3, 9, 1, key_only=False)
        assert s.type is SpecType.NGRAM_MAP_K4V and s.name == "ngram-map-k4v" and s.n_max == 9


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 3), st.booleans(), st.integers(1, 3),
       st.sampled_from([3, 16, 1024]), st.integers(1, 3), st.data())
def test_ngram_map_matches_oracle(n, m, key_only, min_hits, hsize, alpha, data):
    seqs = [data.draw(st.lists(st.integers(0, alpha), min_size=40, max_size=160)) for _ in range(2)]
    mine = NgramMapState(n, m, key_only, min_hits, hash_map_size=hsize)
    ref = OracleMap(n, m, key_only, min_hits, hsize)
    seq = seqs[0]
    L = 0
    for _ in range(data.draw(st.integers(1, 4))):
        # begin with any prefix of either sequence (shrinks, grows, rewrites)
        seq = seqs[data.draw(st.integers(0, 1))]
        L = data.draw(st.integers(0, len(seq)))
        mine.begin(seq[:L])
        ref.begin(seq[:L])
        assert map_state(mine) == oracle_map_state(ref)
        for _ in range(data.draw(st.integers(0, 8))):
            L = data.draw(st.integers(L, len(seq)))
            sampled = data.draw(st.integers(0, alpha))
            d = mine.draft(seq[:L], sampled)
            assert d == ref.draft(seq[:L], sampled)
            if d and data.draw(st.booleans()):
                k = data.draw(st.integers(0, len(d)))
                mine.accept(k)
                ref.accept(k)
            assert map_state(mine) == oracle_map_state(ref)


def test_ngram_map_long_repetitive_history_matches_oracle():
    # exercises the vectorised statistics path (hundreds of key occurrences)
    rng = random.Random(7)
    hist = [rng.choice([1, 1, 1, 2, 3]) for _ in range(1500)]
    for key_only in (False, True):
        mine = NgramMapState(2, 3, key_only, 1)
        ref = OracleMap(2, 3, key_only, 1)
        mine.begin(hist[:1000])
        ref.begin(hist[:1000])
        for L in range(1000, 1500, 37):
            d = mine.draft(hist[:L], hist[L])
            assert d == ref.draft(hist[:L], hist[L])
            if d:
                mine.accept(len(d) // 2)
                ref.accept(len(d) // 2)
        assert map_state(mine) == oracle_map_state(ref)


# =====================================================================
# ngram-mod
# =====================================================================

class TestNgramModTable:
    def test_hash_is_64bit_polynomial_mod_size(self):
        t = NgramModTable(n=3)
        for g in ([1, 2, 3], [0, 0, 0], [2**31 - 1, 5, 7], [-1, 5, 2]):
            assert t.idx(g) == mod_slot(g)
        # a negative token is sign-extended to size_t: n=1, [-1] -> 2^64 - 1
        assert NgramModTable(n=1).idx([-1]) == (U64 - 1) % TABLE_SIZE == TABLE_SIZE - 1
        # the vectorised hashes agree with the closed form
        rng = np.random.default_rng(0)
        arr = rng.integers(-5, 2**31 - 1, 300)
        got = t.slots(arr, 0, 298).tolist()
        assert got == [mod_slot(arr[i:i + 3].tolist()) for i in range(298)]

    def test_add_get_used_reset(self):
        # n=1: the slot of [t] is t % size. size 16:
        t = NgramModTable(n=1, size=16)
        assert t.size() == 16 and t.size_bytes() == 64 and t.get_n() == 1
        t.add([1, 2])     # slot 1 <- 2, used 1
        t.add([17, 3])    # slot 1 again (17 % 16): overwritten, used 1
        t.add([2, 1])     # slot 2 <- 1, used 2
        assert (t.get([1]), t.get([2]), t.get([3]), t.get_used()) == (3, 1, -1, 2)
        t.reset()
        assert t.get_used() == 0 and t.get([1]) == -1

    def test_add_range_matches_sequential_adds(self):
        rng = random.Random(3)
        for size in (7, 64, 1000):
            for n in (1, 2, 4):
                toks = [rng.choice([-1, 0, 1, 2, 3, 5, 2**31 - 1]) for _ in range(200)]
                vec, seq = NgramModTable(n, size), NgramModTable(n, size)
                arr = np.array(toks, dtype=np.int64)
                vec.add_range(arr, 3, 150)
                for i in range(3, 150):
                    seq.add(toks, i)
                assert vec.used == seq.used and (vec.entries == seq.entries).all()
                # without EMPTY among the values (the fast path)
                toks = [x for x in toks if x != -1]
                vec, seq = NgramModTable(n, size), NgramModTable(n, size)
                vec.add_range(np.array(toks, dtype=np.int64), 0, len(toks) - n)
                for i in range(len(toks) - n):
                    seq.add(toks, i)
                assert vec.used == seq.used and (vec.entries == seq.entries).all()


class TestNgramMod:
    # With n_match = 1 the slot of the 1-gram [t] is t % size (res = t), so
    # with size 1024 and tokens < 1024 there are no collisions: every
    # expectation below can be read off the token sequence.

    def test_begin_short_prompt(self):
        s = NgramMod(n_match=3, n_max=4, n_min=0, size=1024)
        s.begin([1, 2])                   # len < n: nothing
        assert s.mod.get_used() == 0 and s.i_last == 0

    def test_begin_adds_all_but_the_last_ngram_and_overwrites(self):
        # prompt 1 2 1 3: adds [1]->2, [2]->1, [1]->3 (range(0, 4-1)); the
        # last 1-gram [3] has no successor. Slot 1 ends as 3; used = 2.
        s = NgramMod(n_match=1, n_max=4, n_min=0, size=1024)
        s.begin([1, 2, 1, 3])
        assert s.i_last == 3 and s.mod.get_used() == 2
        assert (s.mod.get([1]), s.mod.get([2]), s.mod.get([3])) == (3, 1, -1)

    def test_draft_window_and_limits(self):
        # n=2, table from prompt 4 5 6 7 8: [4,5]->6 [5,6]->7 [6,7]->8.
        assert_distinct_slots([[4, 5], [5, 6], [6, 7], [7, 8]], slot=mod_slot)
        s = NgramMod(n_match=2, n_max=2, n_min=0, size=TABLE_SIZE)
        s.begin([4, 5, 6, 7, 8])
        # window = last n-1 prompt tokens + id_last = [4, 5] -> 6, 7 (n_max 2)
        assert s.draft(req([9, 4], 5)) == [6, 7] and s.n_draft_last == 2
        s.n_max_param = 10
        # chain 6, 7, 8 then [7, 8] is empty: 3 >= n_min -> [6, 7, 8]
        assert s.draft(req([9, 4], 5)) == [6, 7, 8] and s.n_draft_last == 3
        s.n_min = 4                       # the chain breaks at i = 3 < 4
        assert s.draft(req([9, 4], 5)) == [] and s.n_draft_last == 0
        assert s.draft(req([9], 5)) == []  # cur_len < n

    def test_self_loop_fills_n_max(self):
        s = NgramMod(n_match=1, n_max=5, n_min=5, size=1024)
        s.begin([7, 7])                   # [7] -> 7
        assert s.draft(req([7, 7], 7)) == [7] * 5

    def test_zero_n_max_drafts_nothing(self):
        s = NgramMod(n_match=1, n_max=0, n_min=0, size=1024)
        s.begin([7, 7])
        assert s.draft(req([7, 7], 7)) == [] and s.n_draft_last == 0

    def test_occupancy_reset_at_begin(self):
        # n=1, size 8: prompt 1 2 3 -> slots 1, 2 used: 2/8 = 0.25, not > 0.25
        s = NgramMod(n_match=1, n_max=4, n_min=0, size=8)
        s.begin([1, 2, 3])
        assert s.mod.get_used() == 2
        # the table persists across begins: 1 2 3 4 adds slot 3 -> 3/8 > 0.25
        s.begin([1, 2, 3, 4])
        assert s.mod.get_used() == 0 and s.i_last == 3   # i_last is kept

    def test_chunked_adding(self):
        # n=1, begin(0 1 2 3) -> i_last = 3 (positions 0..2 added).
        s = NgramMod(n_match=1, n_max=1, n_min=0, size=1024)
        hist = list(range(100))
        s.begin(hist[:4])
        assert s.mod.get_used() == 3
        # cur_len 35: i_last + 32 = 35 < 35 is false -> nothing added
        s.draft(req(hist[:35], 35))
        assert s.mod.get_used() == 3 and s.i_last == 3
        # cur_len 36: 35 < 36 -> add positions 3 .. 34 (i < 36 - 1)
        s.draft(req(hist[:36], 36))
        assert s.mod.get_used() == 35 and s.i_last == 35
        assert s.mod.get([34]) == 35 and s.mod.get([35]) == -1

    def test_low_acceptance_streak_resets(self):
        s = NgramMod(n_match=1, n_max=4, n_min=0, size=1024)
        s.begin([1, 1])                   # [1] -> 1: drafts 1 1 1 1
        draft = lambda: s.draft(req([1, 1], 1))  # noqa: E731
        for _ in range(4):
            assert draft() == [1, 1, 1, 1]
            s.accept(0, False)            # 0/4 < 0.25
        assert s.n_low == 4
        draft()
        s.accept(1, False)                # 1/4 = 0.25 is not low: streak over
        assert s.n_low == 0
        for _ in range(4):
            draft()
            s.accept(0, False)
        draft()
        s.accept(0, True)                 # another speculator's draft: ignored
        assert s.n_low == 4 and s.mod.get_used() == 1
        s.accept(0, False)                # fifth low in a row -> reset
        assert (s.n_low, s.i_last, s.mod.get_used()) == (0, 0, 0)
        assert draft() == []              # cur_len 2: 0 + 32 < 2 false, table empty

    def test_accept_without_draft_is_ignored(self):
        s = NgramMod(n_match=1, n_max=4, n_min=0, size=1024)
        s.begin([1, 2])
        assert s.draft(req([5], 6)) == []
        for _ in range(6):
            s.accept(0, False)            # n_draft_last == 0: no effect
        assert s.n_low == 0 and s.mod.get_used() == 1

    def test_readd_after_reset(self):
        # after a reset i_last = 0, so the next draft with cur_len > 32 adds
        # every n-gram of the history again
        s = NgramMod(n_match=1, n_max=2, n_min=0, size=1024)
        hist = list(range(40))
        s.begin(hist)
        s.mod.reset()
        s.i_last = 0
        assert s.draft(req(hist, 0)) == [1, 2]   # [0] -> 1, [1] -> 2
        assert s.mod.get_used() == 39 and s.i_last == 39

    def test_default_table(self):
        s = NgramMod(n_match=24, n_max=64, n_min=48)
        assert s.mod.size() == 4 * 1024 * 1024 and s.mod.entries.dtype == np.int32
        assert s.n_max == 64 and s.type is SpecType.NGRAM_MOD


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(0, 6), st.integers(0, 6), st.sampled_from([8, 61, 1024]),
       st.data())
def test_ngram_mod_matches_oracle(n, n_max, n_min, size, data):
    alphabet = st.sampled_from([-1, 0, 1, 2, 3, 2**31 - 1])
    seqs = [data.draw(st.lists(alphabet, min_size=0, max_size=150)) for _ in range(2)]
    mine = NgramMod(n, n_max, n_min, size=size)
    ref = OracleMod(n, n_max, n_min, size)
    for _ in range(data.draw(st.integers(1, 3))):
        seq = seqs[data.draw(st.integers(0, 1))]
        L = data.draw(st.integers(0, len(seq)))
        mine.begin(seq[:L])
        ref.begin(seq[:L])
        for _ in range(data.draw(st.integers(0, 10))):
            L = data.draw(st.integers(0, len(seq)))
            sampled = data.draw(alphabet)
            d = mine.draft(req(seq[:L], sampled))
            assert d == ref.draft(seq[:L], sampled)
            k = data.draw(st.integers(0, max(0, len(d))))
            other = data.draw(st.booleans())
            mine.accept(k, other)
            ref.accept(k, other)
            assert (mine.i_last, mine.n_draft_last, mine.n_low) == \
                (ref.i_last, ref.n_draft_last, ref.n_low)
        assert mine.mod.used == ref.used and mine.mod.entries.tolist() == ref.entries


# =====================================================================
# the chain
# =====================================================================

def small_params():
    p = SpecParams(types=parse_types("ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod"))
    p.ngram_simple = NgramMapParams(size_n=2, size_m=3, min_hits=1)
    p.ngram_map_k = NgramMapParams(size_n=2, size_m=3, min_hits=1)
    p.ngram_map_k4v = NgramMapParams(size_n=2, size_m=3, min_hits=1)
    p.ngram_mod = NgramModParams(n_match=2, n_max=4, n_min=1)
    return p


class TestChain:
    def test_from_params_builds_in_priority_order(self):
        chain = SpeculatorChain.from_params(
            SpecParams(types=parse_types("ngram-mod,ngram-map-k4v,ngram-simple,ngram-map-k")))
        assert [s.name for s in chain.speculators] == \
            ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"]
        assert chain.skipped == {}
        # n_max per type from the defaults: size_m 48, ngram_mod.n_max 64
        assert [s.n_max for s in chain.speculators] == [48, 48, 48, 64]
        assert chain.n_max == 64

    def test_first_non_empty_draft_wins(self):
        chain = SpeculatorChain.from_params(small_params())
        chain.begin([4, 5, 6])            # ngram-mod learns [4, 5] -> 6
        calls = lambda: {k: v.n_call_draft for k, v in chain.stats().items()}  # noqa: E731

        # 1. only ngram-mod can draft: history too short for the others
        #    (simple needs > 6, the maps >= 7); window [4, 5] -> 6, then
        #    [5, 6] -> EMPTY at i=1 >= n_min 1 -> [6]
        assert chain.draft(req([3, 4], 5)) == [6]
        assert chain.last_drafter == "ngram-mod"
        chain.accept(1)

        # 2. hist = 4 5 6 0 1 2 7 8 9 5 5 1 2 1 (len 14), sampled 2.
        #    simple: pattern [1, 2], j from 14-3 = 11: hit at 11, copy_max =
        #    min(3, 14-13) = 1 < n -> nothing. map-k: size_last_begin = 3,
        #    lim = 14-6 = 8, range 2 is j = 8..4: [1, 2] at 4 -> hist[6:9].
        #    k4v and mod are not asked.
        hist = [4, 5, 6, 0, 1, 2, 7, 8, 9, 5, 5, 1, 2, 1]
        assert chain.draft(req(hist, 2)) == [7, 8, 9]
        assert chain.last_drafter == "ngram-map-k"
        assert calls() == {"ngram-simple": 2, "ngram-map-k": 2, "ngram-map-k4v": 1, "ngram-mod": 1}
        chain.accept(2)
        mapk = chain.speculators[1]
        assert mapk.map.keys[0].values[0].n_accepted == 2
        s = chain.stats()["ngram-map-k"]
        assert (s.n_gen_drafts, s.n_gen_tokens, s.n_acc_tokens, s.n_acc_tokens_per_pos) == (1, 3, 2, [1, 1])

        # 3. simple drafts: hist2 = 4 5 6 0 1 2 7 8 9 5 5 1 (len 12 > 6),
        #    pattern [1, 2], j from 12-3 = 9 down: j=4 -> copy_max =
        #    min(3, 12-6) = 3 -> [7, 8, 9]; the maps are not called at all,
        #    and the request's n_max truncates.
        hist2 = [4, 5, 6, 0, 1, 2, 7, 8, 9, 5, 5, 1]
        assert chain.draft(req(hist2, 2, n_max=2)) == [7, 8]
        assert chain.last_drafter == "ngram-simple"
        assert calls() == {"ngram-simple": 3, "ngram-map-k": 2, "ngram-map-k4v": 1, "ngram-mod": 1}
        chain.accept(0)
        assert mapk.map.keys[0].values[0].n_accepted == 2   # is_other: untouched

    def test_nobody_drafts(self):
        chain = SpeculatorChain.from_params(small_params())
        chain.begin([])
        assert chain.draft(req([1, 2, 3], 4)) == []
        assert chain.last_drafter is None
        chain.accept(0)


@pytest.mark.parametrize("key_only", [True, False])
def test_a_controller_cut_does_not_cap_ngram_map_drafts(key_only):
    """The controller verifies only the first tokens of a draft; when those are all accepted,
    the key's next draft is as long as before (llama.cpp, which never cuts, would have
    verified it whole). A rejection inside the cut still caps it, as llama.cpp's would."""
    m = NgramMap(size_n=2, size_m=6, min_hits=1, key_only=key_only)
    chain = SpeculatorChain([m])
    hist = [9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 1]
    chain.begin(hist)
    req = DraftRequest(prompt=hist, id_last=2, pos0=len(hist))
    full, _ = chain.ask(m, req)
    assert len(full) >= 4
    for _ in range(3):
        d, _ = chain.ask(m, req)
        chain.commit(m, d[:2], n_proposed=len(d))
        chain.accept(2)
        again, _ = chain.ask(m, req)
        assert again == full
    d, _ = chain.ask(m, req)
    chain.commit(m, d[:3], n_proposed=len(d))
    chain.accept(1)          # the second token was wrong: that the key remembers
    assert len(chain.ask(m, req)[0]) == 1
