"""Running and measuring speculation configurations side by side: one implementation for
``draftlight bench`` and the chat's Lab.

Configurations run *interleaved*: every configuration once per round, round after round,
each run from a fresh chain, so that a busy machine's drifts spread over all of them
(:func:`interleave`); every other round runs them in reverse order, so that a drift within
a round does not always fall on the same configuration. Each configuration's fastest run
counts for its figures (:class:`Row`, folded by :func:`add_result`), and each round's runs,
back to back, also give a *paired* ratio to ``none``'s run of the same round, whose median
follows a drifting machine less than the ratio of two fastest runs does.

>>> calls = []
>>> def run_one(name, payload):
...     calls.append(name)
...     return {"none": 10.0, "mod": 20.0}[name] * (1 + len(calls) / 100), (name, len(calls))
>>> best, speeds = interleave([("none", None), ("mod", None)], 2, run_one)
>>> calls
['none', 'mod', 'mod', 'none']
>>> best["mod"], [round(x, 2) for x in speeds["mod"]]
(('mod', 3), [20.4, 20.6])
>>> [round(x, 3) for x in paired_ratios(speeds, "mod")]
[2.02, 1.981]
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from speculators.base import mean_acceptance_length


class Cancelled(Exception):
    """The run was stopped (the Lab's Cancel); nothing of it counts."""


def interleave(configs: Sequence[tuple[str, Any]], rounds: int,
               run_one: Callable[[str, Any], tuple[float, Any]],
               progress: Callable[[int, int, str], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Run every configuration once per round, ``rounds`` times, in turn (in reverse order
    every other round: ABBA, so that a steady drift of the machine's speed does not favour the
    configuration that runs first).

    ``run_one(name, payload)`` runs one and returns ``(tokens/s, record)``; the
    record of each configuration's fastest run is kept. Returns ``(best records,
    tokens/s of every round per configuration)``. ``cancel`` is asked before
    each run (:class:`Cancelled` when it says yes); ``progress(done, total,
    name)`` is told before each run.
    """
    rounds = max(1, rounds)
    best: dict[str, tuple[float, Any]] = {}
    speeds: dict[str, list[float]] = {name: [] for name, _ in configs}
    total = rounds * len(configs)
    done = 0
    for r in range(rounds):
        for name, payload in (configs if r % 2 == 0 else list(reversed(configs))):
            if cancel is not None and cancel():
                raise Cancelled()
            if progress is not None:
                progress(done, total, f"round {r + 1}/{rounds}: {name}")
            tps, record = run_one(name, payload)
            speeds[name].append(tps)
            if name not in best or tps > best[name][0]:
                best[name] = (tps, record)
            done += 1
    if progress is not None:
        progress(total, total, "done")
    return {k: v[1] for k, v in best.items()}, speeds


def paired_ratios(speeds: dict[str, list[float]], name: str, base: str = "none") -> list[float]:
    """Each round's tokens/s of ``name`` over ``base``'s in the same round."""
    return [a / b for a, b in zip(speeds.get(name, []), speeds.get(base, [])) if b > 0]


def paired_median(speeds: dict[str, list[float]], name: str, base: str = "none") -> float | None:
    r = paired_ratios(speeds, name, base)
    return statistics.median(r) if r else None


def gen_tps(stats) -> float:
    """A run's generation speed as bench reports it: from the first token on (prompt excluded)."""
    n = max(0, stats.n_generated - 1)
    return n / stats.t_gen_s if stats.t_gen_s else 0.0


@dataclass
class Row:
    name: str
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    #: verified drafts and their accepted tokens (llama.cpp's n_call_accept, n_acc_tokens)
    accept_calls: int = 0
    acc_tokens: int = 0
    draft_calls: int = 0
    draft_us: float = 0.0
    equal_to_none: bool | None = None
    mean_draft_len: float = 0.0
    ceiling_tps: float | None = None
    outputs: list[list[int]] = field(default_factory=list)
    per_speculator: dict = field(default_factory=dict)
    #: per prompt: tokens, seconds, tokens/s, speedup over none, drafts, the controller's decisions
    per_prompt: list[dict] = field(default_factory=list)
    #: the adaptive controller's decisions over all prompts (None: off)
    controller: object | None = None

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self, base_tps: float | None) -> dict:
        mal = mean_acceptance_length(self.acc_tokens, self.accept_calls)
        return {
            "name": self.name,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tps, 2),
            "speedup_vs_none": round(self.tps / base_tps, 3) if base_tps else None,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "mean_acceptance_length": round(mal, 3) if mal is not None else None,
            "draft_ms_per_call": round(self.draft_us / self.draft_calls / 1000, 4) if self.draft_calls else None,
            "mean_draft_len": round(self.mean_draft_len, 2),
            "ceiling_tokens_per_s": round(self.ceiling_tps, 2) if self.ceiling_tps else None,
            "fraction_of_ceiling": round(self.tps / self.ceiling_tps, 3) if self.ceiling_tps else None,
            "equal_to_none": self.equal_to_none,
            "speculators": self.per_speculator,
            "controller": self.controller.to_dict() if self.controller is not None else None,
            "per_prompt": self.per_prompt,
        }



