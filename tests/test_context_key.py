"""Automatic does not ask a context-only n-gram lookup where its key has not occurred.

ngram-simple, ngram-map-k and ngram-map-k4v draft only from an earlier occurrence, in the
context, of the last ``size_n`` tokens (the sampled one included): their ``context_key``.
The controller follows how far the context repeats itself (its suffix matcher) and skips
them where the match is shorter than their key. That is only right if they could not have
drafted there: checked here on histories full of repeats, and that the skip happens.
"""

from __future__ import annotations

import random

from speculators.base import DraftRequest
from speculators.chain import SpeculatorChain
from speculators.controller import Controller, ControllerParams, SuffixMatcher
from speculators.ngram_map import NgramMap
from speculators.ngram_simple import NgramSimple

from .test_controller import linear


def _histories(seed: int, n: int = 25, length: int = 300, vocab: int = 6):
    rng = random.Random(seed)
    for _ in range(n):
        # short runs copied from earlier, between fresh tokens: matches of every length
        toks: list[int] = []
        while len(toks) < length:
            if toks and rng.random() < 0.4:
                a = rng.randrange(len(toks))
                toks += toks[a:a + rng.randrange(1, 20)]
            else:
                toks.append(rng.randrange(vocab))
        yield toks[:length]


def test_where_the_key_did_not_occur_earlier_the_lookups_have_nothing_to_draft():
    drafted_with_a_match = 0
    for seed in range(2):
        for toks in _histories(seed):
            specs = [NgramSimple(size_n=n, size_m=8) for n in (2, 4)] + \
                [NgramMap(size_n=n, size_m=8, min_hits=1, key_only=k) for n in (2, 3) for k in (True, False)]
            for s in specs:
                s.begin(toks[:40])
            sm = SuffixMatcher()
            for cut in range(40, len(toks) - 1):
                hist, last = toks[:cut], toks[cut]
                sm.sync(hist)
                m = sm.match(last)
                for s in specs:
                    assert s.context_key > 0
                    d = s.draft(DraftRequest(prompt=hist, id_last=last, pos0=cut))
                    if m < s.context_key:
                        assert d == [], (s.name, s.context_key, m, cut)
                    elif d:
                        drafted_with_a_match += 1
                    s.accept(len(d) // 2, is_other=False)
    assert drafted_with_a_match > 500      # the lookups did draft where the key had occurred


def test_the_controller_asks_a_lookup_only_where_its_key_occurred():
    params = ControllerParams(online_cost=False)
    fresh = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]

    def ask(hist, last):
        spec = NgramSimple(size_n=4, size_m=8)
        ctl = Controller(SpeculatorChain([spec]), linear(0.1), params)
        ctl.prepare(hist)
        ctl.begin()
        dec = ctl.decide(DraftRequest(prompt=hist, id_last=last, pos0=len(hist), n_max=-1))
        return spec.stats.n_call_draft, ctl.stats.n_calls_saved, dec

    # "9 10 11" then 12 occurred before: its 4-token key is there, and it is asked
    hist = fresh + [1, 2, 3, 9, 10, 11]
    assert NgramSimple(4, 8).draft(DraftRequest(prompt=hist, id_last=12, pos0=len(hist)))[:2] == [13, 14]
    calls, saved, _ = ask(hist, 12)
    assert (calls, saved) == (1, 0)
    # "9 10 11" then 5 never did: not asked (it would have found nothing)
    assert NgramSimple(4, 8).draft(DraftRequest(prompt=hist, id_last=5, pos0=len(hist))) == []
    calls, saved, dec = ask(hist, 5)
    assert (calls, saved) == (0, 1) and not dec.draft
