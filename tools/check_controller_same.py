"""Check that the controller package decides exactly as the single module it replaced.

The old ``speculators/controller.py`` is read from git (``git show REV:speculators/controller.py``,
REV the newest commit that still has it unless ``--rev`` says otherwise) and loaded as a module of
this checkout's package; both controllers are then driven through the same seeded scenarios, each with its own fresh
speculators, a deterministic clock and the same target:

* ``scripted``: scripted drafters whose drafts are right, partly right or wrong in seeded phases
  (two lookup types, two model drafters: one pausable with upkeep that can pay, one whose model
  size says it cannot), over random text, with steps that have no room, a ``useful`` cut and a
  sentence-boundary test, and a chain rebuilt part-way on the same cost model;
* ``copy``: Automatic's real n-gram drafters over a reply that copies a passage of its prompt
  (long copies, copies that break off, ordinary text between), over several turns.

Every :class:`Decision` must be equal field by field (the drafter by name), and at the end the
statistics, each speculator's state and the cost model's table. Exit status 0 when all are equal.

    python tools/check_controller_same.py [--seeds 6] [--steps 300] [--rev REV] [--time]

``--time`` times both instead, per step (``decide`` + ``observe``, and ``snapshot`` every
``--snap-every`` steps), on fresh text where nothing is proposed and on long copies.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speculators import controller as new_mod  # noqa: E402
from speculators.base import DraftRequest, Speculator  # noqa: E402
from speculators.chain import SpeculatorChain  # noqa: E402
from speculators.costcurve import CostCurve  # noqa: E402
from speculators.params import SpecParams  # noqa: E402
from speculators.types import SpecType  # noqa: E402


def last_single_module() -> str:
    """The newest commit whose tree still has ``speculators/controller.py``."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)  # noqa: E731
    rev = git("rev-list", "-1", "HEAD", "--", "speculators/controller.py").stdout.strip() or "HEAD"
    return rev if git("cat-file", "-e", f"{rev}:speculators/controller.py").returncode == 0 else rev + "^"


