"""The controller package: rooms of one job each, and its shortcuts equal to the plain computations.

The decisions themselves are covered by tests/test_controller.py (and were checked equal to the
single module this package replaced with tools/check_controller_same.py). Here: the package's
shape (no module over 600 lines, no function over 80, the engine's events loading no controller),
and that each shortcut taken per step -- the suffix matcher comparing whole blocks, a proposal
scored in one pass, rates remembered within a step, a statistics copy made directly -- gives
what the plain computation gives.
"""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from pathlib import Path

import numpy as np

from speculators.controller import AcceptanceModel, ControllerStats, SuffixMatcher, suffix_match

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "speculators" / "controller"


def test_no_module_of_the_controller_is_over_600_lines_nor_any_function_over_80():
    too_long = []
    for path in sorted(PACKAGE.glob("*.py")) + [ROOT / "speculators" / "controller_stats.py"]:
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 600:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    too_long.append(f"{path.name}: {node.name} {n} lines")
    assert too_long == []


def test_the_engines_events_load_no_controller():
    code = ("import sys; sys.path.insert(0, %r); import speculators.events; "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] == ['speculators', 'controller']))") % str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _history(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Tokens with long copies of earlier stretches (longer than the match cap, too)."""
    toks: list[int] = []
    while len(toks) < n:
        if toks and rng.random() < 0.5:
            a = rng.randrange(len(toks))
            toks += toks[a:a + rng.randrange(1, 300)]
        else:
            toks.append(rng.randrange(vocab))
    return toks[:n]


def test_the_suffix_matcher_agrees_with_suffix_match_on_long_copies():
    rng = random.Random(11)
    checked = long = 0
    for _ in range(30):
        vocab = rng.choice((2, 5, 50))
        toks = _history(rng, rng.randrange(50, 700), vocab)
        sm = SuffixMatcher()
        for cut in range(1, len(toks), 5):
            hist = toks[:cut]
            sm.sync(hist)
            arr = np.asarray(hist, dtype=np.int64)
            for _ in range(3):
                last = toks[cut] if cut < len(toks) and rng.random() < 0.7 else rng.randrange(vocab)
                nxt = rng.choice((None, rng.randrange(vocab)))
                cap = rng.choice((2, 9, 128, 1000))
                m = sm.match(last, nxt, cap)
                assert m == suffix_match(arr, last, nxt, cap), (cut, last, nxt, cap)
                checked += 1
                long += m > 40
    assert checked > 1000 and long > 100      # the block comparisons were reached, many times


def test_a_proposal_scored_in_one_pass_counts_as_scored_token_by_token():
    rng = random.Random(3)
    for _ in range(300):
        kw = dict(decay=rng.choice((0.9, 1.0)), prior=rng.random(), run_prior=rng.random() < 0.7)
        one, each = AcceptanceModel(**kw), AcceptanceModel(**kw)
        for _ in range(rng.randrange(1, 20)):
            one.new_draft()
            each.new_draft()
            pos0, n_hit, missed = rng.choice((0, 0, 3, 30, 31, 90)), rng.randrange(0, 70), rng.random() < 0.6
            one.observe_run(pos0, n_hit, missed)
            for j in range(n_hit):
                each.observe(pos0 + j, True)
            if missed:
                each.observe(pos0 + n_hit, False)
        assert (one.tries, one.hits, one.tries1, one.hits1, one.last_first) == \
            (each.tries, each.hits, each.tries1, each.hits1, each.last_first)
        assert one.rates(40, 7) == each.rates(40, 7)


def test_rates_remembered_within_a_step_are_the_rates_worked_out_afresh():
    rng = random.Random(5)

    def replay(kw, log):
        m = AcceptanceModel(**kw)
        for pos0, n_hit in log:
            m.new_draft()
            m.observe_run(pos0, n_hit, True)
        return m

    for _ in range(100):
        kw = dict(decay=0.9, prior=rng.random(), run_prior=rng.random() < 0.7)
        asked, log = AcceptanceModel(**kw), []
        for _ in range(rng.randrange(1, 8)):
            log.append((rng.randrange(60), rng.randrange(30)))
            asked.new_draft()
            asked.observe_run(*log[-1], True)
            depth = rng.choice((0, 5, 40, 300))
            for k in (8, 63, 1, 20, 63):          # a longer one after a shorter, then the memo read
                got_q, got_e = asked.rates(k, depth), asked.expected_tokens(k, depth)
                fresh = replay(kw, log)
                assert got_q == fresh.rates(k, depth)
                assert got_e == replay(kw, log).expected_tokens(k, depth)
                got_q[0] = got_e[0] = -1.0         # the caller's own lists: the memo is not changed
                assert asked.rates(k, depth)[0] != -1.0 and asked.expected_tokens(k, depth)[0] != -1.0


def test_a_statistics_copy_equals_the_difference_with_nothing_and_shares_nothing():
    s = ControllerStats(n_steps=9, n_drafted=4, n_cut=1, cost_curve=[1.0, 1.3], t1_ms=0.7, last_reason="cut",
                        cost_source="measured")
    s.per_speculator["ngram-simple"] = {"verified": 3, "upkeep_ms": 0.25, "accept_est": 0.8}
    c = s.copy()
    assert c.to_dict() == (s - ControllerStats()).to_dict()
    assert c.per_speculator["ngram-simple"]["skipped"] == 0          # missing entries read 0
    c.per_speculator["ngram-simple"]["verified"] += 1
    c.cost_curve.append(9.0)
    assert s.per_speculator["ngram-simple"]["verified"] == 3 and s.cost_curve == [1.0, 1.3]
