"""Bars for the statistics panel; the figures themselves are defined once in :mod:`app.figures`."""

from __future__ import annotations

from speculators.base import SpeculatorStats

from ..figures import ReplyFigures, SessionStats, Totals, pct, reply_footer, spec_stats_from_dict  # noqa: F401

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
