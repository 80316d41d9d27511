#!/usr/bin/env python3
"""The chat UI's own CPU per reply as a conversation grows: does a short reply cost more later?

    python tools/bench_ui_turns.py [--turns 40] [--tokens 10] [--rate 40] [--every 4] [--no-contended]

Runs the real app (``DraftlightApp``) under Textual's headless driver with the scripted engine
(no model), sends ``--turns`` messages whose replies are ``--tokens`` tokens at ``--rate`` tokens
a second, and prints for each ``--every`` replies the medians of the process's CPU time from
sending one to 0.3 s after it ended, and of how many times the screen was laid out meanwhile (each layout
arranges every widget on the screen). By default the app runs as beside a model whose threads
take every core (its paints paced as it paces them there); there the UI's CPU is taken from the
model's threads. The headless driver writes no terminal output, so the real
app costs at least this much.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def run(turns: int, tokens: int, rate: float, every: int, contended: bool = True) -> None:
    import types

    from textual.screen import Screen

    from app.runner import usable_cores

    from app.ui.scripted import ScriptedEngine
    from app.ui.uibench import scripted_app, wait_for_engine

    layouts = [0]
    original = Screen._refresh_layout

    def counted(self, *a, **k):
        layouts[0] += 1
        return original(self, *a, **k)

    Screen._refresh_layout = counted
    engine = ScriptedEngine([(None, [" word"]) for _ in range(tokens)], tokens_per_s=rate)
    if contended:
        # as a model whose threads take every core: the app paces its paints and reserves lines
        engine.ctx = types.SimpleNamespace(n_threads=usable_cores())
    app = scripted_app(engine)
    print(f"{'replies':>7} {'messages':>8} {'UI CPU ms':>10} {'wall ms':>8} {'layouts':>8}   (medians of each block)")
    block: list[tuple[float, float, int]] = []
    async with app.run_test(size=(140, 45)) as pilot:
        await wait_for_engine(app, pilot, tries=500)
        for i in range(turns):
            c0, t0, l0 = time.process_time(), time.perf_counter(), layouts[0]
            app.send(f"question {i}")
            # plain sleeps: a pilot's pause sends a message to every widget and paints the screen
            # (work that grows with the chat, and that the app does not do on its own)
            while app.job is not None:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            block.append((time.process_time() - c0, time.perf_counter() - t0, layouts[0] - l0))
            if len(block) == every or i == turns - 1:
                cpu, wall, lay = (statistics.median(x) for x in zip(*block))
                print(f"{f'{i + 1 - len(block)}-{i}':>7} {len(app.session.turns):>8} {1e3 * cpu:>10.1f} "
                      f"{1e3 * wall:>8.0f} {lay:>8.0f}", flush=True)
                block = []
        c0 = time.process_time()
        await asyncio.sleep(1.0)
        print(f"idle for 1 s at the end: {1e3 * (time.process_time() - c0):.1f} ms of CPU")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=10, help="tokens per reply")
    ap.add_argument("--rate", type=float, default=40.0, help="tokens a second")
    ap.add_argument("--every", type=int, default=4, help="print the medians of each N replies")
    ap.add_argument("--contended", action=argparse.BooleanOptionalAction, default=True,
                    help="run the UI as beside a model whose threads take every core (the default), "
                         "or as with a core to spare")
    args = ap.parse_args()
    asyncio.run(run(args.turns, args.tokens, args.rate, max(1, args.every), args.contended))
    return 0


if __name__ == "__main__":
    sys.exit(main())
