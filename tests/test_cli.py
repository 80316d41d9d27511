"""`draftlight generate` and `draftlight bench`, run as a user runs them."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from .prompts import TEXT


def draftlight(*args, input=None, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          input=input, timeout=timeout, env=env, cwd=Path(__file__).parent.parent)


def assert_clean_error(r, fragment):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("draftlight: error: ") or "error:" in lines[0]
    assert fragment in lines[0]
    assert "Traceback" not in r.stderr


def in_process(engine, *args):
    """What ``draftlight generate ARGS`` writes, from ``engine`` in this process: the flags read
    by the command's own parser, then the prompt, speculation and sampling it gives the engine
    (no config file: the tests' data folders are empty)."""
    from app import config as config_mod
    from app.cli import build_parser
    from app.options import default_spec, sampling_from_args
    a = build_parser().parse_args(["generate", *args])
    cfg = config_mod.Config()
    engine.set_spec(default_spec(a, cfg.spec, from_file=False))
    if a.raw:
        prompt, stop = engine.prompt_tokens(text=a.prompt, raw=True), ()
    else:
        prompt = engine.prompt_tokens(messages=[{"role": "user", "content": a.prompt}])
        stop = tuple(engine.template.stop_strings)
    return engine.run(prompt, max_tokens=a.max_tokens, sampling=sampling_from_args(a, cfg.sampling), stop=stop)


def test_generate_json(default_model_path, q4_engine):
    """--json on a copy request where both types draft: the reply, its provenance and its counts
    are the engine's own for the same prompt and flags (the default model, greedy)."""
    args = ("-p", "Quote exactly: " + TEXT, "-n", "48", "--temp", "0", "--spec-type", "ngram-simple,ngram-mod",
            "--spec-ngram-simple-size-n", "2", "-t", "2")
    r = draftlight("generate", "-m", str(default_model_path), *args, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "tokens", "drafted_by", "stats", "finish_reason"}
    want = in_process(q4_engine, *args)
    assert (out["text"], out["tokens"], out["drafted_by"], out["draft_pos"], out["finish_reason"]) == \
        (want.text, want.tokens, want.drafted_by, want.draft_pos, want.finish_reason)
    st, ws = out["stats"], want.stats
    # the copy was drafted and the drafts accepted, in the numbers the engine gives
    assert st["n_drafted"] > 0 and st["n_accepted"] > 0, st
    for key in ("n_prompt", "n_generated", "n_emitted", "n_steps", "n_drafted", "n_accepted", "n_accept_calls"):
        assert st[key] == ws.to_dict()[key], key
    assert st["valid"] is True and st["synthetic"] is False
    assert set(st["speculators"]) == {"ngram-simple", "ngram-mod"}
    for name, sp in st["speculators"].items():
        for key in ("n_gen_drafts", "n_gen_tokens", "n_acc_drafts", "n_acc_tokens"):
            assert sp[key] == ws.speculators[name].to_dict()[key], (name, key)
    assert set(filter(None, out["drafted_by"])) <= {"ngram-simple", "ngram-mod"}
    assert any(out["drafted_by"])
    assert len(out["tokens"]) == len(out["drafted_by"]) <= 48


def test_generate_streams_text_and_raw_mode(default_model_path, q4_engine):
    # no speculation: Automatic's drafts follow its timings, and on these Q4_K_M weights a batched
    # verify may flip a near-tie, so only plain decoding is the same text in both processes
    args = ("--raw", "-p", "The capital of France is", "-n", "6", "--temp", "0", "-t", "2", "--spec-type", "none")
    r = draftlight("generate", "-m", str(default_model_path), *args)
    assert r.returncode == 0, r.stderr
    want = in_process(q4_engine, *args)
    assert want.text.strip() and len(want.tokens) == 6
    # the greedy text exactly, streamed, then a newline
    assert r.stdout == want.text + "\n"


def test_generate_synthetic_acceptance_warns(default_model_path):
    r = draftlight("generate", "-m", str(default_model_path), "-p", "Say hello", "-n", "8", "--temp", "0",
                   "--spec-type", "ngram-simple", "--spec-synth-len", "2.5", "--json", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["valid"] is False
    assert "not valid" in r.stderr


def test_generate_auto_under_synthetic_acceptance_says_the_controller_is_off(default_model_path):
    """Synthetic acceptance accepts drafts whatever they say: the adaptive controller is off under
    it (the chain drafts as llama.cpp's does), and `generate` says so instead of printing
    figures that read as Automatic's."""
    args = ["generate", "-m", str(default_model_path), "-p", "Say hello", "-n", "8", "--temp", "0",
            "--spec-type", "auto", "--json", "-t", "2"]
    r = draftlight(*args, "--spec-synth-len", "2.5")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["controller"] is None
    assert "the adaptive controller is off under synthetic acceptance" in r.stderr
    plain = draftlight(*args)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["stats"]["controller"]["n_steps"] > 0
    assert "adaptive controller is off" not in plain.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--spec-type", "ngram-fancy"], "unknown speculative type: 'ngram-fancy'"),
    (["--spec-ngram-mod-n-match", "0"], "ngram_mod.n_match"),
    (["--spec-draft-p-min", "2"], "draft.p_min"),
    (["--spec-type", "ngram-simple", "--spec-synth-len", "99"], "synthetic acceptance length"),
    (["--temp", "-1"], "temperature"),
    (["--spec-type", "auto,ngram-mod"], "cannot be combined with ngram-mod"),
])
def test_bad_options_give_one_clear_line(default_model_path, args, fragment):
    r = draftlight("generate", "-m", str(default_model_path), "-p", "hi", "-n", "4", *args)
    assert_clean_error(r, fragment)


