"""``--spec-type auto``: what it picks and why, its defaults, and the controller it runs under."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from speculators.auto import AutoChoice, auto_plan, uses_type
from speculators.chain import SpeculatorChain
from speculators.costcurve import CostCurve
from speculators.params import ParamError, SpecParams
from speculators.sampling import SamplingParams
from speculators.types import NGRAM_TYPES, PRIORITY, SpecType, UnknownSpecType, parse_types

from .gguf_factory import write_header_only
from .prompts import PROMPTS

GREEDY = SamplingParams(temperature=0.0)
NGRAMS = [t.value for t in PRIORITY if t in NGRAM_TYPES]


def test_auto_parses_and_round_trips_through_the_config():
    assert parse_types("auto") == [SpecType.AUTO]
    assert parse_types(["auto"]) == [SpecType.AUTO]
    assert parse_types("auto,none") == []          # none wins, as everywhere
    with pytest.raises(UnknownSpecType, match="cannot be combined with ngram-mod"):
        parse_types("auto,ngram-mod")
    p = SpecParams.auto()
    assert p.types == [SpecType.AUTO] and p.is_auto and p.adaptive_on
    d = p.to_dict()
    assert d["types"] == ["auto"] and "adaptive" not in d
    assert SpecParams.from_dict(d) == p
    assert SpecParams.from_dict({"types": ["auto"]}).is_auto
    assert SpecParams.from_dict({"types": "auto"}).is_auto
    # the controller stays off with an explicit list (llama.cpp's behaviour) unless asked for
    explicit = SpecParams.from_types("ngram-mod")
    assert not explicit.adaptive_on
    explicit.adaptive = True
    assert explicit.adaptive_on and SpecParams.from_dict(explicit.to_dict()).adaptive is True
    off = SpecParams.auto(adaptive=False)
    assert not off.adaptive_on and SpecParams.from_dict(off.to_dict()).adaptive is False
    assert not SpecParams(adaptive=True).adaptive_on   # no types, nothing to control
    with pytest.raises(ParamError, match="adaptive"):
        SpecParams.from_dict({"adaptive": "sometimes"})
    assert p.n_max_configured() == 64                 # ngram-mod's, the longest of the n-gram types


def test_plan_without_an_engine_for_a_plain_model(default_model_path):
    plan = auto_plan(SpecParams.auto(), str(default_model_path))
    assert [c.name for c in plan] == [t.value for t in PRIORITY]
    assert all(isinstance(c, AutoChoice) and isinstance(c, tuple) and len(c) == 3 for c in plan)
    used = [c.name for c in plan if c.used]
    assert used == NGRAMS
    why = {c.name: c.reason for c in plan}
    assert why["draft-mtp"] == "the model has no multi-token-prediction heads"
    assert why["draft-simple"] == "no draft model is set"
    assert all(c.reason for c in plan)


def test_plan_follows_the_gguf_headers(tmp_path, default_model_path):
    mtp = write_header_only(tmp_path / "mtp.gguf", "qwen3", ["blk.1.nextn.eh_proj.weight"], block_count=2)
    plan = {c.name: c for c in auto_plan(SpecParams.auto(), str(mtp))}
    assert plan["draft-mtp"].used and "multi-token-prediction" in plan["draft-mtp"].reason
    dflash = write_header_only(tmp_path / "df.gguf", "dflash", ["markov_w1.weight"], block_count=1)
    sp = SpecParams.auto()
    sp.draft.model = str(dflash)
    plan = {c.name: c for c in auto_plan(sp, str(default_model_path))}
    assert plan["draft-dspark"].used and not plan["draft-dflash"].used and not plan["draft-simple"].used
    assert "df.gguf" in plan["draft-dspark"].reason
    sp.draft.model = str(default_model_path)          # an ordinary model as the draft: draft-simple
    plan = {c.name: c for c in auto_plan(sp, str(default_model_path))}
    assert plan["draft-simple"].used and not plan["draft-dspark"].used
    sp.draft.model = str(tmp_path / "missing.gguf")
    plan = {c.name: c for c in auto_plan(sp, str(default_model_path))}
    assert not plan["draft-simple"].used and "cannot be read" in plan["draft-simple"].reason


def test_the_chain_builds_what_the_plan_says(default_model_path):
    class M:
        path = str(default_model_path)

    chain = SpeculatorChain.from_params(SpecParams.auto(), {"model": M()})
    assert [s.name for s in chain.speculators] == NGRAMS
    assert chain.adaptive and chain.auto_plan == auto_plan(SpecParams.auto(), str(default_model_path))
    assert chain.skipped == {}
    # an explicit list: the reference's chain, no plan, no controller
    ref = SpeculatorChain.from_params(SpecParams.from_types("ngram-mod,ngram-simple"), {"model": M()})
    assert ref.auto_plan is None and not ref.adaptive
    # synthetic acceptance is a benchmark of the reference's loop: no controller
    synth = SpecParams.auto()
    synth.synth_len = 2.0
    assert not SpeculatorChain.from_params(synth, {"model": M()}).adaptive
    assert uses_type(SpecParams.auto(), SpecType.NGRAM_CACHE)
    assert not uses_type(SpecParams.auto(), SpecType.DRAFT_SIMPLE)
    assert not uses_type(SpecParams.from_types("ngram-mod"), SpecType.NGRAM_CACHE)


def test_a_draft_model_that_cannot_draft_is_left_out_with_the_reason(q4_engine, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(2048))
    sp = SpecParams.auto()
    sp.draft.model = str(bad)
    q4_engine.cost_curve = q4_engine.cost_curve or CostCurve({k: 1 + 0.1 * k for k in range(33)})
    try:
        q4_engine.set_spec(sp)
        plan = {c.name: c for c in q4_engine.auto_plan}
        assert not plan["draft-simple"].used and plan["draft-simple"].reason
        assert [s.name for s in q4_engine.chain.speculators] == NGRAMS
    finally:
        q4_engine.set_spec(SpecParams())


def test_engine_runs_auto_under_the_controller_and_keeps_its_cost_curve(q4_engine, tmp_path):
    eng = q4_engine
    saved = (eng.config.cost_cache_dir, eng.cost_curve)
    eng.config.cost_cache_dir = str(tmp_path / "cc")
    eng.cost_curve = None
    try:
        eng.set_spec(SpecParams.auto())
        assert eng.controller is not None and eng.cost_curve.source in ("measured", "cached")
        files = os.listdir(tmp_path / "cc")
        assert len(files) == 1
        assert 1.0 <= eng.cost_curve.rel(1) <= eng.cost_curve.rel(16) <= 17.0
        prompt = eng.prompt_tokens(text=PROMPTS[1])
        res = eng.run(prompt, max_tokens=40, sampling=GREEDY)
        c = res.stats.controller
        assert c is not None and c.n_steps == res.stats.n_steps
        assert sum(c.reasons.values()) == c.n_steps
        assert set(c.per_speculator) == set(NGRAMS)
        assert res.stats.to_dict()["controller"]["n_steps"] == c.n_steps
        # a second reply's stats are that reply's alone
        res2 = eng.run(prompt, max_tokens=20, sampling=GREEDY)
        assert res2.stats.controller.n_steps == res2.stats.n_steps
        # the reference path: no controller, no controller stats
        eng.set_spec(SpecParams.from_types("ngram-mod"))
        assert eng.controller is None and eng.auto_plan is None
        assert eng.run(prompt, max_tokens=8, sampling=GREEDY).stats.controller is None
        # a new engine start reads the curve back
        eng.cost_curve = None
        eng.set_spec(SpecParams.auto())
        assert eng.cost_curve.source == "cached"
    finally:
        eng.config.cost_cache_dir, eng.cost_curve = saved
        eng.set_spec(SpecParams())


# -- the app's defaults ---------------------------------------------------------------

def _ns(**kw):
    base = {"spec_type": None, "spec_adaptive": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_generate_and_bench_default_to_auto_when_nothing_names_the_types(tmp_path):
    from app.options import default_spec, spec_types_configured
    assert default_spec(_ns(), SpecParams(), from_file=False).is_auto
    # an explicit choice in config.toml stays (types = [] there means none, as before)
    assert default_spec(_ns(), SpecParams(), from_file=True).types == []
    cfg = SpecParams.from_types("ngram-mod")
    assert default_spec(_ns(), cfg, from_file=True).types == [SpecType.NGRAM_MOD]
    # a config default of auto (the chat's) is kept as it is
    assert default_spec(_ns(), SpecParams.auto(), from_file=False).is_auto
    # the flag wins
    assert default_spec(_ns(spec_type="none"), SpecParams.auto(), from_file=True).types == []
    p = default_spec(_ns(spec_type="ngram-simple", spec_adaptive=True), SpecParams(), from_file=False)
    assert p.types == [SpecType.NGRAM_SIMPLE] and p.adaptive_on
    f = tmp_path / "config.toml"
    assert not spec_types_configured(f)
    f.write_text("[speculation]\ntypes = []\n")
    assert spec_types_configured(f)
    f.write_text("max_tokens = 5\n[speculation.ngram_mod]\nn_match = 8\n")
    assert not spec_types_configured(f)
    f.write_text("not [ toml")
    assert not spec_types_configured(f)


def test_generate_with_auto_learns_into_the_lookup_store(default_model_path, capsys):
    from app import models
    from app.cli import main
    target = models.default_model_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(default_model_path, target)
    models._write_stamp(target, models._package().EXPECTED_SHA256)
    args = ["generate", "--no-config", "-t", "2", "--temp", "0", "-n", "16", "-p", "Name three colours.", "--json"]
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads(out)
    assert res["lookup"]["save"]["entries"] > 0                 # ngram-cache under auto learned
    st = res["stats"]
    assert st["controller"] is not None and st["controller"]["n_steps"] == st["n_steps"]
    assert set(st["speculators"]) == set(NGRAMS)
    # an explicit list keeps the reference's loop
    rc = main(args + ["--spec-type", "ngram-simple"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["stats"]["controller"] is None
    rc = main(args + ["--spec-type", "ngram-simple", "--spec-adaptive", "on", "--stats"])
    out, err = capsys.readouterr()
    assert rc == 0 and json.loads(out)["stats"]["controller"] is not None
    assert "controller: steps" in err and "verify cost" in err
