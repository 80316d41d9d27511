"""The target's sampler, pinned down where mutation testing found it loose (tools/mutation.py).

``tests/test_sampling_accept.py`` checks the accept rule on scripted greedy logits. Here: the
parameter checks at their bounds, the native sampler chain (which samplers, in which order,
with which arguments) on a tiny model's context whose last logits are scripted, the model's
suppress tokens, seeds, the forced (teacher-forced) runs' flips, save / restore / drop, and that
every native sampler chain made is freed exactly once.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

import llama_cpp as lc

from speculators import sampling
from speculators.params import ParamError
from speculators.sampling import DEFAULT_SEED, Flip, Sampler, SamplingParams

V = 16          # the tiny model's vocabulary
TOP, SECOND = 7, 9


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-block llama model with 16 tokens and a context on it (loads in milliseconds)."""
    from speculators.llama import Context, Model
    from tests.gguf_factory import write_tiny_llama

    path = write_tiny_llama(Path(tmp_path_factory.mktemp("tiny")) / "tiny.gguf", [f"t{i}" for i in range(V)])
    model = Model(path)
    ctx = Context(model, n_ctx=32, n_batch=8, n_threads=1)
    yield model, ctx
    ctx.close()
    model.close()


def scripted(ctx, values) -> None:
    """Make ``values`` the logits of the context's last output row (index -1)."""
    ctx.clear()
    ctx.decode([1], 0, logits="last")
    assert ctx.put_last_logits(np.asarray(values, dtype=np.float32))


def logits(**at) -> np.ndarray:
    row = np.full(V, -20.0, dtype=np.float32)
    for tok, v in at.items():
        row[int(tok[1:])] = v
    return row


class SuppressModel:
    """The tiny model as the sampler sees it, with suppress tokens of our choosing."""

    def __init__(self, model, suppress):
        self.suppress_tokens = None if suppress is None else np.array(suppress, dtype=np.int64)
        self.n_vocab = model.n_vocab
        self._model = model

    def is_eog(self, t):
        return self._model.is_eog(t)


def chain_names(s: Sampler) -> list[str]:
    chain = s._chain
    return [lc.llama_sampler_name(lc.llama_sampler_chain_get(chain, i)).decode().lstrip("?")
            for i in range(lc.llama_sampler_chain_n(chain))]


def draws(model, ctx, params: SamplingParams, n=30, suppress=None) -> list[int]:
    """One token from each of ``n`` samplers seeded 1..n."""
    out = []
    for seed in range(1, n + 1):
        p = SamplingParams(**{**params.__dict__, "seed": seed})
        s = Sampler(p, SuppressModel(model, suppress))
        out.append(s.sample(ctx, -1))
        s.close()
    return out


# -- the parameters ---------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    dict(temperature=0.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.0), dict(min_p=0.0),
    dict(min_p=1.0), dict(seed=0), dict(seed=0xFFFFFFFF), dict(temperature=0.0, top_k=0, top_p=0.0, min_p=0.0, seed=0),
])
def test_the_bounds_are_allowed(kw):
    SamplingParams(**kw).validate()


@pytest.mark.parametrize("kw, field, message", [
    (dict(temperature=-0.5), "temperature", "must be >= 0"),
    (dict(temperature=float("nan")), "temperature", "must be >= 0"),
    (dict(top_k=-1), "top_k", "must be >= 0 (0 disables)"),
    (dict(top_p=-0.01), "top_p", "must be within [0, 1]"),
    (dict(top_p=1.01), "top_p", "must be within [0, 1]"),
    (dict(top_p=1.5), "top_p", "must be within [0, 1]"),
    (dict(min_p=-0.01), "min_p", "must be within [0, 1]"),
    (dict(min_p=1.01), "min_p", "must be within [0, 1]"),
    (dict(min_p=1.5), "min_p", "must be within [0, 1]"),
    (dict(seed=-1), "seed", "must be within [0, 4294967295]"),
    (dict(seed=0x100000000), "seed", "must be within [0, 4294967295]"),
])
def test_out_of_range_values_name_their_field(kw, field, message):
    with pytest.raises(ParamError) as e:
        SamplingParams(**kw).validate()
    assert (e.value.field, e.value.message, str(e.value)) == (field, message, f"{field}: {message}")
    with pytest.raises(ParamError):          # the sampler checks them too
        Sampler(SamplingParams(**kw), SuppressModel.__new__(SuppressModel))


# -- greedy -----------------------------------------------------------------------------------

class RowsCtx:
    """Scripted logits per output row; a row that is not there raises."""

    def __init__(self, rows):
        self.rows = [np.asarray(r, dtype=np.float32) for r in rows]

    def logits(self, i):
        return self.rows[i]


class FakeModel:
    def __init__(self, suppress=None):
        self.suppress_tokens = suppress

    def is_eog(self, t):
        return False


