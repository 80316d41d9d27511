"""ngram-map-k / -k4v, pinned down where mutation testing found them loose (tools/mutation.py).

``tests/test_ngram_speculators.py`` checks the state against a loop-by-loop transliteration of
the reference (``OracleMap``) on random histories. Those histories rarely reach the paths that
only long conversations take: more than 8 keys (the vectorised key search), more than 16
occurrences of a key (the vectorised value count) or 16 positions to hash (the vectorised
key_map fill). Here each of those is checked directly against the reference's rule, and the
begin/accept/draft edge cases the random runs miss are worked by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from speculators.base import DraftRequest
from speculators.chain import SpeculatorChain
from speculators.ngram_map import (HASH_MAP_SIZE, MAX_VALUE_COUNT, NgramMap, NgramMapKey, NgramMapState,
                                   NgramMapValue, _int16, ngram_map_hash)
from speculators.ngram_simple import TokenHistory
from speculators.params import SpecParams
from tests.test_ngram_speculators import OracleMap, map_state, oracle_map_state


def req(prompt, id_last):
    return DraftRequest(prompt=list(prompt), id_last=id_last, pos0=len(prompt))


def vals_of(key):
    return [(v.value_idx, v.value_num, v.n_accepted) for v in key.values]


# -- small pieces -----------------------------------------------------------------------------

@pytest.mark.parametrize("x, expected", [(0, 0), (5, 5), (0x7FFF, 32767), (0x8000, -32768), (0x8001, -32767),
                                         (0xFFFF, -1), (-1, -1), (70000, 4464), (-32768, -32768)])
def test_int16_is_the_c_cast(x, expected):
    assert _int16(x) == expected


def test_a_value_slot_starts_unused():
    assert repr(NgramMapValue()) == "NgramMapValue(0, 0, -1)"


def test_the_chain_builds_both_types_with_their_parameters():
    p = SpecParams.from_types("ngram-map-k,ngram-map-k4v")
    p.ngram_map_k.size_n, p.ngram_map_k.size_m, p.ngram_map_k.min_hits = 3, 5, 2
    p.ngram_map_k4v.size_n, p.ngram_map_k4v.size_m, p.ngram_map_k4v.min_hits = 2, 4, 3
    k, k4v = SpeculatorChain.from_params(p).speculators
    assert (k.name, k.map.size_key, k.map.size_value, k.map.min_hits, k.map.key_only) == ("ngram-map-k", 3, 5, 2, True)
    assert (k4v.name, k4v.map.size_key, k4v.map.size_value, k4v.map.min_hits, k4v.map.key_only) == \
        ("ngram-map-k4v", 2, 4, 3, False)
    assert (k.context_key, k4v.context_key, k.n_max, k4v.n_max) == (3, 2, 5, 4)


def test_a_new_state_is_the_references():
    st = NgramMapState(2, 3, key_only=False, min_hits=1)
    assert map_state(st) == oracle_map_state(OracleMap(2, 3, False, 1))
    assert (st.last_draft_created, st.last_draft_key_idx, st.last_draft_value_idx) == (False, 0, 0)
    # llama.cpp's table of uint32 positions: 1 MiB
    assert st.key_map.dtype == np.uint32 and st.key_map.nbytes == 4 * HASH_MAP_SIZE
    assert st._key_idx_cache is None


# -- map-k and map-k4v differ where no continuation dominates ------------------------------------

def test_map_k_drafts_where_map_k4v_sees_no_dominant_value():
    hist = [0, 1, 2, 5, 1, 2, 6, 9, 9, 1]        # [1, 2] -> 5, then [1, 2] -> 6
    k = NgramMap(size_n=2, size_m=1, min_hits=1, key_only=True)
    k4v = NgramMap(size_n=2, size_m=1, min_hits=1, key_only=False)
    k.begin([]), k4v.begin([])
    assert k.draft(req(hist, 2)) == [6]
    assert k4v.draft(req(hist, 2)) == []


def test_accepts_before_any_draft_are_ignored():
    s = NgramMap(size_n=2, size_m=3, min_hits=1, key_only=True)
    s.accept(2, False)
    s.begin([])
    s.accept(2, False)
    hist = [0, 1, 2, 3, 4, 5, 6, 7, 1]
    assert s.draft(req(hist, 2)) == [3, 4, 5]


def test_an_accept_after_begin_dropped_the_drafting_key_is_ignored():
    st = NgramMapState(2, 2, key_only=True, min_hits=1)
    st.begin([])
    hist = [0, 1, 2, 3, 4, 5, 6, 1]
    assert st.draft(hist, 2) == [3, 4]
    st.begin([0, 1])                              # shorter: cleanup 0, every key dropped
    assert st.keys == []
    st.accept(1)                                  # its key is gone: nothing to remember
    assert st.keys == []


def test_a_history_that_shrinks_without_begin_is_an_error():
    st = NgramMapState(2, 2, key_only=True, min_hits=1)
    st.begin([])
    st.draft(list(range(20)), 3)
    with pytest.raises(RuntimeError) as e:
        st.draft(list(range(10)), 3)
    assert str(e.value) == "ngram-map: idx_last_check > cur_len: 20 > 10 (history shrank without begin())"


# -- begin ---------------------------------------------------------------------------------------

def _key(key_idx, values, m=1):
    k = NgramMapKey(key_idx, m)
    k.values = [NgramMapValue(*v) for v in values]
    return k


def test_begin_removes_values_at_and_after_the_cleanup_index_in_every_slot():
    st = NgramMapState(2, 1, key_only=False, min_hits=1)
    st.keys = [_key(1, [(2, 1, 4), (3, 1, 4), (4, 1, 4), (9, 2, 6)]),
               _key(2, [(5, 1, 1), (3, 3, 2), (0, 0, 7), (0, 0, 7)])]
    st.size_last_begin, st.idx_last_check = 5, 20
    st.begin(list(range(12)))                      # 12 < 20: cleanup = size_last_begin = 5
    assert [vals_of(k) for k in st.keys] == [
        [(2, 1, 4), (3, 1, 4), (4, 1, 4), (0, 0, 6)],   # slot 3 (9 >= 5) cleared, its n_accepted kept
        [(3, 3, 2), (0, 0, 7), (0, 0, 7), (0, 0, 7)],   # 5 == cleanup: removed too, the rest shifted
    ]


def test_begin_goes_on_past_a_dropped_key():
    st = NgramMapState(2, 1, key_only=True, min_hits=1)
    st.keys = [_key(9, [(11, 1, 1)] + [(0, 0, 1)] * 3), _key(3, [(5, 1, 1)] + [(0, 0, 1)] * 3),
               _key(7, [(8, 1, 1)] + [(0, 0, 1)] * 3), _key(1, [(2, 1, 1)] + [(0, 0, 1)] * 3)]
    st.size_last_begin, st.idx_last_check = 6, 30
    st.begin(list(range(10)))                      # cleanup 6: keys at 9 and 7 go
    assert [k.key_idx for k in st.keys] == [3, 1]


def test_begin_goes_on_past_a_key_that_lost_all_its_values():
    st = NgramMapState(2, 1, key_only=False, min_hits=1)
    st.keys = [_key(1, [(7, 1, 1)] + [(0, 0, 1)] * 3), _key(2, [(3, 2, 1)] + [(0, 0, 1)] * 3),
               _key(3, [(9, 1, 1), (4, 1, 1)] + [(0, 0, 1)] * 2)]
    st.size_last_begin, st.idx_last_check = 6, 30
    st.begin(list(range(10)))                      # cleanup 6: the first key has no value left
    assert [(k.key_idx, vals_of(k)[0]) for k in st.keys] == [(2, (3, 2, 1)), (3, (4, 1, 1))]


def test_begin_with_the_length_of_the_last_draft_keeps_the_table():
    """Only a history shorter than the last one seen is cleaned up (as the reference does):
    the same length keeps key_map and key_map_last_idx."""
    rng = np.random.default_rng(3)
    hist = rng.integers(0, 4, 60).tolist()
    mine, ref = NgramMapState(2, 2, False, 1), OracleMap(2, 2, False, 1)
    for o in (mine, ref):
        o.begin(hist[:20])
        o.draft(hist[:50], hist[50])
        o.begin(hist[:50])
    assert map_state(mine) == oracle_map_state(ref)
    assert mine.key_map_last_idx == 45


def test_the_prompt_just_long_enough_to_search_is_searched_from_position_1():
    """With size_last_begin = n + m + 2 the prompt part to search is position 1 alone."""
    n, m = 2, 1
    prompt = [0, 7, 8, 1, 2]                       # len 5 = n + m + 2: [7, 8] at 1
    hist = prompt + [3, 4, 5, 6, 7]                # len 10, key [7, 8]
    mine, ref = NgramMapState(n, m, True, 1), OracleMap(n, m, True, 1)
    mine.begin(prompt), ref.begin(prompt)
    assert mine.draft(hist, 8) == ref.draft(hist, 8) == [1]
    assert map_state(mine) == oracle_map_state(ref)


# -- the paths of long conversations ------------------------------------------------------------

def _ref_fill(km, lst, n, ranges):
    for lo, hi in ranges:
        for j in range(hi, lo - 1, -1):
            slot = ngram_map_hash(lst, j, n) % len(km)
            if km[slot] == 0:
                km[slot] = j


@pytest.mark.parametrize("ranges", [[(5, 5), (10, 30)], [(3, 2), (8, 8), (12, 40)], [(20, 19), (4, 30)],
                                    [(6, 6), (9, 9)]])
def test_key_map_fills_every_position_of_every_range(ranges):
    rng = np.random.default_rng(11)
    lst = rng.integers(0, 50, 60).tolist()
    st = NgramMapState(2, 1, key_only=True, min_hits=1, hash_map_size=1 << 12)
    arr = TokenHistory().sync(lst)[1]
    st._fill_key_map(lst, arr, ranges)
    expect = np.zeros(1 << 12, dtype=np.int64)
    _ref_fill(expect, lst, 2, ranges)
    assert st.key_map.tolist() == expect.tolist()


def _many_keys(n=2, count=12):
    """A history with ``count`` distinct 2-grams, each at a known position, and keys for them."""
    lst = [0]
    positions = []
    for i in range(count):
        positions.append(len(lst))
        lst += [100 + i, 200 + i, 0]
    lst += [100, 200, 7]                          # the first key's n-gram once more, at the end
    st = NgramMapState(n, 1, key_only=True, min_hits=1)
    st.keys = [NgramMapKey(p, 1) for p in positions]
    return st, lst, positions


def test_the_key_search_over_many_keys_finds_the_first_match():
    st, lst, positions = _many_keys()
    arr = TokenHistory().sync(lst)[1]
    assert len(st.keys) > 8
    for i in range(12):
        assert st._find_key(lst, arr, [100 + i, 200 + i]) == i
    assert st._find_key(lst, arr, [100, 201]) == -1           # no key has it
    assert st._find_key(lst, arr, [5, 5]) == -1
    st.keys.append(NgramMapKey(len(lst) - 3, 1))               # a second key with [100, 200]
    assert st._find_key(lst, arr, [100, 200]) == 0
    st2, _, _ = _many_keys()
    st2.keys = [NgramMapKey(4, 1)] + st2.keys[1:] + [NgramMapKey(len(lst) - 3, 1)]
    assert st2._find_key(lst, arr, [100, 200]) == 12           # the first key is [101, 201] now


def test_the_key_search_over_many_keys_skips_keys_past_the_end():
    st, lst, positions = _many_keys()
    arr = TokenHistory().sync(lst)[1]
    # a key whose n-gram ends exactly at the history's end matches; one past it cannot
    st.keys.append(NgramMapKey(len(lst) - 2, 1))               # [200, 7]
    st.keys.append(NgramMapKey(len(lst) - 1, 1))               # [7, ?]: past the end
    assert st._find_key(lst, arr, [200, 7]) == 12
    assert st._find_key(lst, arr, [7, 0]) == -1
    short = lst[:positions[11] + 1]                            # the last key's n-gram is cut off
    arr = TokenHistory().sync(short)[1]
    assert st._find_key(short, arr, [111, 211]) == -1
    assert st._find_key(short, arr, [110, 210]) == 10


def test_a_conversation_with_many_keys_matches_the_reference():
    """Drafts after many different tokens make more than 8 keys: the vectorised key search."""
    rng = np.random.default_rng(2)
    words = rng.integers(0, 30, 400).tolist()
    for key_only in (True, False):
        mine, ref = NgramMapState(1, 2, key_only, 1), OracleMap(1, 2, key_only, 1)
        mine.begin(words[:100]), ref.begin(words[:100])
        for L in range(100, 400, 7):
            for sampled in (words[L], words[L - 50], 3):
                d = mine.draft(words[:L], sampled)
                assert d == ref.draft(words[:L], sampled)
                if d:
                    mine.accept(len(d) - 1), ref.accept(len(d) - 1)
        assert len(mine.keys) > 8
        assert map_state(mine) == oracle_map_state(ref)


def _ref_count(lst, vals, occ, n, m):
    """The reference's count: per occurrence, the first slot that is unused (it takes the
    m-gram) or holds the same m-gram (compared within the history) gets one more."""
    def same(a, b):
        return all(a + j < len(lst) and b + j < len(lst) and lst[a + j] == lst[b + j] for j in range(m))
    for i in occ:
        vb = i + n
        for v in vals:
            if v.value_idx == 0:
                v.value_idx, v.value_num, v.n_accepted = vb, 0, m
            elif not same(vb, v.value_idx):
                continue
            v.value_num = min(v.value_num + 1, MAX_VALUE_COUNT)
            break


@pytest.mark.parametrize("slots", [
    [],                                            # all unused: the first four m-grams take them
    [(None, 2, 5)],                                # a slot whose m-gram runs past the history's end
    [(None, 2, 5), (7, 1, 2)],
    [("end", 3, 1)],                               # a slot whose m-gram ends exactly at the end
])
def test_counting_many_occurrences_matches_the_reference(slots):
    n, m = 1, 2
    rng = np.random.default_rng(9)
    lst = [0]
    for _ in range(30):                            # key 5, then one of a few m-grams
        lst += [5] + [[1, 2], [1, 3], [2, 2], [4, 1], [1, 9]][int(rng.integers(0, 5))]
    lst += [5, 1]                                  # ends with the start of the m-gram [1, 2]
    cur_len = len(lst)
    occ = np.array([i for i in range(1, cur_len - n - m) if lst[i] == 5], dtype=np.int64)
    assert len(occ) > 16

    def fresh():
        vals = [NgramMapValue(0, 0, m) for _ in range(4)]
        for k, (idx, num, acc) in enumerate(slots):
            idx = {None: cur_len - 1, "end": cur_len - m}.get(idx, idx)
            if idx == cur_len - m:
                lst[idx:idx + m] = [1, 2]          # a real m-gram, also found earlier
            vals[k] = NgramMapValue(idx, num, acc)
        return vals

    mine, ref = fresh(), fresh()
    st = NgramMapState(n, m, key_only=False, min_hits=1)
    st._count_values(lst, TokenHistory().sync(lst)[1], mine, occ)
    _ref_count(lst, ref, occ.tolist(), n, m)
    assert [(v.value_idx, v.value_num, v.n_accepted) for v in mine] == \
        [(v.value_idx, v.value_num, v.n_accepted) for v in ref]
