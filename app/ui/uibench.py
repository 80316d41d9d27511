"""UI benchmark: stream scripted tokens through the real widgets and measure the lag.

The lag of a token is the time from the moment the generation worker got
its event from the engine to the moment the reply widget rendered a frame
that includes it (the compositor calls ``render`` when it paints).

Run it with ``python -m app.ui.uibench [tokens_per_s] [n_tokens]``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass


@dataclass
class BenchResult:
    n_tokens: int
    tokens_per_s: float
    received: int
    in_order: bool
    text_ok: bool
    p50_ms: float
    p95_ms: float
    max_ms: float
    seconds: float

    def summary(self) -> str:
        return (f"{self.received}/{self.n_tokens} tokens at {self.tokens_per_s:.0f}/s in {self.seconds:.2f}s, "
                f"in order: {self.in_order}, lag p50 {self.p50_ms:.1f} ms, p95 {self.p95_ms:.1f} ms, "
                f"max {self.max_ms:.1f} ms")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def scripted_app(engine, max_tokens: int | None = None):
    """The real app on a scripted engine (no model), its history in a fresh temporary folder:
    the app's default settings with two n-gram speculators (the scripted replies' drafters)
    and, where given, ``max_tokens`` a reply."""
    from .. import config as config_mod
    from ..storage import History
    from .app import DraftlightApp
    from speculators.params import SpecParams

    cfg = config_mod.Config()
    if max_tokens is not None:
        cfg.max_tokens = max_tokens
    cfg.spec = SpecParams.from_types("ngram-mod,ngram-simple")
    tmp = tempfile.mkdtemp(prefix="draftlight-bench-")
    return DraftlightApp(cfg, engine_factory=lambda m, s, p: engine, history=History(os.path.join(tmp, "h.sqlite3")),
                         persist_config=False)


async def wait_for_engine(app, pilot, tries: int = 200) -> None:
    """Let the app's engine load (at most ``tries`` pauses of 20 ms)."""
    for _ in range(tries):
        if app.engine is not None:
            break
        await pilot.pause(0.02)


async def run_benchmark(tokens_per_s: float = 2000.0, n_tokens: int = 4000,
                        size: tuple[int, int] = (100, 30)) -> BenchResult:
    import time

    from .app import LagProbe
    from .scripted import ScriptedEngine, demo_script

    script = demo_script(n_tokens)
    # a reply never begins with whitespace (the session drops it)
    expected = "".join("".join(toks) for _, toks in script).lstrip()
    engine = ScriptedEngine(script, tokens_per_s=tokens_per_s)
    app = scripted_app(engine, max_tokens=n_tokens + 10)
    app.lag_probe = LagProbe()
    t0 = time.perf_counter()
    async with app.run_test(size=size) as pilot:
        await wait_for_engine(app, pilot)
        app.send("benchmark")
        t0 = time.perf_counter()
        deadline = t0 + n_tokens / tokens_per_s * 4 + 10
        # plain sleeps: a pilot's pause sends a message to every widget and paints the screen,
        # work the app does not do on its own
        while (app.job is not None) and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)
        await pilot.pause(0.1)
        seconds = time.perf_counter() - t0
        views = app._views()
        reply = views[-1]
        text = reply.text
        n_received = reply.body.n_tokens
        record = None
        if app.history is not None and app.chat_id is not None:
            record = [t.id for t in app.history.load_chat(app.chat_id).messages[-1].tokens]
    lags = [v * 1000 for v in app.lag_probe.lags.values()]
    in_order = bool(record is not None and record == list(range(1000, 1000 + len(record)))
                    and len(record) == n_received)
    return BenchResult(n_tokens=len([1 for _, toks in script for _ in toks]), tokens_per_s=tokens_per_s,
                       received=n_received, in_order=in_order, text_ok=text == expected,
                       p50_ms=statistics.median(lags) if lags else float("nan"),
                       p95_ms=_percentile(lags, 0.95), max_ms=max(lags) if lags else float("nan"),
                       seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rate = float(argv[0]) if argv else 2000.0
    n = int(argv[1]) if len(argv) > 1 else 4000
    result = asyncio.run(run_benchmark(rate, n))
    print(result.summary())
    return 0 if result.in_order and result.text_ok and result.received == result.n_tokens else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
