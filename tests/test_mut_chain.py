"""The chain's accounting, pinned down where mutation testing found it loose (tools/mutation.py).

``tests/test_chain.py`` checks the reference's accounting on toy speculators. Here, with a fake
clock: every timer of every call (begin, process, draft, ask, accept) in microseconds and summed
over calls, every counter over several calls, the draft cut at ``n_max`` at its bounds,
``process``'s answer, ``commit`` and ``begin_step``, the synthetic rates' conditional
probabilities and errors, and how ``from_params`` builds, skips and explains types (explicit
and under ``auto``).
"""

from __future__ import annotations

import pytest

from speculators import chain as chain_mod
from speculators.auto import AutoChoice, auto_plan_for_resources
from speculators.base import DraftRequest, Speculator
from speculators.chain import (SpeculatorChain, Unavailable, implemented_types, register,
                               resolve_synth_rates)
from speculators.params import ParamError, SpecParams
from speculators.types import NGRAM_TYPES, PRIORITY, SpecType


class Clock:
    """``time.perf_counter`` that moves only when a toy speculator works (exact binary steps)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(chain_mod.time, "perf_counter", c)
    return c


class Toy(Speculator):
    """Drafts a fixed list; each hook takes ``cost`` seconds of the clock and is recorded."""

    def __init__(self, type_, draft=(), clock=None, cost=0.0, n_max=8, process_ok=True,
                 process_cost=0.0):
        super().__init__(n_max)
        self.type = type_
        self._draft = list(draft)
        self.clock = clock
        self.cost = cost
        self.process_ok = process_ok
        self.process_cost = process_cost   # process time a draft call catches up on first
        self.calls: list[tuple] = []

    def _tick(self):
        if self.clock is not None:
            self.clock.advance(self.cost)

    def begin(self, prompt):
        self.calls.append(("begin", list(prompt)))
        self._tick()

    def process(self, tokens, pos0):
        self.calls.append(("process", list(tokens), pos0))
        self._tick()
        return self.process_ok

    def draft(self, req):
        self.calls.append(("draft",))
        if self.process_cost:
            self.stats.t_process_us += self.process_cost * 1e6
        self._tick()
        return list(self._draft)

    def accept(self, n, is_other):
        self.calls.append(("accept", n, is_other))
        self._tick()

    def draft_cut(self, n_kept):
        self.calls.append(("cut", n_kept))


#: the n-gram types in priority order (what ``auto`` always uses)
NGRAMS = [t.value for t in PRIORITY if t in NGRAM_TYPES]


def req(n_max=-1):
    return DraftRequest(prompt=[1, 2, 3], id_last=4, pos0=3, n_max=n_max)


# -- a new chain ----------------------------------------------------------------------------

def test_a_new_chain_has_nothing_yet():
    c = SpeculatorChain([])
    assert c.last is None and c.last_drafter is None
    assert c.skipped == {} and c.auto_plan is None and c.adaptive is False
    assert c.synth_rates == [] and c.synth_probs == [] and not c.synthetic
    assert c.n_max == 0 and c.draft(req()) == [] and c.get_state() is None


def test_a_type_outside_the_priority_list_goes_last():
    odd = Toy(SpecType.NONE, [1])
    mod = Toy(SpecType.NGRAM_MOD, [2])
    simple = Toy(SpecType.NGRAM_SIMPLE, [3])
    c = SpeculatorChain([odd, mod, simple])
    assert c.speculators == [simple, mod, odd]
    c = SpeculatorChain([mod, odd])
    assert c.speculators == [mod, odd]


def test_conditional_probabilities_of_the_synthetic_rates():
    c = SpeculatorChain([], [0.5, 0.0, 0.0])
    assert c.synth_probs == [0.5, 0.0, 0.0] and c.synthetic
    c = SpeculatorChain([], [0.8, 0.4, 0.1])
    assert c.synth_probs == pytest.approx([0.8, 0.5, 0.25])


# -- timers and counters ---------------------------------------------------------------------------

def test_begin_times_and_counts_every_call(clock):
    a = Toy(SpecType.NGRAM_SIMPLE, clock=clock, cost=0.5)
    b = Toy(SpecType.NGRAM_MOD, clock=clock, cost=0.25)
    c = SpeculatorChain([a, b])
    c.begin([1, 2])
    c.begin([1, 2, 3])
    assert a.calls == [("begin", [1, 2]), ("begin", [1, 2, 3])]
    assert (a.stats.t_begin_us, a.stats.n_call_begin) == (1_000_000.0, 2)
    assert (b.stats.t_begin_us, b.stats.n_call_begin) == (500_000.0, 2)


def test_process_reaches_everyone_times_them_and_says_whether_all_kept_up(clock):
    a = Toy(SpecType.NGRAM_SIMPLE, clock=clock, cost=0.5)
    b = Toy(SpecType.NGRAM_MOD, clock=clock, cost=0.25)
    c = SpeculatorChain([a, b])
    assert c.process([7, 8], 5) is True
    assert c.process([9], 7) is True
    assert a.calls == [("process", [7, 8], 5), ("process", [9], 7)] == b.calls
    assert a.stats.t_process_us == 1_000_000.0 and b.stats.t_process_us == 500_000.0
    a.process_ok = False
    assert c.process([1], 8) is False
    assert b.calls[-1] == ("process", [1], 8)          # the others still get the batch
    a.process_ok, b.process_ok = True, False
    assert c.process([1], 9) is False


def test_draft_times_and_counts_each_speculator_asked(clock):
    empty = Toy(SpecType.NGRAM_SIMPLE, [], clock=clock, cost=0.25)
    full = Toy(SpecType.NGRAM_MOD, [5, 6, 7], clock=clock, cost=0.5)
    c = SpeculatorChain([empty, full])
    assert c.draft(req()) == [5, 6, 7]
    assert c.draft(req()) == [5, 6, 7]
    assert (empty.stats.t_draft_us, empty.stats.n_call_draft, empty.stats.n_gen_drafts) == (500_000.0, 2, 0)
    assert (full.stats.t_draft_us, full.stats.n_call_draft) == (1_000_000.0, 2)
    assert (full.stats.n_gen_drafts, full.stats.n_gen_tokens) == (2, 6)


@pytest.mark.parametrize("n_max, expected", [(-1, [5, 6, 7]), (0, [5, 6, 7]), (1, [5]), (2, [5, 6]),
                                             (3, [5, 6, 7]), (4, [5, 6, 7])])
def test_the_draft_is_cut_at_a_positive_n_max(n_max, expected):
    s = Toy(SpecType.NGRAM_MOD, [5, 6, 7])
    c = SpeculatorChain([s])
    assert c.draft(req(n_max)) == expected
    assert s.stats.n_gen_tokens == len(expected)
    assert c.ask(s, req(n_max))[0] == expected


def test_accept_times_and_counts(clock):
    a = Toy(SpecType.NGRAM_SIMPLE, [5, 6, 7], clock=clock, cost=0.25)
    b = Toy(SpecType.NGRAM_MOD, [1], clock=clock, cost=0.5)
    c = SpeculatorChain([a, b])
    c.draft(req())
    t_draft = a.stats.t_draft_us
    c.accept(1)
    c.draft(req())
    c.accept(0)
    st = a.stats
    assert (st.n_acc_drafts, st.n_acc_tokens, st.n_call_accept, st.n_acc_tokens_per_pos) == (1, 1, 2, [1])
    # the drafter's own accept is timed (the others' are not)
    assert st.t_accept_us == 500_000.0 and st.t_draft_us == 2 * t_draft
    assert b.stats.t_accept_us == 0.0 and b.stats.n_call_accept == 0
    assert b.calls == [("accept", 1, True), ("accept", 0, True)]


def test_accept_with_tokens_but_no_draft_says_so():
    c = SpeculatorChain([Toy(SpecType.NGRAM_SIMPLE, [])])
    with pytest.raises(ValueError, match=r"^accept\(\) with accepted tokens but no draft was made$"):
        c.accept(2)


# -- the adaptive controller's calls -------------------------------------------------------------

def test_ask_returns_the_seconds_and_counts_process_catch_up_as_process_time(clock):
    s = Toy(SpecType.NGRAM_MOD, [5, 6, 7], clock=clock, cost=0.75, process_cost=0.25)
    c = SpeculatorChain([s])
    draft, dt = c.ask(s, req())
    assert (draft, dt) == ([5, 6, 7], 0.75)
    assert s.stats.t_draft_us == 500_000.0 and s.stats.t_process_us == 250_000.0
    c.ask(s, req())
    assert s.stats.t_draft_us == 1_000_000.0 and s.stats.n_call_draft == 2
    assert s.stats.n_gen_drafts == 0 and c.last is None      # asked, not committed


def test_ask_never_counts_negative_or_made_up_draft_time(clock):
    quick = Toy(SpecType.NGRAM_MOD, [5], clock=clock, cost=0.0)
    c = SpeculatorChain([quick])
    assert c.ask(quick, req())[1] == 0.0
    assert quick.stats.t_draft_us == 0.0
    catching_up = Toy(SpecType.NGRAM_SIMPLE, [5], clock=clock, cost=0.25, process_cost=0.5)
    c = SpeculatorChain([catching_up])
    c.ask(catching_up, req())
    assert catching_up.stats.t_draft_us == 0.0


def test_commit_makes_a_draft_of_the_chain_and_tells_a_cut():
    s = Toy(SpecType.NGRAM_MAP_K, [5, 6, 7])
    c = SpeculatorChain([s])
    c.commit(s, [5, 6, 7], n_proposed=3)
    c.commit(s, [5], n_proposed=3)
    c.commit(s, [5, 6])
    assert c.last is s and c.last_drafter == "ngram-map-k"
    assert (s.stats.n_gen_drafts, s.stats.n_gen_tokens) == (3, 6)
    assert [x for x in s.calls if x[0] == "cut"] == [("cut", 1)]
    c.commit(s, [])
    assert c.last is None and c.last_drafter is None
    assert (s.stats.n_gen_drafts, s.stats.n_gen_tokens) == (3, 6)


def test_begin_step_forgets_the_last_drafter():
    s = Toy(SpecType.NGRAM_MOD, [5])
    c = SpeculatorChain([s])
    c.draft(req())
    assert c.last_drafter == "ngram-mod"
    c.begin_step()
    assert c.last is None and c.last_drafter is None
    c.accept(0)                                            # nothing to credit
    assert s.stats.n_call_accept == 0


# -- synthetic rates ------------------------------------------------------------------------------

def test_synth_len_with_a_single_speculative_token():
    assert resolve_synth_rates(SpecParams(synth_len=1.5), 1) == pytest.approx([0.5], abs=1e-9)
    assert resolve_synth_rates(SpecParams(synth_len=2.0), 1) == [1.0]


def test_valid_synth_rates_at_their_bounds_are_kept():
    assert resolve_synth_rates(SpecParams(synth_rates=[1.0, 1.0, 0.0]), 3) == [1.0, 1.0, 0.0]
    assert resolve_synth_rates(SpecParams(synth_rates=[0.5, 0.5]), 2) == [0.5, 0.5]
    assert resolve_synth_rates(SpecParams(synth_rates=[1]), 1) == [1.0]


@pytest.mark.parametrize("params, n_max, field, message", [
    (SpecParams(synth_len=2.0, synth_rates=[0.5]), 1, "synth",
     "synthetic acceptance length and rates are mutually exclusive"),
    (SpecParams(synth_len=2.0), 0, "synth", "synthetic acceptance requires at least one speculative token"),
    (SpecParams(synth_rates=[0.5]), 0, "synth", "synthetic acceptance requires at least one speculative token"),
    (SpecParams(synth_rates=[0.5, 0.4]), 3, "synth_rates", "synthetic acceptance rates must contain 3 values, got 2"),
    (SpecParams(synth_rates=[-0.1]), 1, "synth_rates", "synthetic acceptance rates must be finite and within [0, 1]"),
    (SpecParams(synth_rates=[float("nan")]), 1, "synth_rates",
     "synthetic acceptance rates must be finite and within [0, 1]"),
    (SpecParams(synth_rates=[1.01]), 1, "synth_rates", "synthetic acceptance rates must be finite and within [0, 1]"),
    (SpecParams(synth_rates=[0.5, 0.6]), 2, "synth_rates",
     "synthetic acceptance rates must be monotonically non-increasing"),
    (SpecParams(synth_len=0.99), 2, "synth_len", "synthetic acceptance length must be finite and within [1, 3]"),
    (SpecParams(synth_len=3.01), 2, "synth_len", "synthetic acceptance length must be finite and within [1, 3]"),
])
def test_synth_errors_name_the_field_and_say_what_is_wrong(params, n_max, field, message):
    with pytest.raises(ParamError) as e:
        resolve_synth_rates(params, n_max)
    assert (e.value.field, e.value.message) == (field, message)


# -- building a chain ---------------------------------------------------------------------------------

def test_register_puts_a_factory_in_the_registry(monkeypatch):
    reg = chain_mod._REGISTRY
    monkeypatch.setitem(reg, SpecType.NGRAM_SIMPLE, reg[SpecType.NGRAM_SIMPLE])  # restored after

    def factory(params, resources):
        return Toy(SpecType.NGRAM_SIMPLE, [4, 2], n_max=2)

    assert register("ngram-simple")(factory) is factory
    assert reg[SpecType.NGRAM_SIMPLE] is factory
    c = SpeculatorChain.from_params(SpecParams.from_types("ngram-simple"))
    assert c.draft(req()) == [4, 2]


def test_implemented_types_are_every_registered_type():
    assert implemented_types() == frozenset(chain_mod._REGISTRY)
    assert set(PRIORITY) <= implemented_types()


def test_an_explicit_chain_has_no_auto_plan_and_is_not_adaptive():
    c = SpeculatorChain.from_params(SpecParams.from_types("ngram-simple,ngram-mod"))
    assert [s.name for s in c.speculators] == ["ngram-simple", "ngram-mod"]
    assert c.auto_plan is None and c.adaptive is False and c.skipped == {}


def test_a_type_without_a_factory_is_skipped_and_the_rest_built(monkeypatch):
    monkeypatch.delitem(chain_mod._REGISTRY, SpecType.NGRAM_SIMPLE)
    c = SpeculatorChain.from_params(SpecParams.from_types("ngram-simple,ngram-mod"))
    assert [s.name for s in c.speculators] == ["ngram-mod"]
    assert c.skipped == {"ngram-simple": "not implemented in this version of draftlight"}


def test_an_unavailable_type_says_why(monkeypatch):
    def factory(params, resources):
        raise Unavailable("needs a draft model")
    monkeypatch.setitem(chain_mod._REGISTRY, SpecType.DRAFT_SIMPLE, factory)
    c = SpeculatorChain.from_params(SpecParams.from_types("ngram-mod,draft-simple"))
    assert c.skipped == {"draft-simple": "needs a draft model"}


def test_an_explicit_type_that_fails_to_build_is_an_error(monkeypatch):
    def factory(params, resources):
        raise RuntimeError("broken draft model")
    monkeypatch.setitem(chain_mod._REGISTRY, SpecType.DRAFT_SIMPLE, factory)
    with pytest.raises(RuntimeError, match="broken draft model"):
        SpeculatorChain.from_params(SpecParams.from_types("draft-simple"))


def _auto_with_draft_model(monkeypatch, factory):
    monkeypatch.setitem(chain_mod._REGISTRY, SpecType.DRAFT_SIMPLE, factory)
    params = SpecParams.auto()
    resources = {"draft_model": object()}
    plan = auto_plan_for_resources(params, resources)
    assert [c.name for c in plan if c.used] == NGRAMS + ["draft-simple"]
    return SpeculatorChain.from_params(params, resources), plan


def test_auto_builds_what_its_plan_uses(monkeypatch):
    c, plan = _auto_with_draft_model(monkeypatch, lambda p, r: Toy(SpecType.DRAFT_SIMPLE, [1], n_max=3))
    assert [s.name for s in c.speculators] == [c_.name for c_ in plan if c_.used]
    assert c.auto_plan == plan and c.skipped == {} and c.adaptive is True


@pytest.mark.parametrize("error, reason", [(RuntimeError("vocabularies differ"), "vocabularies differ"),
                                           (RuntimeError(), "RuntimeError")])
def test_auto_leaves_out_a_model_type_that_fails_and_says_why(monkeypatch, error, reason):
    def factory(params, resources):
        raise error
    c, plan = _auto_with_draft_model(monkeypatch, factory)
    assert [s.name for s in c.speculators] == NGRAMS
    assert c.skipped == {"draft-simple": reason}
    expected = [AutoChoice("draft-simple", False, reason) if p.name == "draft-simple" else p for p in plan]
    assert c.auto_plan == expected
    assert [p for p in c.auto_plan if not p.used and p.name != "draft-simple"] == \
        [p for p in plan if not p.used]                    # the unused ones keep their own reason


def test_auto_does_not_hide_a_broken_ngram_type(monkeypatch):
    def factory(params, resources):
        raise RuntimeError("ngram-mod is broken")
    monkeypatch.setitem(chain_mod._REGISTRY, SpecType.NGRAM_MOD, factory)
    with pytest.raises(RuntimeError, match="ngram-mod is broken"):
        SpeculatorChain.from_params(SpecParams.auto())


def test_auto_with_synthetic_acceptance_is_not_adaptive():
    p = SpecParams.auto()
    p.synth_len = 2.0
    c = SpeculatorChain.from_params(p)
    assert c.synthetic and c.adaptive is False


def test_synthetic_acceptance_needs_a_speculator_that_drafts(monkeypatch):
    p = SpecParams.from_types("draft-simple")
    p.synth_len = 2.0
    with pytest.raises(ParamError) as e:                   # draft-simple skipped: nothing drafts
        SpeculatorChain.from_params(p)
    assert e.value.field == "synth"
    monkeypatch.setitem(chain_mod._REGISTRY, SpecType.NGRAM_SIMPLE,
                        lambda params, resources: Toy(SpecType.NGRAM_SIMPLE, [], n_max=0))
    p = SpecParams.from_types("ngram-simple")
    p.synth_len = 1.5
    with pytest.raises(ParamError) as e:                   # n_max 0: no speculative token
        SpeculatorChain.from_params(p)
    assert e.value.field == "synth"


def test_auto_plans_with_the_chains_own_parameters(tmp_path):
    """The plan is made for the parameters given (their draft model), not for the defaults."""
    p = SpecParams.auto()
    p.draft.model = str(tmp_path / "draft.gguf")            # set, but not there
    c = SpeculatorChain.from_params(p)
    (simple,) = [x for x in c.auto_plan if x.name == "draft-simple"]
    assert simple == AutoChoice("draft-simple", False, "the draft model draft.gguf cannot be read")
    assert [s.name for s in c.speculators] == NGRAMS
