"""The Lab: which speculation pays on *this* model, machine and prompt (no Textual here).

It runs configurations (``none``, ``auto``, each type the model can use, variants of
their parameters) interleaved in rounds on the engine the chat already has loaded, with
:func:`app.measure.interleave` and the figures of :class:`app.measure.Row` (the same
code as ``draftlight bench``), and returns a :class:`LabReport`: per configuration its
tokens/s (fastest run and the paired median ratio to ``none``), drafted and accepted
tokens, acceptance, mean acceptance length, time to first token, the fraction of the
verify ceiling, acceptance by draft position and its output; plus the model's verify-cost
curve. Reports are kept in SQLite (:mod:`app.storage`) and export to Markdown, JSON and CSV.

The verify ceiling of a configuration is what it would reach if every draft were
accepted: with drafts of mean length ``L``, a step emits ``L + 1`` tokens and costs
``rel(L)`` one-token decodes (the measured verify-cost curve), so the ceiling is
``none's tokens/s * (L + 1) / rel(L)``.

>>> r = LabResult("ngram-mod", {}, {"tokens_per_s": 30.0, "mean_draft_len": 3.0}, "", [], [], [])
>>> round(ceiling_tps(r, none_tps=20.0, rel=[1.0, 1.1, 1.2, 1.5]), 2)
53.33
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import PRIORITY

from .measure import Cancelled, add_result, finish_row, gen_tps, interleave, new_row, paired_median

__all__ = ["LabConfig", "LabResult", "LabReport", "Cancelled", "presets", "run_lab", "first_divergence",
           "COLUMNS"]


@dataclass
class LabConfig:
    name: str
    spec: SpecParams

    @staticmethod
    def of(name: str, types: str, **params: Any) -> "LabConfig":
        """``LabConfig.of("ngram-mod n_max 16", "ngram-mod", **{"ngram_mod.n_max": 16})``."""
        sp = SpecParams.from_types(types) if types != "none" else SpecParams()
        for dotted, v in params.items():
            section, key = dotted.split(".")
            setattr(getattr(sp, section), key, v)
        sp.validate()
        return LabConfig(name, sp)


def presets(usable: Sequence[str], base: SpecParams | None = None) -> dict[str, list[LabConfig]]:
    """Ready-made sets of configurations for a model whose usable types are ``usable``.

    >>> sorted(presets(["ngram-simple", "ngram-mod"]))
    ['Draft lengths', 'Every type', 'N-gram sizes', 'Quick']
    >>> [c.name for c in presets(["ngram-simple", "ngram-mod"])["Quick"]]
    ['none', 'auto', 'ngram-mod', 'ngram-simple']
    """
    def with_base(c: LabConfig) -> LabConfig:
        if base is not None and c.spec.types and not c.spec.is_auto:
            # the person's own drafter settings (draft model, caches) carry over
            sp = base.copy()
            sp.types = c.spec.types
            for section in ("ngram_simple", "ngram_map_k", "ngram_map_k4v", "ngram_mod", "draft"):
                mine, theirs = getattr(c.spec, section), getattr(SpecParams(), section)
                for f in asdict(mine):
                    if getattr(mine, f) != getattr(theirs, f):
                        setattr(getattr(sp, section), f, getattr(mine, f))
            sp.adaptive = c.spec.adaptive
            return LabConfig(c.name, sp)
        return c

    ordered = [t.value for t in PRIORITY if t.value in usable]
    base_rows = [LabConfig("none", SpecParams()), LabConfig("auto", SpecParams.auto())]
    quick = base_rows + [LabConfig.of(t, t) for t in ("ngram-mod", "ngram-simple", "draft-simple", "draft-mtp")
                         if t in usable]
    every = base_rows + [LabConfig.of(t, t) for t in ordered]
    lengths = list(base_rows)
    if "ngram-mod" in usable:
        lengths += [LabConfig.of(f"ngram-mod max {n}", "ngram-mod", **{"ngram_mod.n_max": n,
                                                                        "ngram_mod.n_min": min(48, n)})
                    for n in (16, 32, 64)]
    for t in ("draft-simple", "draft-mtp", "draft-eagle3"):
        if t in usable:
            lengths += [LabConfig.of(f"{t} n_max {n}", t, **{"draft.n_max": n}) for n in (2, 4, 8)]
    sizes = list(base_rows)
    if "ngram-simple" in usable:
        sizes += [LabConfig.of(f"ngram-simple n {n}", "ngram-simple", **{"ngram_simple.size_n": n})
                  for n in (4, 8, 12)]
    if "ngram-mod" in usable:
        sizes += [LabConfig.of(f"ngram-mod match {n}", "ngram-mod", **{"ngram_mod.n_match": n}) for n in (8, 16, 24)]
    return {name: [with_base(c) for c in cs] for name, cs in
            (("Quick", quick), ("Every type", every), ("Draft lengths", lengths), ("N-gram sizes", sizes))}


@dataclass
class LabResult:
    name: str
    spec: dict
    #: :meth:`app.measure.Row.to_dict` of the fastest run, plus the Lab's own figures
    figures: dict
    text: str
    tokens: list[int]
    drafted_by: list[str | None]
    draft_pos: list[int | None]
    #: acceptance rate at draft positions 1, 2, ... (accepted at that position / verified drafts)
    acceptance_by_pos: list[float] = field(default_factory=list)
    #: the text each token adds (to colour the output as the chat does)
    pieces: list[str] = field(default_factory=list)

    def token_events(self) -> list:
        """The output as the chat's token events (text, id, drafter, draft position)."""
        from speculators.events import TokenEvent
        return [TokenEvent(i, tid, piece, by, pos) for i, (tid, piece, by, pos) in
                enumerate(zip(self.tokens, self.pieces, self.drafted_by, self.draft_pos))]


