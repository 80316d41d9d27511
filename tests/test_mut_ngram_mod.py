"""ngram-mod, pinned down where mutation testing found it loose (tools/mutation.py).

``tests/test_ngram_speculators.py`` checks the table and the speculator against the reference.
Here: an empty or reversed add range, the vectorised add when every stored token is EMPTY,
``get`` at a start other than 0, a speculator's state before its first draft, and the low
acceptance fraction at its threshold.
"""

from __future__ import annotations

import numpy as np

from speculators.base import DraftRequest
from speculators.ngram_mod import EMPTY, NgramMod, NgramModTable


def req(prompt, id_last):
    return DraftRequest(prompt=list(prompt), id_last=id_last, pos0=len(prompt))


def test_a_reversed_or_empty_range_adds_nothing():
    arr = np.arange(100, dtype=np.int64)
    for lo, hi in ((5, 3), (40, 2), (7, 7)):
        t = NgramModTable(n=2, size=64)
        t.add_range(arr, lo, hi)
        assert t.get_used() == 0 and (t.entries == EMPTY).all()


def test_adding_empty_tokens_counts_as_the_reference_does():
    """A stored EMPTY leaves its slot "empty": each later write there counts as a new slot,
    as the reference's loop counts it, also where the range is long enough to vectorise."""
    toks = [EMPTY] * 40
    vec, seq = NgramModTable(n=1, size=4), NgramModTable(n=1, size=4)
    vec.add_range(np.array(toks, dtype=np.int64), 0, 39)
    for i in range(39):
        seq.add(toks, i)
    assert vec.get_used() == seq.get_used() == 39
    assert (vec.entries == seq.entries).all()


def test_get_reads_the_n_gram_at_start():
    t = NgramModTable(n=2, size=1 << 20)
    toks = [1, 2, 3, 4, 5]
    t.add(toks, 0)          # [1, 2] -> 3
    t.add(toks, 2)          # [3, 4] -> 5
    assert t.get(toks, 0) == 3 and t.get(toks, 2) == 5 and t.get(toks, 1) == EMPTY


def test_a_new_speculator_has_drafted_nothing():
    s = NgramMod(n_match=3, n_max=5, n_min=1, size=64)
    assert (s.n_match, s.n_max_param, s.n_min, s.n_max) == (3, 5, 1, 5)
    assert (s.i_last, s.n_draft_last, s.n_low) == (0, 0, 0)


def test_accepts_before_any_draft_change_nothing():
    s = NgramMod(n_match=1, n_max=4, n_min=0, size=1024)
    s.mod.add([1, 1])
    for _ in range(6):
        s.accept(0, False)
    assert s.n_low == 0 and s.mod.get_used() == 1
    s.begin([2, 3])                           # after begin, too: its draft is forgotten
    for _ in range(6):
        s.accept(0, False)
    assert s.n_low == 0 and s.mod.get_used() == 2


def test_the_first_draft_without_begin_adds_the_whole_history():
    s = NgramMod(n_match=1, n_max=2, n_min=0, size=1024)
    hist = list(range(40))
    assert s.draft(req(hist, 0)) == [1, 2]    # [0] -> 1: the n-gram at position 0 counts
    assert s.i_last == 39 and s.mod.get_used() == 39


def test_a_low_acceptance_is_below_a_quarter_of_the_draft():
    s = NgramMod(n_match=1, n_max=8, n_min=0, size=1024)
    s.begin([1, 1])
    assert s.draft(req([1, 1], 1)) == [1] * 8
    s.accept(1, False)                        # 1/8 < 0.25: low
    assert s.n_low == 1
    s.draft(req([1, 1], 1))
    s.accept(2, False)                        # 2/8 = 0.25: not low
    assert s.n_low == 0
