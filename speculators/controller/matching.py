"""How deep into a repeated passage the context is: the longest earlier passage that the last
tokens (and a draft's first token) repeat, and when a lookup draft is evidently a copy."""

from __future__ import annotations

import numpy as np

from .params import ControllerParams

#: a lookup draft whose context repeats an earlier passage for ``m`` tokens (its first draft
#: token included) is read ``m - MATCH_SLACK`` positions into a run: a 4-token match is what a
#: lookup key finds by chance in ordinary text (the default model, greedy, bench/prompts.txt
#: and chat-questions.txt: the next token repeated the earlier passage's 34-53 % of the time
#: after a 4-5 token match, 89-100 % after 6 or more)
MATCH_SLACK = 4
#: a context match this much deeper than the slack lets cold lookup drafters be asked (and a
#: fresh chain's first proposal be verified) at once
MATCH_ASK = 4
#: the longest match looked for
MATCH_CAP = 128


def suffix_match(hist: np.ndarray, last: int, nxt: int | None = None, cap: int = MATCH_CAP) -> int:
    """How many tokens at the end of ``hist + [last]`` repeat an earlier passage of it.

    With ``nxt``: only passages followed by ``nxt`` count (the match a draft starting with
    ``nxt`` continues). ``hist`` is an int numpy array; at most ``cap`` is returned.

    >>> import numpy as np
    >>> h = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    >>> suffix_match(h, 8), suffix_match(h, 8, nxt=9), suffix_match(h, 8, nxt=1), suffix_match(h, 4)
    (4, 4, 0, 0)
    >>> suffix_match(h, 8, cap=2)
    2
    """
    n = len(hist)
    if n == 0:
        return 0
    if nxt is None:
        cand = np.flatnonzero(hist == last)
    else:
        cand = np.flatnonzero((hist[:-1] == last) & (hist[1:] == nxt))
        if hist[-1] == last and last == nxt:
            cand = np.append(cand, n - 1)
    if not cand.size:
        return 0
    m = 1
    while m < cap:
        cand = cand[cand >= m]
        if not cand.size:
            break
        cand = cand[hist[cand - m] == hist[n - m]]
        if not cand.size:
            break
        m += 1
    return m


def evident_copy(m_draft: int, run: int, p: ControllerParams) -> bool:
    """Whether a lookup draft is evidently a copy (:attr:`ControllerParams.copy_match`):
    its own context match ``m_draft`` is long, and ``run`` (the tokens its drafter's proposals
    have predicted in a row, which this draft continues) shows the copy going on.

    >>> p = ControllerParams()
    >>> evident_copy(8, 3, p), evident_copy(8, 0, p), evident_copy(16, 0, p), evident_copy(5, 30, p)
    (True, False, True, False)
    """
    return m_draft >= p.copy_match_alone or (m_draft >= p.copy_match and run > 0)


class SuffixMatcher:
    """:func:`suffix_match` over a growing history, from an index of where each token occurs
    (kept up to date as tokens are appended; rebuilt when the history is rewritten): the
    candidates are the few earlier places of the last token, compared in Python, instead of
    whole-array passes (~60 us a step on a 400-token chat; ~5 us this way).

    >>> sm = SuffixMatcher()
    >>> h = [5, 6, 7, 8, 9, 5, 6, 7]
    >>> sm.sync(h)
    >>> sm.match(8), sm.match(8, nxt=9), sm.match(8, nxt=1), sm.match(4), sm.match(8, cap=2)
    (4, 4, 0, 0, 2)
    >>> h += [8, 9]; sm.sync(h); sm.match(5)                # appended: indexed incrementally
    6
    >>> sm.sync([1, 2, 1]); sm.match(2)                     # rewritten: indexed again
    2
    """

    def __init__(self) -> None:
        self._toks: list[int] = []
        self._where: dict[int, list[int]] = {}
        self._n = 0
        self._last: int | None = None       # tokens[n - 1] when indexed (the list may change in place)

    def sync(self, tokens: list[int]) -> None:
        """Follow ``tokens`` (the history; only read, and only its new end when it grew)."""
        n, old = len(tokens), self._n
        kept = n >= old and (tokens is self._toks or tokens[:old] == self._toks[:old]) and (
            not old or tokens[old - 1] == self._last)
        if not kept:
            self._where, old = {}, 0
        where = self._where
        for i in range(old, n):
            t = tokens[i]
            lst = where.get(t)
            if lst is None:
                where[t] = [i]
            else:
                lst.append(i)
        self._toks, self._n = tokens, n
        self._last = tokens[n - 1] if n else None

    def match(self, last: int, nxt: int | None = None, cap: int = MATCH_CAP) -> int:
        """:func:`suffix_match` of the synced history."""
        toks, n = self._toks, self._n
        if n == 0:
            return 0
        cand = self._where.get(last, ())
        if nxt is not None:
            cand = [p for p in cand if p + 1 < n and toks[p + 1] == nxt]
            if toks[n - 1] == last and last == nxt:
                cand.append(n - 1)
        if not cand:
            return 0
        m = 1
        while m < cap:
            if len(cand) == 1:
                return m + self._extend(cand[0], m, min(cap - m, cand[0] - m + 1))
            cand = [p for p in cand if p >= m and toks[p - m] == toks[n - m]]
            if not cand:
                break
            m += 1
        return m

    def _extend(self, p: int, m: int, limit: int) -> int:
        """How many of the at most ``limit`` tokens before ``toks[p - m + 1]`` equal the ones before
        ``toks[n - m + 1]``, compared backwards: blocks of doubling size compared at once, then
        token by token within the first block that differs."""
        toks, n = self._toks, self._n
        a, b = p - m + 1, n - m + 1          # the compared stretches end just before these
        done, size = 0, 8
        while done < limit:
            s = min(size, limit - done)
            if toks[a - done - s:a - done] == toks[b - done - s:b - done]:
                done += s
                size *= 2
                continue
            for j in range(1, s + 1):
                if toks[a - done - j] != toks[b - done - j]:
                    return done + j - 1
        return done

