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
