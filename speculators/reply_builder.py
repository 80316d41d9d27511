"""The reply as the model writes it: accepted token ids turned into :class:`TokenEvent` s, the
reply's limits (end-of-generation token, max tokens, stop strings) enforced, and which tokens end a
sentence (:func:`sentence_end`, for the adaptive controller)."""

from __future__ import annotations

import codecs
from typing import Callable, Sequence

from .events import STOP_EOG, STOP_LENGTH, STOP_STRING, TokenEvent


#: what ends a sentence at the end of a token's text (a line break anywhere in it does too)
SENTENCE_END = ".!?。！？"


def sentence_end(model) -> Callable[[int], bool]:
    r"""Whether a token of ``model`` ends a sentence: its text, less trailing spaces, ends with
    one of :data:`SENTENCE_END`, or it holds a line break (cached per token).

    >>> class M:
    ...     def token_bytes(self, t): return [b" cheese", b".", b" key.", b"\n", b"3.5", b"? "][t]
    >>> ends = sentence_end(M())
    >>> [ends(t) for t in range(6)]
    [False, True, True, True, False, True]
    """
    cache: dict[int, bool] = {}

    def ends(token: int) -> bool:
        v = cache.get(token)
        if v is None:
            text = model.token_bytes(token).decode("utf-8", "ignore")
            core = text.rstrip(" ")
            v = cache[token] = "\n" in text or (bool(core) and core[-1] in SENTENCE_END)
        return v
    return ends


