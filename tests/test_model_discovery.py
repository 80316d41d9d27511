"""Finding GGUF models on disk: the usual places, a fake Hugging Face cache
with snapshot symlinks, split files, projectors, and the compatibility
verdict from metadata (equal to the check on loaded models)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.model_discovery import (SOURCE_APP, SOURCE_EXTRA, SOURCE_HF, SOURCE_LLAMACPP, SOURCE_LMSTUDIO,
                                 SearchDir, find_gguf_models, search_dirs)
from speculators.compat import IncompatibleDraftModel, check_compatible
from speculators.llama import Model
from speculators.types import SpecType

from .gguf_factory import write_header_only, write_tiny_llama

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")

VOCAB = [b"<pad>", b"<eos>", b"<bos>", b"<unk>", b"<mask>"] + [b"w%d" % i for i in range(5, 200)] + [b"<0x0A>"]


def _tiny(path: Path, texts=VOCAB, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_tiny_llama(path, texts, **kw)


@pytest.fixture()
def layout(tmp_path):
    """A home folder with models in every usual place."""
    home = tmp_path / "home"
    app_dir = tmp_path / "appdata" / "models"
    _tiny(app_dir / "target.gguf", name="target")

    # Hugging Face hub cache: snapshots link into blobs
    hub = home / ".cache" / "huggingface" / "hub"
    repo = hub / "models--acme--tiny-GGUF"
    blob = _tiny(repo / "blobs" / "3f2a9c", name="tiny-q8")
    other = _tiny(repo / "blobs" / "77aa01", texts=VOCAB[:100] + [b"zz%d" % i for i in range(100, 201)],
                  name="tiny-other")
    for rev in ("rev1", "rev2"):  # two revisions share the blob: listed once
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "tiny-Q8_0.gguf").symlink_to(Path("..") / ".." / "blobs" / "3f2a9c")
    (repo / "snapshots" / "rev2" / "sub").mkdir()
    (repo / "snapshots" / "rev2" / "sub" / "tiny-other.gguf").symlink_to(Path("../../..") / "blobs" / "77aa01")
    (repo / "snapshots" / "rev2" / "gone.gguf").symlink_to(Path("../..") / "blobs" / "missing")  # broken
    (repo / "blobs" / "deadbeef.incomplete").write_bytes(b"partial")
    proj = hub / "models--acme--vision-GGUF" / "snapshots" / "r"
    proj.mkdir(parents=True)
    write_header_only(proj / "mmproj-model-f16.gguf", "clip", ["v.weight"])
    write_header_only(proj / "projector.gguf", "clip", ["v.weight"])

    # LM Studio: publisher/repo/file, with a split model
    lms = home / ".lmstudio" / "models" / "pub" / "big-GGUF"
    lms.mkdir(parents=True)
    write_header_only(lms / "big-00001-of-00002.gguf", "qwen3", ["blk.1.nextn.eh_proj.weight"],
                      block_count=2, name="big")
    write_header_only(lms / "big-00002-of-00002.gguf", "qwen3", ["x.weight"], block_count=2)
    (lms / "broken.gguf").write_bytes(b"this is not a model" * 100)
    (lms / "readme.txt").write_text("hi")

    # llama.cpp's cache (old flat layout) and a symlink to the app's model
    lcc = home / ".cache" / "llama.cpp"
    lcc.mkdir(parents=True)
    _tiny(lcc / "acme_gpt2_tiny.gguf", texts=[b"a", b"b", b"ab", b"c", b"d", b"e", "Ċ".encode()],
          tokenizer="gpt2", pre="gpt-2", merges=["a b"], bos=0, eos=1, add_bos=False)
    (lcc / "same-as-target.gguf").symlink_to(app_dir / "target.gguf")

    extra = tmp_path / "extra"
    _tiny(extra / "deep" / "er" / "d.gguf", texts=VOCAB[:150], name="shorter")
    return dict(home=home, app_dir=app_dir, hub=hub, blob=blob, other=other, lms=lms, lcc=lcc, extra=extra)


def _find(layout, **kw):
    return find_gguf_models([layout["extra"]], env={}, home=layout["home"], platform="linux",
                            app_models_dir=layout["app_dir"], **kw)


def test_finds_models_in_the_usual_places(layout):
    found = _find(layout)
    by_name = {c.path.name: c for c in found}
    assert set(by_name) == {"target.gguf", "tiny-Q8_0.gguf", "tiny-other.gguf", "big-00001-of-00002.gguf",
                            "broken.gguf", "acme_gpt2_tiny.gguf", "d.gguf"}
    assert by_name["target.gguf"].source == SOURCE_APP
    hf = by_name["tiny-Q8_0.gguf"]
    assert hf.source == SOURCE_HF and hf.repo == "acme/tiny-GGUF"
    assert hf.path.parent.parent.name == "snapshots"  # the snapshot path, not the blob
    assert (hf.architecture, hf.name, hf.vocab_size, hf.block_count) == ("llama", "tiny-q8", len(VOCAB), 1)
    assert hf.size == layout["blob"].stat().st_size and hf.readable
    assert by_name["tiny-other.gguf"].repo == "acme/tiny-GGUF"
    big = by_name["big-00001-of-00002.gguf"]
    assert big.source == SOURCE_LMSTUDIO and big.repo == "pub/big-GGUF" and big.n_parts == 2
    assert big.size == sum(p.stat().st_size for p in layout["lms"].glob("big-*.gguf"))
    assert big.spec_types == [SpecType.DRAFT_MTP]
    assert not by_name["broken.gguf"].readable and by_name["broken.gguf"].error
    assert by_name["acme_gpt2_tiny.gguf"].source == SOURCE_LLAMACPP
    assert by_name["d.gguf"].source == SOURCE_EXTRA
    # order: the places in order
    order = [SOURCE_APP, SOURCE_LMSTUDIO, SOURCE_LLAMACPP, SOURCE_HF, SOURCE_EXTRA]
    assert [order.index(c.source) for c in found] == sorted(order.index(c.source) for c in found)
    assert all(c.to_dict()["path"] == str(c.path) for c in found)


def test_env_vars_move_the_caches(tmp_path, layout):
    hub = layout["hub"]
    moved = tmp_path / "elsewhere"
    os.rename(hub, moved)
    assert not any(c.source == SOURCE_HF for c in _find(layout))
    found = find_gguf_models(env={"HF_HOME": str(tmp_path / "hfhome")}, home=layout["home"],
                             app_models_dir=layout["app_dir"])
    assert not any(c.source == SOURCE_HF for c in found)
    (tmp_path / "hfhome").mkdir()
    (tmp_path / "hfhome" / "hub").symlink_to(moved, target_is_directory=True)
    found = find_gguf_models(env={"HF_HOME": str(tmp_path / "hfhome")}, home=layout["home"],
                             app_models_dir=layout["app_dir"])
    assert {c.path.name for c in found if c.source == SOURCE_HF} == {"tiny-Q8_0.gguf", "tiny-other.gguf"}
    found = find_gguf_models(env={"HF_HUB_CACHE": str(moved), "LLAMA_CACHE": str(tmp_path / "none")},
                             home=layout["home"], app_models_dir=layout["app_dir"])
    names = {c.path.name: c.source for c in found}
    assert names["tiny-Q8_0.gguf"] == SOURCE_HF
    assert "acme_gpt2_tiny.gguf" not in names  # LLAMA_CACHE points elsewhere now


def test_search_dirs_follow_the_platform_rules(tmp_path):
    home = tmp_path
    d = {s.source: [] for s in search_dirs(env={}, home=home, app_models_dir=tmp_path / "m")}
    for s in search_dirs(env={}, home=home, app_models_dir=tmp_path / "m"):
        d[s.source].append(s.path)
    assert d[SOURCE_HF] == [home / ".cache" / "huggingface" / "hub"]
    assert d[SOURCE_LLAMACPP] == [home / ".cache" / "llama.cpp"]
    assert d[SOURCE_LMSTUDIO] == [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]

    def src(env, platform="linux"):
        return {s.source: s.path for s in search_dirs(env=env, home=home, platform=platform,
                                                       app_models_dir=tmp_path)}
    assert src({"XDG_CACHE_HOME": "/x"})[SOURCE_HF] == Path("/x/huggingface/hub")
    assert src({"XDG_CACHE_HOME": "/x"})[SOURCE_LLAMACPP] == Path("/x/llama.cpp")
    assert src({"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"})[SOURCE_HF] == Path("/h/hub")
    assert src({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"})[SOURCE_HF] == Path("/c")
    assert src({"LLAMA_CACHE": "/l"})[SOURCE_LLAMACPP] == Path("/l")
    assert src({}, "darwin")[SOURCE_LLAMACPP] == home / "Library" / "Caches" / "llama.cpp"
    assert src({"LOCALAPPDATA": "/w"}, "win32")[SOURCE_LLAMACPP] == Path("/w/llama.cpp")
    # LM Studio's own setting for where it downloads to comes first
    (home / ".lmstudio").mkdir()
    (home / ".lmstudio" / "settings.json").write_text('{"downloadsFolder": "/big/disk/models"}')
    lm = [s.path for s in search_dirs(env={}, home=home, app_models_dir=tmp_path) if s.source == SOURCE_LMSTUDIO]
    assert lm[0] == Path("/big/disk/models")


def test_compatibility_from_metadata_equals_the_loaded_check(layout):
    target_path = layout["app_dir"] / "target.gguf"
    found = {c.path.name: c for c in _find(layout)}
    expected_rules = {"target.gguf": None, "tiny-Q8_0.gguf": None, "d.gguf": None,
                      "tiny-other.gguf": "token_text", "acme_gpt2_tiny.gguf": "vocab_type",
                      "big-00001-of-00002.gguf": "unreadable", "broken.gguf": "unreadable"}
    target = Model(str(target_path))
    try:
        for name, rule in expected_rules.items():
            c = found[name]
            for t in (target_path, target):
                v = c.compatibility_with(t)
                assert v.ok == (rule is None) and v.rule == rule, (name, v)
            if rule in (None, "unreadable"):
                continue
            draft = Model(str(c.path))
            try:
                with pytest.raises(IncompatibleDraftModel) as ei:
                    check_compatible(target, draft)
                assert (ei.value.rule, ei.value.reason) == (v.rule, v.reason)
            finally:
                draft.close()
        assert found["tiny-other.gguf"].compatibility_with(target_path).reason == \
            "token text at id 100 differs: 'w100' vs 'zz100'"
        assert "no tokenizer" in found["big-00001-of-00002.gguf"].compatibility_with(target).reason
    finally:
        target.close()


def test_walk_limits_and_explicit_dirs(tmp_path):
    a = tmp_path / "a"
    _tiny(a / "x.gguf")
    (a / "loop").symlink_to(a, target_is_directory=True)  # directory symlinks are not followed
    (a / ".hidden").mkdir()
    _tiny(a / ".hidden" / "h.gguf")
    found = find_gguf_models(dirs=[SearchDir(a, SOURCE_EXTRA), SearchDir(a, SOURCE_EXTRA),
                                   SearchDir(tmp_path / "missing", SOURCE_EXTRA)])
    assert [c.path.name for c in found] == ["x.gguf"]
