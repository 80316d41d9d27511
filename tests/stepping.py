"""A generation driven step by step: a callback after each step (the engine's cancel hook)."""

from __future__ import annotations

from typing import Callable

from speculators.events import FinishEvent


def generate_stepwise(engine, prompt, max_tokens: int, sampling, on_step: Callable[[int], None] | None = None):
    """``engine.generate`` to the end, calling ``on_step(n)`` before step n (1, 2, ...);
    returns the result."""
    steps = 0

    def cancel():
        nonlocal steps
        steps += 1
        if on_step is not None:
            on_step(steps)
        return False
    result = None
    for ev in engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, cancel=cancel):
        if isinstance(ev, FinishEvent):
            result = ev.result
    assert result is not None
    return result


class DraftRecorder:
    """Wraps ``drafter.draft`` and its context's ``logits``: ``drafts`` (each draft, by its
    ``pos0``) and ``first_logits`` (the first logits row read while drafting at each ``pos0``).
    ``check(req)``: called after each draft (for a test's own assertions)."""

    def __init__(self, drafter, check: Callable[[object], None] | None = None):
        import numpy as np
        self.drafts: dict[int, list[int]] = {}
        self.first_logits: dict = {}
        at: list[int | None] = [None]
        orig_draft, orig_logits = drafter.draft, drafter.ctx.logits

        def logits(i):
            out = orig_logits(i)
            if at[0] is not None and at[0] not in self.first_logits:
                self.first_logits[at[0]] = np.array(out, copy=True)
            return out

        def draft(req):
            at[0] = req.pos0
            out = list(orig_draft(req))
            self.drafts[req.pos0] = out
            if check is not None:
                check(req)
            return out
        drafter.draft, drafter.ctx.logits = draft, logits


def assert_same_drafts(a: DraftRecorder, b: DraftRecorder, tol: float = 2e-4) -> None:
    """The same drafts at the same positions, from first logits rows within ``tol``."""
    import numpy as np
    assert a.drafts == b.drafts
    assert sorted(a.first_logits) == sorted(b.first_logits) and len(a.first_logits) > 5
    worst = max(float(np.max(np.abs(a.first_logits[k] - b.first_logits[k]))) for k in a.first_logits)
    assert worst <= tol, worst


def resume_at(ctl, drafter, step: int) -> tuple[Callable[[int], None], list[int]]:
    """An ``on_step`` for :func:`generate_stepwise` under a controller that keeps ``drafter``
    paused, and the list it fills: 1 where the drafter was paused before a step, else 0. At
    ``step`` the one-token step turns slow, so any gain is worth it and the drafter resumes."""
    paused: list[int] = []

    def on_step(n: int) -> None:
        paused.append(0 if drafter.upkeep else 1)
        if n == step:
            ctl.cost.curve.t1_s = 10.0
            ctl.cost.version += 1
    return on_step, paused
