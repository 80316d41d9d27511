"""The figures the footer, F4, bench and the export show mean what llama.cpp means by them."""
from __future__ import annotations

import pytest

from app.figures import ReplyFigures, SessionStats, reply_footer
from speculators.base import SpeculatorStats
from speculators.events import GenerationStats, TokenEvent


def _stats(n_generated, n_steps, t, specs=None, drafted=0, accepted=0):
    g = GenerationStats(n_generated=n_generated, n_steps=n_steps, t_gen_s=t, n_drafted=drafted, n_accepted=accepted)
    g.speculators = dict(specs or {})
    return g


def test_a_draft_that_was_rejected_gives_mean_acc_len_one_not_tokens_per_step():
    # two tokens in two steps; one 3-token draft verified, nothing of it accepted
    g = _stats(2, 2, 0.1, {"ngram-mod": SpeculatorStats(n_call_accept=1, n_acc_tokens=0, n_gen_tokens=3)},
               drafted=3, accepted=0)
    toks = [TokenEvent(0, 1, "a", None, None), TokenEvent(1, 2, "b", None, None)]
    assert g.mean_acceptance_length == 1.0              # llama.cpp: 1 + 0 / 1
    assert g.tokens_per_step == 1.0
    assert "mean acc len 1.00" in reply_footer(toks, g.to_dict())


def test_mean_acc_len_is_summed_over_the_speculators_as_print_stats_defines_it():
    specs = {"ngram-mod": SpeculatorStats(n_call_accept=3, n_acc_tokens=9),
             "ngram-simple": SpeculatorStats(n_call_accept=1, n_acc_tokens=1)}
    g = _stats(20, 8, 1.0, specs, drafted=14, accepted=10)
    assert g.mean_acceptance_length == pytest.approx(1 + 10 / 4)
    # each speculator's own figure is its print_stats line's
    assert specs["ngram-mod"].mean_acceptance_length == pytest.approx(4.0)
    assert ReplyFigures.from_reply([], g.to_dict()).mean_acceptance_length == pytest.approx(3.5)


def test_the_session_speed_lies_between_its_replies_speeds():
    s = SessionStats()
    speeds = []
    for n, t in ((35, 0.977), (35, 0.977), (34, 0.99)):
        g = _stats(n, n, t)
        speeds.append(g.tokens_per_s)
        s.add(g, [TokenEvent(i, i, "x", None, None) for i in range(n)])
    assert min(speeds) <= s.totals.tokens_per_s <= max(speeds)


def test_a_one_token_reply_with_nothing_drafted_has_no_mean_acceptance_length():
    s = SessionStats()
    s.add(_stats(1, 1, 0.01), [TokenEvent(0, 1, "x", None, None)])
    s.add(_stats(3, 2, 0.05), [TokenEvent(i, i, "y", None, None) for i in range(3)])
    assert s.totals.figures.mean_acceptance_length is None
