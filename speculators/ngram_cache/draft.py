"""The drafting rule of llama.cpp's lookup caches: ``common_ngram_cache_draft`` with its lax
(context, static) and strict (dynamic) thresholds, C ``int`` arithmetic and libstdc++ tie-breaks.
Reads n-gram maps; changes none."""

from __future__ import annotations

from typing import Sequence

from .keys import _INT32_MAX, _INT32_MIN, _PAD, _U32, LLAMA_TOKEN_NULL, NGRAM_MAX, NGRAM_STATIC
from .stl_order import _part_order
from .table import NgramCache

# If the sample size or the share of the best candidate is below these,
# the n-gram is skipped (index: position in the list of n-gram sizes,
# i.e. n-gram size - ngram_min). Context cache: lax; dynamic: strict;
# static (2-grams, index NGRAM_STATIC - 1): lax.
DRAFT_MIN_SAMPLE_SIZE_LAX = (2, 2, 1, 1)
DRAFT_MIN_PERCENT_LAX = (66, 50, 50, 50)
DRAFT_MIN_SAMPLE_SIZE_STRICT = (4, 3, 2, 2)
DRAFT_MIN_PERCENT_STRICT = (75, 66, 66, 66)

#: what drafted each token, as recorded by ``_draft_tail(..., sources=[])``
SOURCE_CONTEXT, SOURCE_DYNAMIC, SOURCE_STATIC = 0, 1, 2
SOURCE_NAMES = ("context", "dynamic", "static")

_EMPTY: dict[int, int] = {}


def _wrap32(x: int) -> int:
    """``x`` as a two's-complement int32, as C++ ``int`` arithmetic wraps in practice."""
    if _INT32_MIN <= x <= _INT32_MAX:
        return x
    return ((x - _INT32_MIN) & _U32) + _INT32_MIN


def _try_draft_primary(nc: dict, ngrams: list, part_static: dict,
                       min_sample_size: Sequence[int], min_percent: Sequence[int]) -> int:
    """``try_draft`` for the context/dynamic cache, weighed by the static counts."""
    for i in range(len(ngrams) - 1, -1, -1):
        key = ngrams[i]
        if key is None:
            continue
        part = nc.get(key)
        if part is None:
            continue
        best = 0          # max_count_primary * max_count_static
        best_cp = 0       # max_count_primary
        best_tok = LLAMA_TOKEN_NULL
        total = 0
        tie = False
        for tok, cp in part.items():
            cs = part_static.get(tok)
            cs = 1 if cs is None else _wrap32(100 * cs)
            prod = _wrap32(cp * cs)
            if prod > best:
                best, best_cp, best_tok, tie = prod, cp, tok, False
            elif prod == best and prod > 0:
                tie = True
            total += cp
        total = _wrap32(total)
        if total < min_sample_size[i]:
            continue
        threshold = _wrap32(min_percent[i] * total)
        if tie:
            # Equal scores: llama.cpp keeps the first met in its map's
            # iteration order. Only look it up when it can matter.
            def score(tok: int) -> int:
                cs = part_static.get(tok)
                return _wrap32(part[tok] * (1 if cs is None else _wrap32(100 * cs)))
            tied = [t for t in part if score(t) == best]
            if any(_wrap32(100 * part[t]) >= threshold for t in tied):
                best_tok = next(t for t in _part_order(part) if score(t) == best)
                best_cp = part[best_tok]
            # else: whichever wins, the share check below fails
        if _wrap32(100 * best_cp) < threshold:
            continue
        if best_tok != LLAMA_TOKEN_NULL:
            return best_tok
    return LLAMA_TOKEN_NULL


def _try_draft_static(part_static: dict | None) -> int:
    """``try_draft`` from the static cache alone (lax thresholds of a 2-gram)."""
    if part_static is None:
        return LLAMA_TOKEN_NULL
    best = 0
    best_tok = LLAMA_TOKEN_NULL
    total = 0
    tie = False
    for tok, c in part_static.items():
        if c > best:
            best, best_tok, tie = c, tok, False
        elif c == best and c > 0:
            tie = True
        total += c
    total = _wrap32(total)
    if total < DRAFT_MIN_SAMPLE_SIZE_LAX[NGRAM_STATIC - 1]:
        return LLAMA_TOKEN_NULL
    if _wrap32(100 * best) < _wrap32(DRAFT_MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total):
        return LLAMA_TOKEN_NULL
    if tie:
        best_tok = next(t for t in _part_order(part_static) if part_static[t] == best)
    return best_tok


