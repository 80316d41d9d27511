"""Drafting simulated over a known text, as ``llama-lookup-stats`` does (``lookup stats``).

Holds :class:`SimStats` and :func:`simulate_drafting`. Pure computation on caches
given to it (the dynamic cache is copied, never changed); touches no file.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from speculators.ngram_cache import NGRAM_MAX, NGRAM_MIN, N_DRAFT, NgramCache, ngram_cache_draft

@dataclass
class SimStats:
    """What ``lookup stats`` reports (llama-lookup-stats' numbers)."""

    n_draft: int
    n_ctx: int
    n_input: int
    n_predict: int
    n_drafted: int
    n_accept: int
    t_draft_ms: float

    @property
    def accept_rate(self) -> float | None:
        return self.n_accept / self.n_drafted if self.n_drafted else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accept_rate"] = self.accept_rate
        return d


def simulate_drafting(tokens: Sequence[int], static: NgramCache | None = None, dynamic: NgramCache | None = None,
                      n_draft: int = N_DRAFT, n_ctx: int = 4096, include_tail: bool = True,
                      progress: Callable[[int, int, str], None] | None = None) -> SimStats:
    """``llama-lookup-stats``: drafting simulated over a known text.

    The text is cut into chunks of ``n_ctx`` tokens; each is "generated"
    token by token from its first token, drafting with
    :func:`~speculators.ngram_cache.ngram_cache_draft` (context, dynamic and
    static caches) and accepting the drafted tokens that match the text;
    after each chunk the context cache is merged into the dynamic cache and
    cleared. ``dynamic`` itself is not changed (a copy is used).

    llama.cpp skips the last, partial chunk (and so any text shorter than
    its context); ``include_tail=True`` (the default here) simulates it too.

    >>> simulate_drafting([1, 2, 3] * 4, n_ctx=64).n_accept
    6
    """
    tokens = [int(t) for t in tokens]
    static = static if static is not None else NgramCache()
    dyn = dynamic.copy() if dynamic is not None else NgramCache()
    n_input = len(tokens)
    n_drafted = n_accept = n_predict = 0
    t_draft = 0.0
    i_start = 0
    while True:
        if include_tail:
            if i_start >= n_input:
                break
        elif not i_start + n_ctx < n_input:
            break
        inp = tokens[i_start:i_start + n_ctx]
        L = len(inp)
        ctx = NgramCache()
        pseudo = [inp[0]]
        while len(pseudo) < L:
            t0 = time.perf_counter()
            draft = ngram_cache_draft(pseudo, [pseudo[-1]], n_draft, NGRAM_MIN, NGRAM_MAX, ctx, dyn, static)
            t_draft += time.perf_counter() - t0
            n_drafted += len(draft) - 1
            for j in range(1, len(draft)):
                if len(pseudo) >= L or inp[len(pseudo)] != draft[j]:
                    break
                n_accept += 1
                pseudo.append(inp[len(pseudo)])
                ctx.update(pseudo, NGRAM_MIN, NGRAM_MAX, 1)
            if len(pseudo) < L:
                pseudo.append(inp[len(pseudo)])
                ctx.update(pseudo, NGRAM_MIN, NGRAM_MAX, 1)
        n_predict += L
        dyn.merge(ctx)
        i_start += n_ctx
        if progress is not None:
            progress(min(i_start, n_input), n_input, "simulate")
    return SimStats(n_draft, n_ctx, n_input, n_predict, n_drafted, n_accept, t_draft * 1000)
