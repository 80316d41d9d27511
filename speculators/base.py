"""The speculator interface and its per-implementation statistics.

A speculator proposes draft tokens that the target model then verifies in
one batch. It mirrors ``common_speculative_impl`` of llama.cpp, for one
sequence (draftlight decodes one conversation at a time)::

    begin(prompt)            once, before generation, with the whole prompt
    process(tokens, pos0)    after every target batch (draft models mirror it)
    draft(request) -> list   propose up to request.n_max tokens after request.id_last
    accept(n, is_other)      how many of the last draft the target accepted;
                             is_other=True when another speculator drafted

A worked example with a toy speculator that always guesses "the same token
again":

>>> class Repeat(Speculator):
...     type = SpecType.NGRAM_SIMPLE
...     def draft(self, req):
...         return [req.id_last] * 3
>>> s = Repeat(n_max=3)
>>> s.draft(DraftRequest(prompt=[1, 2], id_last=7, pos0=2, n_max=3))
[7, 7, 7]
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, Sequence

from .types import SpecType


@dataclass
class DraftRequest:
    """What the generation loop asks of the chain at each step.

    ``prompt`` is every token already in the target's context (prompt and
    generated so far) *excluding* ``id_last``, the token just sampled that
    is not yet decoded. ``pos0`` is the position ``id_last`` will take.
    ``n_max`` (-1: no limit) truncates whatever draft wins.
    """

    prompt: Sequence[int]
    id_last: int
    pos0: int
    n_max: int = -1



def common_prefix(a: Sequence, b: Sequence, limit: int | None = None) -> int:
    """How many leading items ``a`` and ``b`` share (at most ``limit``): how much of a context
    that holds ``a`` can stay when it is to hold ``b``.

    >>> common_prefix([1, 2, 3], [1, 2, 4]), common_prefix([1, 2], [1, 2, 3]), common_prefix([1, 2, 3], [1, 2, 3], 1)
    (2, 2, 1)
    """
    m = min(len(a), len(b)) if limit is None else max(0, min(len(a), len(b), limit))
    k = 0
    while k < m and a[k] == b[k]:
        k += 1
    return k


def mean_acceptance_length(n_acc_tokens: int, n_call_accept: int) -> float | None:
    """llama.cpp's ``mean acc len`` (``print_stats``): 1 + accepted draft tokens per verified
    draft; None when no draft was verified. The one definition the footer, F4, bench and the
    export use::

        >>> mean_acceptance_length(6, 4), mean_acceptance_length(0, 0)
        (2.5, None)
    """
    return 1.0 + n_acc_tokens / n_call_accept if n_call_accept else None

@dataclass
class SpeculatorStats:
    """Counters of ``common_speculative_impl``; see :meth:`summary`."""

    n_call_begin: int = 0
    n_call_draft: int = 0
    n_call_accept: int = 0
    n_gen_drafts: int = 0
    n_acc_drafts: int = 0
    n_gen_tokens: int = 0
    n_acc_tokens: int = 0
    n_acc_tokens_per_pos: list[int] = field(default_factory=list)
    t_begin_us: float = 0.0
    t_draft_us: float = 0.0
    t_accept_us: float = 0.0
    #: time in process() (draft models mirror every target batch there)
    t_process_us: float = 0.0

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted tokens per accept call, as ``print_stats`` reports it."""
        return mean_acceptance_length(self.n_acc_tokens, self.n_call_accept)

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        if self.n_call_accept == 0:
            return []
        return [n / self.n_call_accept for n in self.n_acc_tokens_per_pos]

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted tokens over drafted tokens."""
        if self.n_gen_tokens == 0:
            return None
        return self.n_acc_tokens / self.n_gen_tokens

    def _combine(self, other: "SpeculatorStats", sign: int) -> "SpeculatorStats":
        out = self.copy()
        for f in fields(self):
            if f.name != "n_acc_tokens_per_pos":
                setattr(out, f.name, getattr(self, f.name) + sign * getattr(other, f.name))
        a, b = self.n_acc_tokens_per_pos, other.n_acc_tokens_per_pos
        out.n_acc_tokens_per_pos = [(a[i] if i < len(a) else 0) + sign * (b[i] if i < len(b) else 0)
                                    for i in range(max(len(a), len(b)))]
        return out

    def __add__(self, other: "SpeculatorStats") -> "SpeculatorStats":
        """Counters and timers added field by field (e.g. over several replies)."""
        return self._combine(other, 1)

    def __sub__(self, other: "SpeculatorStats") -> "SpeculatorStats":
        """What happened since ``other`` was taken (chain stats only grow)."""
        return self._combine(other, -1)

    def copy(self) -> "SpeculatorStats":
        s = SpeculatorStats(**{k: v for k, v in self.__dict__.items()})
        s.n_acc_tokens_per_pos = list(self.n_acc_tokens_per_pos)
        return s

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["n_acc_tokens_per_pos"] = list(self.n_acc_tokens_per_pos)
        d["mean_acceptance_length"] = self.mean_acceptance_length
        d["acceptance_rate_per_pos"] = self.acceptance_rate_per_pos
        d["acceptance_rate"] = self.acceptance_rate
        return d

    def summary(self, name: str) -> str:
        """One line with the same figures as llama.cpp's ``print_stats``."""
        s = (f"statistics {name:>16}: #calls(b,g,a) = {self.n_call_begin:4d} {self.n_call_draft:6d} "
             f"{self.n_call_accept:6d}, #gen drafts = {self.n_gen_drafts:6d}, #acc drafts = "
             f"{self.n_acc_drafts:5d}, #gen tokens = {self.n_gen_tokens:6d}, #acc tokens = "
             f"{self.n_acc_tokens:5d}")
        if self.n_call_accept > 0:
            rates = ", ".join(f"{r:.3f}" for r in self.acceptance_rate_per_pos)
            s += f", #mean acc len = {self.mean_acceptance_length:.2f}, #acc rate/pos = ({rates})"
        s += (f", dur(b,g,a) = {self.t_begin_us / 1000:.3f}, {self.t_draft_us / 1000:.3f}, "
              f"{self.t_accept_us / 1000:.3f} ms")
        return s