def load_old(rev: str | None = None):
    """The controller module as it was at ``rev`` (default: :func:`last_single_module`), loaded
    as ``speculators._controller_old``."""
    rev = rev or last_single_module()
    src = subprocess.run(["git", "show", f"{rev}:speculators/controller.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="controller_old_")) / "controller_old.py"
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("speculators._controller_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class Clock:
    """Deterministic seconds: the drafters and the driver advance it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Lookup(Speculator):
    """A cheap drafter proposing ``right(call)`` tokens of the text, then wrong ones."""

    def __init__(self, type_: SpecType, text: list[int], right: Callable[[], int], clock: Clock, n: int = 8,
                 call_s: float = 0.00002, context_key: int = 0):
        super().__init__(n)
        self.type, self.text, self.right, self.clock, self.call_s = type_, text, right, clock, call_s
        self.context_key = context_key

    def draft(self, req: DraftRequest) -> list[int]:
        self.clock.t += self.call_s
        k = self.right()
        if k < 0:
            return []
        i = req.pos0 + 1
        n = self.n_max if req.n_max < 0 else min(self.n_max, req.n_max)
        good = self.text[i:i + min(k, n)]
        return good + [-7 - j for j in range(n - len(good))]


class Model(Lookup):
    """A model drafter: drafting costs per token, following the target costs upkeep (paused
    when the controller says so, caught up at the next draft)."""

    def __init__(self, *a, tok_s: float = 0.0004, upkeep_s: float = 0.0002, cost_prior: float | None = None,
                 **kw):
        super().__init__(*a, **kw)
        self.tok_s, self.upkeep_s, self.cost_prior = tok_s, upkeep_s, cost_prior
        self.upkeep, self.missed = True, 0

    def set_upkeep(self, on: bool) -> None:
        self.upkeep = on

    def follow(self, n_tokens: int) -> float:
        """The target decoded a batch of ``n_tokens``: mirrored now, or later."""
        if not self.upkeep:
            self.missed += n_tokens
            return 0.0
        dt = self.upkeep_s * n_tokens
        self.stats.t_process_us += dt * 1e6
        self.clock.t += dt
        return dt

    def draft(self, req: DraftRequest) -> list[int]:
        if self.missed:
            dt, self.missed = self.upkeep_s * self.missed * 0.5, 0
            self.stats.t_process_us += dt * 1e6
            self.clock.t += dt
        self.clock.t += self.tok_s * max(1, req.n_max)
        return super().draft(req)


def phases(rng: random.Random, n: int) -> Callable[[], int]:
    """How many tokens are right, call by call: seeded phases of right, partly right, wrong, none."""
    state = {"left": 0, "kind": 0}

    def right() -> int:
        if state["left"] <= 0:
            state["left"], state["kind"] = rng.randrange(3, 40), rng.randrange(4)
        state["left"] -= 1
        kind = state["kind"]
        if kind == 0:
            return n
        if kind == 1:
            return rng.randrange(0, n + 1)
        if kind == 2:
            return 0
        return -1 if rng.random() < 0.7 else rng.randrange(0, 3)
    return right


def scripted_chain(seed: int, text: list[int], clock: Clock) -> SpeculatorChain:
    rng = random.Random(seed)
    seeds = [rng.randrange(1 << 30) for _ in range(4)]
    tok_s = rng.choice((0.00002, 0.00005, 0.0002))   # a drafter that pays, nearly, or not
    return SpeculatorChain([
        Lookup(SpecType.NGRAM_SIMPLE, text, phases(random.Random(seeds[0]), 8), clock, n=8),
        Lookup(SpecType.NGRAM_CACHE, text, phases(random.Random(seeds[1]), 12), clock, n=12, call_s=0.0001),
        Model(SpecType.DRAFT_SIMPLE, text, phases(random.Random(seeds[2]), 4), clock, n=4, tok_s=tok_s,
              upkeep_s=tok_s / 2),
        Model(SpecType.DRAFT_MTP, text, phases(random.Random(seeds[3]), 3), clock, n=3, cost_prior=0.9),
    ])


def copy_text(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    """(prompt, reply): the reply copies passages of the prompt, breaks off, writes its own."""
    words = lambda k: [rng.randrange(1000, 30000) for _ in range(k)]  # noqa: E731
    passage = words(rng.randrange(80, 240))
    prompt = words(rng.randrange(10, 60)) + passage + words(rng.randrange(3, 12))
    reply: list[int] = []
    while len(reply) < n:
        kind = rng.random()
        if kind < 0.5:
            a = rng.randrange(len(passage) - 10)
            reply += passage[a:a + rng.randrange(5, 120)]
        elif kind < 0.7 and reply:
            a = rng.randrange(len(reply))
            reply += reply[a:a + rng.randrange(3, 30)]
        else:
            reply += words(rng.randrange(1, 25))
    return prompt, reply[:n]


class Side:
    """One controller (old or new module) and what it is driven with."""

    def __init__(self, mod, make_chain: Callable[[Clock], SpeculatorChain], curve: CostCurve, params: Any):
        self.mod, self.clock = mod, Clock()
        self.chain = make_chain(self.clock)
        self.cost = mod.CostModel(curve, params)
        self.ctl = self._controller(params)
        self.make_chain = make_chain

    def _controller(self, params: Any):
        ctl = self.mod.Controller(self.chain, self.cost, params, clock=self.clock)
        ctl.boundary = lambda t: t % 13 == 0
        ctl.useful = lambda d: len(d) if d[-1] % 29 else len(d) - 1
        return ctl

    def rebuild(self, params: Any) -> None:
        """A new chain on the same cost model (the engine's rebuilt chain)."""
        self.chain = self.make_chain(self.clock)
        self.ctl = self._controller(params)


def decision_key(d) -> tuple:
    return (list(d.draft), d.spec.name if d.spec is not None else None, d.reason, d.n_proposed,
            d.expected_gain, d.probe, d.pos0, d.drafter)


_STATE_FIELDS = ("t_call", "next_probe", "probe_every", "len_typ", "potential", "upkeep_on", "last_active",
                 "missed_in_row", "hopeless", "interval", "t_prior", "t_cold", "n_timed", "probe_s",
                 "known_short", "run", "run_end", "expensive", "by_run", "pausable")


def state_key(st) -> dict:
    d = {f: getattr(st, f) for f in _STATE_FIELDS}
    d["upkeep"] = getattr(st, "upkeep_s", getattr(st, "u_s", None))
    m = st.model
    # (its ``version`` counts changes, compared only for a change: not part of what it knows)
    d["model"] = (list(m.tries), list(m.hits), list(m.tries1), list(m.hits1), m.last_first)
    d["short"] = (st.short.hits, st.short.tries) if st.short is not None else None
    r = st.record
    d["record"] = (r.tokens, r.start, r.scored, r.depth0, r.short) if r is not None else None
    return d


def final_key(side: Side) -> dict:
    ctl = side.ctl
    snap = ctl.snapshot().to_dict()
    return {"snapshot": snap, "states": [state_key(st) for st in ctl.states.values()],
            "rel": list(ctl.cost.rel_table(ctl.params.max_len)), "cost_version": ctl.cost.version,
            "t1": ctl.cost.t1_s, "boundaries": (ctl.boundaries.hits, ctl.boundaries.tries), "step": ctl.step,
            "chain": {s.name: (s.stats.n_gen_drafts, s.stats.n_gen_tokens, s.stats.n_acc_tokens,
                               s.stats.n_call_draft, list(s.stats.n_acc_tokens_per_pos))
                      for s in side.chain.speculators}}


#: the clock steps are timed with (``--time`` reads this thread's CPU time: other work on a busy
#: machine does not count)
TIMER: Callable[[], float] = time.perf_counter


def step(side: Side, ctx: list[int], target: list[int], i: int, n_max: int, rng: random.Random,
         snap_every: int, timer: list[float] | None = None):
    """One engine step on ``side``: decide, verify against ``target[i:]``, observe."""
    ctl = side.ctl
    req = DraftRequest(prompt=ctx[:-1], id_last=ctx[-1], pos0=len(ctx) - 1, n_max=n_max)
    t0 = TIMER()
    d = ctl.decide(req)
    t_dec = TIMER() - t0
    n_acc = 0
    for t in d.draft:
        if i + n_acc >= len(target) - 1 or t != target[i + n_acc]:
            break
        n_acc += 1
    ids = target[i:i + n_acc + 1]
    secs = ctl.t1_s * (1.0 + 0.3 * len(d.draft)) * (0.8 + 0.5 * rng.random())
    side.clock.t += secs
    for s in side.chain.speculators:
        if isinstance(s, Model):
            secs += s.follow(len(d.draft) + 1)
    t0 = TIMER()
    ctl.observe(d, ids, seconds=secs if rng.random() < 0.9 else None)
    t_obs = TIMER() - t0
    if d.draft:
        side.chain.accept(n_acc)
    t_snap = 0.0
    if snap_every and ctl.step % snap_every == 0:
        t0 = TIMER()
        ctl.snapshot()
        t_snap = TIMER() - t0
    if timer is not None:
        timer.append(t_dec + t_obs + t_snap)
    return d, ids


def drive(sides: list[Side], prompt: list[int], reply: list[int], seed: int, snap_every: int = 16,
          room: bool = True) -> list[list[tuple]]:
    """Both sides write ``reply`` after ``prompt``; their decisions, step by step."""
    logs: list[list[tuple]] = []
    for side in sides:
        rng = random.Random(seed)
        side.ctl.begin()
        side.ctl.prepare(prompt[:-1])
        ctx, i, log = list(prompt), 0, []
        while i < len(reply):
            left = len(reply) - i - 1
            n_max = -1 if rng.random() < 0.3 else min(rng.choice((0, 3, 8, 16, 64)), left) if room else left
            d, ids = step(side, ctx, reply, i, n_max, rng, snap_every)
            log.append(decision_key(d))
            ctx += ids
            i += len(ids)
        logs.append(log)
    return logs


def compare(name: str, a: Any, b: Any) -> None:
    if a != b:
        if isinstance(a, list) and isinstance(b, list):
            for j, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    raise AssertionError(f"{name}: first difference at {j}: {x} != {y}")
        raise AssertionError(f"{name}: {a} != {b}")


def check_scripted(old, seed: int, steps: int) -> int:
    rng = random.Random(seed)
    text = [rng.randrange(5, 400) for _ in range(steps * 3 + 200)]
    curve = CostCurve({k: 1.0 + 0.22 * k + 0.01 * k * k for k in range(65)})
    curve.t1_s = 0.0007
    params = new_mod.ControllerParams(probe_every=8, probe_every_early=2, probe_every_hopeless=32)
    params_old = old.ControllerParams(**vars(params))
    sides = [Side(old, lambda c: scripted_chain(seed, text, c), curve, params_old),
             Side(new_mod, lambda c: scripted_chain(seed, text, c), curve, params)]
    n = 0
    for turn in range(3):
        start = 50 + turn * steps
        prompt, reply = text[:start], text[start:start + steps]
        a, b = drive(sides, prompt, reply, seed * 100 + turn)
        compare(f"scripted seed {seed} turn {turn} decisions", a, b)
        n += len(a)
        if turn == 1:
            sides[0].rebuild(params_old)
            sides[1].rebuild(params)
    compare(f"scripted seed {seed} final", final_key(sides[0]), final_key(sides[1]))
    return n


def auto_chain(_clock: Clock) -> SpeculatorChain:
    return SpeculatorChain.from_params(SpecParams.auto())


def check_copy(old, seed: int, steps: int) -> int:
    rng = random.Random(seed)
    curve = CostCurve({0: 1.0, 1: 1.8, 2: 2.1, 4: 3.1, 8: 4.3, 16: 6.7, 32: 11.2, 48: 16.0, 64: 21.0})
    curve.t1_s = 0.0007
    params = new_mod.ControllerParams(online_cost=seed % 2 == 0)
    params_old = old.ControllerParams(**vars(params))
    sides = [Side(old, auto_chain, curve, params_old), Side(new_mod, auto_chain, curve, params)]
    n, history = 0, []
    for turn in range(3):
        prompt, reply = copy_text(rng, steps)
        prompt = history + prompt
        a, b = drive(sides, prompt, reply, seed * 100 + turn, room=turn != 1)
        compare(f"copy seed {seed} turn {turn} decisions", a, b)
        n += len(a)
        history = prompt + reply
    compare(f"copy seed {seed} final", final_key(sides[0]), final_key(sides[1]))
    return n


def timed(mod, chain_of: Callable[[], SpeculatorChain], prompt: list[int], reply: list[int], snap_every: int,
          repeat: int = 5) -> tuple[float, float]:
    """(median, mean) microseconds per step of ``decide`` + ``observe`` (+ ``snapshot`` every
    ``snap_every`` steps), the drafters' own calls left out, while ``mod``'s controller writes
    ``reply`` after ``prompt``; the best of ``repeat`` runs."""
    best: tuple[float, float] | None = None
    for _ in range(repeat):
        curve = CostCurve({k: 1.0 + 0.25 * k for k in range(65)})
        curve.t1_s = 0.0007
        side = Side.__new__(Side)
        side.mod, side.clock, side.chain = mod, Clock(), chain_of()
        side.cost = mod.CostModel(curve, mod.ControllerParams())
        side.ctl = mod.Controller(side.chain, side.cost, mod.ControllerParams(), clock=side.clock)
        rng, times, in_drafters = random.Random(0), [], [0.0]
        ask = side.chain.ask

        def timed_ask(spec, req, ask=ask, acc=in_drafters):
            t0 = TIMER()
            try:
                return ask(spec, req)
            finally:
                acc[0] += TIMER() - t0
        side.chain.ask = timed_ask
        side.ctl.begin()
        side.ctl.prepare(prompt[:-1])
        side.chain.begin(prompt[:-1])
        ctx, i = list(prompt), 0
        while i < len(reply):
            in_drafters[0] = 0.0
            _, ids = step(side, ctx, reply, i, -1, rng, snap_every, times)
            times[-1] -= in_drafters[0]     # the drafters' own work is not the controller's
            ctx += ids
            i += len(ids)
        res = (statistics.median(times) * 1e6, statistics.mean(times) * 1e6)
        best = res if best is None or res[0] < best[0] else best
    return best


def right_lookups(text: list[int]) -> SpeculatorChain:
    """Five cheap drafters that always propose the true continuation of ``text`` (their own work
    next to nothing: what a step costs is the controller's)."""
    types = (SpecType.NGRAM_SIMPLE, SpecType.NGRAM_MAP_K, SpecType.NGRAM_MAP_K4V, SpecType.NGRAM_MOD,
             SpecType.NGRAM_CACHE)
    return SpeculatorChain([Lookup(t, text, lambda: 64, Clock(), n=64) for t in types])


def time_both(old, snap_every: int) -> None:
    """Old and new controller, per step, on: nothing to propose; one n-gram drafter on a long copy;
    Automatic's drafters on a long copy."""
    rng = random.Random(5)
    words = lambda k: [rng.randrange(1000, 30000) for _ in range(k)]  # noqa: E731
    fresh_prompt, fresh = words(300), words(1500)
    passage = words(6000)
    copy_prompt = words(50) + passage + words(5)
    cases = [("nothing proposes (Automatic, fresh text)", lambda: auto_chain(Clock()), fresh_prompt, fresh),
             ("one n-gram drafter, long copy",
              lambda: SpeculatorChain.from_params(SpecParams.from_types("ngram-simple")), copy_prompt, passage),
             ("Automatic, long copy", lambda: auto_chain(Clock()), copy_prompt, passage),
             ("five scripted lookups, always right, long copy", lambda: right_lookups(copy_prompt + passage),
              copy_prompt, passage)]
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"load average {load}; median (mean) us of CPU time per step, snapshot every {snap_every} steps")
    gc.disable()     # (a collection of everything else the process holds would land on one step)
    try:
        for name, chain_of, prompt, reply in cases:
            runs = [(timed(old, chain_of, prompt, reply, snap_every, 1),
                     timed(new_mod, chain_of, prompt, reply, snap_every, 1)) for _ in range(5)]
            o, n = min(r[0] for r in runs), min(r[1] for r in runs)     # old and new taken in turn
            print(f"  {name}: old {o[0]:.1f} ({o[1]:.1f}), new {n[0]:.1f} ({n[1]:.1f})")
    finally:
        gc.enable()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rev", default=None, help="the commit to read the old module from (default: the "
                                                 "newest that has speculators/controller.py)")
    ap.add_argument("--time", action="store_true", help="time old and new per step instead of comparing")
    ap.add_argument("--snap-every", type=int, default=16, help="steps between snapshots when timing")
    args = ap.parse_args()
    old = load_old(args.rev)
    if args.time:
        global TIMER
        TIMER = time.thread_time
        time_both(old, args.snap_every)
        return 0
    total = 0
    for seed in range(args.seeds):
        total += check_scripted(old, seed, args.steps)
        total += check_copy(old, seed, args.steps)
    print(f"same: {total} decisions over {args.seeds} seeds (scripted and copy scenarios), and the final "
          f"statistics, speculator states and cost tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
