"""Lookup-cache files that are not what they should be (issue 49, items 5 and 6).

* A file the person named (``--lookup-cache-static`` / ``--lookup-cache-dynamic``, the config's
  paths) is never renamed, moved, written over or deleted: what is wrong with it is said instead.
  Only the app's own files in its cache folder are moved aside to ``.corrupt``.
* A file is judged by its size and first bytes before it is read whole: a text corpus, a GGUF
  model or a multi-GB file costs one small read, never the machine's memory.
* Token ids outside the model's vocabulary never get through (llama.cpp aborts on them).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app import lookup_store as ls
from speculators import ngram_cache as nc
from speculators.chain import SpeculatorChain
from speculators.ngram_cache import CorruptCacheError, LookupCacheError, NgramCache
from speculators.params import SpecParams

ROOT = Path(__file__).resolve().parent.parent

CORPUS = "The cat sat on the mat.\nThe cat ate the rat.\n" * 20


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``folder`` but lock files (a named dynamic cache's lock lives beside it):
    name -> (bytes, mtime_ns)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.endswith(".lock")}


def ngram_spec(static: Path | None = None, dynamic: Path | None = None) -> SpecParams:
    sp = SpecParams.from_types("ngram-cache")
    sp.ngram_cache.lookup_cache_static = str(static) if static else None
    sp.ngram_cache.lookup_cache_dynamic = str(dynamic) if dynamic else None
    return sp


# ---------------------------------------------------------------------------
# item 5: named files are never renamed; files are judged before being read
# ---------------------------------------------------------------------------


def test_a_text_corpus_named_as_a_cache_is_refused_and_left_as_it_is(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    corpus = mine / "corpus.txt"
    corpus.write_text(CORPUS)
    before = snapshot(mine)
    folder = tmp_path / "store"

    for kw in ({"static_path": corpus}, {"dynamic_path": corpus}):
        with pytest.raises(LookupCacheError) as ei:
            ls.LookupStore(folder, **kw).load()
        msg = str(ei.value)
        assert "corpus.txt" in msg and "it is text" in msg and "lookup create" in msg
        assert "left as it is" in msg
        assert snapshot(mine) == before          # same name, same bytes, no .corrupt beside it

    # the speculator's own loader (no store: --no-lookup-store, bench) says the same
    with pytest.raises(LookupCacheError, match="it is text"):
        SpeculatorChain.from_params(ngram_spec(static=corpus), {})
    with pytest.raises(nc.NotALookupCacheError, match="it is text"):
        NgramCache.load(corpus)
    assert snapshot(mine) == before

    # the app's own file with text in it is damaged: moved aside as before, and said to be text
    folder.mkdir(exist_ok=True)
    (folder / "static.bin").write_text(CORPUS)
    store = ls.LookupStore(folder)
    (w,) = store.load()
    assert "it is text" in w and "static.bin.corrupt" in w
    assert (folder / "static.bin.corrupt").read_text() == CORPUS and not (folder / "static.bin").exists()


def test_a_damaged_named_dynamic_cache_is_never_moved_nor_written_over(tmp_path):
    good = NgramCache()
    good.update([1, 2, 3, 1, 2, 3], 1, 4, 6)
    data = good.to_bytes("insertion")
    mine = tmp_path / "mine"
    mine.mkdir()
    dyn = mine / "dynamic.bin"
    dyn.write_bytes(data[:-3])                        # cut in the middle
    before = snapshot(mine)
    with pytest.raises(LookupCacheError, match="cut in the middle") as ei:
        ls.LookupStore(tmp_path / "store", dynamic_path=dyn).load()
    assert "dynamic.bin" in str(ei.value)
    assert snapshot(mine) == before

    # a good one that is replaced by something else while the store runs: the save refuses
    dyn.write_bytes(data)
    store = ls.LookupStore(tmp_path / "store", dynamic_path=dyn)
    assert store.load() == [] and store.dynamic == good
    store.learn([7, 8, 9])
    dyn.write_text(CORPUS)
    with pytest.raises(ls.LookupStoreError, match="it is text"):
        store.save()
    assert dyn.read_text() == CORPUS and sorted(p.name for p in mine.iterdir()) == ["dynamic.bin", "dynamic.bin.lock"]
    assert store.pending_entries == 3                 # what was learned is kept for a later save
    dyn.write_bytes(data)
    store.save()
    want = good.copy()
    want.update([7, 8, 9], 1, 4, 3)
    assert NgramCache.load(dyn) == want


_LIMITED = textwrap.dedent("""
    import json, os, resource, sys, time
    sys.path.insert(0, {root!r})
    from app import lookup_store as ls
    from speculators.ngram_cache import NgramCache

    def vm_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    # reading any of these files whole would take gigabytes (or forever): this process may not
    limit = vm_bytes() + (768 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {{}}

    def attempt(name, fn):
        t0 = time.monotonic()
        try:
            r = fn()
            out[name] = {{"ok": repr(r)}}
        except BaseException as e:
            out[name] = {{"error": type(e).__name__, "msg": str(e)}}
        out[name]["s"] = time.monotonic() - t0
""")


def run_limited(body: str, **kw) -> dict:
    """Run ``body`` after :data:`_LIMITED` in a child whose address space may grow by 768 MiB
    at most (so code that read a file whole fails fast instead of taking the machine's memory);
    the JSON of ``out`` it fills, with the growth of its peak RSS in KiB."""
    code = _LIMITED.format(root=str(ROOT)) + textwrap.dedent(body).format(**{k: str(v) for k, v in kw.items()}) \
        + '\nout["rss_growth_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0\n' \
        + "print(json.dumps(out))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    print(json.dumps(r, indent=1))
    assert r["rss_growth_kib"] < 64 << 10
    for name, v in r.items():
        assert not isinstance(v, dict) or v["s"] < 2.0, (name, v)     # one small read at most
    return r


def sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")


@linux_only
def test_multi_gigabyte_files_are_refused_without_being_read(tmp_path):
    size = 8 << 30
    gguf = sparse(tmp_path / "model.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 0), size)
    # a plausible first record (the n-gram (7,), one token: 8 seen once), then zeros
    record = struct.pack("<5i", 7, -1, -1, -1, 1) + struct.pack("<2i", 8, 1)
    big = sparse(tmp_path / "big.bin", record, size)
    folder = tmp_path / "store"
    folder.mkdir()
    sparse(folder / "static.bin", record, size)
    sparse(folder / "dynamic.bin", record, size)
    if os.stat(big).st_blocks * 512 > 1 << 20:
        pytest.skip("this file system does not keep sparse files")
    r = run_limited("""
        gguf, big, folder = {gguf!r}, {big!r}, {folder!r}
        attempt("gguf_static", lambda: ls.LookupStore(folder + "-x", static_path=gguf).load())
        attempt("gguf_load", lambda: NgramCache.load(gguf))
        attempt("big_dynamic", lambda: ls.LookupStore(folder + "-x", dynamic_path=big).load())
        attempt("big_load", lambda: NgramCache.load(big))
        own = ls.LookupStore(folder)
        attempt("own_load", lambda: own.load())
        own.learn([1, 2, 3])
        attempt("own_save", lambda: own.save())
        out["own_static"] = len(own.static)
    """, gguf=gguf, big=big, folder=folder)

    # a named file: a clear error saying what it is, the file left alone
    assert r["gguf_static"]["error"] == "LookupCacheError"
    assert "model.gguf" in r["gguf_static"]["msg"] and "GGUF model" in r["gguf_static"]["msg"]
    assert r["gguf_load"]["error"] == "NotALookupCacheError"
    assert r["big_dynamic"]["error"] == "LookupCacheError"
    assert "big.bin" in r["big_dynamic"]["msg"] and "8.0 GiB is more than" in r["big_dynamic"]["msg"]
    assert r["big_load"]["error"] == "LookupFileRefused"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file() and not p.name.endswith(".lock")) \
        == ["big.bin", "model.gguf"]
    assert gguf.stat().st_size == big.stat().st_size == size

    # the app's own files that are merely too big are kept, not moved aside, and never written over
    warnings = r["own_load"]["ok"]
    assert "static.bin" in warnings and "dynamic.bin" in warnings and "kept as it is" in warnings
    assert r["own_static"] == 0
    assert r["own_save"]["error"] == "LookupStoreError" and "not written over" in r["own_save"]["msg"]
    assert sorted(p.name for p in folder.iterdir() if p.name != ".lock") == ["dynamic.bin", "static.bin"]
    assert (folder / "dynamic.bin").stat().st_size == size
    with open(folder / "dynamic.bin", "rb") as f:
        assert f.read(len(record)) == record


@linux_only
def test_files_that_are_not_regular_files_are_refused_unread(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # reading /dev/zero would never end; opening a pipe would wait for a writer (a writer is
    # started here, so that code that does open it fails this test instead of hanging it)
    r = run_limited("""
        import threading
        def writer():
            with open({fifo!r}, "wb") as f:
                f.write(b"x" * 100)
        threading.Thread(target=writer, daemon=True).start()
        attempt("zero_load", lambda: NgramCache.load("/dev/zero"))
        attempt("zero_static", lambda: ls.LookupStore({folder!r}, static_path="/dev/zero").load())
        attempt("fifo_dynamic", lambda: ls.LookupStore({folder!r}, dynamic_path={fifo!r}).load())
    """, fifo=fifo, folder=tmp_path / "store")
    assert r["zero_load"]["error"] == "LookupFileRefused" and "not a regular file" in r["zero_load"]["msg"]
    for name in ("zero_static", "fifo_dynamic"):
        assert r[name]["error"] == "LookupCacheError" and "not a regular file" in r[name]["msg"]
    assert fifo.exists() and not list(tmp_path.glob("*.corrupt*"))


# ---------------------------------------------------------------------------
# item 6: token ids outside the vocabulary
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab(default_model_path):
    m = ls.open_vocab(default_model_path)
    yield m
    m.close()


def out_of_vocab_cache(n_vocab: int) -> NgramCache:
    """Two good entries, one whose next token is past the vocabulary, one with a negative id."""
    c = NgramCache()
    c.add((818, 5866), 10_000, 3)
    c.add((818, 5866), n_vocab + 7, 5)
    c.add((2,), 818, 1)
    c.add((5866, -5), 2, 1)
    return c


def test_a_cache_naming_tokens_outside_the_vocabulary_is_refused(vocab, tmp_path):
    n = vocab.n_vocab
    assert n == 262144
    bad = out_of_vocab_cache(n)
    mine = tmp_path / "mine"
    mine.mkdir()
    path = mine / "other-model.bin"
    bad.save(path)
    before = snapshot(mine)

    # named files: refused, with the count and the vocabulary, never moved
    for kw in ({"static_path": path}, {"dynamic_path": path}):
        with pytest.raises(LookupCacheError) as ei:
            ls.LookupStore.for_model(vocab, **kw)
        msg = str(ei.value)
        assert "other-model.bin" in msg and "2 of its 4 entries" in msg
        assert f"vocabulary of {n} tokens" in msg and str(n + 7) in msg
        assert isinstance(ei.value.__cause__, nc.VocabMismatchError) and ei.value.__cause__.n_bad == 2
        assert snapshot(mine) == before
    # the speculator's own loader, given the model (as Engine.set_spec gives it)
    with pytest.raises(LookupCacheError, match="outside this model's vocabulary"):
        SpeculatorChain.from_params(ngram_spec(static=path), {"model": vocab})
    with pytest.raises(nc.VocabMismatchError):
        NgramCache.load(path, n_vocab=n)
    assert NgramCache.load(path) == bad               # without a vocabulary, the file itself is valid

    # the app's own files: damaged, moved aside; the store holds none of those ids
    store = ls.LookupStore.for_model(vocab, load=False)
    store.static_path.write_bytes(path.read_bytes())
    store.dynamic_path.write_bytes(path.read_bytes())
    warnings = store.load()
    assert len(warnings) == 2
    assert all("2 of its 4 entries" in w and f"vocabulary of {n} tokens" in w and ".corrupt" in w
               for w in warnings)
    for cache in (store.static, store.dynamic):
        assert all(0 <= t < n for k, tok, _ in cache.entries() for t in (*k, tok) if t != -1)
    assert len(store.static) == len(store.dynamic) == 0
    assert (store.folder / "static.bin.corrupt").read_bytes() == path.read_bytes()
    # a good cache of the same vocabulary loads as before
    good = NgramCache()
    good.add((818, 5866), 10_000, 3)
    good.save(store.static_path)
    assert store.load() == [] and store.static == good


_DRAFT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from speculators.llama import set_extra_bufts
    set_extra_bufts(os.environ.get("DRAFTLIGHT_EXTRA_BUFTS", "on"))
    from app.lookup_store import LookupStore
    from speculators.engine import Engine, EngineConfig
    from speculators.ngram_cache import LookupCacheError, NgramCache
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    eng = Engine({model!r}, EngineConfig(n_ctx=512, n_threads=1, reuse_prefix=False))
    prompt = eng.prompt_tokens(text="Count from one to ten.")
    seq = list(prompt) + list(eng.run(prompt, max_tokens=8, sampling=greedy).tokens)
    # a static cache that drafts an id past the vocabulary after every 2-gram of this reply
    bad = NgramCache()
    for a, b in zip(seq, seq[1:]):
        if (a, b) not in bad:
            bad.add((a, b), eng.model.n_vocab + 7, 5)
    bad.save({path!r})
    auto = SpecParams.from_types("auto")     # asks every draft's text (stop strings): token_to_piece

    def reply(resources):
        eng.set_spec(auto, resources)
        r = eng.run(prompt, max_tokens=8, sampling=greedy, stop=["zzz"])
        print("replied", r.stats.n_drafted, flush=True)

    # a named static cache: the store refuses it, and so does the speculator's own loader
    try:
        store = LookupStore.for_model(eng.model, static_path={path!r}, root={root_dir!r})
    except LookupCacheError as e:
        print("refused:", e, flush=True)
        store = None
    reply(store.resources() if store is not None else None)
    named = SpecParams.from_types("ngram-cache")
    named.ngram_cache.lookup_cache_static = {path!r}
    try:
        eng.set_spec(named)
        print("set_spec took it", flush=True)
    except LookupCacheError as e:
        print("refused by set_spec:", e, flush=True)
    # the app's own static cache holding it: moved aside, the reply drafts without it
    own = LookupStore.for_model(eng.model, load=False, root={root_dir!r})
    own.static_path.write_bytes(open({path!r}, "rb").read())
    print("warnings:", own.load(), flush=True)
    reply(own.resources())
    eng.close()
    print("done", flush=True)
""")


def test_drafting_never_passes_an_out_of_vocabulary_id_to_llama_cpp(default_model_path, tmp_path):
    p = subprocess.run([sys.executable, "-c", _DRAFT.format(root=str(ROOT), model=str(default_model_path),
                                                            path=str(tmp_path / "bad.bin"),
                                                            root_dir=str(tmp_path / "lookup"))],
                       capture_output=True, text=True, timeout=300)
    print(p.stdout)
    # before: "terminate called after throwing an instance of 'std::out_of_range'", SIGABRT
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-2000:])
    lines = p.stdout.splitlines()
    assert lines[0].startswith("refused:") and "outside this model's vocabulary" in lines[0]
    assert lines[1].startswith("replied")
    assert lines[2].startswith("refused by set_spec:") and "outside this model's vocabulary" in lines[2]
    assert lines[3].startswith("warnings:") and "static.bin.corrupt" in lines[3]
    assert lines[4].startswith("replied") and lines[5] == "done"


def test_malformed_padding_is_caught_too(vocab):
    c = NgramCache()
    c._map[(5, -1, 6, -1)] = {7: 1}                   # padding between ids: no file of llama.cpp's has it
    with pytest.raises(nc.VocabMismatchError, match="misplaced -1 padding"):
        nc.check_vocab(c, vocab.n_vocab)
    assert issubclass(nc.VocabMismatchError, CorruptCacheError)
