"""The lookup store's save / load / merge pinned down where mutation testing found it loose
(tools/mutation.py).

``tests/test_lookup_store.py`` checks learning, merging and pruning. Here, on real files in a
per-test folder: which path a save takes (written as is when the file is still the one this
store last read or wrote, read again and merged when not, or when the store never read it), every
field of a merging save's result, a save that fails (the disk full) keeping what was learned, a
file another process left damaged or naming ids outside the vocabulary, the app's own file that
is not a regular file (kept, never written over), ``clear_dynamic``, the names damaged files are
moved to, and the messages of each.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import types
from pathlib import Path

import pytest

from app import lookup_store as ls
from app.lookup_store import store as ls_store
from speculators.ngram_cache import CorruptCacheError, LookupCacheError, NgramCache, check_vocab


def ngrams_of(tokens, start=0) -> NgramCache:
    c = NgramCache()
    ls.learn_tokens(c, tokens, start)
    return c


def merged(*caches: NgramCache) -> NgramCache:
    out = NgramCache()
    for c in caches:
        out.merge(c)
    return out


def disk_full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device")


# -- which path a save takes ------------------------------------------------------------------------

def test_a_second_save_of_the_same_store_writes_without_reading_again(tmp_path):
    store = ls.LookupStore(tmp_path / "f")
    store.load()
    store.learn([1, 2, 3])
    assert store.save().merged_other is False
    store.learn([1, 2, 3, 4, 5])
    r = store.save()                                 # the file is still the one it wrote
    want = ngrams_of([1, 2, 3, 4, 5])
    path = store.dynamic_path
    assert r == ls.SaveResult(str(path), skipped=False, file_bytes=path.stat().st_size, ngrams=len(want),
                              entries=want.n_entries, added_entries=ngrams_of([1, 2, 3, 4, 5], start=3).n_entries,
                              pruned_entries=0, merged_other=False, warnings=[])
    assert NgramCache.load(path) == want and r.file_bytes == len(want.to_bytes())


def test_another_processs_write_that_keeps_the_size_and_time_is_still_merged(tmp_path):
    folder = tmp_path / "f"
    store = ls.LookupStore(folder)
    store.load()
    store.learn([1, 2, 3])
    store.save()
    path = folder / "dynamic.bin"
    st = path.stat()
    other = ngrams_of([7, 8, 9])                     # as many bytes as what is there
    assert len(other.to_bytes()) == st.st_size
    with open(path, "r+b") as f:                     # written in place: the same inode
        f.write(other.to_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == (st.st_ino, st.st_size,
                                                                                  st.st_mtime_ns)
    store.learn([1, 2, 3, 4])
    assert store.save().merged_other is True         # the contents tell: read again and merged
    assert NgramCache.load(path) == merged(other, ngrams_of([1, 2, 3, 4], start=3))


def test_a_merging_save_that_prunes_says_how_many_entries_went(tmp_path):
    folder = tmp_path / "f"
    a = ls.LookupStore(folder)
    a.load()
    a.learn(list(range(1, 40)))
    a.save()
    b = ls.LookupStore(folder, max_bytes=1000)
    b.learn(list(range(100, 140)))
    r = b.save()
    want = merged(ngrams_of(list(range(1, 40))), ngrams_of(list(range(100, 140))))
    assert r.merged_other and r.pruned_entries > 0 and r.pruned_entries == want.n_entries - r.entries
    assert r.file_bytes == (folder / "dynamic.bin").stat().st_size <= 900


def test_a_store_that_never_read_the_file_merges_into_it(tmp_path):
    folder = tmp_path / "f"
    first = ls.LookupStore(folder)
    first.load()
    first.learn([1, 2, 3])
    first.save()
    late = ls.LookupStore(folder)                    # not loaded: what is on disk is unknown
    late.learn([7, 8, 9])
    r = late.save()
    assert r.merged_other is True
    assert NgramCache.load(folder / "dynamic.bin") == merged(ngrams_of([1, 2, 3]), ngrams_of([7, 8, 9]))


def test_a_merging_save_reports_what_it_wrote_and_the_next_save_writes_as_is(tmp_path):
    folder = tmp_path / "f"
    a, b = ls.LookupStore(folder), ls.LookupStore(folder)
    a.load()
    b.load()
    a.learn([1, 2, 3, 4])
    a.save()
    b.learn([5, 6, 7])
    r = b.save()
    want = merged(ngrams_of([1, 2, 3, 4]), ngrams_of([5, 6, 7]))
    path = folder / "dynamic.bin"
    assert r == ls.SaveResult(str(path), skipped=False, file_bytes=path.stat().st_size, ngrams=len(want),
                              entries=want.n_entries, added_entries=ngrams_of([5, 6, 7]).n_entries,
                              pruned_entries=0, merged_other=True, warnings=[])
    assert NgramCache.load(path) == want and b.dynamic == want
    b.learn([5, 6, 7, 8])
    assert b.save().merged_other is False             # b wrote the file last: no need to read it again


def test_nothing_pending_is_a_skipped_save_naming_the_file(tmp_path):
    store = ls.LookupStore(tmp_path / "f")
    store.load()
    assert store.save() == ls.SaveResult(str(tmp_path / "f" / "dynamic.bin"), skipped=True)
    store.learn([1, 2, 3])
    store.save()
    assert store.learn([1, 2, 3]) == 0                # learned already: nothing new
    assert store.save().skipped


def test_a_named_dynamic_cache_in_folders_not_made_yet_is_saved(tmp_path):
    dyn = tmp_path / "a" / "b" / "dyn.bin"
    store = ls.LookupStore(tmp_path / "f", dynamic_path=dyn)
    store.learn([1, 2, 3])
    assert store.save().path == str(dyn)
    assert NgramCache.load(dyn) == ngrams_of([1, 2, 3])


# -- a save that fails keeps what was learned ------------------------------------------------------------

@pytest.mark.parametrize("merging", [False, True], ids=["as is", "merging"])
def test_a_save_on_a_full_disk_says_why_and_keeps_what_was_learned(tmp_path, monkeypatch, merging):
    folder = tmp_path / "f"
    store = ls.LookupStore(folder)
    store.load()
    store.learn([1, 2, 3])
    store.save()
    if merging:                                      # another process wrote meanwhile
        other = ls.LookupStore(folder)
        other.learn([7, 8, 9])
        other.save()
    store.learn([1, 2, 3, 4, 5])
    pending = store.pending_entries
    monkeypatch.setattr(ls_store, "atomic_write_bytes", disk_full)  # the module that saves
    with pytest.raises(ls.LookupStoreError) as e:
        store.save()
    assert str(e.value) == f"cannot save the dynamic lookup cache {folder / 'dynamic.bin'}: No space left on device"
    assert store.pending_entries == pending
    store.learn([1, 2, 3, 4, 5, 6])                  # learned while the disk was full
    monkeypatch.undo()
    store.save()
    want = ngrams_of([1, 2, 3, 4, 5, 6])
    if merging:
        want.merge(ngrams_of([7, 8, 9]))
    assert NgramCache.load(folder / "dynamic.bin") == want and store.pending_entries == 0


# -- files that are not what they should be -------------------------------------------------------------

def test_a_file_another_process_left_damaged_is_moved_aside_at_save(tmp_path):
    folder = tmp_path / "f"
    store = ls.LookupStore(folder)
    store.load()
    store.learn([1, 2, 3])
    store.save()
    path = folder / "dynamic.bin"
    path.write_bytes(ngrams_of([4, 5, 6]).to_bytes()[:-3])   # cut short by another writer
    store.learn([1, 2, 3, 4])
    r = store.save()
    assert r.merged_other and len(r.warnings) == 1 and store.warnings == r.warnings
    with pytest.raises(CorruptCacheError) as e:
        NgramCache.from_bytes(ngrams_of([4, 5, 6]).to_bytes()[:-3], source="X")
    why = str(e.value).removeprefix("X: ")
    assert r.warnings == [f"the dynamic lookup cache {path} was damaged ({why}); it was moved to "
                          f"dynamic.bin.corrupt and an empty dynamic cache is used"]
    assert NgramCache.load(path) == ngrams_of([1, 2, 3, 4], start=3)   # only what was pending
    assert (folder / "dynamic.bin.corrupt").exists()


def test_ids_outside_the_vocabulary_in_another_processs_file_are_not_merged(tmp_path):
    folder = tmp_path / "f"
    store = ls.LookupStore(folder, model=types.SimpleNamespace(n_vocab=100))
    store.load()
    store.learn([1, 2, 3])
    store.save()
    ngrams_of([1, 2, 500]).save(folder / "dynamic.bin")      # written for another vocabulary
    store.learn([1, 2, 3, 4])
    r = store.save()
    with pytest.raises(CorruptCacheError) as e:
        check_vocab(ngrams_of([1, 2, 500]), 100, "X")
    why = str(e.value).removeprefix("X: ")
    assert r.warnings == [f"the dynamic lookup cache {folder / 'dynamic.bin'} was damaged ({why}); it was moved "
                          f"to dynamic.bin.corrupt and an empty dynamic cache is used"]
    assert NgramCache.load(folder / "dynamic.bin") == ngrams_of([1, 2, 3, 4], start=3)
    assert (folder / "dynamic.bin.corrupt").exists()


def test_the_apps_own_file_that_is_no_regular_file_is_kept_and_never_written_over(tmp_path, caplog):
    folder = tmp_path / "f"
    path = folder / "dynamic.bin"
    path.mkdir(parents=True)
    store = ls.LookupStore(folder)
    with caplog.at_level(logging.WARNING, logger="draftlight.lookup"):
        warnings = store.load()
    msg = (f"the dynamic lookup cache {path} is not used (not a regular file); it is kept as it is and "
           f"an empty cache is used")
    assert warnings == [msg] and store.warnings == [msg]
    assert [r.getMessage() for r in caplog.records if r.name == "draftlight.lookup"] == [msg]
    store.learn([1, 2, 3])
    with pytest.raises(ls.LookupStoreError) as e:
        store.save()
    assert str(e.value) == (f"the dynamic lookup cache {path} is kept as it is and not written over "
                            f"(not a regular file); move it away to let a new one be saved")
    assert path.is_dir() and store.pending_entries == ngrams_of([1, 2, 3]).n_entries


def test_damaged_files_are_moved_to_the_next_free_name(tmp_path):
    p = tmp_path / "dynamic.bin"
    names = []
    for i in range(4):
        p.write_bytes(b"damaged %d" % i)
        names.append(ls.move_aside(p).name)
    assert names == ["dynamic.bin.corrupt", "dynamic.bin.corrupt.1", "dynamic.bin.corrupt.2",
                     "dynamic.bin.corrupt.3"]
    assert (tmp_path / "dynamic.bin.corrupt.2").read_bytes() == b"damaged 2" and not p.exists()


def test_an_error_message_loses_the_path_it_begins_with_only():
    p = Path("/x/dynamic.bin")
    assert ls._reason(ValueError("/x/dynamic.bin: bad record at byte 8"), p) == "bad record at byte 8"
    assert ls._reason(ValueError("bad record at byte 8"), p) == "bad record at byte 8"


# -- clearing ---------------------------------------------------------------------------------------------

def test_clearing_forgets_everything_and_the_next_save_writes_as_is(tmp_path):
    store = ls.LookupStore(tmp_path / "f")
    store.load()
    store.learn([1, 2, 3])
    store.save()
    store.learn([1, 2, 3, 4])                        # pending, and forgotten too
    store.clear_dynamic()
    assert not store.dynamic_path.exists() and len(store.dynamic) == 0 and store.pending_entries == 0
    store.learn([7, 8, 9])
    r = store.save()
    assert r.merged_other is False and NgramCache.load(store.dynamic_path) == ngrams_of([7, 8, 9])


def test_a_dynamic_cache_that_cannot_be_removed_says_why(tmp_path):
    store = ls.LookupStore(tmp_path / "f")
    store.dynamic_path.mkdir(parents=True)           # unlink() refuses a folder
    with pytest.raises(ls.LookupStoreError) as e:
        store.clear_dynamic()
    assert str(e.value) == f"cannot remove {store.dynamic_path}: Is a directory"


# -- what the learner remembers ------------------------------------------------------------------------

def test_a_sequence_superseded_by_its_continuation_leaves_room_for_others():
    lr = ls.Learner()
    lr.new_from([50, 51, 52])
    lr.new_from([1, 2, 3])
    assert lr.new_from([1, 2, 3, 4]) == 3            # [1, 2, 3] is forgotten: its continuation covers it
    for i in range(6):
        lr.new_from([100 + i])
    assert lr.new_from([50, 51, 52, 53]) == 3        # eight remembered: [50, 51, 52] still among them


def test_a_shorter_sequence_covered_by_an_earlier_longer_one_is_kept():
    lr = ls.Learner()
    lr.new_from([1, 2, 9])
    assert lr.new_from([1, 2]) == 2
    assert lr.new_from([1, 2, 7]) == 2               # as far with [1, 2, 9] as with [1, 2]: the first kept
    for i in range(6):
        lr.new_from([100 + i])
    assert lr.new_from([1, 2, 9, 4]) == 2            # [1, 2, 9], the oldest of nine, was forgotten


# -- pruning ----------------------------------------------------------------------------------------------

def test_a_cache_exactly_at_the_cap_is_not_pruned():
    c = ngrams_of([1, 2, 3, 4, 5])
    same, removed = ls.prune_cache(c, c.file_size)
    assert same is c and removed == 0
    smaller, removed = ls.prune_cache(c, c.file_size - 1)
    assert removed > 0 and smaller.file_size <= int((c.file_size - 1) * ls.PRUNE_TO)


def test_among_entries_seen_as_often_the_oldest_go_first():
    c = NgramCache()
    for i in range(300):                             # counts 1, 2 and 3, mixed
        c.add((i,), i + 1000, 1 + (i * 7919) % 3)
    out, removed = ls.prune_cache(c, c.file_size // 2)
    kept = out.to_dict()
    gone = [i for i in range(300) if (i, -1, -1, -1) not in kept]
    ones = [i for i in range(300) if 1 + (i * 7919) % 3 == 1]
    twos = [i for i in range(300) if 1 + (i * 7919) % 3 == 2]
    assert removed == len(gone) and len(gone) > len(ones)
    assert gone == sorted(ones + twos[:len(gone) - len(ones)])   # every 1, then the oldest 2s


# -- loading -------------------------------------------------------------------------------------------------

def test_loading_makes_the_folder_only_where_a_file_of_it_is_used(tmp_path):
    store = ls.LookupStore(tmp_path / "a" / "b")
    assert store.loaded is False
    store.load()
    assert (tmp_path / "a" / "b").is_dir() and store.loaded is True
    static, dynamic = tmp_path / "s.bin", tmp_path / "d.bin"
    ngrams_of([1, 2, 3]).save(static)
    ls.LookupStore(tmp_path / "c", static_path=static, dynamic_path=dynamic).load()
    assert not (tmp_path / "c").exists()              # both files named: the folder is not used
    ls.LookupStore(tmp_path / "d", static_path=static).load()
    ls.LookupStore(tmp_path / "e", dynamic_path=dynamic).load()
    assert (tmp_path / "d").is_dir() and (tmp_path / "e").is_dir()


def test_a_save_right_after_loading_a_file_writes_it_as_is(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    ngrams_of([1, 2, 3]).save(folder / "dynamic.bin")
    store = ls.LookupStore(folder)
    store.load()
    store.learn([1, 2, 3, 4])
    assert store.save().merged_other is False
    assert NgramCache.load(folder / "dynamic.bin") == merged(ngrams_of([1, 2, 3]), ngrams_of([1, 2, 3, 4]))


def test_a_static_file_of_the_app_that_is_no_regular_file_is_kept_at_load(tmp_path):
    folder = tmp_path / "f"
    (folder / "static.bin").mkdir(parents=True)
    store = ls.LookupStore(folder)
    assert store.load() == [f"the static lookup cache {folder / 'static.bin'} is not used (not a regular file); "
                            f"it is kept as it is and an empty cache is used"]


def test_temp_files_of_killed_saves_are_removed_when_an_hour_old(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    old, fresh = folder / ".dynamic.bin.x1.tmp", folder / ".dynamic.bin.x2.tmp"
    old.write_bytes(b"half")
    fresh.write_bytes(b"half")
    t = time.time() - 2 * 3600
    os.utime(old, (t, t))
    ls.LookupStore(folder).load()
    assert not old.exists() and fresh.exists()


# -- a file the person named --------------------------------------------------------------------------------

def named_error(tmp_path, **paths) -> LookupCacheError:
    with pytest.raises(LookupCacheError) as e:
        ls.LookupStore(tmp_path / "f", **paths).load()
    return e.value


def test_a_named_static_cache_that_is_missing_says_so(tmp_path):
    p = tmp_path / "nope.bin"
    e = named_error(tmp_path, static_path=p)
    assert (e.path, e.kind, e.reason) == (str(p), "static", "No such file or directory")
    assert str(e) == f"failed to read static lookup cache {str(p)!r}: No such file or directory"


def test_a_named_cache_that_is_no_regular_file_or_damaged_is_named_and_left_as_it_is(tmp_path):
    d = tmp_path / "d.bin"
    d.mkdir()
    e = named_error(tmp_path, dynamic_path=d)
    assert (e.path, e.kind, e.reason) == (str(d), "dynamic", "not a regular file; the file was left as it is")
    s = tmp_path / "s.bin"
    data = ngrams_of([4, 5, 6]).to_bytes()[:-3]
    s.write_bytes(data)
    e = named_error(tmp_path, static_path=s)
    with pytest.raises(CorruptCacheError) as why:
        NgramCache.from_bytes(data, source="X")
    assert (e.path, e.kind) == (str(s), "static")
    assert e.reason == str(why.value).removeprefix("X: ") + "; the file was left as it is"
    assert s.read_bytes() == data and not (tmp_path / "s.bin.corrupt").exists()


def test_a_named_cache_that_cannot_be_read_says_why(tmp_path):
    (tmp_path / "a file").write_bytes(b"x")
    p = tmp_path / "a file" / "s.bin"                # its folder is a file: os.stat fails
    e = named_error(tmp_path, static_path=p)
    assert (e.path, e.kind, e.reason) == (str(p), "static", "Not a directory")


def test_a_damaged_file_moved_aside_is_logged(tmp_path, caplog):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "dynamic.bin").write_bytes(ngrams_of([4, 5, 6]).to_bytes()[:-3])
    store = ls.LookupStore(folder)
    with caplog.at_level(logging.WARNING, logger="draftlight.lookup"):
        warnings = store.load()
    assert [r.getMessage() for r in caplog.records if r.name == "draftlight.lookup"] == warnings
    assert len(warnings) == 1 and "moved to dynamic.bin.corrupt" in warnings[0]


def test_a_store_starts_unloaded_with_a_minute_to_wait_for_the_lock_and_a_positive_cap(tmp_path):
    store = ls.LookupStore(tmp_path / "f")
    assert (store.loaded, store.lock_timeout, store.max_bytes) == (False, 60.0, ls.DEFAULT_MAX_BYTES)
    assert ls.LookupStore(tmp_path / "f", max_bytes=1).max_bytes == 1
    for bad in (0, -5):
        with pytest.raises(ValueError) as e:
            ls.LookupStore(tmp_path / "f", max_bytes=bad)
        assert str(e.value) == "max_bytes must be positive"


def test_the_apps_own_file_that_cannot_be_read_is_kept_and_never_written_over(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    path = folder / "dynamic.bin"
    path.symlink_to("dynamic.bin")                   # a link to itself: os.stat fails (ELOOP)
    store = ls.LookupStore(folder)
    why = "it cannot be read: Too many levels of symbolic links"
    assert store.load() == [f"the dynamic lookup cache {path} is not used ({why}); it is kept as it is and an "
                            f"empty cache is used"]
    store.learn([1, 2, 3])
    with pytest.raises(ls.LookupStoreError) as e:
        store.save()
    assert str(e.value) == (f"the dynamic lookup cache {path} is kept as it is and not written over ({why}); "
                            f"move it away to let a new one be saved")
    assert path.is_symlink()
