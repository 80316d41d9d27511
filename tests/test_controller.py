"""The adaptive controller on scripted cost curves and scripted acceptance.

A scripted "target" produces a known text; scripted speculators propose
drafts that are right (the text's continuation) or wrong as each test
needs; the controller decides, the target accepts the agreeing prefix, as
the engine does. No model is loaded here: these run in milliseconds.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter

import numpy as np
import pytest

from speculators.base import DraftRequest, Speculator
from speculators.chain import SpeculatorChain
from speculators.controller import STALE_CHECK_STEPS, Controller, ControllerParams, ControllerStats, CostModel
from speculators.costcurve import CostCurve, cache_file, curve_for, device_key, load_cached, mark_stale
from speculators.types import SpecType

TEXT = list(range(1000, 9000))
WRONG = -5


class Scripted(Speculator):
    """Proposes ``n`` tokens; ``right(step)`` says how many of them are the true continuation."""

    def __init__(self, type_, right, n=8, busy_s=0.0):
        super().__init__(n)
        self.type = type_
        self.right = right
        self.n = n
        self.busy_s = busy_s
        self.calls = 0

    def draft(self, req):
        self.calls += 1
        if self.busy_s:
            t = time.perf_counter() + self.busy_s
            while time.perf_counter() < t:
                pass
        k = self.right(self.calls)
        if k is None:
            return []
        i = req.pos0 + 1
        good = TEXT[i:i + min(k, self.n)]
        return good + [WRONG] * (self.n - len(good))


def linear(a, t1_s=None):
    """c(k) = 1 + a k (and a one-token step of ``t1_s`` seconds, where given)."""
    curve = CostCurve({k: 1.0 + a * k for k in range(0, 65)})
    if t1_s is not None:
        curve.t1_s = t1_s
    return curve


def run(ctl, steps, pos=0, log=None):
    """Drive ``steps`` engine steps; returns (position, decisions)."""
    decisions = []
    for _ in range(steps):
        d = ctl.decide(DraftRequest(prompt=TEXT[:pos], id_last=TEXT[pos], pos0=pos, n_max=-1))
        n_acc = 0
        for i, t in enumerate(d.draft):
            if t != TEXT[pos + 1 + i]:
                break
            n_acc += 1
        ids = TEXT[pos + 1: pos + 2 + n_acc]
        ctl.observe(d, ids)
        if d.draft:
            ctl.chain.accept(n_acc)
        decisions.append(d)
        pos += len(ids)
    return pos, decisions


def controller(*specs, curve=None, clock=lambda: 0.0, **kw):
    """A controller whose draft calls cost nothing (a still clock) unless given a real clock."""
    return Controller(SpeculatorChain(list(specs)), curve or linear(0.1), ControllerParams(online_cost=False, **kw),
                      clock=clock)


def test_drafts_when_it_pays():
    s = Scripted(SpecType.NGRAM_SIMPLE, lambda i: 8)
    ctl = controller(s)
    _, ds = run(ctl, 40)
    lengths = [len(d.draft) for d in ds]
    assert lengths[0] == 0                      # nothing known yet: scored without a verify
    assert all(n == 8 for n in lengths[5:]), lengths
    st = ctl.stats
    assert st.n_drafted >= 35 and st.n_steps == 40
    assert st.reasons["drafted"] >= 30
    assert s.stats.n_gen_drafts == st.n_drafted and s.stats.n_acc_tokens == s.stats.n_gen_tokens


def test_does_not_draft_when_it_does_not_pay():
    never = Scripted(SpecType.NGRAM_CACHE, lambda i: 0)
    ctl = controller(never)
    _, ds = run(ctl, 200)
    verified = [i for i, d in enumerate(ds) if d.draft]
    assert len(verified) <= 2 and all(i < 5 for i in verified), verified
    assert ctl.stats.n_skipped >= 190 and ctl.stats.n_not_asked == 0   # asked every step: calls cost nothing
    assert ctl.stats.reasons["skipped"] == ctl.stats.n_skipped


def test_a_perfect_drafter_does_not_pay_where_batches_cost_what_tokens_cost():
    # c(k) = k + 1: verifying k tokens costs as much as decoding them one by one
    s = Scripted(SpecType.NGRAM_SIMPLE, lambda i: 8)
    ctl = controller(s, curve=linear(1.0))
    _, ds = run(ctl, 60)
    assert not any(d.draft for d in ds)
    # proposals are scored unverified (and not asked again while one is being scored)
    assert ctl.stats.n_skipped + ctl.stats.n_not_asked == 60 and ctl.stats.n_skipped >= 5


def test_stops_when_acceptance_drops_and_recovers_without_wasted_verifies():
    phase = {"right": 8}
    s = Scripted(SpecType.NGRAM_MOD, lambda i: phase["right"])
    ctl = controller(s)
    pos, good = run(ctl, 40)
    assert sum(1 for d in good[-20:] if d.draft) == 20
    phase["right"] = 0
    pos, bad = run(ctl, 60, pos)
    wasted = [i for i, d in enumerate(bad) if d.draft]
    assert len(wasted) <= 6 and max(wasted) < 8, wasted   # stops after a few failures
    shadow_before = ctl.stats.n_shadow
    phase["right"] = 8
    pos, again = run(ctl, 30, pos)
    first = next(i for i, d in enumerate(again) if d.draft)
    assert first <= 3                                     # picked back up quickly...
    assert ctl.stats.n_shadow > shadow_before             # ...from proposals scored unverified
    assert all(d.draft for d in again[first + 3:])


def test_cuts_drafts_to_the_length_that_maximises_throughput():
    # the first two proposed tokens are always right, the third always wrong
    s = Scripted(SpecType.NGRAM_CACHE, lambda i: 2)
    ctl = controller(s, curve=linear(0.15))
    _, ds = run(ctl, 80)
    tail = Counter(len(d.draft) for d in ds[20:])
    assert tail.most_common(1)[0][0] == 2, tail
    assert ctl.stats.n_cut >= 50 and ctl.stats.n_tokens_cut >= 6 * 50
    assert ctl.stats.reasons["cut"] == ctl.stats.n_cut
    # where batches up to 8 tokens are free, the whole 8-token draft is worth verifying
    s2 = Scripted(SpecType.NGRAM_CACHE, lambda i: 2)
    flat = CostCurve({k: 1.0 if k <= 8 else 1.0 + 0.5 * (k - 8) for k in range(65)})
    ctl2 = controller(s2, curve=flat)
    _, ds2 = run(ctl2, 40)
    assert all(len(d.draft) == 8 for d in ds2[10:])


def test_length_follows_the_acceptance_by_position():
    # three of four drafts are right for 6 tokens, the fourth only for 1: q_1 high, deeper q lower
    s = Scripted(SpecType.NGRAM_SIMPLE, lambda i: 6 if i % 4 else 1, n=16)
    ctl = controller(s, curve=linear(0.05))
    _, ds = run(ctl, 120)
    lens = Counter(len(d.draft) for d in ds[30:] if d.draft)
    best = lens.most_common(1)[0][0]
    assert 5 <= best <= 7, lens      # not the whole 16-token proposal, not a timid 1 or 2


def test_picks_the_draft_with_the_highest_expected_gain_not_the_first():
    bad = Scripted(SpecType.NGRAM_SIMPLE, lambda i: 0)   # first in the reference's priority
    good = Scripted(SpecType.NGRAM_MOD, lambda i: 8)
    ctl = controller(bad, good)
    _, ds = run(ctl, 50)
    by = Counter(d.drafter for d in ds if d.draft)
    assert by["ngram-mod"] >= 40 and by["ngram-simple"] <= 2, by
    # first drafter wins, as without the controller, would have taken ngram-simple's draft
    chain = SpeculatorChain([Scripted(SpecType.NGRAM_SIMPLE, lambda i: 0), Scripted(SpecType.NGRAM_MOD, lambda i: 8)])
    chain.draft(DraftRequest(prompt=TEXT[:5], id_last=TEXT[5], pos0=5))
    assert chain.last_drafter == "ngram-simple"


def test_cold_cheap_drafters_are_asked_only_now_and_then():
    # each call takes 2 ms next to a 10 ms step: asking every step would cost 20 %
    slow = Scripted(SpecType.NGRAM_CACHE, lambda i: 0, busy_s=0.002)
    curve = linear(0.1, t1_s=0.010)
    ctl = controller(slow, curve=curve, clock=time.perf_counter)
    _, ds = run(ctl, 150)
    assert slow.calls < 150 / 5, slow.calls
    assert ctl.stats.n_calls_saved > 100 and ctl.stats.n_not_asked > 100
    assert not any(d.draft for d in ds)


def test_model_drafters_are_probed_less_and_less_while_they_fail_and_picked_back_up():
    phase = {"right": 0}
    m = Scripted(SpecType.DRAFT_SIMPLE, lambda i: phase["right"], n=3)
    ctl = controller(m, probe_every=8)
    pos, ds = run(ctl, 400)
    probes = [i for i, d in enumerate(ds) if d.probe]
    # probes at the drafter's own length (3), up to probe_len
    assert all(len(ds[i].draft) == min(ctl.params.probe_len, m.n) == 3 for i in probes)
    # a model drafter starts from a model drafter's prior (0.5): after its first probe missed, a
    # verify this cheap (c(1) = 1.1) still pays at the 0.25 it is judged at, and it drafts on
    # through a miss (miss_tolerance); then never
    tried = [i for i, d in enumerate(ds) if d.draft and not d.probe]
    assert tried == [probes[0] + 1, probes[0] + 2][:len(tried)] and tried, tried
    early = ctl.params.probe_early_n
    assert 3 + early <= len(probes) <= 7 + early, probes
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # its first probes come soon after each other (what it is worth is learnt early), then back off
    assert gaps[:early] == [ctl.params.probe_every_early] * early, gaps
    later = gaps[early:]
    assert later == sorted(later) and later[-1] > later[0], gaps
    assert ctl.stats.n_probes == len(probes)
    phase["right"] = 3
    pos, ds2 = run(ctl, 300, pos)
    on = [i for i, d in enumerate(ds2) if d.draft and not d.probe]
    assert on and len(on) > 100                             # a successful probe brings it back


def test_online_timings_refine_the_measured_curve():
    ctl = controller(Scripted(SpecType.NGRAM_SIMPLE, lambda i: 0), curve=linear(1.0))
    ctl.params.online_cost = True
    assert ctl.rel(8) == pytest.approx(9.0)
    rng = np.random.default_rng(0)
    for i in range(200):
        n = int(rng.integers(0, 9))
        ctl.observe_time(n, 0.010 + 0.001 * n)
    ctl.cost.refresh()
    assert ctl.rel(8) == pytest.approx(1.8, rel=0.05)
    assert ctl.t1_s == pytest.approx(0.010, rel=0.05)
    # a stall (a busy machine) moves the estimate only a little
    ctl.observe_time(0, 1.0)
    assert ctl.t1_s < 0.012


def test_controller_stats_add_subtract_and_serialise():
    s = Scripted(SpecType.NGRAM_SIMPLE, lambda i: 8 if i % 5 else 0)
    ctl = controller(s)
    pos, _ = run(ctl, 30)
    a = ctl.snapshot()
    run(ctl, 30, pos)
    b = ctl.snapshot()
    d = b - a
    assert d.n_steps == 30 and d.n_drafted == b.n_drafted - a.n_drafted
    assert d.per_speculator["ngram-simple"]["verified"] == (b.per_speculator["ngram-simple"]["verified"]
                                                             - a.per_speculator["ngram-simple"]["verified"])
    assert d.per_speculator["ngram-simple"]["accept_est"] == b.per_speculator["ngram-simple"]["accept_est"]
    total = a + d
    assert total.n_drafted == b.n_drafted and total.n_skipped == b.n_skipped
    assert sum(total.reasons.values()) == total.n_steps
    out = json.loads(json.dumps(b.to_dict()))
    assert out["n_steps"] == 60 and set(out["reasons"]) == {"drafted", "cut", "probe", "skipped", "no_proposal",
                                                            "not_asked", "no_room"}
    assert out["cost_curve"][0] == 1.0 and len(out["cost_curve"]) == 17
    assert any("ngram-simple" in line for line in b.summary())
    assert (ControllerStats() + ControllerStats()).n_steps == 0


def test_no_room_means_no_draft():
    s = Scripted(SpecType.NGRAM_SIMPLE, lambda i: 8)
    ctl = controller(s)
    run(ctl, 10)
    d = ctl.decide(DraftRequest(prompt=TEXT[:50], id_last=TEXT[50], pos0=50, n_max=0))
    assert d.draft == [] and d.reason == "no_room"
    d = ctl.decide(DraftRequest(prompt=TEXT[:50], id_last=TEXT[50], pos0=50, n_max=3))
    assert len(d.draft) == 3


# -- the verify-cost curve's cache ------------------------------------------------------

class FakeCtx:
    """Decode time grows with the batch (a sleep), so a curve comes out of measure()."""

    n_ctx = 4096
    n_batch = 512

    def __init__(self):
        self.decodes = 0

    def decode(self, tokens, pos0, logits="last"):
        self.decodes += 1
        time.sleep(0.0002 * len(tokens))

    def logits(self, i):
        return np.zeros(8, dtype=np.float32)

    def seq_rm(self, p0, p1=-1):
        return True

    def clear(self):
        pass


class FakeModel:
    def tokenize(self, text, add_special=True, parse_special=False):
        return list(range(40))


@pytest.fixture
def fake_model_file(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 64)
    return str(p)


def test_cost_curve_is_measured_once_then_read_from_the_cache(tmp_path, fake_model_file):
    cache = tmp_path / "cache"
    ctx = FakeCtx()
    c1 = curve_for(ctx, FakeModel(), fake_model_file, 2, 0, cache)
    assert c1.source == "measured" and ctx.decodes > 10
    assert 1.0 <= c1.rel(1) <= c1.rel(8) <= 9.0
    files = os.listdir(cache)
    assert len(files) == 1 and files[0].startswith("costcurve-") and files[0].endswith(".json")
    ctx2 = FakeCtx()
    c2 = curve_for(ctx2, FakeModel(), fake_model_file, 2, 0, cache)
    assert c2.source == "cached" and ctx2.decodes == 0
    assert c2.points == c1.points
    # another thread count is another device setting: measured again, kept beside
    c3 = curve_for(FakeCtx(), FakeModel(), fake_model_file, 4, 0, cache)
    assert c3.source == "measured" and len(os.listdir(cache)) == 2
    # layers on another machine's devices (RPC) verify at the network's cost: measured again too
    remote = {"devices": None, "offload": ["RPC0=10.0.0.2:50052"], "split_mode": None, "tensor_split": None,
              "main_gpu": 0}
    c4 = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 99, cache, remote)
    assert c4.source == "measured" and len(os.listdir(cache)) == 3
    assert curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 99, cache, remote).source == "cached"
    # a hybrid target keeping recurrent-state snapshots for each token of a batch verifies at
    # another cost than the same target without them: measured again, kept beside
    c5 = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, cache, None, {"n_rs_seq": 3})
    assert c5.source == "measured" and len(os.listdir(cache)) == 4
    assert curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, cache).source == "cached"


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe\x00garbage", b"[]", b'{"key": 1}',
                                     b'{"key": null, "curve": {"points": {"0": 1.0}}}'])
def test_a_corrupt_cost_cache_file_is_measured_again(tmp_path, fake_model_file, content):
    cache = tmp_path / "cache"
    key = device_key(fake_model_file, 2, 0)
    path = cache_file(cache, key)
    os.makedirs(cache)
    with open(path, "wb") as f:
        f.write(content)
    c = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, cache)
    assert c.source == "measured"
    assert load_cached(path, key) is not None      # rewritten, whole
    assert not [n for n in os.listdir(cache) if n.endswith(".tmp")]


def test_a_foreign_or_stale_cost_cache_file_is_measured_again(tmp_path, fake_model_file):
    cache = tmp_path / "cache"
    key = device_key(fake_model_file, 2, 0)
    path = cache_file(cache, key)
    os.makedirs(cache)
    other = dict(key, model="/elsewhere/other.gguf")
    with open(path, "w") as f:
        json.dump({"key": other, "curve": {"points": {"0": 1.0, "1": 7.0}}}, f)
    c = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, cache)
    assert c.source == "measured" and c.rel(1) < 7.0
    # the model file changed (a new download in place): its size/mtime differ, so measured again
    with open(fake_model_file, "ab") as f:
        f.write(b"\0" * 16)
    assert curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, cache).source == "measured"
    # points out of any sane range are refused too
    with open(path, "w") as f:
        json.dump({"key": key, "curve": {"points": {"0": 1.0, "1": -3}}}, f)
    assert load_cached(path, key) is None


def test_a_curve_measured_under_load_is_measured_again_at_the_next_load(tmp_path, fake_model_file):
    """Its one-token time is well above the one-token steps timed later: the cache file is marked
    stale (kept, not deleted) and the next load measures again; a curve that agrees stays."""
    cache = tmp_path / "cache"
    key = device_key(fake_model_file, 2, 0)
    path = cache_file(cache, key)
    os.makedirs(cache)
    for t1, stale in ((0.030, True), (0.012, False)):
        with open(path, "w") as f:
            json.dump({"key": key, "curve": {"points": {"0": 1.0, "1": 2.0}, "t1_s": t1}}, f)
        curve = load_cached(path, key)
        assert curve is not None and curve.cache_path == path
        cm = CostModel(curve)
        for _ in range(STALE_CHECK_STEPS):
            cm.observe(0, 0.010)
        assert cm.stale is stale
        assert (load_cached(path, key) is None) is stale
        with open(path) as f:
            data = json.load(f)
        assert data["key"] == key and ("stale" in data) is stale
    # a stale file is measured again, and the new curve replaces it
    assert mark_stale(path, 0.010) and load_cached(path, key) is None
    c = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, cache)
    assert c.source == "measured" and c.cache_path == path
    assert load_cached(path, key) is not None


def test_where_every_step_drafts_the_one_token_time_is_read_from_the_drafted_steps(tmp_path, fake_model_file):
    """No one-token step is ever timed when every step drafts: the one-token time then comes from
    the drafted steps (their time over c(k)), not from a curve measured while the machine was
    busy (there, a drafter costing a tenth of a real step looked nearly free), and that curve is
    marked stale."""
    cache = tmp_path / "cache"
    key = device_key(fake_model_file, 2, 0)
    path = cache_file(cache, key)
    os.makedirs(cache)
    with open(path, "w") as f:
        json.dump({"key": key, "curve": {"points": {"0": 1.0, "2": 1.2}, "t1_s": 0.150}}, f)
    cm = CostModel(load_cached(path, key))
    assert cm.t1_s == pytest.approx(0.150)
    cm.observe(2, 0.016 * 1.2)
    assert cm.t1_s == pytest.approx(0.016)
    for _ in range(STALE_CHECK_STEPS):
        cm.observe(2, 0.016 * 1.2)
    assert cm.t1_s == pytest.approx(0.016, rel=0.05)
    assert cm.stale and load_cached(path, key) is None
    # a timed one-token step, when there is one, is what counts
    cm.observe(0, 0.020)
    assert cm.t1_s == pytest.approx(0.020)


def test_an_unusable_cache_folder_never_stops_loading(tmp_path, fake_model_file):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    c = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, blocker)
    assert c.source == "measured"
    c = curve_for(FakeCtx(), FakeModel(), fake_model_file, 2, 0, None)
    assert c.source == "measured"


# -- model drafters: draft length, upkeep ---------------------------------------------------

class Follower(Scripted):
    """A model drafter that follows the target: every target batch costs it ``upkeep_us``
    (as a draft model decoding the batch would), unless the controller paused it."""

    def __init__(self, right, n=16, upkeep_us=0.0, type_=SpecType.DRAFT_SIMPLE):
        super().__init__(type_, right, n=n)
        self.upkeep_us = upkeep_us
        self.upkeep = True
        self.switches: list[bool] = []
        self.mirrored = 0
        self.caught_up = 0
        self.pos_known = 0     # tokens this drafter has "decoded"

    def set_upkeep(self, on):
        self.upkeep = on
        self.switches.append(on)

    def process(self, tokens, pos0):
        if self.upkeep:
            self.stats.t_process_us += self.upkeep_us * len(tokens) / 2
            self.mirrored += len(tokens)
            self.pos_known = pos0 + len(tokens)
        return True

    def draft(self, req):
        if self.pos_known < req.pos0:
            # paused: catch up on what was missed, in one batch (counted as process time)
            self.stats.t_process_us += self.upkeep_us
            self.caught_up += req.pos0 - self.pos_known
            self.pos_known = req.pos0
        return super().draft(req)


def run_with_upkeep(ctl, steps, pos=0, t_step=0.010, log=None):
    """As run(), with the engine's chain.process() after each verify and the step's time
    (``log``: a list given (decision, tokens accepted, the step's seconds) for each step)."""
    decisions = []
    for _ in range(steps):
        d = ctl.decide(DraftRequest(prompt=TEXT[:pos], id_last=TEXT[pos], pos0=pos, n_max=-1))
        batch = [TEXT[pos]] + d.draft
        tp = sum(s.stats.t_process_us for s in ctl.chain.speculators)
        ctl.chain.process(batch, pos)
        upkeep = (sum(s.stats.t_process_us for s in ctl.chain.speculators) - tp) * 1e-6
        n_acc = 0
        for i, t in enumerate(d.draft):
            if t != TEXT[pos + 1 + i]:
                break
            n_acc += 1
        ids = TEXT[pos + 1: pos + 2 + n_acc]
        seconds = t_step * ctl.rel(len(d.draft)) + upkeep
        ctl.observe(d, ids, seconds)
        if log is not None:
            log.append((d, n_acc, seconds))
        if d.draft:
            ctl.chain.accept(n_acc)
        decisions.append(d)
        pos += len(ids)
    return pos, decisions


def test_an_always_right_model_drafter_drafts_its_full_length():
    # before: the controller asked for round(len_typ) tokens and averaged what came back (never
    # more than asked), and every 2-token probe pulled it down: n_max 16 settled at 12
    m = Scripted(SpecType.DRAFT_SIMPLE, lambda i: 16, n=16)
    ctl = controller(m, curve=linear(0.05))
    _, ds = run(ctl, 60)
    lens = [len(d.draft) for d in ds if d.draft]
    assert lens[-20:] == [16] * 20, lens


def test_model_drafter_lengths_grow_back_after_a_bad_stretch():
    phase = {"right": 16}
    m = Scripted(SpecType.DRAFT_MTP, lambda i: phase["right"], n=16)
    ctl = controller(m, curve=linear(0.05), probe_every=8)
    pos, _ = run(ctl, 40)
    phase["right"] = 0
    pos, bad = run(ctl, 200, pos)
    assert all(d.probe for d in bad[20:] if d.draft)          # off, probed now and then
    phase["right"] = 16
    pos, again = run(ctl, 150, pos)
    lens = [len(d.draft) for d in again if d.draft]
    assert lens and lens[-20:] == [16] * 20, lens              # was: stuck at 3 for the session


def test_a_fresh_chain_takes_up_a_paying_model_drafter_within_a_few_steps_of_a_missed_first_probe():
    """A model drafter whose first probe happens to miss (a 60 %-right MTP head does, two times
    in five) is probed again within a few steps, not a quarter of a reply later: on a cheap
    verify its 128-token reply takes ~9 % longer than the head drafting every step from the
    start (four steps without it). Before, the next probe waited ``probe_every`` (16) steps,
    and the reply took 28 % longer."""
    seq = [0, 0] + [3] * 200          # the drafter's first call misses; then it is right
    f = Follower(lambda c: seq[c], n=3, upkeep_us=300.0, type_=SpecType.DRAFT_MTP)
    ctl = controller(f, curve=linear(0.1, t1_s=0.010))
    log = []
    pos = 0
    while pos < 128:
        pos, _ = run_with_upkeep(ctl, 1, pos, log=log)
    first_on = next(i for i, (d, _, _) in enumerate(log) if d.draft and not d.probe)
    assert log[0][0].probe and log[0][1] == 0 and first_on <= ctl.params.probe_every_early + 1, first_on
    # the head drafting every step from the start: 1 + 3 tokens per step, each a verify of 1.3
    # steps' time and the head's upkeep on the 4 tokens (0.6 ms)
    always = -(-(128 - 1) // 4) * (0.010 * 1.3 + 0.0006)
    spent = sum(x for _, _, x in log)
    assert spent <= 1.12 * always, (spent / always, first_on)


def test_upkeep_is_paused_where_a_model_drafter_does_not_pay_and_kept_where_it_does():
    # verifying is costly here (c(k) = 1 + 0.5 k): even an always-right drafter saves at most
    # half a step per token, which an upkeep of 1.5 steps per batch eats up
    costly = Follower(lambda i: 16, upkeep_us=30000.0)
    curve = linear(0.5, t1_s=0.010)
    ctl = controller(costly, curve=curve, probe_every=8)
    _, ds = run_with_upkeep(ctl, 300)
    assert costly.switches and costly.switches[0] is False and not costly.upkeep
    drafted = [i for i, d in enumerate(ds) if d.draft]
    assert len(drafted) <= 3, drafted                           # probed once or twice, then left
    assert costly.mirrored <= 4 * 2 * 17                        # the target's batches not mirrored
    per = ctl.snapshot().per_speculator["draft-simple"]
    assert per["upkeep_on"] == 0 and per["upkeep_paused_steps"] >= 290 and per["upkeep_est"] > 1.0
    assert ctl.states[id(costly)].hopeless
    # the same drafter with a cheap upkeep pays: it drafts every step and keeps mirroring
    cheap = Follower(lambda i: 16, upkeep_us=500.0)
    ctl2 = controller(cheap, curve=linear(0.5))
    _, ds2 = run_with_upkeep(ctl2, 100)
    assert all(d.draft for d in ds2[10:]) and cheap.upkeep
    assert cheap.mirrored > 500
    # a drafter that is rarely right is not worth its upkeep either, however cheap verifying is
    poor = Follower(lambda i: 1 if i % 4 == 0 else 0, upkeep_us=3000.0)
    curve3 = linear(0.05, t1_s=0.010)
    ctl3 = controller(poor, curve=curve3, probe_every=8)
    pos, _ = run_with_upkeep(ctl3, 300)
    assert not poor.upkeep and ctl3.snapshot().per_speculator["draft-simple"]["upkeep_paused_steps"] >= 250
    # picked back up when it starts to predict well: it catches up on what it missed, then mirrors
    poor.right = lambda i: 16
    pos, ds3 = run_with_upkeep(ctl3, 300, pos)
    assert poor.upkeep and poor.caught_up > 0
    assert all(d.draft for d in ds3[-50:])


def test_the_step_time_given_to_the_cost_curve_leaves_the_upkeep_out():
    # a drafter that cannot pause (a hidden-state hook) adds 10 ms to every 10 ms step
    f = Follower(lambda i: 0, upkeep_us=20000.0)
    f.set_upkeep = None
    curve = linear(0.1, t1_s=0.010)
    ctl = Controller(SpeculatorChain([f]), curve, ControllerParams(probe_every=8), clock=lambda: 0.0)
    run_with_upkeep(ctl, 200)
    assert f.upkeep and f.mirrored >= 200
    assert ctl.t1_s == pytest.approx(0.010, rel=0.05)
    per = ctl.snapshot().per_speculator["draft-simple"]
    assert per["upkeep_est"] == pytest.approx(1.0, rel=0.05) and per["upkeep_ms"] >= 200 * 10


def test_a_new_chain_starts_from_what_an_earlier_one_measured_of_a_drafter():
    curve = linear(0.5, t1_s=0.010)
    from speculators.controller import CostModel
    cost = CostModel(curve, ControllerParams(online_cost=False))
    first = Follower(lambda i: 16, upkeep_us=30000.0)
    run_with_upkeep(Controller(SpeculatorChain([first]), cost, cost.params, clock=lambda: 0.0), 60)
    again = Follower(lambda i: 16, upkeep_us=30000.0)
    ctl = Controller(SpeculatorChain([again]), cost, cost.params, clock=lambda: 0.0)
    assert again.switches == [False]                  # paused before the prompt is mirrored
    _, ds = run_with_upkeep(ctl, 100)
    assert not any(d.draft for d in ds) and again.mirrored == 0


class TimedFollower(Follower):
    """A Follower whose calls take time on a fake clock: ``first_s`` for its first draft (a new
    context builds its graphs and buffers), ``call_s`` for each later one, and ``catchup_s``
    per token a paused drafter catches up on."""

    def __init__(self, right, clock, first_s, call_s, catchup_s=0.0, **kw):
        super().__init__(right, **kw)
        self.clock, self.first_s, self.call_s, self.catchup_s = clock, first_s, call_s, catchup_s
        self.n_calls = 0

    def draft(self, req):
        missed = max(0, req.pos0 - self.pos_known)
        self.clock.t += self.catchup_s * missed
        self.stats.t_process_us += self.catchup_s * missed * 1e6
        self.clock.t += self.first_s if self.n_calls == 0 else self.call_s
        self.n_calls += 1
        return super().draft(req)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_drafters_first_slow_call_does_not_rule_it_out():
    """A model drafter's first call builds its context's graphs (22 ms for a 2-token draft of
    the realistic hybrid's MTP head, 4-5 ms later). That call alone judged nothing: before,
    it made a head that pays "hopeless", never asked again for the whole session."""
    clock = FakeClock()
    f = TimedFollower(lambda i: 16, clock, first_s=0.100, call_s=0.0005, upkeep_us=200.0)
    curve = linear(0.5, t1_s=0.010)
    ctl = controller(f, curve=curve, clock=clock, probe_every=8)
    _, ds = run_with_upkeep(ctl, 120)
    st = ctl.states[id(f)]
    assert f.n_calls >= 2 and not st.hopeless
    assert st.t_call == pytest.approx(0.0005 / 16, rel=0.01)     # the warm calls' time
    assert sum(1 for d in ds[-40:] if d.draft) >= 35             # it pays, and drafts


def test_probes_of_a_drafter_far_from_paying_take_a_bounded_share_of_the_time():
    """A paused drafter whose probes are accepted every other time (the first token) but which
    stays well short of paying (verifying is dear here) is not probed every ``probe_every``
    steps again after each accepted probe:
    the next probe waits until its cost (its catch-up on what it missed included) is at most
    ``probe_share`` of the steps' time."""
    clock = FakeClock()
    f = TimedFollower(lambda c: c % 2, clock, first_s=0.0002, call_s=0.0002, catchup_s=0.0002, upkeep_us=400.0)
    curve = linear(0.9, t1_s=0.010)
    ctl = controller(f, curve=curve, clock=clock, probe_every=8, probe_every_max=400)
    _, ds = run_with_upkeep(ctl, 1500)
    probes = [i for i, d in enumerate(ds) if d.probe]
    st = ctl.states[id(f)]
    assert not f.upkeep and not st.hopeless and len(probes) >= 3
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # a probe catching up on g steps costs about g * 0.2 ms + 0.2 ms: at 1.5 % of 10 ms steps
    # that is a probe every ~15 steps at first, further apart as the catch-ups grow (only a
    # fresh chain's first probes, which learn what the drafter is worth, come sooner)
    early = ctl.params.probe_early_n
    assert gaps[:early] == [ctl.params.probe_every_early] * early and all(g >= 8 for g in gaps[early:]), gaps
    # the time its probes took (the drafter's calls and catch-ups, on the fake clock)
    assert clock.t / (1500 * 0.010) <= 1.5 * ctl.params.probe_share, (clock.t, gaps)


def test_probes_keep_to_their_share_of_the_time_counting_their_verify():
    """A probe's cost is its ask and its verify, less what plain decoding would have taken for
    the tokens it produced. Here asking is cheap and verifying dear (a 2-token draft costs 2.8
    one-token steps): before, probes were spaced by the ask's time alone, so one every 16 steps
    whose first token was accepted every other time cost ~4 % of the time. And a probe whose
    draft is accepted in full costs nothing: such probes are not spaced out."""
    clock = FakeClock()
    f = TimedFollower(lambda c: c % 2, clock, first_s=0.0002, call_s=0.0002, catchup_s=0.00001, upkeep_us=400.0)
    curve = linear(0.9, t1_s=0.010)
    ctl = controller(f, curve=curve, clock=clock, probe_every=16, probe_every_max=400)
    log = []
    run_with_upkeep(ctl, 1500, log=log)
    probes = [(n_acc, s) for d, n_acc, s in log if d.probe]
    assert not f.upkeep and len(probes) >= 3
    # the verifies' cost beyond the tokens they produced, and the asks (on the fake clock)
    spent = clock.t + sum(s - (n_acc + 1) * 0.010 for n_acc, s in probes)
    total = sum(s for _, _, s in log) + clock.t
    assert spent / total <= 1.5 * ctl.params.probe_share, (spent / total, len(probes))

    # probes accepted in full by a drafter that stays just short of paying (its upkeep while it
    # mirrors is dear): a probe's catch-up and call cost about what its verify saves, so it
    # costs about nothing. Before, each was spaced by its ask's time alone, and a longer gap
    # made a dearer catch-up: 16, 54, 190 steps apart
    clock2 = FakeClock()
    g = TimedFollower(lambda c: 3, clock2, first_s=0.0005, call_s=0.0005, catchup_s=0.0005, upkeep_us=10000.0)
    curve2 = linear(0.5, t1_s=0.010)
    ctl2 = controller(g, curve=curve2, clock=clock2, probe_every=16, probe_every_max=400)
    log2 = []
    run_with_upkeep(ctl2, 600, log=log2)
    at = [i for i, (d, _, _) in enumerate(log2) if d.probe]
    # taken up at most once: its probes (3 tokens) never reach the positions past the third,
    # which are judged at the third's rate until one draft of its full length has shown them
    assert sum(1 for d, _, _ in log2 if d.draft and not d.probe) <= 1
    assert all(n_acc == 3 for d, n_acc, _ in log2 if d.probe)
    early = ctl2.params.probe_early_n     # its first probes come sooner: learning what it is worth
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert len(at) >= 30 and gaps[:early] == [ctl2.params.probe_every_early] * early, gaps
    assert all(x == 16 for x in gaps[early:]), gaps


def cpu_like():
    """A verify-cost curve shaped as measured on this project's 2-core CPU with the default model
    (a 262k-token output layer: every verified row costs most of a token)."""
    return CostCurve({0: 1.0, 1: 1.8, 2: 2.1, 4: 3.1, 8: 4.3, 16: 6.7, 32: 11.2, 48: 16.0, 64: 21.0})


def test_a_copy_found_by_a_lookup_drafter_is_drafted_long_within_a_few_steps():
    # ordinary text first: every proposal is wrong, so a first draft token is rarely right...
    phase = {"right": 0}
    s = Scripted(SpecType.NGRAM_SIMPLE, lambda i: phase["right"], n=32)
    ctl = controller(s, curve=cpu_like())
    pos, _ = run(ctl, 80)
    # ...then the reply copies a passage: the proposal that found it is scored unverified, and
    # the tokens it got right put the next draft that far into its run (the same passage), where
    # acceptance is high: drafted long within a few steps, not cut to 1, 3, ... (or, on this
    # curve, never drafted in the passage, as before the drafts were read by their run)
    phase["right"] = 32
    end, ds = run(ctl, 12, pos)
    lens = [len(d.draft) for d in ds]
    first_long = next((i for i, n in enumerate(lens) if n >= 16), None)
    assert first_long is not None and first_long <= 5, lens
    assert all(n == 32 for n in lens[first_long + 1:]), lens
    assert end - pos >= 150, (end - pos, lens)
    # and when the passage ends, the drafts stop at once: the run's first miss
    phase["right"] = 0
    _, after = run(ctl, 30, end)
    assert sum(1 for d in after if d.draft) <= 1, [len(d.draft) for d in after]


def test_under_the_controller_ngram_simple_looks_up_a_short_key_unless_one_is_set():
    from speculators.chain import SpeculatorChain
    from speculators.ngram_simple import ADAPTIVE_SIZE_N
    from speculators.params import SpecParams

    def size(p):
        return next(x for x in SpeculatorChain.from_params(p).speculators if x.name == "ngram-simple").size_n

    assert size(SpecParams.from_types("ngram-simple")) == 12         # llama.cpp's default, as the server
    assert size(SpecParams.auto()) == ADAPTIVE_SIZE_N < 12
    p = SpecParams.auto()
    p.ngram_simple.size_n = 7
    assert size(p) == 7


class Lookup(Speculator):
    """A lookup drafter over a scripted context: proposes ``draft(context)``."""

    def __init__(self, draft, n=64):
        super().__init__(n)
        self.type = SpecType.NGRAM_SIMPLE
        self._draft = draft

    def draft(self, req):
        return self._draft(list(req.prompt) + [req.id_last])


def test_a_prompt_that_ends_inside_a_repeated_passage_is_drafted_long_at_the_first_step():
    # the prompt holds a passage, then starts it again (a pasted text, "repeat it"): the
    # context's own repetition says how deep into the copy the reply is, before any draft was
    # scored -- a fresh controller verifies a long draft at once (it used to score the first
    # proposal unverified, then draft 1, 3, ... tokens)
    passage = list(range(2000, 2100))
    prompt = passage + [7, 7] + passage[:40]
    lookup = Lookup(lambda ctx: passage[40:40 + 64] if ctx[-40:] == passage[:40] else [])
    ctl = controller(lookup, curve=cpu_like())
    ctl.begin()
    d = ctl.decide(DraftRequest(prompt=prompt[:-1], id_last=prompt[-1], pos0=len(prompt) - 1, n_max=-1))
    assert d.reason in ("drafted", "cut") and len(d.draft) >= 16, (d.reason, len(d.draft))


def test_a_short_accidental_match_is_not_trusted_before_anything_is_known():
    # ordinary text: the last four tokens happen to occur earlier (a lookup key's chance match);
    # the proposal is scored, not verified, as before
    text = list(range(3000, 3060))
    prompt = text + text[10:14]
    lookup = Lookup(lambda ctx: [WRONG] * 16)
    ctl = controller(lookup, curve=cpu_like())
    ctl.begin()
    d = ctl.decide(DraftRequest(prompt=prompt[:-1], id_last=prompt[-1], pos0=len(prompt) - 1, n_max=-1))
    assert d.draft == [] and d.reason == "skipped"



def test_a_draft_is_cut_where_the_reply_would_end():
    # a copy of the person's message reaches its end: the lookup drafts on through the turn's end
    # (an end-of-generation token, or a stop string) into the template and the copy again;
    # nothing past the end can be used, so the verify stops there (the engine tells the
    # controller where, for each draft: ReplyBuilder.useful)
    eog = 1
    passage = list(range(2000, 2030)) + [eog, 106, 107] + list(range(2000, 2030))
    prompt = passage[:30] + [7, 7] + passage[:20]
    lookup = Lookup(lambda ctx: passage[20:20 + 40] if ctx[-20:] == passage[:20] else [])
    lengths = []
    for useful in (lambda d: next((i + 1 for i, t in enumerate(d) if t == eog), len(d)), None):
        ctl = controller(lookup, curve=cpu_like())
        ctl.useful = useful
        ctl.begin()
        d = ctl.decide(DraftRequest(prompt=prompt[:-1], id_last=prompt[-1], pos0=len(prompt) - 1, n_max=-1))
        assert d.reason in ("drafted", "cut") and d.draft == passage[20:20 + len(d.draft)]
        lengths.append(len(d.draft))
    # cut through the end token and no further; without the hook the draft ran on past it
    assert lengths[0] == 11 and lengths[1] > 11, lengths


DOT = 500        # a token that ends a sentence (the engine's sentence_end says which do)


def echo_draft_lengths(message, n_echoed, n_draft):
    """The length of the first verified draft when the reply has echoed ``message[:n_echoed]``
    and the lookup drafts ``n_draft`` more of it: with the sentence boundary known, and without."""
    prompt = message + [7, 7] + message[:n_echoed]
    lookup = Lookup(lambda ctx: message[n_echoed:n_echoed + n_draft] if ctx[-n_echoed:] == message[:n_echoed] else [])
    lengths = []
    for boundary in (lambda t: t == DOT, None):
        ctl = controller(lookup, curve=cpu_like())
        ctl.boundary = boundary
        ctl.begin()
        d = ctl.decide(DraftRequest(prompt=prompt[:-1], id_last=prompt[-1], pos0=len(prompt) - 1, n_max=-1))
        assert d.draft == message[n_echoed:n_echoed + len(d.draft)]
        lengths.append(len(d.draft))
    return lengths


def test_an_echo_of_the_persons_words_is_not_verified_past_the_end_of_their_sentence():
    # the reply repeats the start of the person's message (" I have eggs, spinach and some
    # cheese.") and, as often as not, stops at its sentence's end; the lookup drafts on into the
    # message's next sentence. Early in a run, what follows a sentence's end is taken at the
    # rate seen there (a cautious prior at first): the verify stops at the boundary
    message = list(range(2000, 2009)) + [DOT] + list(range(2010, 2030))
    with_end, without = echo_draft_lengths(message, 8, 20)
    assert with_end <= 2 and without > 4, (with_end, without)


def test_a_longer_quote_of_part_of_a_sentence_is_not_verified_past_its_end_either():
    # "What did the keeper carry?" -> "... a small notebook in which he wrote the weather, the
    # ships he saw, and the colour of the sea." and the reply ends: 18 tokens already copied
    # when the lookup drafts on into the passage's next sentence. A verify of its whole draft
    # costs ~11 one-token steps on this CPU; the sentence's end, 3 tokens in, is where it stops
    message = list(range(2000, 2020)) + [DOT] + list(range(2021, 2060))
    with_end, without = echo_draft_lengths(message, 18, 32)
    assert with_end <= 3 and without > 8, (with_end, without)


def test_copies_that_go_on_past_sentence_ends_teach_the_controller_to_draft_across_them():
    sentences = [list(range(3000 + 10 * i, 3005 + 10 * i)) + [DOT] for i in range(16)]
    passage = [t for s in sentences for t in s]
    prompt = passage + [7, 7] + passage[:6]
    lookup = Lookup(lambda ctx: next((passage[r:r + 24] for r in range(len(passage), 5, -1)
                                      if ctx[-6:] == passage[r - 6:r]), []))
    ctl = controller(lookup, curve=cpu_like())
    ctl.boundary = lambda t: t == DOT
    prior = ctl.boundaries.rate
    ctl.begin()
    ctx, across = list(prompt), []
    while len(ctx) - len(prompt) < len(passage) - 30:
        r = len(ctx) - len(prompt) + 6          # the reply has copied passage[:r]
        d = ctl.decide(DraftRequest(prompt=ctx[:-1], id_last=ctx[-1], pos0=len(ctx) - 1, n_max=-1))
        n_acc = 0
        for i, t in enumerate(d.draft):
            if t != passage[r + i]:
                break
            n_acc += 1
        ids = passage[r:r + n_acc + 1]
        ctl.observe(d, ids)
        if d.draft:
            ctl.chain.accept(n_acc)
            across.append(DOT in d.draft[:-1])
        ctx += ids
    # what followed each sentence's end was the copy going on: the rate rose from its prior,
    # and drafts reach across sentence ends
    assert ctl.boundaries.rate > prior + 0.3, (prior, ctl.boundaries.rate)
    assert any(across), across


def test_the_suffix_matcher_agrees_with_suffix_match_as_the_history_grows_and_is_rewritten():
    import random
    import numpy as np
    from speculators.controller import SuffixMatcher, suffix_match
    rng = random.Random(7)
    sm = SuffixMatcher()
    hist: list[int] = []
    for step in range(600):
        r = rng.random()
        if r < 0.03 and hist:
            hist = hist[:rng.randrange(len(hist))] + [rng.randrange(6)]     # rewritten (a new list)
        elif r < 0.5 and len(hist) > 8:
            i = rng.randrange(len(hist) - 4)
            hist.extend(hist[i:i + rng.randrange(1, 5)])                     # a copy of earlier text
        else:
            hist.append(rng.randrange(6))
        sm.sync(hist)
        arr = np.asarray(hist, dtype=np.int64)
        for last in range(6):
            for nxt in (None, *range(6)):
                for cap in (3, 128):
                    assert sm.match(last, nxt, cap) == suffix_match(arr, last, nxt, cap), (hist, last, nxt, cap)


def test_prepare_does_the_first_steps_bookkeeping_while_the_prompt_is_read():
    # the controller's copy of the context and the drafters' own (ngram-cache's context cache)
    # are brought up to date before the reply's first step, which then finds them current
    from speculators.ngram_cache import NgramCacheSpeculator
    passage = list(range(2000, 2040))
    prompt = passage + [7, 7] + passage[:12]
    cache = NgramCacheSpeculator()
    ctl = controller(cache, curve=cpu_like())
    ctl.begin()
    ctl.prepare(prompt[:-1])
    assert cache.cache_size == len(prompt) - 1
    assert ctl._matcher.match(prompt[-1]) == 12          # the copy so far, found in the prompt
    ref = NgramCacheSpeculator()
    req = DraftRequest(prompt=prompt[:-1], id_last=prompt[-1], pos0=len(prompt) - 1, n_max=-1)
    ref_draft = ref.draft(req)
    d = ctl.decide(req)
    # the first step asked it (the copy is deep enough), and its draft and context cache are
    # what they are without prepare
    assert cache.context_cache == ref.context_cache and cache.cache_size == ref.cache_size
    assert ref_draft and d.draft and d.draft == ref_draft[:len(d.draft)]


class MarkovHead(Follower):
    """An MTP head as the realistic hybrid's measured (greedy, bench/chat-questions.txt, on a
    2-core CPU): its first draft token right 82 % of the time after a right one, 63 % after a
    miss; each next one 79 %, then 76 %, given the ones before. Drafting costs ``per_tok_s``
    a token and a paused head's catch-up ``catchup_s`` a token missed, on ``clock``."""

    def __init__(self, seed, clock, per_tok_s=0.004, catchup_s=0.0015, upkeep_us=1800.0):
        super().__init__(self._draw, n=3, upkeep_us=upkeep_us, type_=SpecType.DRAFT_MTP)
        self.rng = random.Random(seed)
        self.clock, self.per_tok_s, self.catchup_s = clock, per_tok_s, catchup_s
        self.last_hit = True

    def _draw(self, calls):
        if self.rng.random() >= (0.82 if self.last_hit else 0.63):
            self.last_hit = False
            return 0
        self.last_hit = True
        k = 1
        for q in (0.79, 0.76):
            if self.rng.random() >= q:
                break
            k += 1
        return k

    def draft(self, req):
        missed = max(0, req.pos0 - self.pos_known)
        if missed:
            # a paused head catches up on the tokens it missed, in one batch (process time)
            self.clock.t += self.catchup_s * missed
            self.stats.t_process_us += self.catchup_s * missed * 1e6
            self.caught_up += missed
            self.pos_known = req.pos0
        out = super().draft(req)
        self.clock.t += self.per_tok_s * (len(out) if req.n_max < 0 else min(len(out), req.n_max))
        return out


def test_auto_keeps_a_paying_mtp_head_drafting_through_its_runs_of_misses():
    """On a CPU where a verify of 3 drafts costs 1.9 one-token steps, the realistic hybrid's MTP
    head pays 1.35x drafting every step; Automatic, with a fresh chain for each reply (as bench
    runs them), ran at 0.68-0.92 of it. Its lookup prior (0.15) and two-token probes judged
    the head at 0.06-0.48 after a few probes, three first-token misses in a row (which such
    a head has now and then) left it paused for 70-80 steps, and a head drafting one token
    never showed its deeper positions. Here the head is scripted with the measured rates and
    costs; Automatic must keep at least 0.97 of drafting every step's speed."""
    curve = CostCurve({0: 1.0, 1: 1.49, 2: 1.90, 3: 1.90, 4: 2.3, 5: 2.7})
    curve.t1_s = 0.040
    params = ControllerParams(online_cost=False)
    cost = CostModel(curve, params)
    t_auto = t_all = 0.0
    n_auto = n_all = 0
    for seed in range(30):
        clock = FakeClock()
        head = MarkovHead(seed, clock)
        ctl = Controller(SpeculatorChain([head]), cost, params, clock=clock)
        log = []
        pos = 0
        while pos < 128:
            pos, _ = run_with_upkeep(ctl, 1, pos, t_step=0.040, log=log)
        t_auto += sum(s for _, _, s in log) + clock.t
        n_auto += pos
        # the same head's draws, drafting 3 every step (draft-mtp): a verify of 4 tokens, 3
        # drafted tokens, the head mirroring the 4-token batch
        always = MarkovHead(seed, FakeClock())
        pos = 0
        while pos < 128:
            pos += 1 + always._draw(0)
            t_all += 0.040 * 1.90 + 3 * always.per_tok_s + always.upkeep_us * 4 / 2 * 1e-6
        n_all += pos
    ratio = (n_auto / t_auto) / (n_all / t_all)
    assert ratio >= 0.97, ratio


class DraftModel(Follower):
    """A draft model on a fake clock: ``per_tok_s`` for each token it drafts, and a quarter of
    that for each token a paused one catches up on (in one batch)."""

    def __init__(self, clock, per_tok_s, **kw):
        super().__init__(lambda c: 16, n=16, **kw)
        self.clock, self.per_tok_s = clock, per_tok_s
        self.n_calls = 0

    def draft(self, req):
        missed = max(0, req.pos0 - self.pos_known)
        self.clock.t += 0.25 * self.per_tok_s * missed
        self.stats.t_process_us += 0.25 * self.per_tok_s * missed * 1e6
        self.clock.t += self.per_tok_s * min(req.n_max, self.n)
        self.n_calls += 1
        return super().draft(req)


def engine_memory(points, t1_s, online_cost):
    """What an engine's chains share: its verify-cost model (one chain's measurements of a
    drafter are the next one's start), the controller's parameters, and a fake clock."""
    curve = CostCurve(points)
    curve.t1_s = t1_s
    params = ControllerParams(online_cost=online_cost)
    return CostModel(curve, params), params, FakeClock()


def test_a_drafter_measured_hopeless_is_not_taken_up_when_the_machine_slows_down():
    """A draft model measured too dear to pay (a Q2_K copy of the target, 94 % of its size:
    12 ms a drafted token and 7 ms of upkeep a step against the target's 20 ms step) stays off
    in the next chains, until its rare probe measures it again. Before, a stretch where the
    machine ran the target's steps slower (another process, a busy host: 40 ms a step) set
    the drafter's remembered cost against the slower steps, it looked cheap, and it drafted on
    most steps, its first draft of each chain decoding the whole context it had missed. (In a
    `bench -md` run on a 2-core VM, one 19-token reply spent 1.7-2.6 s in the draft model in
    two rounds where `none` also ran at half speed: this is the path that allows it.)"""
    cost, params, clock = engine_memory({0: 1.0, 1: 1.39, 2: 1.60, 3: 1.77, 4: 2.33, 8: 3.46, 16: 5.08}, 0.020,
                                        online_cost=True)
    first = DraftModel(clock, 0.012, upkeep_us=7000.0)
    ctl = Controller(SpeculatorChain([first]), cost, params, clock=clock)
    run_with_upkeep(ctl, 40, t_step=0.020)
    st = ctl.states[id(first)]
    assert st.hopeless and first.n_calls >= 2 and st.t_call == pytest.approx(0.012, rel=0.1), (st.t_call, st.per)
    # the next chains, on a machine that now runs the target's steps (and the drafter) twice as slowly
    for _ in range(3):
        again = DraftModel(clock, 0.024, upkeep_us=14000.0)
        ctl = Controller(SpeculatorChain([again]), cost, params, clock=clock)
        _, ds = run_with_upkeep(ctl, 120, t_step=0.040)
        assert cost.t1_s > 0.030                                    # the slower steps were seen
        assert not any(d.draft for d in ds), [(i, len(d.draft), d.probe) for i, d in enumerate(ds) if d.draft]


def short_match_decision(prompt, id_last, draft, short_match=1, seed=0.8):
    """The decision on ``draft`` for a lookup drafter whose first draft position has been
    right ``seed`` of the time (20 drafts' worth), on a verify-cost curve where a one-token
    draft pays from a first-token rate of ~0.34 up."""
    lookup = Lookup(lambda ctx: list(draft))
    ctl = controller(lookup, curve=linear(0.3), short_match=short_match)
    ctl.begin()
    ctl._state(lookup).model.seed([seed], 20.0)
    return ctl, ctl.decide(DraftRequest(prompt=prompt, id_last=id_last, pos0=len(prompt), n_max=-1))


def test_a_lookup_draft_resting_on_a_one_token_match_is_taken_at_the_rate_such_drafts_have():
    # "... weekend" -> ".": the pair (20, 30) occurred once, after another token (11, not 12)
    ctl, d = short_match_decision([10, 11, 20, 30, 12], 20, [30])
    assert d.draft == [] and d.reason == "skipped", d
    # the same draft where the context repeats two tokens, or with the rule off, is verified at
    # the drafter's own rate
    assert short_match_decision([10, 11, 20, 30, 11], 20, [30])[1].draft == [30]
    assert short_match_decision([10, 11, 20, 30, 12], 20, [30], short_match=0)[1].draft == [30]
    # and a cache's memory of other text (the pair not in the context at all) likewise
    assert short_match_decision([10, 11, 20, 31, 12], 20, [30])[1].draft == []


def test_short_match_drafts_that_come_true_are_learned_from_while_unverified():
    # a drafter whose one-token-key drafts are right: each is only scored (skipped at the
    # cautious prior), and after a few the rate they show lets them be verified
    ctx = [10, 11, 20, 30, 12, 20]
    lookup = Lookup(lambda c: [30] if c[-1] == 20 else [])
    ctl = controller(lookup, curve=linear(0.3))
    ctl.begin()
    st = ctl._state(lookup)
    st.model.seed([0.8], 20.0)
    verified, fillers = [], iter(range(40, 1000))

    def step(writes):
        d = ctl.decide(DraftRequest(prompt=ctx[:-1], id_last=ctx[-1], pos0=len(ctx) - 1, n_max=-1))
        ids = writes(d)
        ctl.observe(d, ids)
        if d.draft:
            ctl.chain.accept(len(ids) - 1)
        ctx.extend(ids)
        return d

    for _ in range(12):
        # the target writes 30 after each 20, then a new token (the match stays at one token)
        d = step(lambda d: [30, next(fillers)] if d.draft else [30])
        verified.append(bool(d.draft))
        if not d.draft:
            step(lambda d: [next(fillers)])
        step(lambda d: [20])
    assert not verified[0] and verified[-1], verified
    assert st.short.rate > 0.6, st.short.rate


class RarelyRight(DraftModel):
    """A draft model cheap enough to pay were its drafts accepted, whose first token is right
    one time in four."""

    def __init__(self, clock, per_tok_s, **kw):
        super().__init__(clock, per_tok_s, **kw)
        self.right = lambda i: 1 if i % 4 == 0 else 0


def test_a_fresh_chain_does_not_probe_a_draft_model_an_earlier_one_measured_short_of_paying():
    """``bench -md`` with the Q2_K copy on a CPU where a verify of a few tokens is cheap: the
    draft model could pay at full acceptance, but not at the rate it is accepted. Each fresh
    chain (each round of a bench, a rebuilt chain in the chat) had it mirror the prompt (330
    tokens, ~0.5 s on the draft model) and probed it three times within the reply's first
    steps; an earlier chain of the same engine had measured it short of paying."""
    cost, params, clock = engine_memory({0: 1.0, 1: 1.08, 2: 1.27, 3: 1.39, 4: 2.0, 8: 2.7, 16: 3.8}, 0.022,
                                        online_cost=False)
    first = RarelyRight(clock, 0.006, upkeep_us=2000.0)
    ctl = Controller(SpeculatorChain([first]), cost, params, clock=clock)
    ctl.begin()
    run_with_upkeep(ctl, 60, t_step=0.022)
    st = ctl.states[id(first)]
    assert st.per["probes"] >= 3 and not st.hopeless and st.u_s is not None
    assert not ctl._worth_probing_soon(st)
    # the next chain of the same engine: the prompt is read after begin(), as the engine does
    again = RarelyRight(clock, 0.006, upkeep_us=2000.0)
    ctl = Controller(SpeculatorChain([again]), cost, params, clock=clock)
    ctl.begin()
    ctl.chain.process(TEXT[:300], 0)
    assert again.mirrored == 0, "the draft model mirrored the prompt"
    _, ds = run_with_upkeep(ctl, 14, pos=300, t_step=0.022)
    assert not any(d.draft for d in ds), [(i, len(d.draft), d.probe) for i, d in enumerate(ds) if d.draft]
    # it is still probed, at its probes' share of the time
    _, ds = run_with_upkeep(ctl, 3000, pos=314, t_step=0.022)
    assert any(d.probe for d in ds)


def test_widths_timed_often_are_read_from_their_own_steps():
    """The realistic hybrid's steps, as timed in Automatic: 31 ms plain, 43, 52.5 and 53 ms with
    1, 2 and 3 drafted tokens (flat from 2 to 3), and now and then a long lookup draft of 8 at
    150 ms. One line through all of them read c(3) ~2.4 one-token steps, and the MTP head was
    asked for 2 tokens where 3 paid (its 3-token drafts cost no more to verify)."""
    cost = CostModel(CostCurve({0: 1.0, 1: 1.52, 2: 1.76, 3: 1.76, 4: 2.01, 8: 2.94}), ControllerParams())
    times = {0: 0.031, 1: 0.043, 2: 0.0525, 3: 0.053, 8: 0.150}
    rng = random.Random(3)
    for i in range(300):
        k = 8 if i % 40 == 0 else rng.choice([0, 1, 2, 2, 3, 3, 3])
        cost.observe(k, times[k] * rng.uniform(0.97, 1.03))
    cost.refresh()
    assert cost.rel(2) == pytest.approx(0.0525 / 0.031, rel=0.04)
    assert cost.rel(3) == pytest.approx(0.053 / 0.031, rel=0.04)
    assert cost.rel(3) - cost.rel(2) < 0.1, (cost.rel(2), cost.rel(3))
    assert cost.t1_s == pytest.approx(0.031, rel=0.04)
