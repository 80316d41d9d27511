"""The pacing of a streaming reply's paints: as they come, or spaced where the model takes every core.

May touch: the reply's :class:`~app.ui.widgets.MessageView` (its tokens and live figures), the
app's state line and statistics panel; it reads the session's job and engine.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .. import session as sess
from ..runner import usable_cores
from .app_part import AppPart


class ReplyPainting(AppPart):
    """The app's part that paints a streaming reply's progress (:class:`~app.session.ReplyProgress`)."""

    #: the shortest time between two paints of a streaming reply when the model's threads take
    #: every core (see :meth:`paint_every_s`). What arrives sooner waits for the next paint,
    #: together: the session posts its next ReplyProgress only once this one is applied, so a
    #: paint carries every token (and the newest figures) since the last. A paint costs the UI
    #: process a few ms of CPU; at one per token that was a fifth of a core at 30 tokens/s,
    #: taken from the model's threads (chat 0.84x ``generate``'s speed on 2 cores). Ten a
    #: second at most: that still reads as a smooth stream (and left the model ~0.02x more than
    #: fifteen); :attr:`UI_CPU_SHARE` may space them further.
    PAINT_EVERY_CONTENDED_S = 1 / 10
    #: and there, the share of one core the UI thread may take while a reply streams: each paint's
    #: cycle (the tokens added, the frame, the live figures, what else the thread did meanwhile)
    #: is timed on the thread's CPU clock, and the next paint waits until its cost is this share
    #: of the time since the last. On 2 cores a paint's cycle took ~3.5 ms of CPU: a paint every
    #: ~0.14 s. A slower frame (Markdown, a wide terminal) paints less often, but at least every
    #: :attr:`PAINT_EVERY_MAX_S`. What the UI takes, the model's threads lose about one for one.
    UI_CPU_SHARE = 0.025
    PAINT_EVERY_MAX_S = 1 / 4
    #: where the model's threads take every core, a streaming reply has this many lines from the
    #: start and grows twice as many at a time (blank until written; ``ReplyBody._height``):
    #: each new line otherwise lays the whole screen out again, a few ms of the UI's CPU each,
    #: and those layouts were the largest part of what the UI took from the model while a
    #: reply streamed
    RESERVE_LINES_CONTENDED = 4
    #: how often the live figures (the reply's footer, the top bar's speed, F4) change while a
    #: reply streams: a person reads them a few times a second
    LIVE_EVERY_S = 0.25

    def _init_painting(self) -> None:
        """The pacing's state, before any reply."""
        #: a ReplyProgress waiting for its paint, and when the last paint was
        self._progress: sess.ReplyProgress | None = None
        self._progress_timer: Any = None
        self._painted = 0.0
        self._paint_every = 0.0
        #: the time between paints now (``_paint_every``, or more: see :attr:`UI_CPU_SHARE`),
        #: the UI thread's CPU clock at the last paint, and the mean CPU of a paint's cycle
        self._paint_gap = 0.0
        self._paint_cpu: float | None = None
        self._paint_cost: float | None = None
        self._live_shown: Any = None
        self._live_at = 0.0

    def paint_every_s(self) -> float:
        """0 (paint each update as it comes) while a core is left for the UI beside the model's
        threads; :attr:`PAINT_EVERY_CONTENDED_S` where they take every core."""
        ctx = getattr(self.session.engine, "ctx", None)
        threads = getattr(ctx, "n_threads", None)
        if not isinstance(threads, int) or threads <= 0:
            return 0.0
        return self.PAINT_EVERY_CONTENDED_S if threads + 1 > usable_cores() else 0.0

    def _reply_progress(self, ev: sess.ReplyProgress) -> None:
        if self._progress is not None:
            if self._progress.key == ev.key:
                return
            self._flush_progress()
        due = self._painted + self._paint_gap - time.monotonic()
        if due > 0:
            self._progress = ev
            # a plain loop callback (a Textual timer is a task of its own, each time); the paint
            # itself runs as the app's next callback, where its errors are the app's
            self._progress_timer = asyncio.get_running_loop().call_later(
                due, self.call_next, self._flush_progress)
            return
        self._show_progress(ev)

    def _pace_paints(self) -> None:
        """The time to the next paint, from the CPU the UI thread used since the last (see
        :attr:`UI_CPU_SHARE`)."""
        cpu = time.thread_time()
        if self._paint_cpu is not None:
            cost = cpu - self._paint_cpu
            mean = self._paint_cost = cost if self._paint_cost is None else 0.7 * self._paint_cost + 0.3 * cost
            self._paint_gap = min(self.PAINT_EVERY_MAX_S, max(self._paint_every, mean / self.UI_CPU_SHARE))
        self._paint_cpu = cpu

    def _flush_progress(self) -> None:
        """Show the progress that waits for its paint (now, whatever its time)."""
        ev, self._progress = self._progress, None
        if self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None
        if ev is not None:
            self._show_progress(ev)

    def _show_progress(self, ev: sess.ReplyProgress) -> None:
        self.session.apply(ev)
        self._painted = now = time.monotonic()
        if self._paint_every > 0:
            self._pace_paints()
        view = self._views_by_key.get(ev.key)
        job = self.session.job
        if view is None or job is None or job.turn.key != ev.key or not view.is_attached:
            return
        n0 = view.body.n_tokens
        tokens = self.session.new_tokens(job.turn, n0)
        if tokens:
            times = job.turn.arrived[n0:n0 + len(tokens)] if self.lag_probe is not None else None
            view.add_tokens(tokens, times)
            conv = view.parent
            if conv is not None and not getattr(conv, "is_anchored", True):
                self.call_after_refresh(self._stick_to_bottom)
        if job.live is not None and job.live is not self._live_shown and now - self._live_at >= self.LIVE_EVERY_S:
            self._live_shown, self._live_at = job.live, now
            view.live_stats(job.live)
            tps = job.live.tokens_per_s
            self._set_state(f"writing… {tps:.0f} tok/s" if tps else "writing…")
            self._refresh_stats()
