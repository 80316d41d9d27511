"""ngram-mod: a hashed n-gram -> next-token table (llama.cpp's ``common_ngram_mod``).

The table has a fixed number of slots (4M in llama.cpp). Each n-gram of the
history is hashed to a slot that stores the token which followed it; later
n-grams overwrite earlier ones, collisions included. Drafting hashes the
last ``n`` tokens, reads the next token, slides the window and repeats.

The hash is the 64-bit polynomial of ``ngram-mod.cpp``::

    res = 0
    for t in ngram: res = res * 6364136223846793005 + t    (mod 2**64)
    slot = res % size

Tokens enter as C++ ``int32 -> size_t`` conversions (sign extension), i.e.
modulo 2**64; Python's ``& (2**64 - 1)`` gives exactly that.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import DraftRequest, Speculator
from .chain import register
from .descriptor import NGRAM, Nothing, SpecDescriptor, declare
from .param_kinds import INT, Param
from .ngram_simple import TokenHistory, slot_winners
from .params import SpecParams
from .types import SpecType

__all__ = ["EMPTY", "NgramMod", "NgramModTable", "TABLE_SIZE"]

#: a slot that holds no token
EMPTY = -1
#: slots in llama.cpp's table (4*1024*1024 int32 = 16 MiB)
TABLE_SIZE = 4 * 1024 * 1024
#: the hash multiplier of ngram-mod.cpp
HASH_MUL = 6364136223846793005
_U64 = (1 << 64) - 1
#: occupancy above which begin() clears the table
OCCUPANCY_RESET = 0.25
#: new history n-grams are added once more than this many are pending
ADD_CHUNK = 32
#: an accept below this fraction of the draft counts as low ...
LOW_ACCEPT = 0.25
#: ... and this many low ones in a row clear the table
LOW_STREAK_RESET = 5
#: adds below this count use a plain loop
_VECTOR_FROM = 16


class NgramModTable:
    """``common_ngram_mod``: the hash table with ``add`` / ``get`` / ``reset``.

    >>> t = NgramModTable(n=2, size=16)
    >>> t.idx([1, 2]) == (1 * HASH_MUL + 2) % 2**64 % 16
    True
    >>> t.add([1, 2, 7])          # n-gram [1, 2] followed by 7
    >>> t.get([1, 2]), t.get([2, 1]), t.get_used()
    (7, -1, 1)
    >>> t.add([1, 2, 8])          # same slot: overwritten, still one used
    >>> t.get([1, 2]), t.get_used()
    (8, 1)
    >>> t.reset(); t.get([1, 2]), t.get_used()
    (-1, 0)
    """

    def __init__(self, n: int, size: int = TABLE_SIZE):
        self.n = int(n)
        self.entries = np.full(int(size), EMPTY, dtype=np.int32)
        self.used = 0

    # -- the reference's interface (tokens: the n-gram at ``start``) --------
    def idx(self, tokens: Sequence[int], start: int = 0) -> int:
        res = 0
        for i in range(start, start + self.n):
            res = (res * HASH_MUL + tokens[i]) & _U64
        return res % len(self.entries)

    def add(self, tokens: Sequence[int], start: int = 0) -> None:
        """Store ``tokens[start + n]`` as the successor of the n-gram at ``start``."""
        i = self.idx(tokens, start)
        if self.entries[i] == EMPTY:
            self.used += 1
        self.entries[i] = tokens[start + self.n]

    def get(self, tokens: Sequence[int], start: int = 0) -> int:
        """The successor stored for the n-gram at ``start`` (EMPTY if none)."""
        return int(self.entries[self.idx(tokens, start)])

    def reset(self) -> None:
        self.entries.fill(EMPTY)
        self.used = 0

    def get_n(self) -> int:
        return self.n

    def get_used(self) -> int:
        return self.used

    def size(self) -> int:
        return len(self.entries)

    def size_bytes(self) -> int:
        return self.entries.nbytes

    # -- vectorised --------------------------------------------------------
    def slots(self, arr: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Slots of the n-grams starting at ``lo .. hi-1`` of ``arr`` (int64 tokens)."""
        count = hi - lo
        h = np.zeros(count, dtype=np.uint64)
        mul = np.uint64(HASH_MUL)
        for i in range(self.n):
            # int64 -> uint64 is the two's complement reinterpretation, like
            # the C++ int32 -> size_t conversion; the products wrap mod 2**64
            h = h * mul + arr[lo + i: lo + i + count].astype(np.uint64)
        return (h % np.uint64(len(self.entries))).astype(np.intp)

    def add_range(self, arr: np.ndarray, lo: int, hi: int) -> None:
        """``add`` at every position ``lo <= i < hi``, in increasing order.

        Needs ``arr[hi - 1 + n]``. Equivalent to the reference's loop: the
        last write to a slot wins and ``used`` counts slots that were EMPTY
        when written.
        """
        count = hi - lo
        if count <= 0:
            return
        n = self.n
        entries = self.entries
        slots = self.slots(arr, lo, hi)
        vals = arr[lo + n: hi + n].astype(np.int32)  # llama_token is int32
        if count < _VECTOR_FROM or bool((vals == EMPTY).any()):
            # a stored EMPTY keeps its slot "empty": only a loop is exact then
            used = self.used
            for s, v in zip(slots.tolist(), vals.tolist()):
                if entries[s] == EMPTY:
                    used += 1
                entries[s] = v
            self.used = used
            return
        # the last position writing to each slot wins
        last = slot_winners(slots, "last")
        uniq = slots[last]
        self.used += int(np.count_nonzero(entries[uniq] == EMPTY))
        entries[uniq] = vals[last]


