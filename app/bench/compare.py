"""``bench``'s comparison: every row on the same prompts, interleaved prompt by prompt and round
by round, each run from a fresh chain; the fastest run of each counts, and each round's runs
(back to back) give a paired ratio to none's run of the same round, whose median follows a busy
machine's drifts less than the ratio of two fastest runs does.

Rows: llama-cpp-python's own generation (the reference, where one is given), ``none`` through
draftlight's loop, then one per ``--spec-type``. With ``same_text`` every draftlight row writes
none's reply (teacher-forced) and the flips of each forced run are kept.
"""

from __future__ import annotations

import statistics
import sys

from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from ..measure import Row, add_result, finish_row, interleave, new_row, paired_ratios
from ..runtime import auto_warnings
from .reference import REFERENCE, llama_cpp_python_once
from .report import flips_of, progress
from .runs import measure_ceiling, one, round_counts


def prepare_rows(engine, row_specs: list[tuple[str, SpecParams]], report: dict) -> None:
    """Build every row's chain once before any timing: type errors surface first, the types a
    row turns off and auto's warnings are printed, and auto's plan and verify-cost curve (measured
    or read from the cache here) go into ``report``."""
    for name, sp in row_specs:
        engine.set_spec(sp)
        for skipped, why in engine.chain.skipped.items():
            print(f"draftlight: warning: {name}: {skipped} is off: {why}", file=sys.stderr)
        for warning in auto_warnings(sp, engine.auto_plan):
            print(f"draftlight: warning: {name}: {warning}", file=sys.stderr)
        if engine.auto_plan:
            report.setdefault("auto_plan", {})[name] = [list(c) for c in engine.auto_plan]
        if engine.cost_curve is not None:
            report["cost_curve"] = {"source": engine.cost_curve.source,
                                    "rel": engine.cost_curve.to_list(16),
                                    "measure_s": round(engine.cost_curve.measure_s, 3)}