def new_row(name: str, n_prompts: int) -> Row:
    row = Row(name)
    row.outputs = [[] for _ in range(n_prompts)]
    return row


def add_result(row: Row, res) -> dict:
    """Fold one prompt's best run into the row; returns its per-prompt figures."""
    s = res.stats
    n = max(0, s.n_generated - 1)
    row.tokens += n
    row.seconds += s.t_gen_s
    row.drafted += s.n_drafted
    row.accepted += s.n_accepted
    row.steps += s.n_steps
    for name, st in s.speculators.items():
        d = row.per_speculator.setdefault(name, {"drafts": 0, "drafted": 0, "accepted": 0, "calls": 0,
                                                 "draft_us": 0.0, "process_us": 0.0})
        d["process_us"] += st.t_process_us
        d["drafts"] += st.n_gen_drafts
        d["drafted"] += st.n_gen_tokens
        d["accepted"] += st.n_acc_tokens
        d["calls"] += st.n_call_draft
        d["draft_us"] += st.t_draft_us
        row.draft_calls += st.n_call_draft
        row.draft_us += st.t_draft_us
        row.accept_calls += st.n_call_accept
        row.acc_tokens += st.n_acc_tokens
    if s.controller is not None:
        row.controller = s.controller if row.controller is None else row.controller + s.controller
    c = s.controller
    return {"tokens": n, "seconds": round(s.t_gen_s, 4), "tokens_per_s": round(n / s.t_gen_s, 2) if s.t_gen_s else 0.0,
            "drafted": s.n_drafted, "accepted": s.n_accepted, "steps": s.n_steps,
            "controller": {"steps": c.n_steps, "drafted": c.n_drafted, "skipped": c.n_skipped, "cut": c.n_cut,
                           "no_proposal": c.n_no_proposal, "not_asked": c.n_not_asked, "probes": c.n_probes}
            if c is not None else None}


def finish_row(row: Row) -> None:
    row.per_speculator = {
        n: {**d, "draft_ms_per_call": round(d["draft_us"] / d["calls"] / 1000, 4) if d["calls"] else None,
            "draft_ms_per_token": round(d["draft_us"] / d["drafted"] / 1000, 4) if d["drafted"] else None,
            # the drafter's whole cost per drafted token: drafting plus mirroring the target's batches
            "cost_ms_per_drafted_token": round((d["draft_us"] + d["process_us"]) / d["drafted"] / 1000, 4)
            if d["drafted"] else None}
        for n, d in row.per_speculator.items()}
    drafts = sum(d["drafts"] for d in row.per_speculator.values())
    row.mean_draft_len = row.drafted / drafts if drafts else 0.0
