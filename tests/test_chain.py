"""The chain as the reference defines it: names, priority, first wins, accounting, synth."""

from __future__ import annotations

import math

import pytest

from speculators import (ALL_TYPES, PRIORITY, DraftRequest, ParamError, SpecParams, SpecType, Speculator, SpeculatorStats,
                         SpeculatorChain, UnknownSpecType, parse_types, resolve_synth_rates)


def test_type_names_are_the_references():
    assert [t.value for t in ALL_TYPES] == [
        "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
        "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
    assert [t.value for t in PRIORITY] == [
        "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
        "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"]


def test_parse_types():
    assert parse_types("ngram-mod,ngram-simple") == [SpecType.NGRAM_SIMPLE, SpecType.NGRAM_MOD]
    assert parse_types("ngram-mod, none") == []
    assert parse_types("none,ngram-mod") == []
    assert parse_types("") == []
    assert parse_types(["draft-simple", "ngram-cache", "ngram-cache"]) == [SpecType.NGRAM_CACHE,
                                                                          SpecType.DRAFT_SIMPLE]
    with pytest.raises(UnknownSpecType) as e:
        parse_types("ngram-mod,ngram-fancy")
    assert "ngram-fancy" in str(e.value)
    for t in ALL_TYPES:
        assert t.value in str(e.value)


class Fixed(Speculator):
    """A toy speculator that returns a fixed draft and records what it is told."""

    def __init__(self, type_, draft, n_max=8):
        super().__init__(n_max)
        self.type = type_
        self._draft = draft
        self.accepts: list[tuple[int, bool]] = []
        self.begun = 0

    def begin(self, prompt):
        self.begun += 1

    def draft(self, req):
        return list(self._draft)

    def accept(self, n, is_other):
        self.accepts.append((n, is_other))


def req(n_max=-1):
    return DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=n_max)


def test_priority_order_and_first_drafter_wins():
    cache = Fixed(SpecType.NGRAM_CACHE, [9, 9])
    simple = Fixed(SpecType.NGRAM_SIMPLE, [])
    mod = Fixed(SpecType.NGRAM_MOD, [7, 8, 9])
    chain = SpeculatorChain([cache, mod, simple])  # any order in, priority order inside
    assert [s.name for s in chain.speculators] == ["ngram-simple", "ngram-mod", "ngram-cache"]
    assert chain.draft(req()) == [7, 8, 9]
    assert chain.last_drafter == "ngram-mod"
    st = chain.stats()
    assert (st["ngram-simple"].n_call_draft, st["ngram-mod"].n_call_draft, st["ngram-cache"].n_call_draft) == (1, 1, 0)
    assert st["ngram-simple"].n_gen_drafts == 0 and st["ngram-mod"].n_gen_drafts == 1


def test_draft_is_truncated_to_the_request_n_max():
    chain = SpeculatorChain([Fixed(SpecType.NGRAM_MOD, [1, 2, 3, 4, 5])])
    assert chain.draft(req(n_max=2)) == [1, 2]
    assert chain.stats()["ngram-mod"].n_gen_tokens == 2
    assert chain.draft(req(n_max=-1)) == [1, 2, 3, 4, 5]


def test_accept_credits_the_drafter_and_tells_the_others():
    a = Fixed(SpecType.NGRAM_SIMPLE, [5, 6, 7])
    b = Fixed(SpecType.NGRAM_MOD, [1])
    chain = SpeculatorChain([a, b])
    chain.draft(req())
    chain.accept(2)
    chain.draft(req())
    chain.accept(0)
    chain.draft(req())
    chain.accept(3)
    s = chain.stats()["ngram-simple"]
    assert s.n_gen_drafts == 3 and s.n_gen_tokens == 9
    assert s.n_acc_drafts == 2 and s.n_acc_tokens == 5
    assert s.n_call_accept == 3
    assert s.n_acc_tokens_per_pos == [2, 2, 1]
    # print_stats' figures
    assert s.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert s.acceptance_rate_per_pos == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert a.accepts == [(2, False), (0, False), (3, False)]
    assert b.accepts == [(2, True), (0, True), (3, True)]
    line = chain.print_stats()[0]
    assert "#mean acc len = 2.67" in line and "#acc rate/pos = (0.667, 0.667, 0.333)" in line


def test_accept_without_a_draft():
    chain = SpeculatorChain([Fixed(SpecType.NGRAM_SIMPLE, [])])
    assert chain.draft(req()) == []
    chain.accept(0)  # allowed, nothing credited
    assert chain.stats()["ngram-simple"].n_call_accept == 0
    with pytest.raises(ValueError):
        chain.accept(1)


