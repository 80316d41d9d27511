"""The plan: the seeded sequence of actions and faults, drawn before anything runs (the same seed
gives the same steps). Pure: no tmux, no app.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


#: how often each action is drawn (most are cheap keys; the Lab, a static build and a restart take
#: seconds each: fewer of those, so that 300 actions and 30 faults take a few minutes)
ACTIONS: dict[str, float] = {
    "send": 20, "esc": 8, "new_chat": 6, "f2_resume": 8, "f2_close": 3, "f3_change": 4, "f3_cancel": 3,
    "f4": 7, "f5": 2, "f6": 2, "help": 2, "palette": 2, "type": 5, "lab": 2.5, "static_build": 2.5,
    "quit_restart": 2,
}
FAULTS: dict[str, float] = {"runner_death": 40, "runner_stop": 20, "disk_full": 20, "db_lock": 20}
WORDS = ("apple", "river", "seven", "green", "lamp", "north", "piano", "cloud", "tiger", "salt", "maple",
         "orbit", "candle", "pepper", "window", "garden")


@dataclass
class Step:
    index: int
    kind: str
    fault: bool
    params: dict = field(default_factory=dict)

    def label(self) -> str:
        ps = " ".join(f"{k}={v}" for k, v in self.params.items())
        return ("fault " if self.fault else "") + self.kind + (f" {ps}" if ps else "")


def make_plan(seed: int, n_actions: int, n_faults: int) -> list[Step]:
    """The run's steps: ``n_actions`` actions and ``n_faults`` faults, drawn from ``seed`` alone.

    >>> plan = make_plan(3, 40, 8)
    >>> len(plan), sum(s.fault for s in plan), plan[0].kind
    (48, 8, 'send')
    >>> [s.label() for s in plan] == [s.label() for s in make_plan(3, 40, 8)]
    True
    >>> import collections
    >>> sorted(collections.Counter(s.kind for s in plan if s.fault).items())
    [('db_lock', 1), ('disk_full', 2), ('runner_death', 3), ('runner_stop', 2)]
    >>> sigs = [s.params["signal"] for s in plan if s.kind == "runner_death"]
    >>> all(a != b for a, b in zip(sigs, sigs[1:]))
    True
    """
    rng = random.Random(seed)
    total = n_actions + n_faults
    lead = min(3, n_actions)          # a message first: faults on a chat that has one
    if n_faults > total - lead:
        raise ValueError("too many faults for so few actions")
    fault_at = set(rng.sample(range(lead, total), n_faults))
    # each kind its share of the faults (largest remainders round), in a shuffled order
    total_w = sum(FAULTS.values())
    shares = {k: n_faults * w / total_w for k, w in FAULTS.items()}
    counts = {k: int(v) for k, v in shares.items()}
    for k in sorted(shares, key=lambda k: counts[k] - shares[k])[:n_faults - sum(counts.values())]:
        counts[k] += 1
    kinds = [k for k, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    sig_next = rng.choice(["SIGSEGV", "SIGKILL"])
    steps: list[Step] = []
    for i in range(total):
        if i in fault_at:
            kind = kinds.pop()
            p: dict[str, Any] = {}
            if kind == "runner_death":
                p = {"signal": sig_next, "during_reply": rng.random() < 0.5}
                sig_next = "SIGKILL" if sig_next == "SIGSEGV" else "SIGSEGV"
            elif kind == "runner_stop":
                p = {"hold": round(rng.uniform(1.5, 3.0), 1), "during_reply": rng.random() < 0.5,
                     "then": rng.choice(["nothing", "esc", "f4", "send", "f2_close"])}
            elif kind == "disk_full":
                p = {"steps": rng.randint(2, 4), "word": rng.choice(WORDS)}
            elif kind == "db_lock":
                p = {"hold": round(rng.uniform(2.0, 4.5), 1), "word": rng.choice(WORDS)}
            steps.append(Step(i, kind, True, p))
            continue
        kind = "send" if i == 0 else rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        p = {}
        if kind == "send":
            p = {"wait": i == 0 or rng.random() < 0.35, "word": rng.choice(WORDS)}
        elif kind == "f2_resume":
            p = {"down": rng.randint(0, 3)}
        elif kind == "lab":
            p = {"run_for": round(rng.uniform(0.3, 2.0), 1)}
        elif kind == "static_build":
            p = {"cancel": rng.random() < 0.5}
        elif kind == "type":
            p = {"word": rng.choice(WORDS)}
        steps.append(Step(i, kind, False, p))
    return steps


# ---------------------------------------------------------------------------
# reading the screen
# ---------------------------------------------------------------------------