class Comparison:
    """The rows' runs on a list of prompts: :meth:`measure_prompt` for each prompt in turn, then
    :meth:`finish` for the rows (the reference's first, then none's, then the ``row_specs``)."""

    def __init__(self, engine, llm, row_specs: list[tuple[str, SpecParams]], n_prompts: int,
                 max_tokens: int, stop, rounds: int, same_text: bool):
        self.engine, self.llm = engine, llm
        self.n_prompts, self.max_tokens, self.stop = n_prompts, max_tokens, stop
        self.rounds, self.same_text = rounds, same_text
        self.greedy = SamplingParams(temperature=0.0)
        self.configs: list[tuple[str, SpecParams | None]] = [(REFERENCE, None)] if llm is not None else []
        self.configs.append(("none", SpecParams()))
        self.configs.extend(row_specs)
        self.rows: dict[str, Row] = {name: new_row(name, n_prompts) for name, _ in self.configs}
        self.per_prompt: dict[str, list[dict]] = {name: [] for name, _ in self.configs}
        #: per row and prompt: each round's speed over none's in the same round
        self.paired: dict[str, list[list[float]]] = {name: [] for name, _ in self.configs}
        #: none's reply to the prompt at hand, which every row writes (``same_text``; else None)
        self.forced: list[int] | None = None
        self.flip_log: dict[str, list] = {}   # per row: each forced run's flips, for the prompt at hand
        self.round_work: dict[str, list[list]] = {}   # per row: each round's work (round_counts), the same

    def run_one(self, name: str, sp: SpecParams | None, prompt: list[int]) -> tuple[float, object]:
        """One run of row ``name`` (``sp`` None: the reference) on ``prompt``: (tokens/s, result)."""
        if sp is None:
            t, out, n_gen = llama_cpp_python_once(self.llm, prompt, self.max_tokens, self.stop)
            return (max(0, n_gen - 1) / t if t else 0.0), (t, out, n_gen)
        self.engine.set_spec(sp)
        res = self.engine.run(prompt, max_tokens=self.max_tokens, sampling=self.greedy, stop=self.stop,
                              forced=self.forced)
        if self.forced is not None:
            self.flip_log.setdefault(name, []).append(res.stats.forced_flips)
        self.round_work.setdefault(name, []).append(round_counts(res.stats))
        return one(res)

    def measure_prompt(self, pi: int, prompt: list[int]) -> None:
        """Every row on prompt ``pi``, round after round; the fastest run of each is recorded."""
        where = f"prompt {pi + 1}/{self.n_prompts}"
        self.round_work.clear()
        if self.same_text:
            # none's own reply, which every row then writes
            progress(f"{where}, none's text")
            self.engine.set_spec(SpecParams())
            # what it wrote through its end (the end-of-turn token, or the stop string's tokens):
            # forced to that too, every row ends its reply where none's ended
            self.forced = list(self.engine.run(prompt, max_tokens=self.max_tokens, sampling=self.greedy,
                                               stop=self.stop).written)
            self.flip_log.clear()
        best, per_round = interleave(
            self.configs, self.rounds, lambda name, sp: self.run_one(name, sp, prompt),
            progress=lambda done, total, what: progress(f"{where}, {what}"))
        for name, _ in self.configs:
            self.paired[name].append(paired_ratios(per_round, name))
        for name, sp in self.configs:
            if sp is None:
                self._record_reference(pi, name, best[name])
            else:
                self._record(pi, name, best[name], per_round[name])

    def _record_reference(self, pi: int, name: str, best: tuple) -> None:
        t, out, n_gen = best
        n = max(0, n_gen - 1)
        row = self.rows[name]
        row.seconds += t
        row.tokens += n
        row.outputs[pi] = out
        self.per_prompt[name].append({"tokens": n, "seconds": round(t, 4),
                                      "tokens_per_s": round(n / t, 2) if t else 0.0})

    def _record(self, pi: int, name: str, res, rounds_tps: list[float]) -> None:
        row = self.rows[name]
        row.outputs[pi] = res.tokens
        d = add_result(row, res)
        self.per_prompt[name].append(d)
        # every round's speed, so that any two rows can be paired round by round (auto
        # against a fixed type, not only against none)
        d["rounds_tokens_per_s"] = [round(x, 2) for x in rounds_tps]
        # and what each round did: a round slower than its row's others either did other
        # work (drafted, verified or asked its drafters for more) or the machine was slower
        d["rounds_work"] = self.round_work.get(name, [])
        if self.same_text:
            d["flips"] = flips_of(self.flip_log.get(name, []))

    def finish(self, ceiling_prompt: list[int]) -> list[Row]:
        """The rows, finished: per prompt their speedup over none (fastest runs, and the median of
        the paired rounds) and whether they wrote none's text; each drafting row's ceiling measured
        on ``ceiling_prompt``."""
        none_row = self.rows["none"]
        for name, _ in self.configs:
            row = self.rows[name]
            finish_row(row)
            for pi, d in enumerate(self.per_prompt[name]):
                self._compare_to_none(name, pi, d, row, none_row)
            row.per_prompt = self.per_prompt[name]
            if name not in ("none", REFERENCE):
                row.equal_to_none = all(d["equal_to_none"] for d in row.per_prompt)
                if row.mean_draft_len >= 1:
                    row.ceiling_tps = measure_ceiling(self.engine, ceiling_prompt, round(row.mean_draft_len))
        if REFERENCE in self.rows:
            ref = self.rows[REFERENCE]
            ref.equal_to_none = all(d.get("equal_to_none") for d in ref.per_prompt)
        return [self.rows[name] for name, _ in self.configs]

    def _compare_to_none(self, name: str, pi: int, d: dict, row: Row, none_row: Row) -> None:
        base = self.per_prompt["none"][pi]["tokens_per_s"]
        paired = self.paired[name][pi]
        d["index"] = pi
        d["speedup_vs_none"] = round(d["tokens_per_s"] / base, 3) if base else None
        d["speedup_vs_none_paired"] = round(statistics.median(paired), 3) if paired else None
        if name == REFERENCE:
            d["equal_to_none"] = row.outputs[pi] == none_row.outputs[pi]
        elif name != "none":
            # forced, every output is none's: what counts is whether the model's own
            # picks were none's at every position
            d["equal_to_none"] = not d["flips"] if self.same_text else row.outputs[pi] == none_row.outputs[pi]