def test_begin_reaches_every_speculator():
    a, b = Fixed(SpecType.NGRAM_SIMPLE, []), Fixed(SpecType.NGRAM_MOD, [])
    chain = SpeculatorChain([a, b])
    chain.begin([1, 2, 3])
    assert a.begun == b.begun == 1
    assert chain.stats()["ngram-mod"].n_call_begin == 1


def test_state_hooks_exist_on_every_speculator(tmp_path):
    """Every type's hooks do real work (the base class's no-ops would fail here), and
    the one type with per-sequence state round-trips it through the chain."""
    import random

    chain = SpeculatorChain.from_params(SpecParams.from_types(
        "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache"))
    assert [s.name for s in chain.speculators] == [
        "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
    rng = random.Random(3)
    phrase = [rng.randrange(1000, 60000) for _ in range(120)]
    hist = phrase * 5 + phrase[:30]  # every type's lookup finds the phrase's continuation
    for s in chain.speculators:
        for hook in ("begin", "process", "draft", "accept", "get_state", "set_state"):
            assert callable(getattr(s, hook))
        s.begin(hist[:-1])
        d = s.draft(DraftRequest(prompt=hist[:-1], id_last=hist[-1], pos0=len(hist) - 1, n_max=s.n_max))
        assert d and d == phrase[30:30 + len(d)], s.name
        s.accept(len(d), False)
        # as in the reference, no n-gram type keeps per-sequence state
        assert s.get_state() is None, s.name
    assert chain.get_state() is None

    # EAGLE3 keeps its deferred boundary (position + g row) where the target's single-position
    # checkpoints would lose it: on a hybrid target. It must survive get_state/set_state.
    from speculators.engine import Engine, EngineConfig
    from speculators.sampling import SamplingParams
    from tests.hidden_models import write_eagle3, write_qwen35_mtp

    target = write_qwen35_mtp(tmp_path / "hybrid.gguf", with_mtp=False)
    drafter = write_eagle3(tmp_path / "eagle3.gguf", target_layers=(0, 1, 1))
    spec = SpecParams.from_types("draft-eagle3")
    spec.draft.model, spec.draft.p_min, spec.draft.n_max = str(drafter), 0.0, 3
    eng = Engine(str(target), EngineConfig(n_ctx=256, n_batch=16, n_threads=1), spec)
    try:
        assert eng.model.is_hybrid and eng.chain.skipped == {}
        eng.run(eng.model.tokenize("hello world"), max_tokens=8, sampling=SamplingParams(temperature=0.0))
        (s,) = eng.chain.speculators
        data = eng.chain.get_state()
        assert data is not None and len(data) > 4
        pos, g = s.pending_pos, s.pending_g.copy()
        assert pos > 0 and g.any()
        s.pending_pos, s.pending_g = -1, g * 0
        assert eng.chain.get_state() is None  # nothing pending: nothing to stash
        eng.chain.set_state(data)
        assert s.pending_pos == pos and (s.pending_g == g).all()
        assert eng.chain.get_state() == data
    finally:
        eng.close()


def test_model_types_without_a_model_are_skipped_with_a_reason():
    chain = SpeculatorChain.from_params(SpecParams.from_types("ngram-mod,draft-simple"))
    assert [s.name for s in chain.speculators] == ["ngram-mod"]
    assert "draft-simple" in chain.skipped and chain.skipped["draft-simple"]


# -- synthetic acceptance ---------------------------------------------------

def _geom_len(rates):
    return 1 + sum(rates)


def test_synth_len_bisection_matches_the_requested_mean_length():
    for n_max, length in [(3, 2.0), (8, 4.5), (16, 1.5), (5, 5.9)]:
        rates = resolve_synth_rates(SpecParams(synth_len=length), n_max)
        assert len(rates) == n_max
        assert _geom_len(rates) == pytest.approx(length, abs=1e-6)
        p = rates[0]
        assert rates == pytest.approx([p ** (i + 1) for i in range(n_max)])
    assert resolve_synth_rates(SpecParams(synth_len=1.0), 4) == [0.0, 0.0, 0.0, 0.0]
    assert resolve_synth_rates(SpecParams(synth_len=5.0), 4) == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("params, n_max, message", [
    (SpecParams(synth_len=0.5), 4, "within [1, 5]"),
    (SpecParams(synth_len=6.0), 4, "within [1, 5]"),
    (SpecParams(synth_len=math.inf), 4, "finite"),
    (SpecParams(synth_len=2.0), 0, "at least one speculative token"),
    (SpecParams(synth_rates=[0.5, 0.4]), 3, "must contain 3 values, got 2"),
    (SpecParams(synth_rates=[0.5, 0.6, 0.1]), 3, "non-increasing"),
    (SpecParams(synth_rates=[1.5, 0.6, 0.1]), 3, "within [0, 1]"),
    (SpecParams(synth_len=2.0, synth_rates=[0.5]), 1, "mutually exclusive"),
])
def test_synth_validation(params, n_max, message):
    with pytest.raises(ParamError) as e:
        resolve_synth_rates(params, n_max)
    assert message in str(e.value)


def test_synth_rates_become_conditional_probabilities():
    p = SpecParams.from_types("ngram-cache")
    p.synth_rates = [0.8, 0.4, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0]
    chain = SpeculatorChain.from_params(p)
    assert chain.synthetic
    assert chain.synth_probs == pytest.approx([0.8, 0.5, 0.5, 0.5, 0.5, 0.4, 0.5, 0.0])


def test_n_max_configured_follows_the_reference():
    p = SpecParams.from_types("ngram-simple,ngram-mod,draft-simple,ngram-cache")
    assert p.n_max_configured() == 64
    p.ngram_mod.n_max = 4
    assert p.n_max_configured() == 48  # ngram-simple's size_m


@pytest.mark.parametrize("mutate, field", [
    (lambda p: setattr(p.draft, "n_max", -1), "draft.n_max"),
    (lambda p: setattr(p.draft, "p_min", 1.5), "draft.p_min"),
    (lambda p: setattr(p.ngram_simple, "size_n", 0), "ngram_simple.size_n"),
    (lambda p: setattr(p.ngram_map_k4v, "size_m", 2000), "ngram_map_k4v.size_m"),
    (lambda p: setattr(p.ngram_map_k, "min_hits", 0), "ngram_map_k.min_hits"),
    (lambda p: setattr(p.ngram_mod, "n_match", 0), "ngram_mod.n_match"),
    (lambda p: setattr(p.ngram_mod, "n_min", -1), "ngram_mod.n_min"),
])
def test_out_of_range_parameters_name_the_field(mutate, field):
    p = SpecParams()
    mutate(p)
    with pytest.raises(ParamError) as e:
        p.validate()
    assert e.value.field == field


def test_params_round_trip_through_a_dict():
    p = SpecParams.from_types("ngram-mod,ngram-cache")
    p.ngram_mod.n_match = 12
    p.draft.p_min = 0.25
    q = SpecParams.from_dict(p.to_dict())
    assert q == p


def test_stats_add_and_subtract_field_by_field():
    a = SpeculatorStats(n_call_draft=3, n_gen_tokens=9, n_acc_tokens=5, t_draft_us=10.0,
                        n_acc_tokens_per_pos=[2, 2, 1])
    b = SpeculatorStats(n_call_draft=1, n_gen_tokens=2, n_acc_tokens=1, t_draft_us=4.0, t_process_us=2.0,
                        n_acc_tokens_per_pos=[1])
    s = a + b
    assert (s.n_call_draft, s.n_gen_tokens, s.n_acc_tokens, s.t_draft_us, s.t_process_us) == (4, 11, 6, 14.0, 2.0)
    assert s.n_acc_tokens_per_pos == [3, 2, 1]
    assert s - b == a
    assert a.n_acc_tokens_per_pos == [2, 2, 1]  # operands untouched


def test_a_controller_cut_reaches_ngram_map_through_the_chain_and_does_not_cap_its_key():
    """llama.cpp verifies ngram-map's whole draft, and a key remembers how much of it was
    accepted. Automatic may verify only the start of it: the chain tells the drafter of the cut
    (``commit(..., n_proposed)``), so a cut draft accepted whole does not cap the key's next
    draft at the cut, while an uncut draft accepted in part does."""
    from speculators.ngram_map import NgramMap
    hist = [0, 1, 2, 3, 4, 5, 6, 7, 1]
    req = DraftRequest(prompt=hist, id_last=2, pos0=9)

    def one(cut: bool) -> list[int]:
        s = NgramMap(size_n=2, size_m=3, min_hits=1, key_only=True)
        chain = SpeculatorChain([s])
        chain.begin([])
        draft, _ = chain.ask(s, req)
        assert draft == [3, 4, 5]
        if cut:
            chain.commit(s, draft[:1], n_proposed=len(draft))   # Automatic verifies [3] alone
        else:
            chain.commit(s, draft)                               # all of it: [3] kept, 4 rejected
        chain.accept(1)
        return chain.ask(s, req)[0]

    assert one(cut=True) == [3, 4, 5]
    assert one(cut=False) == [3]
