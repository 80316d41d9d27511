"""Context shift: a reply that reaches the end of the context keeps going.

When the target's context is full in the middle of a reply, llama-server
(``server-context.cpp``, ``pre_decode``) keeps the first ``n_keep`` tokens,
discards half of the rest and moves the positions of what follows down, so
that generation goes on without decoding anything again::

    before   [ keep (n_keep) | discard (n_discard) | rest ........ ]  n_ctx tokens
    after    [ keep (n_keep) | rest ........ | free ......         ]

* ``llama_memory_seq_rm(n_keep, n_keep + n_discard)`` drops the cells of
  the discarded tokens and ``llama_memory_seq_add(n_keep + n_discard, end,
  -n_discard)`` moves the positions of the rest (llama.cpp re-rotates the
  cached keys, the "K-shift", at the next decode). This is the ``shift``
  mode: its cost is one pass over the cache, not a decode.
* Where the memory cannot do that - ``llama_memory_can_shift`` says no
  (a sliding-window cache smaller than the full one, multi-position RoPE),
  or the model is recurrent or hybrid (a recurrent state summarises every
  token it has seen and cannot forget the discarded ones) - the memory is
  cleared and the kept tokens are decoded again (``redecode`` mode).

Both keep the same tokens, so the generation loop and every speculator go
on from the same token history; they are not numerically the same (a
shifted cache still carries what the kept tokens computed while the
discarded ones were there, a re-decoded one does not), so the engine never
mixes them within one reply.

The speculators follow the cut through :func:`follow_shift`: the n-gram
drafters see the kept history as a new prompt (their indexes hold
positions), ngram-cache keeps its position-free counts, and draft-simple
shifts (or re-decodes) its own draft context the same way. Hidden-state
drafters (draft-mtp, draft-eagle3, draft-dflash) would need the target's
hidden states of the kept tokens after the cut, which a shift does not
recompute: with them in the chain the reply ends at the context limit, as
it did before context shift existed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import llama_cpp as lc

__all__ = ["MODE_SHIFT", "MODE_REDECODE", "ShiftRecord", "plan_shift", "cut_tokens", "memory_can_shift",
           "shift_memory", "speculator_can_follow", "chain_blockers", "follow_shift", "shift_context"]

#: positions moved in place (no decode)
MODE_SHIFT = "shift"
#: memory cleared and the kept tokens decoded again
MODE_REDECODE = "redecode"


@dataclass(frozen=True)
class ShiftRecord:
    """One context shift during a generation.

    ``n_before`` tokens were in the context; the first ``n_keep`` were kept,
    the next ``n_discard`` dropped; ``n_reply`` tokens of the reply had been
    produced when it happened; ``seconds`` is the time the shift itself
    took (memory and speculators, not the next decode).
    """

    n_before: int
    n_keep: int
    n_discard: int
    mode: str
    seconds: float
    n_reply: int = 0

    @property
    def n_after(self) -> int:
        return self.n_before - self.n_discard

    def to_dict(self) -> dict:
        return {"n_before": self.n_before, "n_keep": self.n_keep, "n_discard": self.n_discard,
                "n_after": self.n_after, "mode": self.mode, "seconds": self.seconds, "n_reply": self.n_reply}


def plan_shift(n_tokens: int, n_ctx: int, n_keep: int = 0, n_discard: int = 0) -> tuple[int, int]:
    """``(n_keep, n_discard)`` for a context holding ``n_tokens``, as llama-server computes them.

    ``n_keep`` is capped at ``n_ctx - 4``; ``n_discard`` (0: half of what
    follows the kept tokens) leaves at least one token after the cut.

    >>> plan_shift(256, 256, n_keep=10)
    (10, 123)
    >>> plan_shift(256, 256, n_keep=1000)       # capped: a few tokens still go
    (252, 2)
    >>> plan_shift(256, 256, n_keep=0, n_discard=500)
    (0, 255)
    """
    if n_keep < 0:
        raise ValueError("n_keep must be 0 or more")
    n_keep = min(n_keep, max(0, n_ctx - 4), n_tokens)
    n_left = n_tokens - n_keep
    n_discard = n_discard if n_discard > 0 else n_left // 2
    n_discard = max(0, min(n_discard, n_left - 1))
    return n_keep, n_discard


def cut_tokens(tokens: Sequence[int], n_keep: int, n_discard: int) -> list[int]:
    """The tokens left after the cut.

    >>> cut_tokens([1, 2, 3, 4, 5, 6, 7], 1, 3)
    [1, 5, 6, 7]
    """
    return list(tokens[:n_keep]) + list(tokens[n_keep + n_discard:])


def memory_can_shift(ctx, model) -> bool:
    """Whether ``ctx``'s memory can drop a middle range and move positions (no re-decode)."""
    if model.is_recurrent or model.is_hybrid:
        return False
    if not getattr(ctx, "mem", None):
        return False
    return bool(lc.llama_memory_can_shift(ctx.mem))


