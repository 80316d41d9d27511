"""What the adaptive controller decided, and why: the statistics type, apart from the controller.

:class:`ControllerStats` is the record that the controller (:mod:`speculators.controller`) keeps
and the engine's events (:mod:`speculators.events`) carry; it imports nothing of either, so the
events do not load the controller and the controller does not load the events.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

#: why a step was or was not drafted (keys of :attr:`ControllerStats.reasons`)
REASONS: dict[str, str] = {
    "drafted": "verified a draft expected to beat plain decoding",
    "cut": "verified only the part of the draft expected to pay",
    "probe": "verified a short probe of a drafter not trusted yet",
    "skipped": "a draft was proposed but was expected to be slower than plain decoding",
    "no_proposal": "the drafters asked had nothing to propose",
    "not_asked": "no drafter was worth asking this step (all cold, between probes)",
    "no_room": "no room for a draft (reply or context limit)",
}

#: a speculator's counters in :attr:`ControllerStats.per_speculator` (they add and subtract)
PER_SPEC_COUNTERS = ("verified", "skipped", "cut", "tokens_cut", "shadow", "probes", "calls", "calls_saved",
                      "upkeep_ms", "upkeep_paused_steps")
#: a speculator's current estimates there (taken from the newer operand)
PER_SPEC_SNAPSHOT = ("accept_est", "gain_est", "active", "upkeep_est", "upkeep_on", "hopeless")


@dataclass
class ControllerStats:
    """What the controller decided, and why (per reply: engine stats hold the difference).

    Counters add and subtract field by field; the snapshot fields (the
    current estimates: ``cost_curve``, ``t1_ms``, ``cost_source``,
    ``last_reason`` and each speculator's ``accept_est``, ``gain_est``,
    ``active``) come from the newer operand (the right one in ``+``, the
    left one in ``-``).
    """

    n_steps: int = 0         # steps decided
    n_drafted: int = 0       # steps that verified a draft (probes included)
    n_skipped: int = 0       # a draft was proposed but not worth verifying
    n_no_proposal: int = 0   # the drafters asked proposed nothing
    n_not_asked: int = 0     # no drafter was worth asking
    n_no_room: int = 0       # no room for a draft
    n_cut: int = 0           # verified drafts cut shorter than proposed
    n_tokens_cut: int = 0    # draft tokens dropped by those cuts
    n_probes: int = 0        # verified probes of cold model drafters
    n_shadow: int = 0        # proposals scored without verifying them
    n_calls_saved: int = 0   # draft calls not made (cold drafters between probes)
    per_speculator: dict[str, dict[str, float]] = field(default_factory=dict)
    cost_curve: list[float] = field(default_factory=list)   # c(0..16), snapshot
    cost_source: str = ""                                   # measured / cached / given
    t1_ms: float | None = None                              # one-token step, snapshot
    last_reason: str = ""

    @property
    def reasons(self) -> dict[str, int]:
        return {"drafted": self.n_drafted - self.n_probes - self.n_cut, "cut": self.n_cut,
                "probe": self.n_probes, "skipped": self.n_skipped, "no_proposal": self.n_no_proposal,
                "not_asked": self.n_not_asked, "no_room": self.n_no_room}

    def _combine(self, other: "ControllerStats", sign: int) -> "ControllerStats":
        newer = other if sign > 0 else self
        out = ControllerStats(**{n: getattr(self, n) + sign * getattr(other, n) for n in _COUNTS})
        for n in _CURRENT:
            v = getattr(newer, n)
            setattr(out, n, list(v) if isinstance(v, list) else v)
        mine, theirs = self.per_speculator, other.per_speculator
        per: dict[str, dict[str, float]] = {}
        for name in list(mine) + [n for n in theirs if n not in mine]:
            a = mine.get(name, {})
            b = theirs.get(name, {})
            nd = (newer.per_speculator.get(name) or (a if sign > 0 else b) or {})
            d = {k: a.get(k, 0) + sign * b.get(k, 0) for k in PER_SPEC_COUNTERS}
            for k in PER_SPEC_SNAPSHOT:
                d[k] = nd.get(k, 0)
            per[name] = d
        out.per_speculator = per
        return out

    def __add__(self, other: "ControllerStats") -> "ControllerStats":
        return self._combine(other, 1)

    def __sub__(self, other: "ControllerStats") -> "ControllerStats":
        return self._combine(other, -1)

    def copy(self) -> "ControllerStats":
        """A copy (equal to ``self - ControllerStats()``): nothing shared with ``self``; a
        speculator's missing entries read 0."""
        out = ControllerStats(**{n: getattr(self, n) for n in _COUNTS})
        for n in _CURRENT:
            v = getattr(self, n)
            setattr(out, n, list(v) if isinstance(v, list) else v)
        out.per_speculator = {name: {k: d.get(k, 0) for k in _PER_SPEC_KEYS}
                              for name, d in self.per_speculator.items()}
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["per_speculator"] = {k: dict(v) for k, v in self.per_speculator.items()}
        d["cost_curve"] = list(self.cost_curve)
        d["reasons"] = self.reasons
        return d

    def summary(self) -> list[str]:
        """Short lines (about 40 columns) for a statistics panel."""
        lines = [f"steps {self.n_steps} · drafted {self.n_drafted} (cut {self.n_cut})",
                 f"skipped {self.n_skipped} · nothing to draft {self.n_no_proposal + self.n_not_asked}"]
        if self.n_probes:
            lines.append(f"probes {self.n_probes}")
        if self.cost_curve:
            c = self.cost_curve
            pts = " ".join(f"{k}:{c[k]:.2f}" for k in (1, 2, 4, 8) if k < len(c))
            lines.append(f"verify cost ({self.cost_source or 'given'}) {pts}")
        for name, p in self.per_speculator.items():
            if p.get("hopeless") and not p.get("verified"):
                # costs more than it could ever save (measured, or known from its model's size)
                lines.append(f"{name} too costly to pay here · used 0")
                continue
            lines.append(f"{name} {'on' if p.get('active') else 'cold'} · acc {p.get('accept_est', 0) * 100:.0f}% · "
                         f"gain {p.get('gain_est', 0):.2f}× · used {int(p.get('verified', 0))}")
        return lines


#: the counters (they add and subtract) and the current estimates (taken from the newer operand)
_COUNTS = tuple(f.name for f in fields(ControllerStats) if f.name.startswith("n_"))
_CURRENT = tuple(f.name for f in fields(ControllerStats) if not f.name.startswith("n_") and f.name != "per_speculator")
_PER_SPEC_KEYS = PER_SPEC_COUNTERS + PER_SPEC_SNAPSHOT
