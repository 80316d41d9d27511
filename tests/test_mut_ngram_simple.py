"""ngram-simple and the shared n-gram helpers, pinned down where mutation testing found them loose
(tools/mutation.py).

``tests/test_ngram_speculators.py`` checks the drafts against the reference's loops. Here: the
helpers' edge cases (an empty range or pattern, one slot, numpy histories that were rewritten),
that their results stay index arrays / int64 mirrors, and the flags and settings-pane fields
that :func:`ngram_map_options` declares for the n-gram types.
"""

from __future__ import annotations

import numpy as np
import pytest

from speculators.base import DraftRequest
from speculators.descriptor import NGRAM, Flag, Setting, SpecDescriptor
from speculators.ngram_simple import (ADAPTIVE_SIZE_N, NgramSimple, TokenHistory, find_ngrams,
                                      lookup_size, ngram_map_options, rfind_ngram, slot_winners)
from speculators.params import SpecParams


# -- find_ngrams ------------------------------------------------------------------------------

@pytest.mark.parametrize("lo, hi", [(3, 2), (5, 0), (1, -5), (4, -1)])
def test_an_empty_range_finds_nothing(lo, hi):
    arr = np.array([1, 2, 1, 2, 1, 2, 1, 2, 1, 2], dtype=np.int64)
    found = find_ngrams(arr, [1], lo, hi)
    assert found.tolist() == [] and found.dtype == np.intp
    assert rfind_ngram(arr, [1, 2], lo, hi) == -1


def test_an_empty_pattern_finds_nothing():
    arr = np.array([1, 2, 3], dtype=np.int64)
    found = find_ngrams(arr, [], 0, 2)
    assert found.tolist() == [] and found.dtype == np.intp


def test_what_is_found_indexes_an_array_even_when_nothing_is():
    arr = np.array([4, 5, 6, 4, 5], dtype=np.int64)
    for pattern, lo, hi in (([4, 5], 0, 3), ([9], 0, 4), ([4], 3, 1), ([], 0, 4)):
        found = find_ngrams(arr, pattern, lo, hi)
        assert np.issubdtype(found.dtype, np.integer)
        assert arr[found].tolist() == [arr[j] for j in found.tolist()]


def test_long_histories_take_the_gathering_path_and_agree_with_a_plain_search():
    rng = np.random.default_rng(5)
    arr = rng.integers(0, 3, 3000).astype(np.int64)
    for k in (1, 2, 3, 5):
        pattern = arr[100:100 + k].tolist()
        expect = [j for j in range(10, 2900) if arr[j:j + k].tolist() == pattern]
        assert find_ngrams(arr, pattern, 10, 2899).tolist() == expect


# -- slot_winners -----------------------------------------------------------------------------

def test_slot_winners_of_one_and_of_none():
    for keep in ("first", "last"):
        assert slot_winners(np.array([5]), keep).tolist() == [0]
        none = slot_winners(np.array([], dtype=np.int64), keep)
        assert none.tolist() == [] and none.dtype == np.intp


def test_slot_winners_on_two_equal_slots():
    assert slot_winners(np.array([7, 7]), "first").tolist() == [0]
    assert slot_winners(np.array([7, 7]), "last").tolist() == [1]


# -- TokenHistory ------------------------------------------------------------------------------

def test_the_mirror_stays_int64_as_it_grows():
    h = TokenHistory()
    toks = list(range(1000))
    for step in (1000, 1100, 1101, 3000, 3001, 9000):
        toks = toks + list(range(len(toks), step))
        lst, arr = h.sync(toks)
        assert arr.dtype == np.int64 and arr.tolist() == toks and lst == toks
    lst, arr = h.sync(toks[:50] + [7])           # rewritten: rebuilt
    assert arr.dtype == np.int64 and arr.tolist() == toks[:50] + [7]


def test_numpy_histories_that_were_rewritten_are_rebuilt():
    h = TokenHistory()
    h.sync(np.array([5, 6, 7]))
    lst, arr = h.sync(np.array([9, 6, 7, 8]))    # longer, but the start changed
    assert lst == [9, 6, 7, 8] and arr.tolist() == [9, 6, 7, 8]
    lst, arr = h.sync(np.array([9, 6, 1, 8]))    # same length, changed
    assert lst == [9, 6, 1, 8] and arr.tolist() == [9, 6, 1, 8]
    lst, arr = h.sync(np.array([9, 6]))          # shorter
    assert lst == [9, 6] and arr.tolist() == [9, 6]
    lst, arr = h.sync(np.array([9, 6, 3]))       # appended
    assert lst == [9, 6, 3] and arr.tolist() == [9, 6, 3]


