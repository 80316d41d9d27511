"""The run's options and its outcome: the messages sent, the failures and faults recorded, and the
figures and report printed at the end. Data only: nothing here drives the app.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass

from .limits import FREEZE_S
from .screen import squeeze


@dataclass
class Options:
    seed: int = 1
    actions: int = 300
    faults: int = 30
    model: str | None = None
    base: str | None = None            # the run's folder (default: a temp folder)
    cache_dir: str | None = None       # the cache folder (default: under base)
    max_tokens: int = 32
    threads: int = 2
    max_seconds: float = 600.0
    max_failures: int = 40
    disk: str = "auto"                 # auto | tmpfs | fsize
    quiet: bool = False


@dataclass
class Sent:
    text: str
    step: int
    state: str = "typed"               # typed | input (refused) | accepted | saved | lost
    t: float = 0.0                     # when the app took it
    resent: int = 0
    refused: bool = False
    saved_after: float | None = None


@dataclass
class Failure:
    step: int
    label: str
    kind: str
    detail: str
    recent: list[str]
    screen: str
    stack: str = ""
    what: str = ""
    lag: float = 0.0

    def head(self) -> str:
        return f"step {self.step} ({self.label}): {self.kind}: {self.detail}"


@dataclass
class FaultRecord:
    step: int
    kind: str
    detail: str


@dataclass
class Result:
    seed: int
    plan_digest: str
    actions: int
    faults: int
    fault_kinds: dict[str, int]
    survived: int
    sent: int
    refused: int
    resent: int
    saved: int
    lost: int
    worst_lag: float
    worst_lag_at: str
    lag_p50: float
    lag_p95: float
    n_lags: int
    app_starts: int
    runner_starts: int
    disk_mode: str
    seconds: float
    failures: list[Failure]
    faults_log: list[FaultRecord]
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)   # the 1-min load average: first, mean, highest
    slowest_quit: float = 0.0
    #: the settings pane's paints (held to FREEZE_S as every key; told apart in the figures, the pane
    #: being the UI's largest): the slowest, and how many took over FREEZE_S
    settings_worst: float = 0.0
    settings_over: int = 0
    settings_n: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0 and self.worst_lag <= FREEZE_S

    def figures(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.fault_kinds.items()))
        return "\n".join([
            f"soak: seed {self.seed} (plan {self.plan_digest}), {self.seconds:.0f} s, full disk by {self.disk_mode}",
            f"  actions   {self.actions}",
            f"  faults    {self.faults} ({kinds})",
            f"  survived  {self.survived} of {self.faults}",
            f"  messages  {self.sent} sent, {self.saved} in the history, {self.refused} refused at first "
            f"({self.resent} sent again), lost {self.lost}",
            f"  worst key-to-paint lag {self.worst_lag:.3f} s ({self.worst_lag_at}); "
            f"median {self.lag_p50 * 1000:.0f} ms, p95 {self.lag_p95 * 1000:.0f} ms over {self.n_lags} keys",
            f"  the settings pane (F3) opening or closing: slowest {self.settings_worst:.3f} s, "
            f"{self.settings_over} of {self.settings_n} over {FREEZE_S:.0f} s",
            f"  app starts {self.app_starts}, runners started {self.runner_starts}; the slowest Ctrl+Q took "
            f"{self.slowest_quit:.1f} s to exit",
            f"  machine load (1-min average) {self.load[0]:.1f} at the start, {self.load[1]:.1f} on average, "
            f"{self.load[2]:.1f} at most, on {os.cpu_count()} cores",
            f"  failures  {len(self.failures)}",
        ])

    def report(self, screens: int = 12) -> str:
        out = [self.figures()]
        groups: dict[tuple, list[Failure]] = collections.OrderedDict()
        for f in self.failures:
            groups.setdefault((f.kind, f.what or f.label.split()[0 if not f.label.startswith("fault") else 1]),
                              []).append(f)
        shown = 0
        for fs in groups.values():
            f = max(fs, key=lambda x: (x.lag, -x.step))      # the longest freeze: the clearest stack
            others = [x for x in fs if x is not f]
            out.append("")
            out.append(f"FAILURE {f.head()}" + (f"  [and {len(others)} more like it: steps "
                                                 f"{', '.join(str(x.step) for x in others[:12])}"
                                                 f"{', …' if len(others) > 12 else ''}]" if others else ""))
            out.append("  the steps that led there:")
            out += [f"    {r}" for r in f.recent]
            if f.stack:
                out.append("  the UI thread was at:")
                out += [f"    {ln}" for ln in f.stack.splitlines()]
            if shown < screens:
                shown += 1
                out.append("  the screen:")
                out += [f"    |{ln}" for ln in squeeze(f.screen)]
        return "\n".join(out)