#: (key, heading) of the results table, in order; ``None`` values show as "-"
COLUMNS: list[tuple[str, str]] = [
    ("name", "configuration"), ("tokens_per_s", "tok/s"), ("speedup_vs_none", "× none"),
    ("paired_vs_none", "paired ×"), ("drafted", "drafted"), ("accepted", "accepted"),
    ("acceptance_rate", "acceptance"), ("mean_acceptance_length", "mean acc len"), ("ttft_ms", "1st token ms"),
    ("fraction_of_ceiling", "of ceiling"), ("same_as_none", "same text"),
]


@dataclass
class LabReport:
    prompt: str
    model: str
    rounds: int
    max_tokens: int
    results: list[LabResult]
    #: the verify-cost curve: rel[k] = the cost of verifying k drafts (k + 1 tokens) over one decode
    cost_curve: list[float] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    #: the weights are quantized (a divergence from none's text is then a near-tie, not a bug)
    quantized: bool = True
    id: int | None = None

    def result(self, name: str) -> LabResult:
        return next(r for r in self.results if r.name == name)

    def value(self, r: LabResult, key: str) -> Any:
        return r.name if key == "name" else r.figures.get(key)

    def rows(self, sort_by: str | None = None, reverse: bool = True) -> list[LabResult]:
        if sort_by is None:
            return list(self.results)
        def k(r: LabResult):
            v = self.value(r, sort_by)
            return (v is not None, v if v is not None else 0)
        return sorted(self.results, key=k, reverse=reverse)

    def fastest(self) -> LabResult:
        return max(self.results, key=lambda r: r.figures.get("tokens_per_s") or 0.0)

    def unsteady(self, tolerance: float = 1.25) -> list[str]:
        """Configurations whose two ratios to ``none`` (of the fastest runs, and the median of each
        round's paired ratio) disagree by more than ``tolerance`` times: the machine's speed changed
        during the run (other programs), and its figures should not be trusted without more rounds.

        >>> def res(name, fastest, paired):
        ...     return LabResult(name, {}, {"speedup_vs_none": fastest, "paired_vs_none": paired}, "", [], [], [])
        >>> r = LabReport("p", "m", 2, 8, [res("none", 1.0, 1.0), res("a", 1.03, 16.3), res("b", 1.9, 1.8)])
        >>> r.unsteady()
        ['a']
        """
        out = []
        for r in self.results:
            a, b = r.figures.get("speedup_vs_none"), r.figures.get("paired_vs_none")
            if a and b and max(a / b, b / a) > tolerance:
                out.append(r.name)
        return out

    # -- export -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "model": self.model, "rounds": self.rounds, "max_tokens": self.max_tokens,
                "created": self.created, "quantized": self.quantized, "cost_curve": self.cost_curve,
                "results": [asdict(r) for r in self.results]}

    @classmethod
    def from_dict(cls, d: dict, id: int | None = None) -> "LabReport":
        results = [LabResult(**r) for r in d.get("results", [])]
        return cls(d["prompt"], d["model"], int(d["rounds"]), int(d["max_tokens"]), results,
                   list(d.get("cost_curve") or []), float(d.get("created") or 0.0), bool(d.get("quantized", True)), id)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow([k for k, _ in COLUMNS] + ["mean_draft_len", "ceiling_tokens_per_s", "acceptance_by_pos"])
        for r in self.results:
            w.writerow([self.value(r, k) for k, _ in COLUMNS]
                       + [r.figures.get("mean_draft_len"), r.figures.get("ceiling_tokens_per_s"),
                          " ".join(f"{a:.3f}" for a in r.acceptance_by_pos)])
        return buf.getvalue()

    def to_markdown(self) -> str:
        def cell(v: Any) -> str:
            if v is None:
                return "-"
            if isinstance(v, bool):
                return "yes" if v else "no"
            if isinstance(v, float):
                return f"{v:.2f}" if abs(v) >= 1 or v == 0 else f"{v:.3f}"
            return str(v).replace("|", "\\|")
        lines = [f"# draftlight Lab: {self.model}", "",
                 f"{len(self.results)} configurations, {self.rounds} rounds, up to {self.max_tokens} tokens, "
                 f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(self.created))}", "",
                 "Prompt:", "", "```", self.prompt.replace("```", "`\u200b``"), "```", "",
                 "| " + " | ".join(h for _, h in COLUMNS) + " |",
                 "|" + "---|" * len(COLUMNS)]
        for r in self.rows("tokens_per_s"):
            lines.append("| " + " | ".join(cell(self.value(r, k)) for k, _ in COLUMNS) + " |")
        none = next((r for r in self.results if r.name == "none"), None)
        if none is not None:
            lines += ["", "First divergence from none's output:"]
            for r in self.results:
                if r is none:
                    continue
                i = first_divergence(none.tokens, r.tokens)
                lines.append(f"- {r.name}: " + ("none (the same text)" if i is None else
                                                f"at token {i + 1}" + (" (quantized weights: a near-tie)"
                                                                      if self.quantized else "")))
        return "\n".join(lines) + "\n"


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The index of the first token where two outputs differ (None: the same).

    >>> first_divergence([1, 2, 3], [1, 2, 4]), first_divergence([1, 2], [1, 2]), first_divergence([1], [1, 2])
    (2, None, 1)
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def rel_at(rel: Sequence[float], k: float) -> float:
    """The curve at a (fractional) draft length, linear between points, flat past the end."""
    if not rel:
        return 1.0 + k * 0.0
    if k <= 0:
        return rel[0]
    if k >= len(rel) - 1:
        return rel[-1]
    lo = int(k)
    f = k - lo
    return rel[lo] * (1 - f) + rel[lo + 1] * f


