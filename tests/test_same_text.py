"""Teacher-forced runs (``Engine.generate(forced=...)``, ``bench --same-text``).

On quantized weights a batched verify can flip a near-tie, after which two
speculative types write different replies and their speeds measure different
work. Forced, every type writes the same text; each position is still
sampled, and where the model's own pick differs the run records a flip with
its logit margin -- so a forced run still shows whether it was lossless.
"""

from __future__ import annotations

import json

import pytest

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from tests.lossless import Q4_TIE
from tests.prompts import CODE, TEXT
from tests.test_cli import draftlight

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["Quote the following text exactly, word for word:\n\n" + TEXT,
           "Rewrite the following Python code exactly, keeping every line the same:\n\n" + CODE]


def _run(eng, spec, prompt, n=96, forced=None):
    eng.set_spec(spec)
    return eng.run(prompt, max_tokens=n, sampling=GREEDY, stop=tuple(eng.template.stop_strings), forced=forced)


def test_a_forced_run_writes_the_forced_text_and_says_where_the_model_disagreed(f16_engine):
    eng = f16_engine
    prompt = eng.prompt_tokens(text=PROMPTS[0])
    ref = _run(eng, SpecParams(), prompt)
    assert ref.stats.forced_flips is None  # not forced
    own = list(ref.tokens)
    # a text the model would not write: one token changed in the middle
    k = len(own) // 2
    other = own[:k] + [own[k + 1] if own[k + 1] != own[k] else own[k] + 1] + own[k + 1:]
    for spec in (SpecParams(), SpecParams.from_types("ngram-simple"), SpecParams.auto()):
        res = _run(eng, spec, prompt, forced=own)
        assert list(res.tokens) == own and res.stats.forced_flips == []  # F16: lossless
        res = _run(eng, spec, prompt, n=k + 1, forced=other)
        assert list(res.tokens) == other[:k + 1]
        (flip,) = res.stats.forced_flips
        assert (flip.index, flip.forced, flip.own) == (k, other[k], own[k]) and flip.margin > 0
    # drafting still happens and pays on the forced copy
    res = _run(eng, SpecParams.from_types("ngram-simple"), prompt, forced=own)
    assert res.stats.n_accepted > 0 and res.stats.n_steps < len(own)


def test_a_run_forced_to_what_a_reply_wrote_ends_where_that_reply_ended(f16_engine):
    """``written`` is the reply's tokens and what ended it (here the transcript's stop string,
    held back from the text). Forced to it, a run ends at the same place in the same way,
    even where its own model would have gone on: cut short mid-sentence, every type stops
    there and records the flip. (Forced to ``tokens`` alone, a run writes on past their end
    with its own picks: on quantized weights, a verify batch over the end that flips a near-tie
    there made a row time a longer, other reply than none's.)"""
    eng = f16_engine
    prompt = eng.prompt_tokens(text="What is the difference between weather and climate?")
    ref = _run(eng, SpecParams(), prompt, n=64)
    n = len(ref.tokens)
    assert ref.finish_reason in ("stop", "stop_string") and n >= 4
    assert ref.written[:n] == list(ref.tokens) and len(ref.written) > n
    end = ref.written[n:]
    for spec in (SpecParams(), SpecParams.from_types("ngram-simple"), SpecParams.auto()):
        res = _run(eng, spec, prompt, n=64, forced=ref.written)
        assert (list(res.tokens), res.written, res.finish_reason) == (list(ref.tokens), ref.written, ref.finish_reason)
        assert res.stats.forced_flips == []  # F16: lossless
        k = n // 2
        cut = list(ref.tokens[:k]) + end
        res = _run(eng, spec, prompt, n=64, forced=cut)
        assert (list(res.tokens), res.written, res.finish_reason) == (cut[:k], cut, ref.finish_reason)
        assert res.stats.forced_flips and res.stats.forced_flips[0].index == k