def _draft_tail(tail: list[int], inp_size: int, draft: list[int], n_draft: int,
                ngram_min: int, ngram_max: int,
                ctx: dict, dyn: dict, sta: dict, sources: list[int] | None = None) -> None:
    # ``tail`` holds the last tokens of the input (at least the last
    # max(ngram_max, NGRAM_STATIC) when there are that many); drafted
    # tokens are appended to it, so every n-gram is a suffix of it.
    # ``sources``, when given, receives one SOURCE_* per drafted token.
    off = inp_size - len(tail)
    sizes = range(ngram_min, ngram_max + 1)
    while len(draft) - 1 < n_draft:
        n = len(tail)
        total_len = off + n
        part_static = sta.get((tail[n - 2], tail[n - 1], LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL))
        ngrams = [
            # An n-gram reaching before the first token: llama.cpp reads out
            # of bounds there (undefined behaviour); we treat it as unseen.
            (tuple(tail[n - s:]) + _PAD[s]) if total_len >= s else None
            for s in sizes
        ]
        ps = _EMPTY if part_static is None else part_static
        src = SOURCE_CONTEXT
        tok = _try_draft_primary(ctx, ngrams, ps, DRAFT_MIN_SAMPLE_SIZE_LAX, DRAFT_MIN_PERCENT_LAX)
        if tok == LLAMA_TOKEN_NULL:
            src = SOURCE_DYNAMIC
            tok = _try_draft_primary(dyn, ngrams, ps, DRAFT_MIN_SAMPLE_SIZE_STRICT, DRAFT_MIN_PERCENT_STRICT)
        if tok == LLAMA_TOKEN_NULL:
            src = SOURCE_STATIC
            tok = _try_draft_static(part_static)
        if tok == LLAMA_TOKEN_NULL:
            break
        draft.append(tok)
        tail.append(tok)
        if sources is not None:
            sources.append(src)


def _check_sizes(ngram_min: int, ngram_max: int) -> None:
    if ngram_min < 1 or ngram_max > NGRAM_MAX or ngram_max < ngram_min:
        raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max <= {NGRAM_MAX}, got {ngram_min}..{ngram_max}")


def ngram_cache_draft(inp: Sequence[int], draft: list[int], n_draft: int, ngram_min: int, ngram_max: int,
                      nc_context: NgramCache, nc_dynamic: NgramCache, nc_static: NgramCache) -> list[int]:
    """``common_ngram_cache_draft``: extend ``draft`` by up to ``n_draft`` tokens.

    ``inp`` is every token so far, ending with the last sampled one;
    ``draft`` must hold exactly that token and is extended in place (and
    returned). Each step looks at the n-grams ending at the current end of
    ``inp + draft[1:]``, longest first, and drafts the most frequent next
    token of the first that passes its thresholds: the context cache with
    the lax ones, then the dynamic cache with the strict ones, both with
    candidates weighed by the static cache's counts after the last two
    tokens (x100 when present, x1 when not); failing both, the static
    2-gram alone under the lax thresholds. Drafting stops at the first step
    where nothing qualifies.

    >>> ctx, dyn, sta = NgramCache(), NgramCache(), NgramCache()
    >>> sta.add((4, 5), 6, 2); sta.add((5, 6), 7, 1); sta.add((5, 6), 8, 1)
    >>> ngram_cache_draft([4, 5], [5], 8, 1, 4, ctx, dyn, sta)
    [5, 6, 8]

    Here ``(5, 6)`` is a tie at 50 %; libstdc++ iterates 8 before 7.
    """
    if len(draft) != 1:
        raise ValueError("draft must hold exactly the last sampled token")
    _check_sizes(ngram_min, ngram_max)
    inp_size = len(inp)
    if inp_size < NGRAM_STATIC:
        return draft
    keep = max(ngram_max, NGRAM_STATIC)
    tail = [int(t) for t in inp[inp_size - keep:]] if inp_size > keep else [int(t) for t in inp]
    _draft_tail(tail, inp_size, draft, n_draft, ngram_min, ngram_max,
                nc_context._map, nc_dynamic._map, nc_static._map)
    return draft
