"""The verify-cost curve: what a batch of n+1 tokens costs next to one token.

Speculation pays only when the tokens a draft brings in outweigh the wider
verify batch it needs. How much wider costs depends on the model, the
device and the thread count, so the curve is measured, once, on the real
context: batches of 2, 3, 4, ... tokens are decoded after a short prefix
(with logits for every row, and every row sampled, as a verify step does),
each right after a one-token batch; the median of a few such paired
ratios counts, so a busy machine moves it little. ``rel(n)`` is the time
of a batch of ``n + 1`` tokens over the time of one token
(``rel(0) == 1``).

The measurement is kept in a small JSON file per model file (path, size,
modification time), device/backend, thread count and GPU layers, so later
starts reuse it. A curve measured while something else held the machine
shows it later: its one-token time is well above the one-token steps the
engine then times (:meth:`speculators.controller.CostModel.observe`); the
file is then marked stale (:func:`mark_stale`) and measured again at the
next load. A file that is corrupt, from an older format or about
another model is measured again and overwritten (atomically); nothing
here ever stops a model from loading.

>>> c = CostCurve({0: 1.0, 1: 1.1, 3: 1.5})
>>> round(c.rel(2), 3), round(c.rel(5), 3)      # interpolated, then extrapolated
(1.3, 1.9)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .ngram_cache import atomic_write

FORMAT = 1
#: the batch sizes (draft lengths n; batches of n + 1) measured at load
MEASURE_LENGTHS: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: rounds per size (the median ratio counts); rounds after the second stop once the budget is spent
MEASURE_ROUNDS = 5
MEASURE_BUDGET_S = 1.5
_PREFIX_TEXT = ("The lighthouse keeper climbed the steps every evening and wrote down the weather, "
                "the ships he saw and the colour of the sea.")


@dataclass
class CostCurve:
    """Relative verify cost by draft length; see the module docstring."""

    #: draft length n -> time(batch of n + 1) / time(batch of 1)
    points: dict[int, float]
    #: seconds of a one-token verify step when measured (None: unknown)
    t1_s: float | None = None
    #: "measured", "cached" or "given"
    source: str = "given"
    #: how long the measurement took (s); 0 when read from the cache
    measure_s: float = 0.0
    #: the cache file it was read from or saved to (None: not cached)
    cache_path: str | None = field(default=None, repr=False, compare=False)
    _xs: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        pts = {int(k): float(v) for k, v in self.points.items()}
        pts[0] = 1.0
        self.points = pts
        self._xs = sorted(pts)

    def rel(self, n: int) -> float:
        """Cost of verifying a draft of ``n`` tokens, in one-token steps."""
        if n <= 0:
            return 1.0
        xs, p = self._xs, self.points
        if n in p:
            return p[n]
        if n > xs[-1]:
            if len(xs) < 2:
                return 1.0 + 0.1 * n
            a, b = xs[-2], xs[-1]
            slope = max(0.0, (p[b] - p[a]) / (b - a))
            return p[b] + slope * (n - b)
        lo = max(x for x in xs if x < n)
        hi = min(x for x in xs if x > n)
        return p[lo] + (p[hi] - p[lo]) * (n - lo) / (hi - lo)

    @property
    def max_measured(self) -> int:
        return self._xs[-1]

    def to_list(self, n_max: int = 16) -> list[float]:
        return [round(self.rel(n), 4) for n in range(n_max + 1)]

    def to_dict(self) -> dict[str, Any]:
        return {"points": {str(k): v for k, v in sorted(self.points.items())}, "t1_s": self.t1_s,
                "source": self.source, "measure_s": self.measure_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CostCurve":
        pts = d["points"]
        if not isinstance(pts, dict) or not pts:
            raise ValueError("no points")
        points = {int(k): float(v) for k, v in pts.items()}
        for k, v in points.items():
            if k < 0 or not (0.5 <= v < 1e4) or v != v:
                raise ValueError(f"bad point {k}: {v}")
        t1 = d.get("t1_s")
        return cls(points, float(t1) if t1 is not None else None, str(d.get("source", "given")))


# -- measuring ---------------------------------------------------------------

def measure(ctx, model, lengths: tuple[int, ...] = MEASURE_LENGTHS, rounds: int = MEASURE_ROUNDS,
            sample=None, budget_s: float = MEASURE_BUDGET_S) -> CostCurve:
    """Time verify batches on ``ctx`` (its KV cache is cleared afterwards).

    Each wider batch is timed right after a one-token batch and the two
    times are divided: a ratio taken back to back is little moved by the
    rest of a busy machine, and the median of the rounds' ratios counts.
    ``sample(ctx, i)`` samples output row ``i`` (default: numpy argmax, as
    greedy verification does).
    """
    import numpy as np

    if sample is None:
        def sample(c, i):
            return int(np.argmax(c.logits(i)))
    t_start = time.perf_counter()
    prefix = model.tokenize(_PREFIX_TEXT, add_special=True, parse_special=False)[:32]
    n_ctx = ctx.n_ctx
    lengths = tuple(n for n in lengths if n > 0 and len(prefix) + n + 1 < n_ctx and n + 1 <= ctx.n_batch)
    tok = prefix[-1]
    pos = len(prefix)

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        ctx.decode([tok] * (n + 1), pos, logits="all" if n else "last")
        if n:
            for i in range(n + 1):
                sample(ctx, i)
        else:
            sample(ctx, -1)
        dt = time.perf_counter() - t0
        if not ctx.seq_rm(pos, -1):
            ctx.clear()
            ctx.decode(prefix, 0, logits="last")
        return dt

    ratios: dict[int, list[float]] = {n: [] for n in lengths}
    ones: list[float] = []
    ctx.clear()
    ctx.decode(prefix, 0, logits="last")
    try:
        timed(0)  # warm-up: the first decode after a clear pays for allocations
        for r in range(max(1, rounds)):
            if r > 1 and time.perf_counter() - t_start > budget_s:
                break
            for n in lengths:
                t1 = timed(0)
                tn = timed(n)
                ones.append(t1)
                ratios[n].append(tn / t1 if t1 > 0 else 1.0)
    finally:
        ctx.clear()
    points = {0: 1.0, **{n: float(np.median(v)) for n, v in ratios.items() if v}}
    t1 = float(np.median(ones)) if ones else None
    return CostCurve(clean_points(points), t1, "measured", time.perf_counter() - t_start)


def clean_points(points: dict[int, float]) -> dict[int, float]:
    """Physical bounds on timer noise: a batch of n + 1 tokens costs at least one token
    and at most n + 1 separate ones, and a wider batch never less than a narrower one.

    >>> clean_points({0: 1.0, 1: 0.9, 2: 1.4, 4: 30.0, 8: 3.0})
    {0: 1.0, 1: 1.0, 2: 1.4, 4: 3.0, 8: 3.0}
    """
    out = {n: min(max(1.0, float(v)), n + 1.0) for n, v in points.items()}
    out[0] = 1.0
    # isotonic from above: a point above a wider batch's cost is noise
    run = float("inf")
    for n in sorted(out, reverse=True):
        run = min(run, out[n])
        out[n] = run
    return {n: out[n] for n in sorted(out)}


# -- the cache -----------------------------------------------------------------

def device_key(model_path: str, n_threads: int | None, n_gpu_layers: int,
               placement: dict[str, Any] | None = None, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the curve depends on: the model file, the build/device, threads, GPU layers, where
    the layers are (``placement``: the devices, RPC servers' included, the split; a verify over a
    network costs what the network costs), and how the context was made where that changes a
    verify's cost (``context``: a hybrid target's recurrent-state snapshots, kept for every
    token of a batch)."""
    st = os.stat(model_path)
    backend = ""
    try:
        import llama_cpp as lc
        info = lc.llama_print_system_info()
        backend = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
        backend += f"|gpu_offload={int(bool(lc.llama_supports_gpu_offload()))}"
        backend += f"|llama_cpp={getattr(lc, '__version__', '?')}"
    except Exception:  # pragma: no cover - a build without these symbols
        pass
    return {"format": FORMAT, "model": os.path.realpath(model_path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "backend": backend, "n_threads": n_threads,
            "n_gpu_layers": n_gpu_layers, **({"placement": placement} if placement else {}),
            **({"context": context} if context else {})}


def cache_file(cache_dir: str | os.PathLike, key: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(os.fspath(cache_dir), f"costcurve-{digest}.json")


def load_cached(path: str, key: dict[str, Any]) -> CostCurve | None:
    """The cached curve for ``key``, or None (missing, corrupt or foreign file)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("key") != key or data.get("stale"):
            return None
        curve = CostCurve.from_dict(data["curve"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    curve.source = "cached"
    curve.measure_s = 0.0
    curve.cache_path = path
    return curve


def mark_stale(path: str, observed_t1_s: float) -> bool:
    """Mark a cached curve to be measured again at the next load (atomically; the file is kept,
    with the one-token time that showed it wrong). False when it cannot be written."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            return False
        data["stale"] = {"observed_t1_s": observed_t1_s, "at": time.time()}
        atomic_write(path, json.dumps(data, indent=1).encode("utf-8"))
    except (OSError, ValueError):
        return False
    return True


def save_cached(path: str, key: dict[str, Any], curve: CostCurve) -> bool:
    """Write atomically (temp file + rename); False when the folder is unusable."""
    d = os.path.dirname(path) or "."
    try:
        os.makedirs(d, exist_ok=True)
        data = json.dumps({"key": key, "curve": {**curve.to_dict(), "source": "measured"}}, indent=1)
        atomic_write(path, data.encode("utf-8"))
    except OSError:
        return False
    return True


def curve_for(ctx, model, model_path: str, n_threads: int | None, n_gpu_layers: int,
              cache_dir: str | os.PathLike | None, placement: dict[str, Any] | None = None,
              context: dict[str, Any] | None = None) -> CostCurve:
    """The cached curve for this model and device, or a fresh measurement (then cached)."""
    key = path = None
    if cache_dir is not None:
        try:
            key = device_key(model_path, n_threads, n_gpu_layers, placement, context)
            path = cache_file(cache_dir, key)
        except OSError:
            key = path = None
        if path is not None:
            cached = load_cached(path, key)
            if cached is not None:
                return cached
    curve = measure(ctx, model)
    if path is not None and key is not None and save_cached(path, key, curve):
        curve.cache_path = path
    return curve