def test_bad_model_files_give_one_clear_line(tmp_path, default_model_path):
    r = draftlight("generate", "-m", str(tmp_path / "missing.gguf"), "-p", "hi")
    assert_clean_error(r, "not found")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    assert_clean_error(draftlight("generate", "-m", str(junk), "-p", "hi"), "not a GGUF model file")
    trunc = tmp_path / "truncated.gguf"
    with open(default_model_path, "rb") as f:
        trunc.write_bytes(f.read(50_000_000))
    assert_clean_error(draftlight("generate", "-m", str(trunc), "-p", "hi"), "incomplete")
    assert_clean_error(draftlight("generate", "-m", str(tmp_path), "-p", "hi"), "directory")


def test_bad_prompts_give_one_clear_line(default_model_path, tmp_path):
    assert_clean_error(draftlight("generate", "-m", str(default_model_path), "-p", "   "), "empty")
    assert_clean_error(draftlight("generate", "-m", str(default_model_path)), "no prompt")
    r = draftlight("generate", "-m", str(default_model_path), "-c", "256", "-p", TEXT * 3)
    assert_clean_error(r, "context holds 256")


def test_bench_reports_every_type_side_by_side(f16_model_path, tmp_path):
    pf = tmp_path / "prompts.txt"
    pf.write_text("Quote exactly: " + TEXT + "\n---\nRepeat twice: one two three four five six\n")
    r = draftlight("bench", "-m", str(f16_model_path), "-f", str(pf), "--spec-type", "ngram-simple,ngram-mod",
                   "--spec-ngram-simple-size-n", "2", "--spec-ngram-mod-n-match", "4",
                   "--spec-ngram-mod-n-min", "1", "-n", "24", "--rounds", "1", "-t", "2", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    names = [row["name"] for row in rep["rows"]]
    assert names == ["llama-cpp-python", "none", "ngram-simple", "ngram-mod", "ngram-simple,ngram-mod"]
    rows = {row["name"]: row for row in rep["rows"]}
    assert rows["none"]["speedup_vs_none"] == 1.0
    assert rep["none_vs_llama_cpp_python"] > 0
    # the reference row generates what none does, ending where it ends (F16: the same tokens)
    assert rows["llama-cpp-python"]["equal_to_none"] is True
    assert rows["llama-cpp-python"]["tokens"] == rows["none"]["tokens"]
    for name in ("ngram-simple", "ngram-mod", "ngram-simple,ngram-mod"):
        row = rows[name]
        assert row["equal_to_none"] is True  # F16: lossless
        assert row["tokens_per_s"] > 0 and row["speedup_vs_none"] > 0
        if row["drafted"]:
            assert row["ceiling_tokens_per_s"] > 0 and row["draft_ms_per_call"] is not None
            assert row["mean_acceptance_length"] >= 1.0
    assert rows["ngram-simple"]["drafted"] > 0


def test_bench_reports_draft_simple_and_its_cost(f16_model_path, q2k_model_path):
    r = draftlight("bench", "-m", str(f16_model_path), "-md", str(q2k_model_path), "-p",
                   "Quote exactly: " + TEXT, "--spec-type", "ngram-simple,draft-simple", "-n", "16",
                   "--rounds", "1", "--no-baseline", "-t", "2", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)["rows"]}
    assert set(rows) == {"none", "ngram-simple", "draft-simple", "ngram-simple,draft-simple"}
    ds = rows["draft-simple"]
    assert ds["equal_to_none"] is True and ds["drafted"] > 0
    cost = ds["speculators"]["draft-simple"]["cost_ms_per_drafted_token"]
    assert cost is not None and cost > 0


def test_bad_adaptive_flag_is_refused_without_a_traceback(default_model_path):
    r = draftlight("generate", "-m", str(default_model_path), "-p", "hi", "--spec-adaptive", "maybe")
    assert r.returncode == 2 and "expected on or off" in r.stderr and "Traceback" not in r.stderr