def ceiling_tps(r: LabResult, none_tps: float, rel: Sequence[float]) -> float | None:
    L = r.figures.get("mean_draft_len") or 0.0
    if L < 1 or none_tps <= 0 or not rel:
        return None
    return none_tps * (L + 1) / rel_at(rel, L)


def _acceptance_by_pos(stats) -> list[float]:
    per_pos: list[int] = []
    calls = 0
    for st in stats.speculators.values():
        calls += st.n_call_accept
        for i, n in enumerate(st.n_acc_tokens_per_pos):
            if i >= len(per_pos):
                per_pos.append(0)
            per_pos[i] += n
    return [n / calls for n in per_pos] if calls else []


def _quantized(engine: Any) -> bool:
    desc = ""
    m = getattr(engine, "model", None)
    for attr in ("description",):
        v = getattr(m, attr, "")
        desc = v() if callable(v) else str(v or "")
    return not any(t in desc.upper() for t in (" F16", " BF16", " F32"))


def run_lab(engine: Any, prompt: Sequence[int], configs: Sequence[LabConfig], *, rounds: int = 3,
            max_tokens: int = 128, stop: Sequence[str] = (), prompt_text: str = "",
            cancel: Callable[[], bool] | None = None,
            progress: Callable[[int, int, str], None] | None = None,
            resources: Callable[[SpecParams], dict | None] | None = None) -> LabReport:
    """Run ``configs`` (``none`` is always among them, first) on ``engine``, interleaved in rounds.

    Greedy sampling, every run from a fresh chain (``engine.set_spec``); the
    chain is left as the last configuration had it: the caller puts its own back.
    ``resources(spec)``: what to build a chain with (e.g. the chat's lookup caches).
    """
    cfgs = list(configs)
    if not any(c.name == "none" for c in cfgs):
        cfgs.insert(0, LabConfig("none", SpecParams()))
    else:
        cfgs.sort(key=lambda c: c.name != "none")
    greedy = SamplingParams(temperature=0.0)
    #: each run's prompt time; the figure is the least (after the first run the target's prompt is
    #: in its cache, as in the chat: what is left is what the configuration adds, e.g. a drafter's)
    prompt_s: dict[str, list[float]] = {c.name: [] for c in cfgs}

    def run_one(name: str, cfg: LabConfig):
        from speculators.events import FinishEvent, StepEvent
        engine.set_spec(cfg.spec, resources=resources(cfg.spec) if resources else None)
        pieces: list[str] = []
        res = None
        for ev in engine.generate(list(prompt), max_tokens=max_tokens, sampling=greedy, stop=tuple(stop),
                                  cancel=cancel):
            if isinstance(ev, StepEvent):
                pieces.extend(t.text for t in ev.tokens)
            elif isinstance(ev, FinishEvent):
                res = ev.result
        if res is None or (cancel is not None and cancel()):
            raise Cancelled()
        prompt_s[name].append(res.stats.t_prompt_s)
        return gen_tps(res.stats), (res, pieces)

    best, speeds = interleave([(c.name, c) for c in cfgs], rounds, run_one, progress=progress, cancel=cancel)
    rel: list[float] = []
    curve = getattr(engine, "lab_cost_curve", None)
    if callable(curve):
        try:
            rel = list(curve())
        except Exception:
            rel = []
    none_res = best["none"][0]
    none_tps = gen_tps(none_res.stats)
    results = []
    for c in cfgs:
        res, pieces = best[c.name]
        row = new_row(c.name, 1)
        row.outputs[0] = list(res.tokens)
        add_result(row, res)
        finish_row(row)
        figs = row.to_dict(none_tps)
        for k in ("outputs", "per_prompt"):
            figs.pop(k, None)
        figs["paired_vs_none"] = round(paired_median(speeds, c.name), 3) if c.name != "none" else 1.0
        figs["ttft_ms"] = round(min(prompt_s[c.name] or [res.stats.t_prompt_s]) * 1000, 1)
        figs["same_as_none"] = list(res.tokens) == list(none_res.tokens)
        figs["rounds_tokens_per_s"] = [round(x, 2) for x in speeds[c.name]]
        r = LabResult(c.name, c.spec.to_dict(), figs, res.text, list(res.tokens),
                      list(getattr(res, "drafted_by", []) or []), list(getattr(res, "draft_pos", []) or []),
                      _acceptance_by_pos(res.stats), pieces[:len(res.tokens)])
        ceil = ceiling_tps(r, none_tps, rel)
        figs["ceiling_tokens_per_s"] = round(ceil, 2) if ceil else None
        figs["fraction_of_ceiling"] = round(figs["tokens_per_s"] / ceil, 3) if ceil else None
        results.append(r)
    model = getattr(getattr(engine, "model", None), "path", "") or ""
    return LabReport(prompt_text, str(model), max(1, rounds), max_tokens, results, rel,
                     quantized=_quantized(engine))
