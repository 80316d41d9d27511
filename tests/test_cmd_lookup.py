"""``draftlight lookup`` end to end, and the lookup store in ``generate`` and ``bench``.

Everything runs with the real embedded default model (its vocabulary only
for ``lookup``), installed into the private data dir so that commands
without ``--model`` find it.
"""

from __future__ import annotations

import io
import json
import os

import pytest

from app import lookup_store as ls
from app.cli import main
from speculators.ngram_cache import NgramCache

CORPUS = ("The harbour master walked along the quay every morning. "
          "The harbour master counted the boats and wrote the tides in his book.\n") * 8
OTHER = "Every boat in the harbour had a name painted on its bow in white letters.\n" * 4


@pytest.fixture
def default_model(default_model_path):
    """The default model, as if the app had assembled it (a link, stamped)."""
    from app import models
    target = models.default_model_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(default_model_path, target)
    models._write_stamp(target, models._package().EXPECTED_SHA256)
    return target


@pytest.fixture(scope="module")
def vocab(default_model_path):
    m = ls.open_vocab(default_model_path)
    yield m
    m.close()


def folder_of(vocab):
    return ls.folder_for_fingerprint(ls.tokenizer_fingerprint(vocab))


def as_read_by_f(text: str) -> str:
    """A corpus file's text as llama.cpp's -f reads it: one trailing newline dropped."""
    return text[:-1] if text.endswith("\n") else text


def static_by_hand(vocab, *texts):
    """What llama-lookup-create -f counts: the 2-grams of each tokenized file text."""
    c = NgramCache()
    for t in texts:
        toks = vocab.tokenize(as_read_by_f(t), add_special=True, parse_special=True)
        c.update(toks, 2, 2, len(toks))
    return c


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_create_installs_into_the_models_folder_or_writes_output(default_model, vocab, tmp_path, capsys):
    c1, c2 = tmp_path / "a.txt", tmp_path / "b.txt"
    c1.write_text(CORPUS)
    c2.write_text(OTHER)
    rc, out, err = run(capsys, "lookup", "create", str(c1), str(c2))
    assert rc == 0, err
    want = static_by_hand(vocab, CORPUS, OTHER)
    installed = folder_of(vocab) / "static.bin"
    assert installed.read_bytes() == want.to_bytes("stl")
    assert f"{len(want)} n-grams, {want.n_entries} entries" in out and str(installed) in out

    dest = tmp_path / "out" / "s.bin"
    dest.parent.mkdir()
    rc, out, err = run(capsys, "lookup", "create", "--model", str(default_model), "--output", str(dest), str(c2))
    assert rc == 0, err
    assert dest.read_bytes() == static_by_hand(vocab, OTHER).to_bytes("stl")
    assert installed.read_bytes() == want.to_bytes("stl")      # untouched

    rc, out, err = run(capsys, "lookup", "create", str(tmp_path / "missing.txt"))
    assert rc == 1 and err.count("\n") == 1 and "missing.txt" in err


def test_merge_adds_counts(tmp_path, capsys):
    a, b = NgramCache(), NgramCache()
    a.update([1, 2, 3, 1, 2, 4], 1, 4, 6)
    b.update([1, 2, 3, 9], 1, 4, 4)
    a.save(tmp_path / "a.bin")
    b.save(tmp_path / "b.bin")
    rc, out, err = run(capsys, "lookup", "merge", str(tmp_path / "m.bin"), str(tmp_path / "a.bin"),
                       str(tmp_path / "b.bin"))
    assert rc == 0, err
    # as llama-lookup-merge: the first file loaded, the others merged in, saved
    want = NgramCache.load(tmp_path / "a.bin")
    want.merge(NgramCache.load(tmp_path / "b.bin"))
    assert (tmp_path / "m.bin").read_bytes() == want.to_bytes("stl")
    assert NgramCache.load(tmp_path / "m.bin")[(1, 2)] == {3: 2, 4: 1}
    (tmp_path / "bad.bin").write_bytes(b"\x01\x02\x03")
    rc, out, err = run(capsys, "lookup", "merge", str(tmp_path / "m2.bin"), str(tmp_path / "a.bin"),
                       str(tmp_path / "bad.bin"))
    assert rc == 1 and "draftlight: error:" in err and "Traceback" not in err
    assert not (tmp_path / "m2.bin").exists()


