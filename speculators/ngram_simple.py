"""ngram-simple: draft the m-gram that followed the last earlier occurrence
of the current n-gram (llama.cpp's ``common_ngram_simple_draft``).

This module also holds two helpers the other n-gram speculators share:
:class:`TokenHistory`, an incrementally maintained numpy mirror of the
token history, and :func:`rfind_ngram`, a vectorised backwards n-gram
search.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import DraftRequest, Speculator
from .chain import register
from .descriptor import NGRAM, Nothing, SpecDescriptor, declare
from .param_kinds import INT, Param
from .params import NgramMapParams, SpecParams
from .types import SpecType

__all__ = ["NgramSimple", "TokenHistory", "find_ngrams", "ngram_simple_draft", "rfind_ngram",
           "slot_winners"]


class TokenHistory:
    """A list copy and an int64 numpy copy of the latest token history.

    The generation loop hands every speculator the whole history on each
    call; converting 8k Python ints to numpy each time would cost ~0.25 ms.
    :meth:`sync` converts only tokens appended since the previous call and
    verifies (one C-level list comparison) that the older ones are unchanged,
    rebuilding from scratch when they are not - so the mirror is always exact.

    >>> h = TokenHistory()
    >>> lst, arr = h.sync([5, 6, 7])
    >>> lst, arr.tolist()
    ([5, 6, 7], [5, 6, 7])
    >>> lst, arr = h.sync([5, 6, 7, 8])      # appended: only 8 is converted
    >>> arr.tolist()
    [5, 6, 7, 8]
    >>> h.sync([9, 6])[1].tolist()            # changed: rebuilt
    [9, 6]
    """

    __slots__ = ("_list", "_buf", "_n")

    def __init__(self) -> None:
        self._list: list[int] = []
        self._buf = np.zeros(1024, dtype=np.int64)
        self._n = 0

    def _rebuild(self, tokens: list[int]) -> None:
        self._list = list(tokens)
        n = len(tokens)
        cap = max(1024, 1 << (n + n // 2).bit_length())
        self._buf = np.zeros(cap, dtype=np.int64)
        if n:
            self._buf[:n] = np.asarray(tokens, dtype=np.int64)
        self._n = n

    def _append(self, tail: list[int]) -> None:
        k = len(tail)
        if k == 0:
            return
        need = self._n + k
        if need > len(self._buf):
            buf = np.zeros(max(need * 2, 1024), dtype=np.int64)
            buf[: self._n] = self._buf[: self._n]
            self._buf = buf
        if k == 1:
            self._buf[self._n] = tail[0]
        else:
            self._buf[self._n: need] = np.asarray(tail, dtype=np.int64)
        self._n = need

    def sync(self, prompt: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """Mirror ``prompt``; return ``(list, int64 array)``, both exact copies.

        The returned objects are owned by the history: do not mutate them.
        """
        if isinstance(prompt, np.ndarray):
            n = len(prompt)
            old = self._n
            if n >= old and np.array_equal(prompt[:old], self._buf[:old]):
                tail = prompt[old:].tolist()
                self._list.extend(tail)
                self._append(tail)
            else:
                self._rebuild(prompt.tolist())
            return self._list, self._buf[: self._n]
        if not isinstance(prompt, list):
            prompt = list(prompt)
        n = len(prompt)
        old = len(self._list)
        if n >= old:
            tail = prompt[old:]
            self._list.extend(tail)
            # Same-length list comparison runs in C (~1 ns per token).
            if self._list == prompt:
                self._append(tail)
            else:
                self._rebuild(prompt)
        else:
            self._rebuild(prompt)
        return self._list, self._buf[: self._n]


#: below this many surviving candidates, switch from contiguous comparisons
#: over the whole range to gathering the few candidate positions
_GATHER_BELOW = 64


def find_ngrams(arr: np.ndarray, pattern: Sequence[int], lo: int, hi: int) -> np.ndarray:
    """All ``j`` in ``[lo, hi]`` (ascending) with ``arr[j:j+len(pattern)] == pattern``.

    ``hi + len(pattern) <= len(arr)`` must hold. Costs a few contiguous
    vector comparisons over the range, then gathers the few survivors.

    >>> find_ngrams(np.array([1, 2, 3, 1, 2, 3, 1, 2]), [1, 2], 0, 6).tolist()
    [0, 3, 6]
    """
    k = len(pattern)
    if hi < lo or k == 0:
        return np.zeros(0, dtype=np.intp)
    span = hi - lo + 1
    # first and last token, then the others, over the whole range while
    # many candidates remain
    order = [0] + ([k - 1] if k > 1 else []) + list(range(1, k - 1))
    mask = arr[lo: lo + span] == pattern[0]
    done = 1
    while done < k and np.count_nonzero(mask) >= _GATHER_BELOW:
        pos = order[done]
        mask &= arr[lo + pos: lo + pos + span] == pattern[pos]
        done += 1
    cand = np.flatnonzero(mask)
    if cand.size == 0:
        return cand
    cand += lo
    for pos in order[done:]:
        cand = cand[arr[cand + pos] == pattern[pos]]
        if cand.size == 0:
            break
    return cand


def rfind_ngram(arr: np.ndarray, pattern: Sequence[int], lo: int, hi: int) -> int:
    """Largest ``j`` in ``[lo, hi]`` with ``arr[j:j+len(pattern)] == pattern``, else -1.

    This is the reference's descending search loop, first hit wins.

    >>> a = np.array([1, 2, 3, 1, 2, 3, 1, 2])
    >>> rfind_ngram(a, [1, 2], 0, 6), rfind_ngram(a, [1, 2], 0, 5), rfind_ngram(a, [9], 0, 7)
    (6, 3, -1)
    """
    found = find_ngrams(arr, pattern, lo, hi)
    return int(found[-1]) if found.size else -1


def slot_winners(slots: np.ndarray, keep: str) -> np.ndarray:
    """Indices ``i`` such that ``slots[i]`` is the ``keep="first"`` / ``"last"``
    occurrence of its value, in ascending order of ``i``.

    This is how a sequence of table writes collapses: "last" for writes that
    overwrite, "first" for writes that only fill empty slots. (Sorting a
    combined slot/position key is several times faster than ``np.unique``
    with ``return_index``.)

    >>> slot_winners(np.array([5, 3, 5, 3, 9]), "first").tolist()
    [0, 1, 4]
    >>> slot_winners(np.array([5, 3, 5, 3, 9]), "last").tolist()
    [2, 3, 4]
    """
    count = len(slots)
    if count == 0:
        return np.zeros(0, dtype=np.intp)
    bits = max(1, (count - 1).bit_length())
    key = (slots.astype(np.int64) << bits) | np.arange(count, dtype=np.int64)
    key.sort()
    s = key >> bits
    pick = np.ones(count, dtype=bool)
    if keep == "last":
        pick[:-1] = s[1:] != s[:-1]
    else:
        pick[1:] = s[1:] != s[:-1]
    winners = key[pick] & ((1 << bits) - 1)
    winners.sort()
    return winners.astype(np.intp)


def ngram_simple_draft(size_n: int, size_m: int, tokens: Sequence[int], sampled: int,
                       arr: np.ndarray | None = None) -> list[int]:
    """``common_ngram_simple_draft``: the reference algorithm, vectorised.

    The pattern is the last ``size_n - 1`` history tokens plus ``sampled``.
    It is searched backwards from position ``len - size_n - 1`` down to 1
    (position 0 is never a match); the first (latest) hit wins, and the up
    to ``size_m`` tokens after it are the draft - unless fewer than
    ``size_n`` tokens are available there. Nothing is drafted while
    ``len(tokens) <= size_n + size_m + 1``.

    >>> hist = [9, 1, 2, 3, 4, 5, 1, 2]
    >>> ngram_simple_draft(2, 3, hist, 3)     # pattern [2, 3] found at 2
    [4, 5, 1]
    >>> ngram_simple_draft(2, 4, hist, 3)     # copy_max = min(4, 8 - 4) = 4
    [4, 5, 1, 2]
    >>> ngram_simple_draft(2, 5, hist, 3)     # len 8 <= 2 + 5 + 1: too short
    []
    """
    cur_len = len(tokens)
    n, m = int(size_n), int(size_m)
    if cur_len <= n + m + 1:
        return []
    if arr is None:
        arr = np.asarray(tokens, dtype=np.int64)
    pattern = [int(t) for t in tokens[cur_len - n + 1: cur_len]]
    pattern.append(int(sampled))
    match_pos = rfind_ngram(arr, pattern, 1, cur_len - n - 1)
    if match_pos <= 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    start = match_pos + n
    return [int(t) for t in tokens[start: start + copy_max]]


class NgramSimple(Speculator):
    """Self-speculation by plain n-gram lookup (``ngram-simple``).

    Stateless apart from a cache of the history; ``begin`` and ``accept``
    do nothing, as in the reference. Worked example with ``size_n=2``,
    ``size_m=2``: the pattern ``[2, 3]`` (last history token + sampled one)
    last occurred at position 2, so the two tokens after it are drafted.

    >>> s = NgramSimple(size_n=2, size_m=2)
    >>> s.draft(DraftRequest(prompt=[9, 1, 2, 3, 4, 5, 1, 2], id_last=3, pos0=8))
    [4, 5]
    >>> s.draft(DraftRequest(prompt=[9, 1, 2, 3, 4, 5, 1, 2], id_last=7, pos0=8))
    []
    """

    type = SpecType.NGRAM_SIMPLE

    def __init__(self, size_n: int, size_m: int):
        super().__init__(n_max=size_m)
        self.size_n = size_n
        self.size_m = size_m
        self.context_key = size_n      # the pattern is looked up in the history alone
        self._hist = TokenHistory()

    def begin(self, prompt: Sequence[int]) -> None:
        # nothing to do in the reference; warm the history mirror so that
        # the first draft does not pay for converting the whole prompt
        self._hist.sync(prompt)

    def draft(self, req: DraftRequest) -> list[int]:
        if len(req.prompt) <= self.size_n + self.size_m + 1:
            return []
        lst, arr = self._hist.sync(req.prompt)
        return ngram_simple_draft(self.size_n, self.size_m, lst, req.id_last, arr)


#: the lookup n-gram length under the adaptive controller (Automatic), where ``size_n`` is left
#: at llama.cpp's default of 12: the controller scores a proposal against what the model goes on
#: to write before it verifies one, so a short key's wrong guesses cost a lookup, not a verify,
#: while a short passage quoted back (a sentence is ~15 tokens) is found when there is still
#: most of it left to draft. With 12, a copied sentence was found with a few tokens left, or,
#: where a sampled reply changed a word in its first 12 tokens, not at all
#: (``tools/bench_copy.py``: 47 of 60 copy requests lit up with 12, 49 with 4).
ADAPTIVE_SIZE_N = 4


def lookup_size(params: SpecParams) -> int:
    """The lookup n-gram length ngram-simple uses with ``params``.

    >>> lookup_size(SpecParams.from_types("ngram-simple")), lookup_size(SpecParams.auto())
    (12, 4)
    >>> p = SpecParams.auto(); p.ngram_simple.size_n = 8; lookup_size(p)   # set: used as is
    8
    """
    n = params.ngram_simple.size_n
    if params.adaptive_on and n == NgramMapParams().size_n:
        return ADAPTIVE_SIZE_N
    return n


def ngram_map_options(type_name: str, section: str, size_n_note: str | None = None) -> dict:
    """The parameters of an n-gram type whose section is an :class:`~speculators.params.NgramMapParams`
    (``section``): ngram-simple, ngram-map-k(4v); ``size_n_note``: said after size_n's default.

    >>> [p.flags for p in ngram_map_options("ngram-simple", "ngram_simple")["params"]][0]
    ('--spec-ngram-simple-size-n',)
    """
    params = tuple(Param(f"{section}.{name}", label, INT, (f"--spec-{type_name}-{opt}",), f"{type_name}: {what}",
                         default_note=size_n_note if name == "size_n" else None)
                   for opt, name, label, what in (("size-n", "size_n", "lookup n-gram size", "lookup n-gram length"),
                                                  ("size-m", "size_m", "draft m-gram size", "draft m-gram length"),
                                                  ("min-hits", "min_hits", "min hits", "minimum hits")))
    return {"section": section, "params": params, "n_max": lambda p: getattr(p, section).size_m}


declare(SpecDescriptor(
    name="ngram-simple", rank=10, kind=NGRAM,
    info="repeats what followed the last n-gram",
    needs=Nothing("always available: repeats what followed the last n-gram of the conversation"),
    **ngram_map_options("ngram-simple", "ngram_simple", f"{ADAPTIVE_SIZE_N} under auto")))


@register(SpecType.NGRAM_SIMPLE)
def _make_ngram_simple(params: SpecParams, resources: dict) -> Speculator:
    return NgramSimple(size_n=lookup_size(params), size_m=params.ngram_simple.size_m)