def test_greedy_keeps_its_params_and_seed():
    p = SamplingParams(temperature=0.0, seed=1234)
    s = Sampler(p, FakeModel())
    assert s.params is p and s.seed == 1234 and s._chain is None
    assert s.save() == (None, 0, 0)


def test_greedy_never_picks_a_suppress_token_and_leaves_the_logits_alone():
    row = logits(t7=5.0, t9=4.0, t3=1.0)
    ctx = RowsCtx([row])
    s = Sampler(SamplingParams(temperature=0.0), FakeModel(np.array([TOP], dtype=np.int64)))
    assert s.sample(ctx, 0) == SECOND
    assert ctx.rows[0][TOP] == 5.0            # the context's own logits are not written
    s = Sampler(SamplingParams(temperature=0.0), FakeModel(np.array([TOP, SECOND], dtype=np.int64)))
    assert s.sample(ctx, 0) == 3
    assert Sampler(SamplingParams(temperature=0.0), FakeModel()).sample(ctx, 0) == TOP


# -- forced runs ------------------------------------------------------------------------------

def test_forced_tokens_are_taken_in_turn_and_the_flips_say_where_the_model_differed():
    rows = [logits(t1=2.0, t2=0.5), logits(t3=2.0, t4=1.123456), logits(t5=2.0), logits(t6=1.0)]
    s = Sampler(SamplingParams(temperature=0.0), FakeModel(), forced=[1, 4, 5])
    ctx = RowsCtx(rows)
    assert [s.sample(ctx, i) for i in range(4)] == [1, 4, 5, 6]   # then the model's own
    assert s.flips == [Flip(index=1, forced=4, own=3, margin=round(2.0 - np.float32(1.123456), 4))]
    assert s.flips[0].margin == 0.8765
    assert s._pos == 4


def test_a_forced_run_at_a_later_row_reads_that_row():
    rows = [logits(t1=2.0), logits(t2=2.0, t8=1.0)]
    s = Sampler(SamplingParams(temperature=0.0), FakeModel(), forced=[8])
    assert s.sample(RowsCtx(rows), 1) == 8
    assert s.flips == [Flip(0, 8, 2, 1.0)]


def test_forced_flips_under_sampling_have_no_margin(tiny):
    model, ctx = tiny
    scripted(ctx, logits(t7=5.0, t9=1.0))
    s = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=3), model, forced=[SECOND])
    assert s.sample(ctx, -1) == SECOND
    (flip,) = s.flips
    assert (flip.index, flip.forced, flip.own) == (0, SECOND, TOP) and math.isnan(flip.margin)
    s.close()


# -- the native sampler chain -------------------------------------------------------------------

def test_the_chain_is_llama_cpps_in_its_order(tiny):
    model, _ = tiny
    cases = [
        (SamplingParams(seed=1), None, ["top-k", "top-p", "min-p", "temp", "dist"]),
        (SamplingParams(seed=1), [3], ["logit-bias", "top-k", "top-p", "min-p", "temp", "dist"]),
        (SamplingParams(top_k=0, top_p=1.0, min_p=0.0, seed=1), None, ["temp", "dist"]),
        (SamplingParams(top_k=1, top_p=0.99, min_p=0.5, seed=1), None, ["top-k", "top-p", "min-p", "temp", "dist"]),
        (SamplingParams(top_k=0, top_p=0.5, min_p=0.0, seed=1), None, ["top-p", "temp", "dist"]),
        (SamplingParams(top_k=0, top_p=1.0, min_p=1.0, seed=1), None, ["min-p", "temp", "dist"]),
    ]
    for params, suppress, names in cases:
        s = Sampler(params, SuppressModel(model, suppress))
        assert chain_names(s) == names, (params, suppress)
        s.close()


def test_an_explicit_seed_reaches_the_distribution_and_repeats_the_draws(tiny):
    model, ctx = tiny
    scripted(ctx, logits(t1=1.0, t2=1.0, t3=1.0, t4=1.0, t5=1.0, t6=1.0))
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    s = Sampler(p, model)
    assert s.seed == 42 and lc.llama_sampler_get_seed(s._chain) == 42
    first = [s.sample(ctx, -1) for _ in range(12)]
    s.close()
    s = Sampler(p, model)
    assert [s.sample(ctx, -1) for _ in range(12)] == first
    s.close()
    assert len(set(first)) > 1               # six equal logits: the draws spread over them


def test_the_default_seed_picks_a_random_31_bit_seed(tiny):
    model, _ = tiny
    seeds = set()
    for _ in range(12):
        s = Sampler(SamplingParams(seed=DEFAULT_SEED), model)
        assert 0 <= s.seed < 2 ** 31
        assert lc.llama_sampler_get_seed(s._chain) == s.seed
        seeds.add(s.seed)
        s.close()
    assert len(seeds) > 2