class NgramMod(Speculator):
    """The ``ngram-mod`` speculator (``common_speculative_impl_ngram_mod``).

    * ``begin`` adds every n-gram of the prompt, then clears the table if
      more than a quarter of its slots are used;
    * ``draft`` first adds the history's new n-grams, but only once more
      than 32 are pending; then it follows the table from the last
      ``n_match`` tokens for up to ``n_max`` tokens, and drafts nothing if
      the chain breaks before ``n_min`` tokens;
    * ``accept`` counts drafts of which less than a quarter was accepted;
      five in a row clear the table.

    Worked example with ``n_match=2`` and a 64-slot table: the prompt
    teaches 1 2 -> 3, 2 3 -> 4, 3 4 -> 9.

    >>> s = NgramMod(n_match=2, n_max=3, n_min=1, size=64)
    >>> s.begin([1, 2, 3, 4, 9])
    >>> s.mod.get_used(), s.i_last
    (3, 3)
    >>> s.draft(DraftRequest(prompt=[5, 1], id_last=2, pos0=2))
    [3, 4, 9]
    >>> s.draft(DraftRequest(prompt=[5, 3], id_last=4, pos0=2))   # 4 9 -> ? stops
    [9]
    >>> s.n_draft_last
    1
    >>> s.n_min = 2                                                # 1 < n_min: nothing
    >>> s.draft(DraftRequest(prompt=[5, 3], id_last=4, pos0=2)), s.n_draft_last
    ([], 0)
    """

    type = SpecType.NGRAM_MOD

    def __init__(self, n_match: int, n_max: int, n_min: int, size: int = TABLE_SIZE):
        super().__init__(n_max=n_max)
        self.n_match = n_match
        self.n_max_param = n_max
        self.n_min = n_min
        self.mod = NgramModTable(n_match, size)
        #: the last prompt position whose n-gram was added to the table
        self.i_last = 0
        #: length of the last draft (0: none), for the acceptance check
        self.n_draft_last = 0
        #: consecutive accepts with a low acceptance fraction
        self.n_low = 0
        self._hist = TokenHistory()

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = 0
        self.n_draft_last = 0
        n = self.mod.get_n()
        if len(prompt) < n:
            return
        _, arr = self._hist.sync(prompt)
        self.mod.add_range(arr, 0, len(prompt) - n)
        self.i_last = len(prompt) - n
        if self.mod.get_used() / self.mod.size() > OCCUPANCY_RESET:
            self.mod.reset()

    def draft(self, req: DraftRequest) -> list[int]:
        self.n_draft_last = 0
        prompt = req.prompt
        cur_len = len(prompt)
        n = self.mod.get_n()
        if cur_len < n:
            return []

        # add new n-grams in chunks
        if self.i_last + ADD_CHUNK < cur_len:
            _, arr = self._hist.sync(prompt)
            self.mod.add_range(arr, self.i_last, cur_len - n)
            self.i_last = cur_len - n

        window = [int(t) for t in prompt[cur_len - n + 1: cur_len]]
        window.append(int(req.id_last))

        # follow the table; the hash slides along the window (the polynomial
        # hash mod 2**64 rolls exactly: drop the oldest term, shift, add)
        size = self.mod.size()
        entries = self.mod.entries
        h = 0
        for t in window:
            h = (h * HASH_MUL + t) & _U64
        top = pow(HASH_MUL, n - 1, 1 << 64)
        out: list[int] = []
        for i in range(self.n_max_param):
            token = int(entries[h % size])
            if token == EMPTY:
                if i < self.n_min:
                    return []
                break
            out.append(token)
            h = ((h - window[i] * top) * HASH_MUL + token) & _U64
            window.append(token)

        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int, is_other: bool) -> None:
        if is_other:
            return
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < LOW_ACCEPT:
                self.n_low += 1
                if self.n_low >= LOW_STREAK_RESET:
                    self.mod.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


declare(SpecDescriptor(
    name="ngram-mod", rank=40, kind=NGRAM,
    info="hashed n-gram pool shared across replies",
    needs=Nothing("always available: hashed n-gram pool shared across replies (long copies)"),
    section="ngram_mod", n_max=lambda p: max(0, p.ngram_mod.n_max),
    params=(Param("ngram_mod.n_match", "match length", INT, ("--spec-ngram-mod-n-match",),
                  "ngram-mod lookup length"),
            Param("ngram_mod.n_min", "min draft", INT, ("--spec-ngram-mod-n-min",), "ngram-mod min draft"),
            Param("ngram_mod.n_max", "max draft", INT, ("--spec-ngram-mod-n-max",), "ngram-mod max draft"))))


@register(SpecType.NGRAM_MOD)
def _make_ngram_mod(params: SpecParams, resources: dict) -> Speculator:
    p = params.ngram_mod
    return NgramMod(n_match=p.n_match, n_max=p.n_max, n_min=p.n_min)