class ReplyBuilder:
    r"""Turns accepted token ids into events, enforcing the reply's limits.

    It stops at an end-of-generation token (never emitted), at ``max_tokens``,
    and at a stop string, which is cut from the text. While the text ends
    with what could be the start of a stop string, the tokens that hold it
    are kept back, so a stop string never shows while it is still forming;
    every released token keeps its own text and provenance.

    >>> class M:
    ...     def is_eog(self, t): return t == 0
    ...     def token_bytes(self, t): return {1: b"Hi", 2: b"\n", 3: b"User", 4: b":", 5: b"!"}[t]
    >>> r = ReplyBuilder(M(), ["\nUser:"], 10)
    >>> [e.text for e in r.add(1, None, None)[0]]
    ['Hi']
    >>> r.add(2, None, None)[0], r.add(3, None, None)[0]   # held: may start "\nUser:"
    ([], [])
    >>> r.add(4, None, None)
    ([], 'stop_string')
    >>> r.text, r.written            # what the model wrote, the stop string's tokens too
    ('Hi', [1, 2, 3, 4])
    """

    def __init__(self, model, stop: Sequence[str], max_tokens: int):
        self.model = model
        self.stop = [s for s in stop if s]
        self.max_hold = max((len(s) for s in self.stop), default=1) - 1
        #: every start of a stop string (what a text may end with while one forms)
        self._starts = {s[:k] for s in self.stop for k in range(1, len(s) + 1)}
        self.max_tokens = max_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""
        self._held: list[tuple[int, TokenEvent]] = []  # (text offset, event)
        self.tokens: list[TokenEvent] = []  # released, in order
        self.n_produced = 0
        #: every token id added, through the one that ended the reply (an end-of-generation
        #: token, the last of a stop string), held-back and cut ones included
        self.written: list[int] = []

    @property
    def text(self) -> str:
        """The released text."""
        if not self._held:
            return self._text
        return self._text[:self._held[0][0]]

    def _release(self, upto: int | None = None) -> list[TokenEvent]:
        n = len(self._held) if upto is None else upto
        out = [ev for _, ev in self._held[:n]]
        del self._held[:n]
        self.tokens.extend(out)
        return out

    def add(self, tok: int, by: str | None, pos: int | None) -> tuple[list[TokenEvent], str | None]:
        self.written.append(tok)
        if self.model.is_eog(tok):
            return self._release(), STOP_EOG
        start = len(self._text)
        piece = self._decoder.decode(self.model.token_bytes(tok))
        self._text += piece
        self._held.append((start, TokenEvent(self.n_produced, tok, piece, by, pos)))
        self.n_produced += 1
        if self.stop:
            lo = max(0, start - self.max_hold)
            hits = [j for j in (self._text.find(s, lo) for s in self.stop) if j >= 0]
            if hits:
                cut = min(hits)
                self._text = self._text[:cut]
                kept = 0
                for off, ev in self._held:
                    if off >= cut:
                        break
                    ev.text = ev.text[:cut - off]
                    kept += 1
                out = self._release(kept)
                self._held.clear()
                return out, STOP_STRING
        if self.n_produced >= self.max_tokens:
            return self._release(), STOP_LENGTH
        # keep back the tokens whose text might begin a stop string
        safe = len(self._text) - self._partial_stop_len()
        n = 0
        for off, ev in self._held:
            if off + len(ev.text) > safe:
                break
            n += 1
        return self._release(n), None

    def useful(self, draft: Sequence[int]) -> int:
        r"""How many of ``draft``'s tokens are worth verifying: those before the token that
        would end the reply (an end-of-generation token, or the one that completes a stop
        string), or all of them where none would. That token itself is never worth it: were
        the ones before it accepted, the verify's own next token is it, and the reply ends in
        the same step with a batch one shorter; what follows it could only cost a verify.

        >>> class M:
        ...     def is_eog(self, t): return t == 0
        ...     def token_bytes(self, t): return {1: b"Hi", 2: b"\n", 3: b"User", 4: b":", 5: b"!",
        ...                                       6: b"Use", 7: b"r:"}[t]
        >>> r = ReplyBuilder(M(), ["\nUser:"], 10)
        >>> r.useful([5, 1, 5]), r.useful([5, 0, 5]), r.useful([0, 5]), r.useful([1, 2, 3, 4, 5, 1])
        (3, 1, 0, 3)
        >>> _ = r.add(1, None, None), r.add(2, None, None)     # the text ends with a held newline
        >>> r.useful([3, 4, 5]), r.useful([4])
        (1, 1)
        >>> _ = r.add(3, None, None)                           # "\nUser" held: ":" would end it
        >>> r.useful([4, 5])
        0
        >>> r = ReplyBuilder(M(), ["\nUser:"], 10)
        >>> _ = r.add(2, None, None), r.add(6, None, None)     # a reply shorter than a stop string
        >>> r.useful([7, 5])
        0
        """
        n = len(draft)
        for i, t in enumerate(draft):
            if self.model.is_eog(t):
                n = i
                break
        if not self.stop or n == 0:
            return n
        # the text the draft would add after what may begin a stop string; where the first
        # stop string ends, the token that holds its last character (one search per stop
        # string over the joined text: the controller asks this of every draft, at every step)
        pieces = [self.model.token_bytes(t).decode("utf-8", "replace") for t in draft[:n]]
        tail = self._text[-self.max_hold:] if self.max_hold > 0 else ""
        text = tail + "".join(pieces)
        ends = [j + len(s) for s in self.stop if (j := text.find(s)) >= 0]
        if not ends:
            return n
        end, first = len(tail), min(ends)
        for i, piece in enumerate(pieces):
            end += len(piece)
            if end >= first:
                return i
        return n

    def _partial_stop_len(self) -> int:
        t, starts = self._text, self._starts
        for k in range(min(self.max_hold, len(t)), 0, -1):
            if t[-k:] in starts:
                return k
        return 0

    def finish(self, reason: str | None) -> list[TokenEvent]:
        """Release what is held (the generation ended for another reason)."""
        if reason == STOP_STRING:
            return []
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._text += tail
            if self._held:
                self._held[-1][1].text += tail
            elif self.tokens:
                self.tokens[-1].text += tail
        return self._release()
