"""ngram-cache: the cache, its file format, drafting and the speculator.

Expected values are worked out by hand in the comments from llama.cpp's
``common/ngram-cache.cpp`` and ``common_speculative_impl_ngram_cache`` in
``common/speculative.cpp``. Two oracles back the tie-breaking rule:

* ``OracleMap``: a literal, node-by-node transliteration of libstdc++'s
  ``_Hashtable`` insertion and rehash (``_M_insert_bucket_begin``,
  ``_M_rehash_aux``, ``_Prime_rehash_policy::_M_need_rehash``), against
  which :func:`stl_order` is checked;
* when g++ and llama.cpp's sources are on this machine (``python tools/native.py
  fetch`` unpacks the pinned sdist outside the checkout), a differential test
  compiles the real ``ngram-cache.cpp`` and compares update, save (byte
  for byte), load, merge and draft on random inputs (skipped otherwise).

File byte compatibility: llama.cpp writes entries in ``unordered_map``
iteration order, which the C++ standard leaves open. We assert
(1) exact bytes against files assembled by hand with ``struct``, both for
``order="insertion"`` (a loaded file is written back unchanged) and for
``order="stl"`` (the libstdc++ order, derived by hand below), and
(2) when the C++ is available, exact bytes against what the compiled
llama.cpp code writes for the same history.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import struct
import subprocess
import timeit

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from speculators.base import DraftRequest
from speculators.chain import SpeculatorChain
from speculators.ngram_cache import (
    DRAFT_MIN_PERCENT_LAX, DRAFT_MIN_PERCENT_STRICT, DRAFT_MIN_SAMPLE_SIZE_LAX,
    DRAFT_MIN_SAMPLE_SIZE_STRICT, N_DRAFT, CorruptCacheError, LookupCacheError, NgramCache,
    NgramCacheSpeculator, ngram_cache_draft, ngram_key, stl_order,
)
from speculators.params import NgramCacheParams, SpecParams
from speculators.types import SpecType, parse_types

U64 = 2**64
FIB = 11400714819323198485
N = -1  # LLAMA_TOKEN_NULL


def rec(ngram, pairs):
    """One file record, assembled independently of the module under test."""
    ng = tuple(ngram) + (N,) * (4 - len(ngram))
    out = struct.pack("<4i", *ng) + struct.pack("<i", len(pairs))
    for tok, cnt in pairs:
        out += struct.pack("<ii", tok, cnt)
    return out


def draft(inp, ctx=None, dyn=None, sta=None, n_draft=8):
    """Tokens drafted after inp (whose last token is the one just sampled)."""
    ctx, dyn, sta = ctx or NgramCache(), dyn or NgramCache(), sta or NgramCache()
    return ngram_cache_draft(list(inp), [inp[-1]] if inp else [N], n_draft, 1, 4, ctx, dyn, sta)[1:]


def cache_of(entries):
    c = NgramCache()
    for ngram, tok, cnt in entries:
        c.add(ngram, tok, cnt)
    return c


# ---------------------------------------------------------------------------
# update
# ---------------------------------------------------------------------------


def test_update_hand_worked():
    # common_ngram_cache_update(cache, 1, 4, inp=[1, 2, 1, 2, 3], nnew=5):
    # for each size s, positions i = max(5 - 5, s) .. 4; inp[i] follows inp[i-s:i].
    #   s=1, i=1..4: (1)->2, (2)->1, (1)->2, (2)->3
    #   s=2, i=2..4: (1,2)->1, (2,1)->2, (1,2)->3
    #   s=3, i=3..4: (1,2,1)->2, (2,1,2)->3
    #   s=4, i=4:    (1,2,1,2)->3
    c = NgramCache()
    c.update([1, 2, 1, 2, 3], 1, 4, 5)
    assert c.to_dict() == {
        (1, N, N, N): {2: 2},
        (2, N, N, N): {1: 1, 3: 1},
        (1, 2, N, N): {1: 1, 3: 1},
        (2, 1, N, N): {2: 1},
        (1, 2, 1, N): {2: 1},
        (2, 1, 2, N): {3: 1},
        (1, 2, 1, 2): {3: 1},
    }
    # 7 n-grams, 9 (n-gram, token) pairs, 4 + 3 + 2 + 1 = 10 occurrences
    assert (len(c), c.n_entries, c.total_count) == (7, 9, 10)
    assert c[(2,)] == {1: 1, 3: 1} and c.get((9,)) is None and (1, 2) in c and (3,) not in c
    # Appending 1 and updating with nnew=1 only adds the n-grams ending at
    # the new position: (3)->1, (2,3)->1, (1,2,3)->1, (2,1,2,3)->1 ...
    c.update([1, 2, 1, 2, 3, 1], 1, 4, 1)
    assert c[(3,)] == {1: 1} and c[(2, 3)] == {1: 1} and c[(1, 2, 3)] == {1: 1}
    assert c[(2, 1, 2, 3)] == {1: 1} and c.total_count == 14
    # ... which is what a full rebuild gives.
    full = NgramCache()
    full.update([1, 2, 1, 2, 3, 1], 1, 4, 6)
    assert c == full


def test_update_static_sizes_and_nnew_bounds():
    # lookup-create builds static caches with sizes 2..2: [7, 8, 7, 8] gives
    # (7,8)->7 at i=2 and (8,7)->8 at i=3.
    c = NgramCache()
    c.update([7, 8, 7, 8], 2, 2, 4)
    assert c.to_dict() == {(7, 8, N, N): {7: 1}, (8, 7, N, N): {8: 1}}
    # nnew larger than the input is clamped by max(size - nnew, s); nnew 0 adds nothing.
    d = NgramCache()
    d.update([7, 8, 7, 8], 2, 2, 100)
    assert d == c
    d.update([7, 8, 7, 8], 2, 2, 0)
    assert d == c
    with pytest.raises(ValueError):
        c.update([1, 2], 1, 5, 2)


def test_merge_adds_counts():
    a = cache_of([((1,), 2, 3), ((1, 2), 5, 1)])
    b = cache_of([((1,), 2, 4), ((1,), 9, 1), ((7,), 7, 2)])
    a.merge(b)
    assert a.to_dict() == {(1, N, N, N): {2: 7, 9: 1}, (1, 2, N, N): {5: 1}, (7, N, N, N): {7: 2}}
    assert b.to_dict() == {(1, N, N, N): {2: 4, 9: 1}, (7, N, N, N): {7: 2}}  # untouched


# ---------------------------------------------------------------------------
# draft
# ---------------------------------------------------------------------------


def test_threshold_tables_match_reference():
    assert DRAFT_MIN_SAMPLE_SIZE_LAX == (2, 2, 1, 1) and DRAFT_MIN_PERCENT_LAX == (66, 50, 50, 50)
    assert DRAFT_MIN_SAMPLE_SIZE_STRICT == (4, 3, 2, 2) and DRAFT_MIN_PERCENT_STRICT == (75, 66, 66, 66)


def test_draft_empty_and_short_history():
    full = cache_of([((5,), 6, 9), ((5, 5), 6, 9)])
    assert draft([], ctx=full) == []
    # inp_size < LLAMA_NGRAM_STATIC (2): nothing, whatever the caches hold
    assert draft([5], ctx=full) == []
    assert draft([5, 5], ctx=full, n_draft=1) == [6]
    with pytest.raises(ValueError):
        ngram_cache_draft([1, 2], [1, 2], 8, 1, 4, NgramCache(), NgramCache(), NgramCache())


def test_draft_no_match():
    ctx = cache_of([((1, 2), 3, 5)])
    assert draft([9, 9, 9, 9], ctx=ctx) == []
    assert draft([9, 9, 9, 9]) == []


def test_draft_context_lax_thresholds():
    # 1-gram (index 0): lax needs >= 2 samples and >= 66 %.
    #   {6: 2, 7: 1}: 3 samples, 100*2 = 200 >= 66*3 = 198 -> 6
    #   {6: 1, 7: 1}: 100 < 132 -> nothing
    #   {6: 1}:       1 sample < 2 -> nothing
    assert draft([0, 0, 0, 5], ctx=cache_of([((5,), 6, 2), ((5,), 7, 1)]), n_draft=1) == [6]
    assert draft([0, 0, 0, 5], ctx=cache_of([((5,), 6, 1), ((5,), 7, 1)])) == []
    assert draft([0, 0, 0, 5], ctx=cache_of([((5,), 6, 1)])) == []
    # 2-gram (index 1): >= 2 samples, >= 50 %: {6: 1, 7: 1} passes (100 >= 100)
    # 3-, 4-grams: one sample is enough.
    assert draft([0, 0, 4, 5], ctx=cache_of([((4, 5), 6, 1), ((4, 5), 7, 2)]), n_draft=1) == [7]
    assert draft([0, 3, 4, 5], ctx=cache_of([((3, 4, 5), 6, 1)]), n_draft=1) == [6]
    assert draft([2, 3, 4, 5], ctx=cache_of([((2, 3, 4, 5), 6, 1)]), n_draft=1) == [6]


def test_draft_longest_ngram_first_and_fallback():
    # The 4-gram says 8, the 1-gram says 6: the 4-gram is tried first.
    ctx = cache_of([((2, 3, 4, 5), 8, 1), ((5,), 6, 3)])
    assert draft([2, 3, 4, 5], ctx=ctx, n_draft=1) == [8]
    # A 2-gram that fails its thresholds ({6: 1, 7: 1, 8: 1}: 100 < 150)
    # falls through to the 1-gram ({9: 2}).
    ctx = cache_of([((4, 5), 6, 1), ((4, 5), 7, 1), ((4, 5), 8, 1), ((5,), 9, 2)])
    assert draft([0, 0, 4, 5], ctx=ctx, n_draft=1) == [9]


def test_draft_strict_thresholds_for_dynamic():
    # The same 2-gram {6: 1, 7: 2} that the context cache accepts (3 samples,
    # 200 >= 150) passes strict too (3 >= 3, 200 >= 66*3 = 198) ...
    entries = [((4, 5), 6, 1), ((4, 5), 7, 2)]
    assert draft([0, 0, 4, 5], dyn=cache_of(entries), n_draft=1) == [7]
    # ... but {6: 1, 7: 1} only passes lax: strict needs 3 samples.
    entries = [((4, 5), 6, 1), ((4, 5), 7, 1)]
    assert draft([0, 0, 4, 5], ctx=cache_of(entries), n_draft=1) != []
    assert draft([0, 0, 4, 5], dyn=cache_of(entries), n_draft=1) == []
    # 1-gram strict: 4 samples and 75 %: {6: 3, 7: 1} yes, {6: 2, 7: 1} no.
    assert draft([0, 0, 0, 5], dyn=cache_of([((5,), 6, 3), ((5,), 7, 1)]), n_draft=1) == [6]
    assert draft([0, 0, 0, 5], dyn=cache_of([((5,), 6, 2), ((5,), 7, 1)]), n_draft=1) == []
    # The context cache is asked before the dynamic one.
    assert draft([0, 0, 4, 5], ctx=cache_of([((4, 5), 1, 2)]), dyn=cache_of([((4, 5), 2, 9)]),
                 n_draft=1) == [1]


def test_draft_ties_follow_libstdcxx_order():
    # {6: 1, 7: 1} after (4, 5) is a 50 % tie that passes the lax 2-gram
    # check. llama.cpp keeps the first met while iterating the map. With 13
    # buckets tokens 6 and 7 sit in buckets 6 and 7; a key in an empty
    # bucket goes to the front of the list, so the later one comes first.
    assert draft([0, 0, 4, 5], ctx=cache_of([((4, 5), 6, 1), ((4, 5), 7, 1)]), n_draft=1) == [7]
    assert draft([0, 0, 4, 5], ctx=cache_of([((4, 5), 7, 1), ((4, 5), 6, 1)]), n_draft=1) == [6]
    # 6 and 19 share bucket 6; within a bucket the later one also comes first.
    assert draft([0, 0, 4, 5], ctx=cache_of([((4, 5), 6, 1), ((4, 5), 19, 1)]), n_draft=1) == [19]


def test_draft_static_weighting():
    # Context (4, 5) -> {7: 1, 6: 1}: alone, a tie won by 6 (inserted last).
    ctx = cache_of([((4, 5), 7, 1), ((4, 5), 6, 1)])
    assert draft([0, 0, 4, 5], ctx=ctx, n_draft=1) == [6]
    # The static 2-gram (4, 5) -> {7: 1} weighs 7 by 100*1 against 6's 1:
    # 1*100 > 1*1, and the share check uses 7's context count (100 >= 100).
    sta = cache_of([((4, 5), 7, 1)])
    assert draft([0, 0, 4, 5], ctx=ctx, sta=sta, n_draft=1) == [7]
    # The weighting can also veto: context {6: 2, 7: 1} with static {7: 1}
    # makes 7 the best (1*100 > 2*1) but 100*1 < 50*3, so the 2-gram fails;
    # the 1-gram (5) is absent, then dynamic is empty, then the static
    # 2-gram (4, 5) -> {7: 1} has 1 sample < 2: nothing at all.
    ctx = cache_of([((4, 5), 6, 2), ((4, 5), 7, 1)])
    assert draft([0, 0, 4, 5], ctx=ctx, n_draft=1) == [6]
    assert draft([0, 0, 4, 5], ctx=ctx, sta=sta, n_draft=1) == []


def test_draft_static_cache_alone():
    # Static 2-grams, lax thresholds of index 1: >= 2 samples, >= 50 %.
    #   (4, 5) -> {6: 2}        -> 6
    #   (5, 6) -> {7: 1, 8: 1}  -> tie; 8 was inserted last, different buckets -> 8
    #   (6, 8) -> {9: 1}        -> 1 sample: stop
    sta = cache_of([((4, 5), 6, 2), ((5, 6), 7, 1), ((5, 6), 8, 1), ((6, 8), 9, 1)])
    assert draft([4, 5], sta=sta) == [6, 8]


def test_draft_dynamic_cache_and_n_draft():
    # Dynamic 4-grams of the cycle 1 2 3 4 each seen twice (strict: >= 2 samples).
    dyn = NgramCache()
    dyn.update([1, 2, 3, 4] * 3, 1, 4, 12)
    assert draft([9, 1, 2, 3, 4], dyn=dyn) == [1, 2, 3, 4, 1, 2, 3, 4]   # n_draft 8
    assert draft([9, 1, 2, 3, 4], dyn=dyn, n_draft=3) == [1, 2, 3]
    assert draft([9, 1, 2, 3, 4], dyn=dyn, n_draft=0) == []


def test_draft_uses_drafted_tokens_as_context():
    # After drafting 6, the next n-grams end in ... 5 6: (5, 6) -> 7 is only
    # reachable through the drafted token.
    ctx = cache_of([((4, 5), 6, 1), ((4, 5), 6, 1), ((5, 6), 7, 2)])
    assert draft([0, 0, 4, 5], ctx=ctx) == [6, 7]


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------

# Three records, assembled by hand: an n-gram is 4 int32 padded with -1,
# then an int32 entry count, then (int32 token, int32 count) pairs.
HAND_RECORDS = [
    ((5,), [(7, 3), (9, 1)]),
    ((5, 7), [(9, 2)]),
    ((1, 2, 3, 4), [(10, 1), (11, 4), (12, 2)]),
]
HAND_FILE = b"".join(rec(ng, pairs) for ng, pairs in HAND_RECORDS)


def test_hand_built_file_loads(tmp_path):
    assert len(HAND_FILE) == 3 * 20 + 6 * 8  # three headers, six entries
    p = tmp_path / "hand.bin"
    p.write_bytes(HAND_FILE)
    c = NgramCache.load(p)
    assert c.to_dict() == {
        (5, N, N, N): {7: 3, 9: 1},
        (5, 7, N, N): {9: 2},
        (1, 2, 3, 4): {10: 1, 11: 4, 12: 2},
    }
    assert (len(c), c.n_entries, c.total_count) == (3, 6, 13)
    # insertion order: a loaded file is written back unchanged
    assert c.to_bytes("insertion") == HAND_FILE
    c.save(tmp_path / "again.bin", order="insertion")
    assert (tmp_path / "again.bin").read_bytes() == HAND_FILE


def _fib(t):
    return ((t % U64) * FIB) % U64


def test_hand_built_file_stl_order(tmp_path):
    # What llama.cpp (libstdc++) writes after loading HAND_FILE: the map of
    # 3 n-grams has 13 buckets; common_ngram_hash_function XORs
    # token * 11400714819323198485 (mod 2**64) over the four slots.
    buckets = [
        (_fib(5) ^ _fib(N) ^ _fib(N) ^ _fib(N)) % 13,
        (_fib(5) ^ _fib(7) ^ _fib(N) ^ _fib(N)) % 13,
        (_fib(1) ^ _fib(2) ^ _fib(3) ^ _fib(4)) % 13,
    ]
    # (5) alone in bucket 5; (5, 7) and (1, 2, 3, 4) share bucket 0.
    assert buckets == [5, 0, 0]
    # Insert (5) -> list [(5)]; insert (5,7) into empty bucket 0 -> front:
    # [(5,7), (5)]; insert (1,2,3,4) at the front of bucket 0's run:
    # [(1,2,3,4), (5,7), (5)].
    # Within (1,2,3,4): tokens 10, 11, 12 in buckets 10, 11, 12 -> 12, 11, 10;
    # within (5): 7 and 9 -> 9, 7.
    expected = rec((1, 2, 3, 4), [(12, 2), (11, 4), (10, 1)]) + rec((5, 7), [(9, 2)]) \
        + rec((5,), [(9, 1), (7, 3)])
    c = NgramCache.from_bytes(HAND_FILE)
    assert c.to_bytes() == expected
    c.save(tmp_path / "stl.bin")
    assert (tmp_path / "stl.bin").read_bytes() == expected
    assert NgramCache.load(tmp_path / "stl.bin") == c


def test_save_load_roundtrip(tmp_path):
    rng = random.Random(1)
    c = NgramCache()
    seq = [rng.randrange(50) for _ in range(3000)]
    c.update(seq, 1, 4, len(seq))
    c.add((-5, 2**31 - 1), -(2**31), 2**31 - 1)  # extremes of int32
    for order in ("stl", "insertion"):
        p = tmp_path / f"rt-{order}.bin"
        c.save(p, order=order)
        back = NgramCache.load(p)
        assert back == c
        if order == "insertion":
            assert back.to_bytes("insertion") == p.read_bytes() == c.to_bytes("insertion")
        assert len(p.read_bytes()) == 20 * len(c) + 8 * c.n_entries


def test_empty_file_is_empty_cache(tmp_path):
    p = tmp_path / "empty.bin"
    p.write_bytes(b"")
    c = NgramCache.load(p)
    assert len(c) == 0 and c == NgramCache()
    NgramCache().save(tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == b""


@pytest.mark.parametrize("data, what", [
    (HAND_FILE[:-1], "cut in the middle"),                 # truncated by one byte
    (HAND_FILE[:-4], "cut in the middle"),                 # last count missing
    (HAND_FILE[:-8], "cut in the middle"),                 # last pair missing
    (HAND_FILE[:10], "truncated record"),                  # inside the first n-gram
    (HAND_FILE[:16], "truncated record"),                  # n-gram without its count
    (rec((1,), [(2, 1)])[:-2], "cut in the middle"),       # entry cut inside an int32
    (rec((1,), [(2, 0)]), "count of 0"),                   # zero count
    (rec((1,), [(2, -3)]), "count of -3"),                 # negative count
    (rec((1,), [(2, 1), (3, -2**31)]), "count of -2147483648"),
    (struct.pack("<5i", 1, N, N, N, 0), "token count of 0"),        # empty part
    (struct.pack("<5i", 1, N, N, N, -1), "token count of -1"),
    (struct.pack("<5i", 1, N, N, N, 2**31 - 1) + b"\0" * 16, "cut in the middle"),
    (HAND_FILE + b"\x00\x01\x02", "stray bytes"),                    # trailing garbage
    (HAND_FILE + b"\xff" * 8, "truncated record"),
    (HAND_FILE + b"\xff" * 20, "token count of -1"),
    (HAND_FILE + b"\x00" * 40, "token count of 0"),
    (rec((1,), [(2, 1), (2, 5)]), "more than once"),                 # duplicate token
    (rec((1,), [(2, 1)]) + rec((1,), [(3, 1)]), "appears twice"),    # duplicate n-gram
], ids=lambda x: x if isinstance(x, str) else f"{len(x)}B")
def test_malformed_files_raise(tmp_path, data, what):
    p = tmp_path / "bad.bin"
    p.write_bytes(data)
    with pytest.raises(CorruptCacheError, match=what) as ei:
        NgramCache.load(p)
    assert str(p) in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_save_is_atomic(tmp_path, monkeypatch):
    tmp_path = tmp_path / "atomic"
    tmp_path.mkdir()
    p = tmp_path / "cache.bin"
    p.write_bytes(HAND_FILE)
    c = cache_of([((1,), 2, 3)])

    def boom(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        c.save(p)
    monkeypatch.undo()
    assert p.read_bytes() == HAND_FILE                     # old file intact
    assert sorted(os.listdir(tmp_path)) == ["cache.bin"]   # no temporary left over
    c.save(p)
    assert NgramCache.load(p) == c
    assert sorted(os.listdir(tmp_path)) == ["cache.bin"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o666 & ~umask  # like an ofstream


def test_save_refuses_unwritable_counts():
    c = NgramCache()
    c.add((1,), 2, 2**31 - 1)
    c.add((1,), 2, 1)  # merged counts past int32: llama.cpp would wrap and assert
    with pytest.raises(ValueError, match="int32"):
        c.to_bytes()


# Byte strings for the loader: random ones, and valid files mutated.
_valid_files = st.lists(
    st.tuples(st.lists(st.integers(-2, 6), min_size=1, max_size=4),
              st.lists(st.tuples(st.integers(-3, 9), st.integers(1, 5)), min_size=1, max_size=4)),
    max_size=5,
).map(lambda recs: b"".join(rec(ng, list(dict(pairs).items())) for ng, pairs in recs))


@st.composite
def _mutated(draw):
    data = bytearray(draw(_valid_files))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["cut", "flip", "word", "insert", "append", "delete"]))
        if kind == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)):]
        elif kind == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind == "word" and len(data) >= 4:
            i = 4 * draw(st.integers(0, len(data) // 4 - 1))
            data[i:i + 4] = struct.pack("<i", draw(st.sampled_from([0, -1, 1, 2, 3, 2**31 - 1, -(2**31)])))
        elif kind == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(max_size=12))
        elif kind == "append":
            data += draw(st.binary(max_size=24))
        elif kind == "delete" and data:
            i = draw(st.integers(0, len(data) - 1))
            del data[i:i + draw(st.integers(1, 8))]
    return bytes(data)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=120), _mutated()))
def test_loader_never_misbehaves(data):
    try:
        c = NgramCache.from_bytes(data)
    except CorruptCacheError:
        event("rejected")
        return
    event("accepted")
    # Accepted: the input was exactly a sequence of valid records, so it is
    # reproduced byte for byte, and either order reloads to the same cache.
    assert c.to_bytes("insertion") == data
    assert NgramCache.from_bytes(c.to_bytes()) == c


# ---------------------------------------------------------------------------
# libstdc++ iteration order
# ---------------------------------------------------------------------------


class OracleMap:
    """libstdc++ ``_Hashtable`` with unique keys, node by node.

    Nodes form one singly linked list headed by ``before_begin``; bucket
    ``b`` holds the node *before* its first node. Rehash policy:
    ``_Prime_rehash_policy`` with max load factor 1 (``_M_need_rehash``);
    its prime table is not reproduced here, only the bucket counts it
    yields for doubling requests (read from the compiled library).
    """

    PRIMES_FOR = {12: 13, 26: 29, 58: 59, 118: 127, 254: 257, 514: 541, 1082: 1109,
                  2218: 2357, 4714: 5087}

    class Node:
        __slots__ = ("key", "next")

        def __init__(self, key):
            self.key, self.next = key, None

    def __init__(self, hash_fn):
        self.hash = hash_fn
        self.before_begin = self.Node(None)
        self.n_bkt, self.n_elt, self.next_resize = 1, 0, 0
        self.buckets = [None]

    def _next_bkt(self, n):
        nb = self.PRIMES_FOR[n]
        self.next_resize = nb
        return nb

    def _need_rehash(self, n_ins=1):
        if self.n_elt + n_ins > self.next_resize:
            min_bkts = max(self.n_elt + n_ins, 0 if self.next_resize else 11)
            if min_bkts >= self.n_bkt:
                return self._next_bkt(max(min_bkts + 1, self.n_bkt * 2))
            self.next_resize = self.n_bkt
        return None

    def _rehash(self, nb):
        new = [None] * nb
        p = self.before_begin.next
        self.before_begin.next = None
        bbegin = 0
        while p is not None:
            nxt = p.next
            b = self.hash(p.key) % nb
            if new[b] is None:
                p.next = self.before_begin.next
                self.before_begin.next = p
                new[b] = self.before_begin
                if p.next is not None:
                    new[bbegin] = p
                bbegin = b
            else:
                p.next = new[b].next
                new[b].next = p
            p = nxt
        self.buckets, self.n_bkt = new, nb

    def emplace(self, key):
        b = self.hash(key) % self.n_bkt
        prev = self.buckets[b]
        if prev is not None:  # find within the bucket's run
            p = prev.next
            while p is not None and self.hash(p.key) % self.n_bkt == b:
                if p.key == key:
                    return
                p = p.next
        nb = self._need_rehash()
        if nb is not None:
            self._rehash(nb)
            b = self.hash(key) % self.n_bkt
        node = self.Node(key)
        if self.buckets[b] is not None:
            node.next = self.buckets[b].next
            self.buckets[b].next = node
        else:
            node.next = self.before_begin.next
            self.before_begin.next = node
            if node.next is not None:
                self.buckets[self.hash(node.next.key) % self.n_bkt] = node
            self.buckets[b] = self.before_begin
        self.n_elt += 1

    def keys(self):
        out, p = [], self.before_begin.next
        while p is not None:
            out.append(p.key)
            p = p.next
        return out


def test_stl_order_against_node_oracle():
    rng = random.Random(3)
    for n in [0, 1, 2, 3, 12, 13, 14, 28, 29, 30, 59, 60, 127, 128, 300, 541, 542, 1500]:
        keys = list(dict.fromkeys(rng.randrange(-40, 3000) for _ in range(n)))
        if rng.random() < 0.5:
            keys = list(dict.fromkeys(rng.randrange(-2**31, 2**31) for _ in range(n)))
        m = OracleMap(lambda k: k % U64)
        for k in keys:
            m.emplace(k)
        assert stl_order(keys) == m.keys(), n
        ngrams = list(dict.fromkeys(ngram_key([rng.randrange(-1, 20) for _ in range(rng.randrange(1, 5))])
                                    for _ in range(n)))
        h = lambda ng: _fib(ng[0]) ^ _fib(ng[1]) ^ _fib(ng[2]) ^ _fib(ng[3])  # noqa: E731
        m = OracleMap(h)
        for k in ngrams:
            m.emplace(k)
        c = NgramCache()
        for k in ngrams:
            c.add(k, 1)
        assert c._stl_keys() == m.keys() == stl_order(ngrams, h), n


def test_merge_inserts_in_stl_order():
    # Merging {(1): {6: 1, 7: 1}} into a cache holding (1): {5: 1} adds 6 and
    # 7 in the source's iteration order, 7 then 6; the target then lists
    # 5, 7, 6 in insertion order, and iterates 6, 7, 5 (latest first).
    a = cache_of([((1,), 5, 1)])
    b = cache_of([((1,), 6, 1), ((1,), 7, 1)])
    a.merge(b)
    assert list(a[(1,)]) == [5, 7, 6]
    assert a.to_bytes() == rec((1,), [(6, 1), (7, 1), (5, 1)])


# ---------------------------------------------------------------------------
# the speculator
# ---------------------------------------------------------------------------


def req(prompt, id_last, n_max=-1):
    return DraftRequest(prompt=list(prompt), id_last=id_last, pos0=len(prompt), n_max=n_max)


def test_speculator_through_chain():
    chain = SpeculatorChain.from_params(SpecParams(types=parse_types("ngram-cache")))
    assert [s.type for s in chain.speculators] == [SpecType.NGRAM_CACHE]
    assert chain.n_max == N_DRAFT == 8
    history = [3, 1, 4, 1, 5, 9, 2, 6] * 4
    out = chain.draft(req(history, 3))
    # (1, 5, 9, 2, 6, 3) ... every 4-gram of the cycle was seen 3-4 times
    assert out == [1, 4, 1, 5, 9, 2, 6, 3]
    assert chain.last_drafter == "ngram-cache"
    chain.accept(8)
    # the chain cuts to the caller's n_max; the speculator stops early too
    assert chain.draft(req(history + [3] + out, 1, n_max=3)) == [4, 1, 5]


def test_speculator_hand_worked_incremental_update():
    spec = NgramCacheSpeculator()
    # First call: prompt [1, 2, 3] + id_last 1 -> the context cache learns
    # (1)->2, (2)->3, (3)->1, (1,2)->3, (2,3)->1, (1,2,3)->1 and drafts from
    # the n-grams ending in ... 2 3 1: (1) -> {2: 1} has one sample (< 2),
    # (3, 1), (2, 3, 1) and (1, 2, 3, 1) are unseen: nothing.
    assert spec.draft(req([1, 2, 3], 1)) == []
    assert spec.cache_size == 4 and spec.context_cache.total_count == 6
    # Second call: the prompt grew by id_last and one accepted token (1 2 3 1 2),
    # new id_last 3. llama.cpp updates with prompt[4:] + [3] = [2, 3] only:
    # (2)->3. The boundary n-grams (1)->2 and (3,1)->2 etc. are never recorded.
    spec.draft(req([1, 2, 3, 1, 2], 3))
    assert spec.cache_size == 6
    assert spec.context_cache[(2,)] == {3: 2}
    assert spec.context_cache.get((3, 1)) is None
    # Drafting after 1 2 3 1 2 3: the 4-gram (3,1,2,3) is unseen, the 3-gram
    # (1,2,3) -> {1: 1} passes (one sample is enough for 3-grams): 1. Then
    # after ... 2 3 1: (1,2,3,1), (2,3,1), (3,1) unseen, (1) -> {2: 1} has one
    # sample (< 2): stop. The same call again adds nothing to the cache.
    assert spec.draft(req([1, 2, 3, 1, 2], 3)) == [1]
    assert spec.context_cache.total_count == 7
    # A shorter prompt (a new conversation) does not update anything, as in llama.cpp.
    before = spec.context_cache.copy()
    spec.draft(req([7, 7], 7))
    assert spec.context_cache == before


def test_speculator_matches_direct_draft():
    rng = random.Random(5)
    spec = NgramCacheSpeculator()
    text = []
    while len(text) < 600:
        text += rng.choice([[1, 2, 3], [4, 5], [6], [1, 2, 7]])
    prompt, pos = text[:20], 20
    shadow = NgramCache()
    seen = 0
    while pos < len(text) - 1:
        out = spec.draft(req(prompt, text[pos]))
        # shadow: update with only the new stretch, then draft from all tokens
        new = prompt[seen:] + [text[pos]]
        shadow.update(new, 1, 4, len(new))
        seen = len(prompt) + 1
        assert out == draft(prompt + [text[pos]], ctx=shadow)
        acc = 0
        while acc < len(out) and pos + 1 + acc < len(text) and text[pos + 1 + acc] == out[acc]:
            acc += 1
        pos += 1 + acc
        prompt = text[:pos]
    assert spec.context_cache == shadow


def test_factory_loads_and_reports_bad_paths(tmp_path):
    good = tmp_path / "static.bin"
    good.write_bytes(HAND_FILE)
    params = SpecParams(types=parse_types("ngram-cache"),
                        ngram_cache=NgramCacheParams(lookup_cache_static=str(good),
                                                     lookup_cache_dynamic=str(good)))
    chain = SpeculatorChain.from_params(params)
    spec = chain.speculators[0]
    assert spec.static_cache == NgramCache.from_bytes(HAND_FILE) == spec.dynamic_cache
    assert spec.static_cache is not spec.dynamic_cache

    missing = tmp_path / "nope.bin"
    params.ngram_cache = NgramCacheParams(lookup_cache_dynamic=str(missing))
    with pytest.raises(LookupCacheError, match="dynamic lookup cache") as ei:
        SpeculatorChain.from_params(params)
    assert str(missing) in str(ei.value) and ei.value.path == str(missing)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value.__cause__, OSError)

    bad = tmp_path / "bad.bin"
    bad.write_bytes(HAND_FILE[:-3])
    params.ngram_cache = NgramCacheParams(lookup_cache_static=str(bad))
    with pytest.raises(LookupCacheError, match="static lookup cache") as ei:
        SpeculatorChain.from_params(params)
    assert str(bad) in str(ei.value) and isinstance(ei.value.__cause__, CorruptCacheError)

    # empty strings mean "none", as in llama.cpp
    params.ngram_cache = NgramCacheParams(lookup_cache_static="", lookup_cache_dynamic="")
    assert len(SpeculatorChain.from_params(params).speculators[0].static_cache) == 0


def test_context_cache_can_be_merged_and_saved(tmp_path):
    spec = NgramCacheSpeculator()
    history = [5, 6, 7] * 5
    spec.draft(req(history, 5))
    spec.dynamic_cache.merge(spec.context_cache)
    spec.dynamic_cache.save(tmp_path / "dyn.bin")
    assert NgramCache.load(tmp_path / "dyn.bin") == spec.context_cache


def test_draft_speed_with_long_history():
    # 8k tokens of history, then a generation: the context cache is updated
    # incrementally, so a draft call must stay far below 0.5 ms on average.
    rng = random.Random(0)
    text = []
    while len(text) < 8192 + 512:
        if text and rng.random() < 0.3:
            s = rng.randrange(len(text))
            text += text[s:s + rng.randrange(2, 30)]
        else:
            text.append(int(32000 * rng.random() ** 4))
    spec = NgramCacheSpeculator()
    calls = []
    pos = 8192

    def step():
        nonlocal pos
        out = spec.draft(DraftRequest(prompt=text[:pos], id_last=text[pos], pos0=pos))
        acc = 0
        while acc < len(out) and text[pos + 1 + acc] == out[acc]:
            acc += 1
        pos += 1 + acc
        calls.append(len(out))

    total = timeit.timeit(step, number=1)           # the first call reads the whole prompt
    while pos < 8192 + 400:
        total += timeit.timeit(step, number=1)
    mean = total / len(calls)
    assert mean < 0.5e-3, f"{mean * 1e6:.0f} us per draft call"


# ---------------------------------------------------------------------------
# against the real C++ (when it can be compiled here)
# ---------------------------------------------------------------------------

def _native_common() -> str:
    """llama.cpp's common/ in the pinned sdist that tools/native.py fetches and unpacks
    (outside the checkout; ``.ci/run`` does it before the tests)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "native.py")
    if not os.path.isfile(path):
        return ""
    spec = importlib.util.spec_from_file_location("draftlight_native_tool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.src_dir() / "common")


# DRAFTLIGHT_LLAMA_CPP_COMMON wins; else the sdist tools/native.py unpacked (read at import,
# before the tests' private XDG dirs are set)
_LLAMA_COMMON = [os.environ.get("DRAFTLIGHT_LLAMA_CPP_COMMON", ""), _native_common()]
_LLAMA_COMMON = next((d for d in _LLAMA_COMMON if d and os.path.exists(os.path.join(d, "ngram-cache.cpp"))), None)

_HARNESS = r"""
#include "ngram-cache.h"
#include <iostream>
#include <map>
#include <string>
#include <vector>
static std::vector<llama_token> rd(std::istream & in) { size_t n; in >> n; std::vector<llama_token> v(n); for (auto & x : v) in >> x; return v; }
int main() {
    std::map<int, common_ngram_cache> c; std::string cmd;
    while (std::cin >> cmd) {
        if (cmd == "update") { int id, mn, mx, nn; std::cin >> id >> mn >> mx >> nn; auto v = rd(std::cin); common_ngram_cache_update(c[id], mn, mx, v, nn, false); }
        else if (cmd == "load") { int id; std::string p; std::cin >> id >> p; c[id] = common_ngram_cache_load(p); }
        else if (cmd == "save") { int id; std::string p; std::cin >> id >> p; common_ngram_cache_save(c[id], p); std::cout << "ok" << std::endl; }
        else if (cmd == "merge") { int a, b; std::cin >> a >> b; common_ngram_cache_merge(c[a], c[b]); }
        else if (cmd == "draft") { int x, y, z, nd; std::cin >> x >> y >> z >> nd; auto inp = rd(std::cin);
            std::vector<llama_token> d = {inp.back()}; common_ngram_cache_draft(inp, d, nd, 1, 4, c[x], c[y], c[z]);
            for (size_t i = 1; i < d.size(); ++i) std::cout << d[i] << ' '; std::cout << std::endl; }
    }
}
"""
_STUBS = {
    "llama.h": "#pragma once\n#include <cstdint>\ntypedef int32_t llama_token;\n#define LLAMA_TOKEN_NULL -1\n",
    "common.h": "#pragma once\n#include <cstdio>\n#include <cstdlib>\n#include <chrono>\n"
                "#define GGML_ASSERT(x) do { if (!(x)) { fprintf(stderr, \"assert %s\\n\", #x); abort(); } } while (0)\n"
                "static inline int64_t ggml_time_ms() { return 0; }\n",
    "log.h": "#pragma once\n#define LOG_DBG(...) do {} while (0)\n",
}


@pytest.mark.skipif(shutil.which("g++") is None or _LLAMA_COMMON is None,
                    reason="needs g++ and llama.cpp's common/ngram-cache.cpp "
                           "(python tools/native.py fetch, or DRAFTLIGHT_LLAMA_CPP_COMMON)")
def test_differential_against_llama_cpp(tmp_path):
    for name in ("ngram-cache.h", "ngram-cache.cpp"):
        shutil.copy(os.path.join(_LLAMA_COMMON, name), tmp_path / name)
    for name, text in _STUBS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "harness.cpp").write_text(_HARNESS)
    exe = tmp_path / "harness"
    subprocess.run(["g++", "-O2", "-std=c++17", "-I", str(tmp_path), str(tmp_path / "harness.cpp"),
                    str(tmp_path / "ngram-cache.cpp"), "-o", str(exe)], check=True, capture_output=True)
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def send(line):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def ask(line):
        send(line)
        return proc.stdout.readline().split()

    def vec(v):
        return f"{len(v)} " + " ".join(map(str, v))

    rng = random.Random(11)

    def text(n, vocab):
        out = []
        while len(out) < n:
            if out and rng.random() < 0.5:
                s = rng.randrange(len(out))
                out += out[s:s + rng.randrange(1, 10)]
            else:
                out.append(rng.randrange(vocab) - (3 if rng.random() < 0.02 else 0))
        return out[:n]

    try:
        # the hand-built file: the C++ writes exactly the order derived by hand
        (tmp_path / "hand.bin").write_bytes(HAND_FILE)
        send(f"load 99 {tmp_path / 'hand.bin'}")
        assert ask(f"save 99 {tmp_path / 'hand-cpp.bin'}") == ["ok"]
        assert (tmp_path / "hand-cpp.bin").read_bytes() == NgramCache.from_bytes(HAND_FILE).to_bytes()
        n_drafts = 0
        for trial in range(25):
            vocab = rng.choice([3, 6, 40, 3000])
            py = {}
            for k, (mn, mx) in enumerate([(1, 4), (1, 4), (2, 2)]):
                cid = 10 * trial + k
                seq = text(rng.choice([30, 300, 1500]), vocab)
                py[k] = NgramCache()
                pos = 0
                while pos < len(seq):  # lookup.cpp style: whole input, nnew new tokens
                    step = rng.choice([1, 3, 40, 500])
                    pos = min(len(seq), pos + step)
                    send(f"update {cid} {mn} {mx} {step} " + vec(seq[:pos]))
                    py[k].update(seq[:pos], mn, mx, step)
                out = tmp_path / f"c{cid}.bin"
                assert ask(f"save {cid} {out}") == ["ok"]
                assert out.read_bytes() == py[k].to_bytes(), "save differs"
            # load + merge + save
            lid = 10 * trial + 5
            send(f"load {lid} {tmp_path / f'c{10 * trial + 2}.bin'}")
            merged = NgramCache.load(tmp_path / f"c{10 * trial + 2}.bin")
            send(f"merge {lid} {10 * trial}")
            merged.merge(py[0])
            assert ask(f"save {lid} {tmp_path / 'm.bin'}") == ["ok"]
            assert (tmp_path / "m.bin").read_bytes() == merged.to_bytes(), "merge differs"
            for _ in range(40):
                # at least 4 tokens: below that llama.cpp reads out of bounds
                inp = text(rng.randrange(4, 9), vocab)
                dyn, dyn_id = (merged, lid) if rng.random() < 0.5 else (py[1], 10 * trial + 1)
                want = [int(t) for t in ask(f"draft {10 * trial} {dyn_id} {10 * trial + 2} 8 " + vec(inp))]
                assert draft(inp, py[0], dyn, py[2]) == want, inp
                n_drafts += 1
        assert n_drafts == 1000
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