class Speculator:
    """Base class: every hook exists and does nothing unless overridden."""

    type: ClassVar[SpecType] = SpecType.NONE
    #: a drafter that proposes only where the context's last ``context_key`` tokens (the
    #: sampled one included) occurred earlier in the context, as an exact n-gram lookup of the
    #: context alone does: the adaptive controller, which follows how far the context repeats
    #: itself, does not ask it where it cannot have anything (0: it may, from what it keeps)
    context_key: int = 0

    def __init__(self, n_max: int):
        #: maximum draft length after implementation-specific limits
        self.n_max = n_max
        self.stats = SpeculatorStats()

    @property
    def name(self) -> str:
        return self.type.value

    def begin(self, prompt: Sequence[int]) -> None:
        """Called once at the start of a generation with the full prompt."""

    def process(self, tokens: Sequence[int], pos0: int) -> bool:
        """Called with every batch the target decodes (tokens at pos0...)."""
        return True

    def draft(self, req: DraftRequest) -> list[int]:
        """Return proposed tokens following ``req.id_last`` (may be empty)."""
        return []

    def accept(self, n_accepted: int, is_other: bool) -> None:
        """The target accepted ``n_accepted`` tokens of the last draft."""

    def draft_cut(self, n_kept: int) -> None:
        """Only the first ``n_kept`` tokens of the last draft go to verification.

        The adaptive controller cuts drafts to the length it expects to pay;
        the acceptance then reported is out of the cut draft. What a
        speculator remembers of its last draft is cut to match: its length
        in ``n_draft_last`` (ngram-mod judges its acceptance fraction by it)
        and the per-token sources in ``_last_sources`` (ngram-cache counts
        drafted tokens per cache from them).
        """
        if isinstance(getattr(self, "n_draft_last", None), int):
            self.n_draft_last = min(self.n_draft_last, n_kept)
        if isinstance(getattr(self, "_last_sources", None), list):
            del self._last_sources[n_kept:]

    def get_state(self) -> bytes | None:
        """Serialise per-sequence state, or None when there is none."""
        return None

    def set_state(self, data: bytes) -> None:
        """Restore what :meth:`get_state` returned."""

    def close(self) -> None:
        """Release native resources (draft contexts)."""