def test_other_sequences_are_mirrored_like_lists():
    h = TokenHistory()
    assert h.sync((1, 2, 3))[0] == [1, 2, 3]
    lst, arr = h.sync(range(1, 6))
    assert lst == [1, 2, 3, 4, 5] and arr.tolist() == [1, 2, 3, 4, 5]
    lst, arr = h.sync((1, 9))
    assert lst == [1, 9] and arr.tolist() == [1, 9]


# -- NgramSimple -----------------------------------------------------------------------------

def test_ngram_simple_looks_up_its_n_gram_in_the_history():
    s = NgramSimple(size_n=3, size_m=5)
    assert (s.context_key, s.n_max, s.size_n, s.size_m) == (3, 5, 3, 5)


def test_lookup_size_under_auto_and_when_set():
    assert lookup_size(SpecParams.from_types("ngram-simple")) == 12
    assert lookup_size(SpecParams.auto()) == ADAPTIVE_SIZE_N == 4
    p = SpecParams.from_types("ngram-simple")
    p.ngram_simple.size_n = 5
    assert lookup_size(p) == 5


def test_ngram_simple_drafts_once_the_history_is_long_enough():
    s = NgramSimple(size_n=2, size_m=3)
    # pattern [2, 3] at 2; copy_max = min(3, 9 - 4) = 3
    assert s.draft(DraftRequest(prompt=[9, 1, 2, 3, 4, 5, 6, 1, 2], id_last=3, pos0=9)) == [4, 5, 6]
    # len 6 <= 2 + 3 + 1: nothing
    assert s.draft(DraftRequest(prompt=[1, 2, 3, 1, 2, 9], id_last=3, pos0=6)) == []


# -- ngram_map_options ----------------------------------------------------------------------------

def _derived(name: str, **opts) -> SpecDescriptor:
    """A descriptor of the options, to read the flags and fields they derive."""
    return SpecDescriptor(name=name, rank=999, kind=NGRAM, **opts)


def test_the_flags_and_fields_of_an_n_gram_type():
    opts = ngram_map_options("ngram-simple", "ngram_simple", "4 under auto")
    assert set(opts) == {"section", "params", "n_max"}
    assert opts["section"] == "ngram_simple"
    d = _derived("ngram-simple-copy", **opts)
    assert d.flags == (
        Flag(("--spec-ngram-simple-size-n",), "spec_ngram_simple_size_n", "ngram_simple.size_n", "int",
             "ngram-simple: lookup n-gram length (default 12; 4 under auto)"),
        Flag(("--spec-ngram-simple-size-m",), "spec_ngram_simple_size_m", "ngram_simple.size_m", "int",
             "ngram-simple: draft m-gram length (default 48)"),
        Flag(("--spec-ngram-simple-min-hits",), "spec_ngram_simple_min_hits", "ngram_simple.min_hits", "int",
             "ngram-simple: minimum hits (default 1)"),
    )
    assert d.fields == (
        Setting("ngram_simple.size_n", "lookup n-gram size", "int", "default 12; 4 under auto"),
        Setting("ngram_simple.size_m", "draft m-gram size", "int"),
        Setting("ngram_simple.min_hits", "min hits", "int"),
    )
    p = SpecParams()
    p.ngram_simple.size_m = 17
    assert opts["n_max"](p) == 17


def test_without_a_size_n_note_the_default_is_the_parameters():
    opts = ngram_map_options("ngram-map-k", "ngram_map_k")
    d = _derived("ngram-map-k-copy", **opts)
    assert d.flags[0].help == "ngram-map-k: lookup n-gram length (default 12)"
    assert d.fields[0] == Setting("ngram_map_k.size_n", "lookup n-gram size", "int", None)
    p = SpecParams()
    p.ngram_map_k.size_m = 9
    assert opts["n_max"](p) == 9
