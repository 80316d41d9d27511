"""Automatic on copies: a copy that is evidently one is drafted whole, as a fixed lookup type
drafts it; a miss ends that; ordinary text costs no verify.

The drafters are the real ones of ``auto``'s chain (and of the fixed ``ngram-simple``), over
scripted token streams: a target that writes a passage of its prompt again.
"""
from __future__ import annotations

import random

from speculators.base import DraftRequest
from speculators.chain import SpeculatorChain
from speculators.controller import Controller, ControllerParams
from speculators.costcurve import CostCurve
from speculators.params import SpecParams


def cpu_like():
    """The verify-cost curve of the default model on a 2-core CPU (steep: cutting is tempting)."""
    return CostCurve({0: 1.0, 1: 1.8, 2: 2.1, 4: 3.1, 8: 4.3, 16: 6.7, 32: 11.2, 48: 16.0, 64: 21.0})


def words(rng, n, lo=1000, hi=30000):
    return [rng.randrange(lo, hi) for _ in range(n)]


def auto_controller():
    chain = SpeculatorChain.from_params(SpecParams.auto())
    return Controller(chain, cpu_like(), ControllerParams(online_cost=False), clock=lambda: 0.0)


def write(ctl, prompt, reply, n_max=64):
    """The target writes ``reply`` after ``prompt``: each step's draft is verified against it.
    Returns (decision, tokens written that step) per step."""
    ctl.begin()
    ctl.prepare(prompt[:-1])
    ctx, log = list(prompt), []
    i = 0
    while i < len(reply):
        room = min(n_max, len(reply) - i - 1)
        d = ctl.decide(DraftRequest(prompt=ctx[:-1], id_last=ctx[-1], pos0=len(ctx) - 1, n_max=max(0, room)))
        n_acc = 0
        for t in d.draft:
            if i + n_acc >= len(reply) - 1 or t != reply[i + n_acc]:
                break
            n_acc += 1
        ids = reply[i:i + n_acc + 1]
        ctl.observe(d, ids)
        if d.draft:
            ctl.chain.accept(n_acc)
        log.append((d, ids))
        ctx += ids
        i += len(ids)
    return log


def fixed_draft(prompt_ctx, n_max=64):
    """What the fixed ngram-simple type drafts after ``prompt_ctx`` (its own chain, as the engine
    asks it)."""
    chain = SpeculatorChain.from_params(SpecParams.from_types("ngram-simple"))
    chain.begin(prompt_ctx[:-1])
    return chain.draft(DraftRequest(prompt=prompt_ctx[:-1], id_last=prompt_ctx[-1], pos0=len(prompt_ctx) - 1,
                                    n_max=n_max))


def copy_case(seed=3, n_passage=160):
    rng = random.Random(seed)
    passage = words(rng, n_passage)
    prompt = words(rng, 40) + passage + words(rng, 6)
    return prompt, passage


def test_an_evident_copy_is_drafted_whole_from_the_first_step_that_shows_it():
    prompt, passage = copy_case()
    ctl = auto_controller()
    log = write(ctl, prompt, passage)
    ctx, whole, first = list(prompt), [], None
    for d, ids in log:
        # from the step where the reply has copied enough of the passage to show it
        if d.draft and d.reason != "probe" and len(ctx) - len(prompt) >= ctl.params.copy_match - 1:
            # every verified draft is the drafter's whole proposal: nothing cut
            whole.append(len(d.draft) == d.n_proposed)
            if first is None:
                first = len(d.draft), len(ctx) - len(prompt)
        ctx += ids
    assert whole and all(whole), [(d.reason, len(d.draft), d.n_proposed) for d, _ in log]
    # as long as the fixed type's first draft in the copy, and no later in it
    n_auto, at = first
    fixed_at = next(i for i in range(len(passage)) if fixed_draft(prompt + passage[:i]))
    n_fixed = len(fixed_draft(prompt + passage[:fixed_at]))
    assert n_auto >= n_fixed and at <= fixed_at, (n_auto, at, n_fixed, fixed_at)
    # the copy takes a few verifies, not one per few tokens
    assert len(log) <= 12, [len(d.draft) for d, _ in log]


def test_the_steps_before_the_copy_is_evident_are_not_verified_whole():
    # the first tokens of the copy: a lookup's match is short, so its proposal is not taken
    # whole on that alone (a chance match in ordinary text is 4-5 tokens)
    prompt, passage = copy_case(seed=5)
    ctl = auto_controller()
    log = write(ctl, prompt, passage[:3])
    assert all(len(d.draft) <= 3 for d, _ in log), [len(d.draft) for d, _ in log]


def test_a_miss_ends_the_whole_drafts():
    # the reply copies the passage with one token changed (an edit): the draft that reaches the
    # edit stops there, and the steps right after it do not verify long drafts on the broken
    # match, until the copy is evident again
    prompt, passage = copy_case(seed=7)
    edited = list(passage)
    edited[80] = 7
    log = write(auto_controller(), prompt, edited)
    pos, after = 0, []
    for d, ids in log:
        if pos > 80 and pos <= 84:
            after.append(len(d.draft))
        pos += len(ids)
    assert after and all(n <= 4 for n in after), after
    # and it found the copy again afterwards: drafts long before the end
    assert max(len(d.draft) for d, _ in log[-3:]) >= 8, [len(d.draft) for d, _ in log]


def test_ordinary_text_is_not_drafted():
    rng = random.Random(11)
    prompt = words(rng, 120)
    reply = words(rng, 200)
    ctl = auto_controller()
    log = write(ctl, prompt, reply)
    assert ctl.stats.n_drafted == 0, [(d.reason, len(d.draft)) for d, _ in log if d.draft]
