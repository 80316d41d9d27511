"""One timed run of the engine and what it did, for ``bench``: its generation speed (prompt
decoding excluded), its work (drafted, accepted, steps, time in drafters), a whole row of runs,
and the ceiling (the speed of one batched verify at full acceptance for a draft length)."""

from __future__ import annotations

import time

from speculators.sampling import SamplingParams

from ..measure import Row, add_result, finish_row, gen_tps, interleave, new_row


def one(res) -> tuple[float, object]:
    """(tokens/s of generation, the result) of one engine run, as :func:`app.measure.interleave` wants."""
    return gen_tps(res.stats), res


def timed_generation(engine, prompts, max_tokens, rounds: int = 1, stop=()) -> Row:
    """Run every prompt; time only token generation (prompt decoding excluded).

    With ``rounds`` > 1 each prompt runs that many times and the fastest
    run counts, which keeps a busy machine's stalls out of the figures.
    """
    row = new_row(engine.chain.speculators and ",".join(s.name for s in engine.chain.speculators) or "none",
                  len(prompts))
    greedy = SamplingParams(temperature=0.0)
    for pi, prompt in enumerate(prompts):
        best, _ = interleave([(row.name, None)], rounds,
                             lambda _n, _p: one(engine.run(prompt, max_tokens=max_tokens, sampling=greedy, stop=stop)))
        row.outputs[pi] = best[row.name].tokens
        add_result(row, best[row.name])
    finish_row(row)
    return row


def round_counts(stats) -> list:
    """One run's work, for the JSON report: [drafted, accepted, steps, ms spent in drafters
    (drafting and their per-batch upkeep)].

        >>> from speculators.events import GenerationStats
        >>> st = GenerationStats(n_drafted=12, n_accepted=9, n_steps=20)
        >>> round_counts(st)
        [12, 9, 20, 0.0]
    """
    us = sum(s.t_draft_us + s.t_process_us for s in stats.speculators.values())
    return [stats.n_drafted, stats.n_accepted, stats.n_steps, round(us / 1000, 2)]


def measure_ceiling(engine, prompt: list[int], draft_len: int, reps: int = 8) -> float:
    """Tokens/s if every draft of ``draft_len`` tokens were accepted.

    Decodes batches of ``draft_len + 1`` tokens after the prompt and samples
    every row, as a verify step does (the fastest of ``reps`` batches).
    """
    import numpy as np
    ctx = engine.ctx
    engine.prefill(prompt)      # (a prompt state the engine kept is restored)
    n = draft_len + 1
    pos = len(prompt)
    if pos + n * reps >= ctx.n_ctx:
        reps = max(1, (ctx.n_ctx - pos - 1) // n)
    batch = [int(np.argmax(ctx.logits(-1)))] * n
    best = float("inf")
    for r in range(reps):
        t0 = time.perf_counter()
        ctx.decode(batch, pos + r * n, logits="all")
        for i in range(n):
            int(np.argmax(ctx.logits(i)))
        best = min(best, time.perf_counter() - t0)
    ctx.clear()
    engine.kv_tokens = []
    return n / best if best > 0 else 0.0