def test_bench_rows_are_named_as_given_with_per_prompt_figures(f16_model_path, tmp_path, capsys):
    r = draftlight("bench", "-m", str(f16_model_path), "-p", "Quote exactly: " + TEXT, "-p", "Why do cats purr?",
                   "--spec-type", "auto", "--spec-type", "ngram-mod", "--spec-type", "ngram-simple,ngram-mod",
                   "--spec-type", "none", "-n", "16", "--rounds", "1", "--no-baseline", "-t", "2", "--json",
                   timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    rows = {row["name"]: row for row in rep["rows"]}
    assert [row["name"] for row in rep["rows"]] == ["none", "auto", "ngram-mod", "ngram-simple,ngram-mod"]
    for name, row in rows.items():
        pp = row["per_prompt"]
        assert [d["index"] for d in pp] == [0, 1]
        assert sum(d["tokens"] for d in pp) == row["tokens"]
        assert all(d["speedup_vs_none"] > 0 for d in pp)
        if name != "none":
            assert all(d["equal_to_none"] is True for d in pp)   # F16: lossless
        for d in pp:        # one round: its work is the (fastest) run's
            assert d["rounds_work"][0][:3] == [d["drafted"], d["accepted"], d["steps"]], d
    auto = rows["auto"]
    assert auto["controller"]["n_steps"] == sum(d["controller"]["steps"] for d in auto["per_prompt"])
    assert rows["ngram-mod"]["controller"] is None and rows["ngram-mod"]["per_prompt"][0]["controller"] is None
    assert [c[0] for c in rep["auto_plan"]["auto"]][:5] == ["ngram-simple", "ngram-map-k", "ngram-map-k4v",
                                                            "ngram-mod", "ngram-cache"]
    assert rep["cost_curve"]["rel"][0] == 1.0
    # the prompts where auto did none's work (it drafted nothing: F16, the same steps) are named
    same = auto["same_work_as"]
    assert set(same) == {"none", "ngram-mod", "ngram-simple,ngram-mod"}
    assert same["none"] == [d["index"] for d in auto["per_prompt"] if d["rounds_work"][0][0] == 0]
    assert 0 not in same["none"] and auto["per_prompt"][0]["drafted"] > 0      # it copies the quote
    assert "same_work_as" not in rows["ngram-mod"]
    from app.cmd_bench import print_table
    print_table(rep)
    assert "auto did the same work (drafted, accepted, steps, every round) as none on" in capsys.readouterr().out
    # without --spec-type, bench compares auto with none
    # (two rounds: each prompt also gets the median of its rounds' paired ratios to none)
    r = draftlight("bench", "-m", str(f16_model_path), "-p", "Why do cats purr?", "-n", "8", "--rounds", "2",
                   "--no-baseline", "-t", "2", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["name"] for row in rows] == ["none", "auto"]
    assert rows[0]["per_prompt"][0]["speedup_vs_none_paired"] == 1.0     # none against itself, round by round
    assert [len(r["per_prompt"][0]["rounds_work"]) for r in rows] == [2, 2]
    # a ratio of two 8-token runs: how large depends on the machine's load (17 was seen), not the code
    paired = rows[1]["per_prompt"][0]["speedup_vs_none_paired"]
    assert isinstance(paired, float) and paired > 0
    # each round's speed is in the report, so that two rows can be paired by round: the paired
    # figure is the median of those rounds' ratios
    n_r, a_r = (row["per_prompt"][0]["rounds_tokens_per_s"] for row in rows)
    assert len(n_r) == len(a_r) == 2 and max(a_r) == rows[1]["per_prompt"][0]["tokens_per_s"]
    assert abs(statistics.median([a / n for a, n in zip(a_r, n_r)]) - paired) < 0.02


def test_benchs_llama_cpp_python_row_ends_where_the_chat_template_stops(f16_engine, f16_model_path):
    """bench's reference row (llama-cpp-python's own generation) ends at the stop strings the
    engine ends at, with the engine's threads and batch: on "hello" the model writes a short
    reply and then the transcript's next turn, which the stop string cuts (the issue's report:
    31 tokens against none's 3, "same: yes")."""
    from llama_cpp import Llama

    from app.cmd_bench import _llama_cpp_python_once
    from speculators.events import STOP_STRING
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    eng = f16_engine
    eng.set_spec(SpecParams())
    stop = tuple(eng.template.stop_strings)
    prompt = eng.prompt_tokens(messages=[{"role": "user", "content": "hello"}])
    ref = eng.run(prompt, max_tokens=32, sampling=SamplingParams(temperature=0.0), stop=stop)
    assert ref.finish_reason == STOP_STRING and ref.stats.n_generated < 32, ref.finish_reason
    llm = Llama(model_path=str(f16_model_path), n_ctx=eng.ctx.n_ctx, n_threads=eng.ctx.n_threads,
                n_threads_batch=eng.ctx.n_threads, n_batch=eng.ctx.n_batch, verbose=False)
    try:
        _, tokens, n_generated = _llama_cpp_python_once(llm, prompt, 32, stop)
        assert tokens == ref.tokens and n_generated == ref.stats.n_generated
        # without the stop strings it would have run on to the token limit
        _, free, _ = _llama_cpp_python_once(llm, prompt, 32, ())
        assert len(free) > len(tokens)
    finally:
        llm.close()
