"""The Lab's core on the real model: configurations run interleaved on one loaded engine, with
bench's figures, and the same drafted/accepted counts and text as ``draftlight bench`` on the
same prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.lab import LabConfig, LabReport, first_divergence, presets, run_lab
from app.measure import Cancelled
from app.storage import History

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"

pytestmark = pytest.mark.slow


def test_the_lab_measures_configurations_on_the_loaded_engine_as_bench_does(f16_engine, f16_model_path):
    eng = f16_engine
    prompt = eng.model.tokenize(PROMPT, add_special=True)
    configs = [LabConfig("none", __import__("speculators.params", fromlist=["SpecParams"]).SpecParams()),
               LabConfig.of("ngram-mod", "ngram-mod"), LabConfig.of("ngram-simple", "ngram-simple")]
    seen = []
    rep = run_lab(eng, prompt, configs, rounds=2, max_tokens=48, prompt_text=PROMPT,
                  progress=lambda d, t, what: seen.append((d, t)))
    assert [r.name for r in rep.results] == ["none", "ngram-mod", "ngram-simple"]
    assert seen[0] == (0, 6) and seen[-1] == (6, 6)
    none = rep.result("none")
    for r in rep.results:
        f = r.figures
        assert f["tokens_per_s"] > 0 and len(f["rounds_tokens_per_s"]) == 2
        assert r.text == none.text and f["same_as_none"]            # F16: lossless
        assert "".join(r.pieces) == r.text and len(r.pieces) == len(r.tokens)
    for name in ("ngram-mod", "ngram-simple"):
        f = rep.result(name).figures
        assert 0 < f["accepted"] <= f["drafted"]
        assert f["paired_vs_none"] > 0 and f["speedup_vs_none"] > 0
        assert f["mean_acceptance_length"] > 1
        assert rep.result(name).acceptance_by_pos and all(0 <= a <= 1 for a in rep.result(name).acceptance_by_pos)
        assert f["ceiling_tokens_per_s"] > 0 and 0 < f["fraction_of_ceiling"]
        assert any(rep.result(name).drafted_by)
    assert len(rep.cost_curve) == 17 and rep.cost_curve[0] == pytest.approx(1.0, abs=0.05)
    assert not rep.quantized

    # the same prompt through bench: the same text and draft counts per configuration
    r = subprocess.run([sys.executable, "-m", "app", "bench", "-m", str(f16_model_path), "--raw",
                        "-p", PROMPT, "-n", "48", "-t", "2", "--rounds", "1", "--no-baseline", "--json",
                        "--spec-type", "ngram-mod", "--spec-type", "ngram-simple"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    bench = {row["name"]: row for row in json.loads(r.stdout)["rows"]}
    for name in ("ngram-mod", "ngram-simple"):
        f = rep.result(name).figures
        assert (bench[name]["drafted"], bench[name]["accepted"]) == (f["drafted"], f["accepted"])
        assert bench[name]["equal_to_none"] is True


def test_a_cancelled_lab_run_raises_and_the_report_is_not_made(f16_engine):
    eng = f16_engine
    prompt = eng.model.tokenize(PROMPT, add_special=True)
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3
    with pytest.raises(Cancelled):
        run_lab(eng, prompt, [LabConfig.of("ngram-mod", "ngram-mod")], rounds=5, max_tokens=32, cancel=cancel)


def test_reports_are_kept_in_sqlite_and_export(tmp_path):
    from app.lab import LabResult
    rep = LabReport("Count | to ten", "/m/model.gguf", 2, 32, [
        LabResult("none", {}, {"tokens_per_s": 10.0, "drafted": 0, "accepted": 0, "same_as_none": True},
                  "1 2", [1, 2], [None, None], [None, None], [], ["1", " 2"]),
        LabResult("ngram-mod", {"types": ["ngram-mod"]},
                  {"tokens_per_s": 15.0, "drafted": 4, "accepted": 3, "same_as_none": False, "mean_draft_len": 4.0},
                  "1 3", [1, 3], [None, "ngram-mod"], [None, 0], [0.75], ["1", " 3"])])
    h = History(tmp_path / "h.sqlite3")
    rid = h.add_lab_run(rep)
    back = h.lab_runs()
    assert [r.id for r in back] == [rid] and back[0].results[1].figures["accepted"] == 3
    assert back[0].results[1].token_events()[1].drafted_by == "ngram-mod"
    md = back[0].to_markdown()
    assert "| ngram-mod | 15.00 |" in md and "Count | to ten" in md
    assert "- ngram-mod: at token 2 (quantized weights: a near-tie)" in md
    csv_text = back[0].to_csv()
    assert csv_text.splitlines()[0].startswith("name,tokens_per_s,speedup_vs_none")
    assert json.loads(back[0].to_json())["results"][0]["name"] == "none"
    h.close()


def test_presets_use_only_the_types_the_model_can_use():
    ps = presets(["ngram-simple", "ngram-map-k", "ngram-mod"])
    every = [c.name for c in ps["Every type"]]
    assert every == ["none", "auto", "ngram-simple", "ngram-map-k", "ngram-mod"]
    lengths = [c.name for c in ps["Draft lengths"]]
    assert "ngram-mod max 16" in lengths and not any("draft-simple" in n for n in lengths)
    assert ps["Draft lengths"][2].spec.ngram_mod.n_max == 16
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None


@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="tmux is not installed")
def test_the_lab_in_the_real_app_on_a_reply(tmp_path, default_model_path):
    """The real app under tmux: a reply, then F8 and Run on it; the table is read off the screen,
    "Use this" makes the chat use the chosen configuration."""
    import re
    from .test_ui_e2e_tmux import COPY_PROMPT, Tmux, _args
    t = Tmux(tmp_path, width=140, height=50)
    try:
        t.start(_args(default_model_path, "-n", "48"), tmp_path / "pid")
        t.wait_for(r"ready\s*$", timeout=120)
        t.keys(COPY_PROMPT, literal=True)
        t.keys("Enter")
        t.wait_reply_done(timeout=120)
        t.keys("F8")
        t.wait_for(r"Lab — which speculation pays", timeout=20)
        t.keys("C-r")
        screen = t.wait_for(r"Fastest: ", timeout=240)
        rows = {}
        for line in screen.splitlines():
            m = re.match(r"\s*(none|auto|ngram-mod|ngram-simple)\s+(\d+\.\d)\s+(\d+\.\d\d)×", line)
            if m:
                rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
        assert set(rows) == {"none", "auto", "ngram-mod", "ngram-simple"}, screen
        assert rows["none"][1] == 1.0 and all(v[0] > 0 for v in rows.values())
        assert "acceptance by draft position" in screen and "one two three" in screen
        # the table is sorted by tokens/s: "Use this" on its first row
        first = next(line.split()[0] for line in screen.splitlines()
                     if re.match(r"\s*(none|auto|ngram-mod|ngram-simple)\s+\d", line))
        t.keys("C-u")
        t.wait_for(r"The chat now uses " + re.escape(first), timeout=20)
        t.keys("Escape")
        t.wait_for(r"ready\s*$", timeout=20)
        t.keys("C-q")
        t.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=30)
        from app import config as config_mod
        spec = config_mod.load().spec
        if first == "auto":
            assert spec.is_auto
        else:
            assert [x.value for x in spec.types] == ([] if first == "none" else [first])
    finally:
        t.close()