def shift_memory(ctx, model, tokens: Sequence[int], n_keep: int, n_discard: int,
                 redecode: bool = False) -> str:
    """Cut ``tokens`` (what sequence 0 of ``ctx`` holds at positions 0..) in the memory.

    Returns the mode used. The memory then holds :func:`cut_tokens` at
    positions 0..; nothing is decoded in ``shift`` mode, and in ``redecode``
    mode the kept tokens are decoded without logits (the next token to
    decode is already known). ``redecode=True`` forces that mode.
    """
    n = len(tokens)
    if n_discard <= 0:
        return MODE_SHIFT
    if not redecode and memory_can_shift(ctx, model):
        if lc.llama_memory_seq_rm(ctx.mem, 0, n_keep, n_keep + n_discard):
            lc.llama_memory_seq_add(ctx.mem, 0, n_keep + n_discard, n, -n_discard)
            return MODE_SHIFT
    kept = cut_tokens(tokens, n_keep, n_discard)
    ctx.clear()
    if kept:
        ctx.decode(kept, 0, logits="none")
    return MODE_REDECODE


# -- the speculators ------------------------------------------------------------------

def _hook(spec):
    """The speculator's own ``shift`` hook, when its class defines one."""
    fn = getattr(spec, "shift", None)
    return fn if callable(fn) else None


def speculator_can_follow(spec) -> bool:
    """Whether ``spec`` can follow a context shift and stay consistent."""
    flag = getattr(spec, "can_shift", None)
    if isinstance(flag, bool):
        return flag
    return spec.type.value in _FALLBACKS


def chain_blockers(chain) -> list[str]:
    """Names of the chain's speculators that cannot follow a shift (empty: all can)."""
    if chain is None:
        return []
    return [s.name for s in chain.speculators if not speculator_can_follow(s)]


def follow_shift(chain, history: Sequence[int], n_keep: int, n_discard: int) -> None:
    """Tell every speculator that the target's context now holds ``history``.

    ``history`` is what the target holds after the cut (positions 0..);
    ``n_keep``/``n_discard`` describe the cut. Call :func:`chain_blockers`
    first: a speculator that cannot follow is left alone here.
    """
    if chain is None:
        return
    history = list(history)
    for s in chain.speculators:
        if not speculator_can_follow(s):
            continue
        t0 = time.perf_counter()
        fn = _hook(s)
        if fn is not None:
            fn(history, n_keep, n_discard)
        else:
            _FALLBACKS[s.type.value](s, history, n_keep, n_discard)
        s.stats.t_begin_us += (time.perf_counter() - t0) * 1e6


def shift_context(ctx, model, tokens: Sequence[int], n_keep: int, n_discard: int, chain=None,
                  redecode: bool = False) -> tuple[list[int], str]:
    """Cut the target's memory and bring the chain in step; returns (kept tokens, mode)."""
    mode = shift_memory(ctx, model, tokens, n_keep, n_discard, redecode=redecode)
    kept = cut_tokens(tokens, n_keep, n_discard)
    follow_shift(chain, kept, n_keep, n_discard)
    return kept, mode


# -- how each built-in speculator follows a shift (used when its class has no hook) --------

def _shift_ngram_simple(s, history, n_keep, n_discard) -> None:
    s.begin(history)


def _shift_ngram_map(s, history, n_keep, n_discard) -> None:
    # key and value positions index the history: start again from the kept tokens
    from .ngram_map import NgramMapState
    old = s.map
    s.map = NgramMapState(old.size_key, old.size_value, old.key_only, old.min_hits, len(old.key_map))
    s.begin(history)


def _shift_ngram_mod(s, history, n_keep, n_discard) -> None:
    # the table maps n-grams to next tokens (no positions); re-index the kept history
    s.begin(history)


def _shift_ngram_cache(s, history, n_keep, n_discard) -> None:
    # the counts hold no positions; what the context cache has not counted yet (the last step's
    # accepted tokens, at the end) moves down with the kept tokens and is counted at the next draft
    seen = s.cache_size - n_discard if s.cache_size > n_keep + n_discard else min(s.cache_size, n_keep)
    s.cache_size = max(0, min(len(history), seen))
    s._last_sources = []


def _shift_draft_simple(s, history, n_keep, n_discard) -> None:
    s._last_batch = None
    kv = s.kv
    old = s.target
    s.target = list(history)
    # the draft context mirrors the target; cut it the same way where it is in step
    ctx = s.ctx
    end = n_keep + n_discard
    if len(kv) > end and kv[:end] == old[:end] and not s.use_checkpoints:
        try:
            mode = shift_memory(ctx, s.model, kv, n_keep, n_discard)
        except Exception:
            ctx.clear()
            kv.clear()
        else:
            s.kv = cut_tokens(kv, n_keep, n_discard)
            if mode == MODE_REDECODE:
                s.n_process_tokens += len(s.kv)
    else:
        ctx.clear()
        kv.clear()
    if getattr(s, "upkeep", True):
        s._sync(s.target)
    # paused (Automatic found it does not pay): what the draft context lacks is decoded in the
    # catch-up before its next draft, if it is ever asked again, not on every shift


_FALLBACKS = {
    "ngram-simple": _shift_ngram_simple,
    "ngram-map-k": _shift_ngram_map,
    "ngram-map-k4v": _shift_ngram_map,
    "ngram-mod": _shift_ngram_mod,
    "ngram-cache": _shift_ngram_cache,
    "draft-simple": _shift_draft_simple,
}
