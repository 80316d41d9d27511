"""Session statistics: per-speculator figures summed over replies, and their text form.

Pure Python (no Textual): the widgets turn these into text.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from speculators.base import SpeculatorStats
from speculators.events import GenerationStats

#: the counters and timers of SpeculatorStats (whatever the engine adds)
_SUM_FIELDS = tuple(f.name for f in dataclasses.fields(SpeculatorStats) if f.name != "n_acc_tokens_per_pos")


def spec_stats_from_dict(d: Mapping[str, Any]) -> SpeculatorStats:
    s = SpeculatorStats()
    for k in _SUM_FIELDS:
        if k in d:
            setattr(s, k, d[k])
    s.n_acc_tokens_per_pos = list(d.get("n_acc_tokens_per_pos", []))
    return s


@dataclass
class Totals:
    replies: int = 0
    n_generated: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_steps: int = 0
    t_gen_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.t_gen_s if self.t_gen_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.n_generated / self.n_steps if self.n_steps else None


@dataclass
class SessionStats:
    """Figures of the finished replies of this session, plus the live one."""

    totals: Totals = field(default_factory=Totals)
    speculators: dict[str, SpeculatorStats] = field(default_factory=dict)

    def add(self, stats: GenerationStats) -> None:
        t = self.totals
        t.replies += 1
        t.n_generated += stats.n_generated
        t.n_drafted += stats.n_drafted
        t.n_accepted += stats.n_accepted
        t.n_steps += stats.n_steps
        t.t_gen_s += stats.t_gen_s
        for name, s in stats.speculators.items():
            cur = self.speculators.get(name)
            self.speculators[name] = s.copy() if cur is None else cur + s

    def with_live(self, live: GenerationStats | None) -> "SessionStats":
        """A copy that includes the reply still being written."""
        out = SessionStats(Totals(**self.totals.__dict__),
                           {k: v.copy() for k, v in self.speculators.items()})
        if live is not None:
            out.add(live)
            out.totals.replies -= 1
        return out


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.0f}%"


def reply_footer(stats: Mapping[str, Any] | None, finish: str | None = None, status: str | None = None) -> str:
    """The one-line summary under a reply (from ``GenerationStats.to_dict()``)."""
    parts: list[str] = []
    if stats:
        n = stats.get("n_generated", 0)
        parts.append(f"{stats.get('n_emitted', n) or n} tok")
        tps = stats.get("tokens_per_s") or 0.0
        if tps:
            parts.append(f"{tps:.1f} tok/s")
        drafted = stats.get("n_drafted", 0)
        if drafted:
            acc = stats.get("n_accepted", 0)
            parts.append(f"drafted {drafted}")
            parts.append(f"accepted {acc} ({pct(stats.get('acceptance_rate'))})")
            mal = stats.get("mean_acceptance_length")
            if mal:
                parts.append(f"mean acc len {mal:.2f}")
            contrib = [k for k, v in (stats.get("speculators") or {}).items()
                       if (v or {}).get("n_acc_tokens", 0) > 0]
            if contrib:
                parts.append("by " + ", ".join(contrib))
        elif stats.get("n_generated"):
            parts.append("no drafts")
        if stats.get("synthetic"):
            parts.append("synthetic acceptance")
    if status == "streaming":
        parts.append("interrupted")
    elif finish == "cancelled":
        parts.append("stopped")
    elif finish == "length":
        parts.append("hit the token limit")
    elif finish == "context":
        parts.append("context full")
    return " · ".join(parts)


_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(frac: float, width: int) -> str:
    """A horizontal bar of ``width`` cells filled to ``frac`` (eighth-cell steps)."""
    frac = min(1.0, max(0.0, frac))
    eighths = round(frac * width * 8)
    full, rem = divmod(eighths, 8)
    s = "█" * full + (_EIGHTHS[rem] if rem else "")
    return s.ljust(width)


def acceptance_bars(s: SpeculatorStats, width: int = 16, max_rows: int = 12) -> list[tuple[int, str, float]]:
    """(draft position, bar, rate) for each position (rate = accepted at pos / accept calls)."""
    rates = s.acceptance_rate_per_pos
    rows = [(i, bar(r, width), r) for i, r in enumerate(rates[:max_rows])]
    return rows
