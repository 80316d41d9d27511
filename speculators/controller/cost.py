"""The verify-cost curve as the controller reads it (:class:`CostModel`): measured at load, then
refined from the steps the engine times."""

from __future__ import annotations

from typing import Any

from ..costcurve import CostCurve, mark_stale
from .models import clip_stall
from .params import ControllerParams

#: a refined verify-cost table that moves no entry by more than this share is not taken up (the
#: decisions derived from the table would be worked out again for nothing)
REL_STILL = 0.003

#: timed steps of one draft width after which the cost model reads that width from them
BY_K_MIN = 4

#: steps timed before a cached cost curve is checked against them, and how much slower its
#: one-token time may be before it counts as measured under load
STALE_CHECK_STEPS = 24
STALE_FACTOR = 1.5


class CostModel:
    """The verify-cost curve as the controller uses it: measured, then refined online.

    One per engine (it is the device's, not the chain's), so what the steps
    teach survives a rebuilt chain.
    """

    def __init__(self, curve: CostCurve, params: ControllerParams | None = None):
        self.curve = curve
        self.params = params or ControllerParams()
        # online estimate: one-token step time, decaying sums for a line t = a + b * n
        self._t1: float | None = None
        #: one-token step time read from drafted steps (their time over c(k)), until a
        #: one-token step is timed: where every step drafts, the measured t1 is all there is
        #: otherwise, and a curve measured on a busy machine made drafting look cheap
        self._t1_drafted: float | None = None
        self._reg = [0.0] * 5
        #: per draft width: decaying (weight, mean seconds) of its timed steps -- a curve that
        #: jumps or stays flat between widths (the realistic hybrid: 31, 43, 52.5 and 53 ms for
        #: 0-3 drafted tokens) is read where it is used, which a line cannot do
        self._by_k: dict[int, list[float]] = {}
        self._n_timed = 0
        self._rel: list[float] = []
        self._rel_dirty = True
        #: (curve, its rel(0..max_len)) as measured, before the online refinement
        self._measured: tuple[CostCurve, list[float]] | None = None
        #: bumped whenever rel() changes
        self.version = 0
        #: whether the curve was found measured under load (checked once, after a few steps)
        self.stale = False
        #: what model drafters were measured to cost on this device (per drafter: ``t_call``,
        #: ``u``, ``hopeless``), so that a rebuilt chain starts from it instead of paying for
        #: probes and upkeep again to learn it
        self.drafters: dict[str, dict[str, Any]] = {}

    @property
    def source(self) -> str:
        return self.curve.source

    def refresh(self) -> None:
        """Fold what was observed into rel() now (it is otherwise done every few steps)."""
        self._rel_dirty = True

    def rel(self, k: int) -> float:
        """Verify cost of a ``k``-token draft in one-token steps (measured, refined online)."""
        if self._rel_dirty:
            self._rebuild_rel()
        if k < len(self._rel):
            return self._rel[k]
        return self._rel[-1] + (self._rel[-1] - self._rel[-2]) * (k - len(self._rel) + 1)

    def rel_table(self, n: int) -> list[float]:
        """``[rel(0), ..., rel(n)]`` (the list itself where the table is that long: do not change it)."""
        if self._rel_dirty:
            self._rebuild_rel()
        if n < len(self._rel):
            return self._rel
        return [self.rel(k) for k in range(n + 1)]

    def _online_line(self) -> tuple[float, float, float] | None:
        """(intercept s, slope s/token, weight 0..1) of the timings seen, or None."""
        s0, sx, sy, sxx, sxy = self._reg
        if s0 < 4.0:
            return None
        mx, my = sx / s0, sy / s0
        var = sxx / s0 - mx * mx
        if var < 0.5:
            return None  # every step had (nearly) the same width: no slope to read
        b = max(0.0, (sxy / s0 - mx * my) / var)
        a = my - b * mx
        if a <= 0:
            return None
        return a, b, min(1.0, s0 / 40.0)

    def _rebuild_rel(self) -> None:
        n = self.params.max_len
        measured = self._measured
        if measured is None or measured[0] is not self.curve or len(measured[1]) != n + 1:
            measured = self._measured = (self.curve, [self.curve.rel(k) for k in range(n + 1)])
        base = list(measured[1])
        line = self._online_line() if self.params.online_cost else None
        if line is not None:
            a, b, w = line
            base = [(1 - w) * c + w * min(k + 1.0, 1.0 + b * k / a) for k, c in enumerate(base)]
        t1 = self._t1
        if self.params.online_cost and t1:
            # widths timed often enough are read from their own steps (over one-token steps)
            for k, (wk, mk) in self._by_k.items():
                if 1 <= k <= n and wk >= BY_K_MIN:
                    f = min(1.0, wk / (2 * BY_K_MIN))
                    base[k] = (1 - f) * base[k] + f * min(k + 1.0, max(1.0, mk / t1))
        run = 1.0
        for k in range(n + 1):
            run = max(run, base[k])
            base[k] = run
        base[0] = 1.0
        self._rel_dirty = False
        prev = self._rel
        if len(prev) == len(base) and all(abs(b - a) <= REL_STILL * a for a, b in zip(prev, base)):
            return          # what the new timings moved is too small to matter: decisions keep theirs
        self._rel = base
        self.version += 1

    def _check_stale(self) -> None:
        """A curve whose one-token time is well above the steps timed now was measured while
        something else held the machine: have it measured again at the next load."""
        c = self.curve
        seen = self._t1 if self._t1 is not None else self._t1_drafted
        if self.stale or not c.t1_s or seen is None or not c.cache_path:
            return
        if c.t1_s > STALE_FACTOR * seen:
            self.stale = True
            mark_stale(c.cache_path, seen)

    @property
    def t1_s(self) -> float:
        """Seconds of a one-token step (observed, else measured, else a guess)."""
        if self._t1 is not None:
            return self._t1
        if self._t1_drafted is not None:
            return self._t1_drafted
        return self.curve.t1_s or 0.02

    def observe(self, n_draft: int, seconds: float) -> None:
        """The engine timed a verify step with a draft of ``n_draft`` tokens.

        One-token steps give the absolute step time; all steps feed a
        decaying least-squares line ``t = a + b * n`` that, once the widths
        seen vary enough, refines the measured curve (a busy machine's
        stalls are clipped, not averaged in).
        """
        if seconds <= 0 or not self.params.online_cost:
            return
        if n_draft == 0:
            if self._t1 is None:
                self._t1 = seconds
            else:
                x = clip_stall(seconds, self._t1)
                self._t1 += self.params.cost_alpha * (x - self._t1)
        else:
            x = seconds / max(self.rel(n_draft), 1.0)
            if self._t1_drafted is None:
                self._t1_drafted = x
            else:
                x = clip_stall(x, self._t1_drafted)
                self._t1_drafted += self.params.cost_alpha * (x - self._t1_drafted)
        line = self._online_line()
        if line is not None:
            seconds = clip_stall(seconds, line[0] + line[1] * n_draft)
        d = 1.0 - self.params.cost_alpha / 4
        if n_draft > 0:
            wm = self._by_k.setdefault(n_draft, [0.0, 0.0])
            seconds_k = clip_stall(seconds, wm[1]) if wm[0] >= BY_K_MIN else seconds
            wm[0] = wm[0] * d + 1.0
            wm[1] += (seconds_k - wm[1]) / wm[0]
        s0, sx, sy, sxx, sxy = (v * d for v in self._reg)
        x = float(n_draft)
        self._reg = [s0 + 1.0, sx + x, sy + seconds, sxx + x * x, sxy + x * seconds]
        self._n_timed += 1
        if self._n_timed == STALE_CHECK_STEPS:
            self._check_stale()
        if self._n_timed % 8 == 0:
            self._rel_dirty = True
