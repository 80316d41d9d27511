"""A scripted stand-in for :class:`speculators.engine.Engine`, for the UI benchmark and tests.

It yields the same event types as the real engine, from a script of steps,
at a chosen pace. Each step is ``(drafter, [token texts])``: with a drafter,
every token but the last is a draft token it proposed and the model accepted
(draft positions 0, 1, ...), the last one the model's own, as in a real
verify step.

>>> eng = ScriptedEngine([(None, ["Hi"]), ("ngram-mod", [" there", ",", " friend"])])
>>> evs = list(eng.generate(eng.prompt_tokens(messages=[{"role": "user", "content": "x"}])))
>>> [(t.text, t.drafted_by, t.draft_pos) for e in evs if hasattr(e, "tokens") for t in e.tokens]
[('Hi', None, None), (' there', 'ngram-mod', 0), (',', 'ngram-mod', 1), (' friend', None, None)]
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from speculators.base import SpeculatorStats
from speculators.engine import EngineConfig, GenerationError
from speculators.events import (STOP_CANCELLED, STOP_EOG, STOP_LENGTH, FinishEvent, GenerationResult,
                                GenerationStats, StatsEvent, StepEvent, TokenEvent)
from speculators.params import SpecParams

Step = tuple[str | None, Sequence[str]]


def demo_script(n_tokens: int, drafters: Sequence[str] = ("ngram-mod", "ngram-simple")) -> list[Step]:
    """About ``n_tokens`` tokens: plain steps mixed with accepted drafts of varying length."""
    words = ("the cache keeps every n-gram it has seen so that a repeated phrase can be drafted "
             "ahead and checked in one batch ").split()
    steps: list[Step] = []
    n = 0
    i = 0
    k = 0
    while n < n_tokens:
        if k % 3 == 2:
            length = min(2 + k % 6, n_tokens - n)
            toks = [" " + words[(i + j) % len(words)] for j in range(length)]
            steps.append((drafters[k % len(drafters)] if length > 1 else None, toks))
            n += length
            i += length
        else:
            steps.append((None, [" " + words[i % len(words)]]))
            n += 1
            i += 1
        k += 1
    return steps


@dataclass
class _Model:
    path: str = "scripted.gguf"

    def description(self) -> str:
        return "scripted test model"


@dataclass
class _Spec:
    type_name: str
    stats: SpeculatorStats = field(default_factory=SpeculatorStats)

    @property
    def name(self) -> str:
        return self.type_name


class _Chain:
    def __init__(self, types: Sequence[str], skipped: dict[str, str]):
        self.speculators = [_Spec(t) for t in types]
        self.skipped = dict(skipped)

    def stats(self) -> dict[str, SpeculatorStats]:
        return {s.name: s.stats.copy() for s in self.speculators}

    def close(self) -> None:
        pass


class ScriptedEngine:
    """Yields scripted events; ``tokens_per_s`` paces them (None: as fast as possible).

    ``unavailable`` maps a type to the reason it cannot be built: asking for
    it lands it in ``chain.skipped``, as the real chain does. ``gate``, when
    given, is waited on before each step after the first (to hold a reply
    mid-stream in tests).
    """

    def __init__(self, script: Sequence[Step] | Callable[[list[dict]], Sequence[Step]] | None = None,
                 tokens_per_s: float | None = None, *, model_path: str = "scripted.gguf",
                 unavailable: dict[str, str] | None = None, gate: threading.Event | None = None,
                 fail: str | None = None, fixed_time_s: float | None = None):
        self.script = script if script is not None else demo_script(40)
        self.tokens_per_s = tokens_per_s
        self.model = _Model(model_path)
        self.config = EngineConfig()
        self.unavailable = dict(unavailable or {})
        self.spec = SpecParams()
        self.chain = _Chain([], {})
        self.gate = gate
        self.fail = fail
        #: report this generation time (deterministic statistics for snapshots)
        self.fixed_time_s = fixed_time_s
        self.requests: list[list[dict]] = []
        self.set_spec_calls = 0
        self.closed = False

    def set_spec(self, params: SpecParams, resources: dict | None = None) -> _Chain:
        params.validate()
        if params.is_auto:
            # as the real chain: Automatic picks what this model can use (here: the n-gram types)
            from speculators.auto import auto_plan
            types = [c.name for c in auto_plan(params, None) if c.used]
        else:
            types = [t.value for t in params.types]
        ok = [t for t in types if t not in self.unavailable]
        skipped = {t: self.unavailable[t] for t in types if t in self.unavailable}
        self.chain = _Chain(ok, skipped)
        self.spec = params
        self.set_spec_calls += 1
        return self.chain

    def prompt_tokens(self, messages=None, text=None, raw=False) -> list[int]:
        messages = list(messages or [{"role": "user", "content": text or ""}])
        self.requests.append(messages)
        return [1] * max(1, sum(len(m["content"]) for m in messages) // 4)

    def generate(self, prompt, max_tokens: int = 512, sampling=None, stop=(), cancel=None,
                 stats_interval_s: float = 0.25, context_shift: bool = False, n_keep: int = 0) -> Iterator:
        if self.fail:
            raise GenerationError(self.fail)
        script = self.script(self.requests[-1] if self.requests else []) if callable(self.script) else self.script
        stats = GenerationStats(n_prompt=len(prompt))
        spec_stats: dict[str, SpeculatorStats] = {}
        out_ids: list[int] = []
        out_by: list[str | None] = []
        out_pos: list[int | None] = []
        text: list[str] = []
        t0 = time.perf_counter()
        last_stats = t0
        finish = STOP_EOG
        for n_step, (by, toks) in enumerate(script):
            if cancel is not None and cancel():
                finish = STOP_CANCELLED
                break
            if self.gate is not None and n_step > 0:
                while not self.gate.wait(0.01):
                    if cancel is not None and cancel():
                        break
                if cancel is not None and cancel():
                    finish = STOP_CANCELLED
                    break
            toks = list(toks)[: max_tokens - len(out_ids)]
            if self.tokens_per_s:
                due = t0 + (len(out_ids) + len(toks)) / self.tokens_per_s
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            evs = []
            n_draft = len(toks) - 1 if by else 0
            for i, piece in enumerate(toks):
                drafted = by is not None and i < n_draft
                ev = TokenEvent(len(out_ids), 1000 + len(out_ids), piece, by if drafted else None,
                                i if drafted else None)
                out_ids.append(ev.id)
                out_by.append(ev.drafted_by)
                out_pos.append(ev.draft_pos)
                text.append(piece)
                evs.append(ev)
            if by:
                s = spec_stats.setdefault(by, SpeculatorStats(n_call_begin=1))
                s.n_call_draft += 1
                s.n_call_accept += 1
                s.n_gen_drafts += 1
                s.n_gen_tokens += n_draft
                s.n_acc_tokens += n_draft
                s.n_acc_drafts += 1 if n_draft else 0
                s.n_acc_tokens_per_pos.extend([0] * (n_draft - len(s.n_acc_tokens_per_pos)))
                for i in range(n_draft):
                    s.n_acc_tokens_per_pos[i] += 1
                stats.n_drafted += n_draft
                stats.n_accepted += n_draft
            stats.n_steps += 1
            stats.n_generated = len(out_ids)
            yield StepEvent(evs, by, n_draft, n_draft)
            now = time.perf_counter()
            if now - last_stats >= stats_interval_s:
                last_stats = now
                stats.t_gen_s = now - t0
                stats.speculators = {k: v.copy() for k, v in spec_stats.items()}
                yield StatsEvent(stats)
            if len(out_ids) >= max_tokens:
                finish = STOP_LENGTH
                break
        stats.t_gen_s = self.fixed_time_s or max(1e-6, time.perf_counter() - t0)
        stats.n_generated = len(out_ids)
        stats.speculators = {k: v.copy() for k, v in spec_stats.items()}
        for name, s in spec_stats.items():
            for sp in self.chain.speculators:
                if sp.name == name:
                    sp.stats = s.copy()
        yield StatsEvent(stats)
        yield FinishEvent(GenerationResult("".join(text), out_ids, out_by, out_pos, finish, stats,
                                           "stopped" if finish == STOP_CANCELLED else ""))

    def close(self) -> None:
        self.closed = True