def test_the_random_seed_comes_from_pythons_random(tiny, monkeypatch):
    """A process that seeds ``random`` gets repeatable replies under the default seed."""
    model, _ = tiny
    random.seed(7)
    a = Sampler(SamplingParams(seed=DEFAULT_SEED), model)
    random.seed(7)
    b = Sampler(SamplingParams(seed=DEFAULT_SEED), model)
    assert a.seed == b.seed
    a.close(), b.close()


def test_suppress_tokens_are_never_sampled(tiny):
    model, ctx = tiny
    scripted(ctx, logits(t7=5.0, t9=4.9, t3=1.0))
    # top-k 1 after the bias: the best token that is not suppressed, every time
    assert set(draws(model, ctx, SamplingParams(temperature=1.0, top_k=1), n=8, suppress=[TOP])) == {SECOND}
    assert set(draws(model, ctx, SamplingParams(temperature=1.0, top_k=1), n=8, suppress=[TOP, SECOND])) == {3}
    assert set(draws(model, ctx, SamplingParams(temperature=1.0, top_k=1), n=8)) == {TOP}


def test_top_p_and_min_p_keep_only_the_top_token_when_asked_to(tiny):
    """min_keep is 1, as llama.cpp's common sampler has it: a near-tie second token is dropped."""
    model, ctx = tiny
    scripted(ctx, logits(t7=10.0, t9=9.9))
    assert set(draws(model, ctx, SamplingParams(temperature=1.0, top_k=0, top_p=0.01, min_p=0.0))) == {TOP}
    assert set(draws(model, ctx, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=1.0))) == {TOP}
    # and without them both are drawn
    assert set(draws(model, ctx, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))) == {TOP, SECOND}


def test_temperature_sharpens_and_flattens(tiny):
    model, ctx = tiny
    scripted(ctx, logits(t7=1.0, t9=0.0))
    cold = draws(model, ctx, SamplingParams(temperature=0.05, top_k=2, top_p=1.0, min_p=0.0), n=40)
    hot = draws(model, ctx, SamplingParams(temperature=50.0, top_k=2, top_p=1.0, min_p=0.0), n=40)
    assert set(cold) == {TOP}
    assert 10 <= hot.count(SECOND) <= 30


def test_sampling_reads_the_row_asked_for(tiny):
    model, ctx = tiny
    ctx.clear()
    ctx.decode([1, 2], 0, logits="all")
    row0 = ctx.logits(0).copy()
    s = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=1), model)
    assert s.sample(ctx, 0) == int(np.argmax(row0))
    s.close()


# -- save / restore / drop, and freeing ----------------------------------------------------------

@pytest.fixture
def frees(monkeypatch):
    """Every ``llama_sampler_free`` call's argument (the real function still runs)."""
    seen = []
    real = sampling.lc.llama_sampler_free

    def free(ptr):
        seen.append(ptr)
        if ptr is not None:
            real(ptr)
    monkeypatch.setattr(sampling.lc, "llama_sampler_free", free)
    return seen


def test_restore_rewinds_the_random_state_the_position_and_the_flips(tiny, frees):
    model, ctx = tiny
    scripted(ctx, logits(t1=1.0, t2=1.0, t3=1.0, t4=1.0, t5=1.0, t6=1.0))
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11), model,
                forced=[99, 98, 97, 96, 95, 94, 93, 92])
    s.sample(ctx, -1)
    saved = s.save()
    assert saved[1:] == (1, 1)
    after = [s.sample(ctx, -1) for _ in range(5)]
    flips = list(s.flips)
    assert s._pos == 6 and len(flips) == 6
    old_chain = s._chain
    s.restore(saved)
    assert frees == [old_chain]               # the chain it replaces is freed
    assert s._pos == 1 and len(s.flips) == 1
    assert [s.sample(ctx, -1) for _ in range(5)] == after
    assert [(f.index, f.forced, f.own) for f in s.flips] == [(f.index, f.forced, f.own) for f in flips]
    s.close()


def test_restore_of_a_greedy_sampler_rewinds_position_and_flips(frees):
    ctx = RowsCtx([logits(t1=2.0)])
    s = Sampler(SamplingParams(temperature=0.0), FakeModel(), forced=[3, 3, 3])
    s.sample(ctx, 0)
    saved = s.save()
    assert saved == (None, 1, 1)
    s.sample(ctx, 0), s.sample(ctx, 0)
    s.restore(saved)
    assert (s._pos, len(s.flips), s._chain) == (1, 1, None)
    s.restore(None)                           # nothing saved: nothing changes
    assert (s._pos, len(s.flips)) == (1, 1)
    Sampler.drop(saved)
    Sampler.drop(None)
    assert frees == []


def test_drop_frees_the_copy_and_close_frees_the_chain_once(tiny, frees):
    model, _ = tiny
    s = Sampler(SamplingParams(seed=5), model)
    saved = s.save()
    assert saved[0] is not None and saved[0] != s._chain
    Sampler.drop(saved)
    assert frees == [saved[0]]
    chain = s._chain
    s.close()
    assert frees == [saved[0], chain] and s._chain is None
    s.close()
    assert frees == [saved[0], chain]