def test_on_q4_every_type_forced_to_none_text_disagrees_only_at_near_ties(q4_engine):
    """On Q4_K_M, a batched verify's logits differ from one-token decoding's by up to ~0.8:
    forced to none's text, a type's own pick may differ from it only where the two tokens'
    logits are that close (a near-tie), never elsewhere."""
    eng = q4_engine
    n_accepted = 0
    for text in PROMPTS:
        prompt = eng.prompt_tokens(text=text)
        own = list(_run(eng, SpecParams(), prompt, n=128).tokens)
        for spec in (SpecParams.auto(), SpecParams.from_types("ngram-simple"), SpecParams.from_types("ngram-mod")):
            res = _run(eng, spec, prompt, n=128, forced=own)
            assert list(res.tokens) == own
            for f in res.stats.forced_flips:
                assert 0 < f.margin < Q4_TIE, f"position {f.index}: margin {f.margin} is not a near-tie"
            n_accepted += res.stats.n_accepted
    assert n_accepted > 50


def test_a_restored_step_rewinds_the_forced_position():
    """On a target that cannot drop a partial sequence, a rejected draft restores the step's
    checkpoint and replays the accepted tokens: the forced text is read again from where the
    step began (without that, the replay would take later tokens, and run out of them early)."""
    import tempfile
    from pathlib import Path

    from speculators.engine import Engine, EngineConfig
    from tests.predictable_models import write_bigram_qwen35_mtp
    from tests.test_checkpoint_state import REPEATS, _count_restores

    with tempfile.TemporaryDirectory() as d:
        target = write_bigram_qwen35_mtp(Path(d) / "qwen35-mtp.gguf")
        eng = Engine(str(target), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2, reuse_prefix=False),
                     SpecParams.from_types("ngram-mod"))
        try:
            assert eng.use_checkpoints and eng.n_rs_seq == 0
            prompt = eng.prompt_tokens(text=REPEATS, raw=True)
            own = list(eng.run(prompt, max_tokens=64, sampling=GREEDY).tokens)
            restores = _count_restores(eng)
            res = eng.run(prompt, max_tokens=64, sampling=GREEDY, forced=own)
            assert restores[0] >= 1
            assert list(res.tokens) == own and res.stats.forced_flips == []
            # a forced token the model would not pick, after the restored steps
            k = 60
            other = own[:k] + [own[k - 1]]
            res = eng.run(prompt, max_tokens=k + 1, sampling=GREEDY, forced=other)
            assert list(res.tokens) == other
            assert [(f.index, f.own) for f in res.stats.forced_flips] == [(k, own[k])]
        finally:
            eng.close()


def test_bench_same_text_compares_every_type_on_none_text(default_model_path, capsys):
    r = draftlight("bench", "-m", str(default_model_path), "-p", PROMPTS[0], "-p", PROMPTS[1],
                   "--spec-type", "auto", "--spec-type", "ngram-simple", "-n", "48", "--rounds", "2",
                   "--no-baseline", "-t", "2", "--same-text", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["same_text"] is True
    rows = {row["name"]: row for row in rep["rows"]}
    none = rows["none"]
    for name in ("auto", "ngram-simple"):
        row = rows[name]
        assert row["tokens"] == none["tokens"]
        for d, dn in zip(row["per_prompt"], none["per_prompt"]):
            assert d["tokens"] == dn["tokens"]
            assert d["equal_to_none"] is (not d["flips"])
            assert all(0 < f["margin"] < Q4_TIE and 1 <= f["runs"] <= 2 for f in d["flips"])
    assert rows["ngram-simple"]["accepted"] > 0
    # the table bench prints without --json (the same report, printed by the same function)
    from app.cmd_bench import print_table
    print_table(rep)
    assert "--same-text: every row wrote none's reply" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--same-text", "--spec-synth-len", "4"]])
def test_same_text_with_synthetic_acceptance_is_refused_clearly(default_model_path, bad):
    r = draftlight("bench", "-m", str(default_model_path), "-p", "Hi", "--spec-type", "ngram-simple",
                   "-n", "8", "--rounds", "1", "--no-baseline", "-t", "2", *bad, timeout=600)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "synthetic" in r.stderr