def test_stats_simulates_drafting(default_model, vocab, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(CORPUS)
    tokens = vocab.tokenize(as_read_by_f(CORPUS), add_special=True, parse_special=True)
    rc, out, err = run(capsys, "lookup", "stats", "--no-static", "--no-dynamic", "--json", str(text))
    assert rc == 0, err
    bare = json.loads(out)
    ref = ls.simulate_drafting(tokens, n_ctx=4096)
    assert (bare["n_predict"], bare["n_drafted"], bare["n_accept"]) == (len(tokens), ref.n_drafted, ref.n_accept)
    assert bare["static"] is None and bare["dynamic"] is None and bare["n_accept"] > 0

    # a static cache of the same text lets drafting start earlier
    sta = tmp_path / "s.bin"
    static_by_hand(vocab, CORPUS).save(sta)
    rc, out, err = run(capsys, "lookup", "stats", "--static", str(sta), "--no-dynamic", str(text))
    assert rc == 0, err
    lines = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    assert int(lines["n_accept     "]) > bare["n_accept"]
    assert "accept       =" in out and str(sta) in out

    # by default the model's installed caches are used
    ls.LookupStore.for_model(vocab).build_static([text])
    rc, out, err = run(capsys, "lookup", "stats", "--json", str(text))
    d = json.loads(out)
    assert d["static"] == str(folder_of(vocab) / "static.bin") and d["n_accept"] == int(lines["n_accept     "])


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_info_and_clear(default_model, vocab, tmp_path, capsys, monkeypatch):
    rc, out, err = run(capsys, "lookup", "info")
    assert rc == 0 and "no lookup caches yet" in out
    corpus = tmp_path / "c.txt"
    corpus.write_text(CORPUS)
    assert run(capsys, "lookup", "create", str(corpus))[0] == 0
    store = ls.LookupStore.for_model(vocab)
    store.learn(vocab.tokenize("the harbour master the harbour master"))
    store.save()
    folder = folder_of(vocab)
    rc, out, err = run(capsys, "lookup", "info")
    assert rc == 0 and str(folder) in out and "gemma-3-270m" in out and "Gemma 3 270m" in out
    assert f"{len(store.static)} n-grams" in out and f"{store.dynamic.n_entries} entries" in out
    rc, out, err = run(capsys, "lookup", "info", "--json")
    info = json.loads(out)
    (f,) = info["folders"]
    assert f["files"]["dynamic.bin"]["entries"] == store.dynamic.n_entries
    assert f["files"]["static.bin"]["bytes"] == (folder / "static.bin").stat().st_size

    # no terminal and no --yes: refused
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    rc, out, err = run(capsys, "lookup", "clear")
    assert rc == 1 and "--yes" in err and folder.exists()
    # a terminal: asked; "n" keeps it
    monkeypatch.setattr("sys.stdin", FakeTty("n\n"))
    rc, out, err = run(capsys, "lookup", "clear", folder.name)
    assert rc == 1 and "Remove" in err and folder.exists()
    # only the dynamic cache
    rc, out, err = run(capsys, "lookup", "clear", "--dynamic-only", "--yes", str(folder))
    assert rc == 0 and not (folder / "dynamic.bin").exists() and (folder / "static.bin").exists()
    # something that is not a cache folder is refused
    rc, out, err = run(capsys, "lookup", "clear", "--yes", str(tmp_path))
    assert rc == 1 and "not a lookup cache folder" in err and tmp_path.exists()
    monkeypatch.setattr("sys.stdin", FakeTty("y\n"))
    rc, out, err = run(capsys, "lookup", "clear", "--model", str(default_model))
    assert rc == 0 and not folder.exists()
    assert "no lookup caches yet" in run(capsys, "lookup", "info")[1]


def test_generate_learns_into_the_dynamic_cache(default_model, vocab, capsys):
    args = ["generate", "--no-config", "-t", "1", "--temp", "0", "-n", "12", "--spec-type", "ngram-cache",
            "-p", "Name three colours.", "--json"]
    dyn = folder_of(vocab) / "dynamic.bin"
    rc, out, err = run(capsys, *args)
    assert rc == 0, err
    first = NgramCache.load(dyn)
    res = json.loads(out)
    assert res["lookup"]["save"]["entries"] == first.n_entries > 0
    assert set(res["lookup"]["sources"]) == {"context", "dynamic", "static"}
    # --no-lookup-store: the user's caches are left alone
    rc, out, err = run(capsys, *args, "--no-lookup-store")
    assert rc == 0 and "lookup" not in json.loads(out) and NgramCache.load(dyn) == first
    # a damaged file: moved aside, the person told, the reply still comes
    dyn.write_bytes(dyn.read_bytes()[:-5])
    rc, out, err = run(capsys, *args[:-1])
    assert rc == 0 and "warning" in err and "dynamic.bin.corrupt" in err
    assert (dyn.parent / "dynamic.bin.corrupt").exists() and NgramCache.load(dyn) == first
    # explicit paths win over the folder
    rc, out, err = run(capsys, *args, "-lcs", str(dyn.parent / "nope.bin"))
    assert rc == 1 and "static lookup cache" in err and err.count("\n") == 1


def test_bench_lookup_learn_reports_both_side_by_side(default_model, capsys):
    rc, out, err = run(capsys, "bench", "--no-baseline", "--json", "-t", "1", "-c", "512", "-n", "12",
                       "--lookup-learn-prompt", "Write a one-sentence product description for a red wool sweater.",
                       "--lookup-learn-prompt", "Write a one-sentence product description for a blue cotton shirt.",
                       "-p", "Write a one-sentence product description for a green silk scarf.")
    assert rc == 0, err
    report = json.loads(out)
    for key in ("model", "n_ctx", "threads", "max_tokens", "prompts", "rows", "synthetic"):
        assert key in report
    names = [r["name"] for r in report["rows"]]
    assert names == ["none", "ngram-cache, no dynamic", "ngram-cache, learned dyn"]
    lk = report["lookup_learn"]
    assert lk["learn_prompts"] == 2 and lk["dynamic_entries"] > 0
    assert lk["without"]["sources"]["dynamic"]["drafted"] == 0
    assert lk["with"]["drafted"] == report["rows"][2]["drafted"]
    # the table prints them too
    from app.cmd_bench import print_table
    print_table(report)
    out = capsys.readouterr().out
    assert "ngram-cache, learned dyn" in out and "lookup learning: 2 prompts" in out
    assert "ngram-cache with it:    drafted" in out
    # without --spec-type, bench compares Automatic speculation with none
    rc, out, err = run(capsys, "bench", "--no-baseline", "--json", "-t", "1", "-c", "512", "-n", "4",
                       "--rounds", "1", "-p", "x")
    assert rc == 0, err
    assert [r["name"] for r in json.loads(out)["rows"]] == ["none", "auto"]
