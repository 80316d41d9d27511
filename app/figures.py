"""The figures of a reply and of a session: one definition, shown the same everywhere.

The reply footer, the statistics panel (F4) and the Markdown export all take
their numbers from here, so they never disagree.

*Tokens* are the tokens of the reply as shown (and stored). The engine may
verify a few more than it shows: tokens past a stop string, or the trailing
newline a transcript model ends its turn with. Draft tokens the model
accepted there are counted as accepted (the verify did accept them) but are
named separately, so accepted tokens never exceed the coloured tokens of the
reply without saying why::

    >>> from speculators.events import TokenEvent
    >>> toks = [TokenEvent(0, 1, "Hi", None, None), TokenEvent(1, 2, " you", "ngram-mod", 0)]
    >>> f = ReplyFigures.from_reply(toks, {"n_generated": 5, "n_drafted": 4, "n_accepted": 3,
    ...                                    "n_steps": 2, "t_gen_s": 0.5, "speculators": {
    ...                                        "ngram-mod": {"n_call_accept": 2, "n_acc_tokens": 3}}})
    >>> (f.n_tokens, f.n_accepted, f.n_accepted_shown, f.n_accepted_past)
    (2, 3, 1, 2)
    >>> f.footer()
    '2 tok · 8.0 tok/s · drafted 4 · accepted 3 (75%: 1 in the reply, 2 past its end) · mean acc len 2.50 · by ngram-mod'

The mean acceptance length is llama.cpp's (``print_stats``): 1 + accepted draft
tokens per verified draft, so a reply with nothing drafted has none. Speeds are
the engine's, after the first token; a session's speed is the sum of its replies'
tokens after their first over the sum of their times, so it lies between them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from speculators.base import SpeculatorStats, mean_acceptance_length
from speculators.events import GenerationStats, TokenEvent


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.0f}%"


def spec_stats_from_dict(d: Mapping[str, Any]) -> SpeculatorStats:
    s = SpeculatorStats()
    for k, v in d.items():
        if k == "n_acc_tokens_per_pos":
            s.n_acc_tokens_per_pos = list(v)
        elif hasattr(s, k) and isinstance(v, (int, float)) and not isinstance(getattr(type(s), k, None), property):
            setattr(s, k, v)
    return s


@dataclass
class ReplyFigures:
    """What the footer, F4 and the export say about one reply."""

    n_tokens: int = 0            # tokens in the reply as shown
    n_generated: int = 0         # tokens the model produced (incl. any past the reply's end)
    n_drafted: int = 0           # draft tokens sent to verification
    n_accepted: int = 0          # of those, accepted by the model
    n_accepted_shown: int = 0    # accepted draft tokens that are in the reply (coloured)
    n_steps: int = 0
    t_gen_s: float = 0.0
    synthetic: bool = False
    #: accepted draft tokens in the reply, per speculator
    shown_by: dict[str, int] = field(default_factory=dict)
    #: verified drafts and their accepted tokens, summed over the speculators (llama.cpp's
    #: ``n_call_accept`` and ``n_acc_tokens``)
    n_accept_calls: int = 0
    n_acc_tokens: int = 0

    @classmethod
    def from_reply(cls, tokens: Sequence[TokenEvent], stats: Mapping[str, Any] | None) -> "ReplyFigures":
        f = cls._from_reply(tokens, stats)
        for d in ((stats or {}).get("speculators") or {}).values():
            if isinstance(d, Mapping):
                f.n_accept_calls += int(d.get("n_call_accept", 0) or 0)
                f.n_acc_tokens += int(d.get("n_acc_tokens", 0) or 0)
        return f

    @classmethod
    def _from_reply(cls, tokens: Sequence[TokenEvent], stats: Mapping[str, Any] | None) -> "ReplyFigures":
        s = stats or {}
        n_acc = int(s.get("n_accepted", 0) or 0)
        if not tokens and s.get("n_generated"):
            # a reply stored without its tokens: what it showed is all that is known
            n = int(s.get("n_emitted", s.get("n_generated", 0)) or 0)
            return cls(n_tokens=n, n_generated=int(s.get("n_generated", n) or 0),
                       n_drafted=int(s.get("n_drafted", 0) or 0), n_accepted=n_acc, n_accepted_shown=n_acc,
                       n_steps=int(s.get("n_steps", 0) or 0), t_gen_s=float(s.get("t_gen_s", 0.0) or 0.0),
                       synthetic=bool(s.get("synthetic")))
        by = Counter(t.drafted_by for t in tokens if t.drafted_by is not None)
        shown = sum(by.values())
        return cls(n_tokens=len(tokens), n_generated=int(s.get("n_generated", len(tokens)) or 0),
                   n_drafted=int(s.get("n_drafted", 0) or 0), n_accepted=max(n_acc, shown),
                   n_accepted_shown=shown, n_steps=int(s.get("n_steps", 0) or 0),
                   t_gen_s=float(s.get("t_gen_s", 0.0) or 0.0), synthetic=bool(s.get("synthetic")),
                   shown_by=dict(by))

    @property
    def n_accepted_past(self) -> int:
        return self.n_accepted - self.n_accepted_shown

    @property
    def tokens_per_s(self) -> float:
        """Generation speed after the first token (as the engine measures it)."""
        n = self.n_generated - 1
        return n / self.t_gen_s if self.t_gen_s > 0 and n > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted draft tokens per verified draft (llama.cpp's ``mean acc len``)."""
        return mean_acceptance_length(self.n_acc_tokens, self.n_accept_calls)

    def accepted_text(self) -> str:
        s = f"accepted {self.n_accepted}"
        if self.n_accepted_past:
            return s + f" ({pct(self.acceptance_rate)}: {self.n_accepted_shown} in the reply, " \
                       f"{self.n_accepted_past} past its end)"
        return s + f" ({pct(self.acceptance_rate)})"

    def footer(self, contributors: Sequence[str] = ()) -> str:
        parts = [f"{self.n_tokens} tok"]
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.n_drafted:
            parts.append(f"drafted {self.n_drafted}")
            parts.append(self.accepted_text())
            mal = self.mean_acceptance_length
            if mal:
                parts.append(f"mean acc len {mal:.2f}")
            names = list(contributors) or list(self.shown_by)
            if names:
                parts.append("by " + ", ".join(names))
        elif self.n_tokens:
            parts.append("no drafts")
        if self.synthetic:
            parts.append("synthetic acceptance")
        return " · ".join(parts)


def reply_footer(tokens: Sequence[TokenEvent], stats: Mapping[str, Any] | None, finish: str | None = None,
                 status: str | None = None, notes: Sequence[str] = ()) -> str:
    """The one-line summary under a reply."""
    parts: list[str] = []
    if stats:
        parts.append(ReplyFigures.from_reply(tokens, stats).footer())
    parts.extend(notes)
    if status == "streaming":
        parts.append("interrupted")
    elif finish == "cancelled":
        parts.append("stopped")
    elif finish == "length":
        parts.append("hit the token limit")
    elif finish == "context":
        parts.append("context full")
    return " · ".join(p for p in parts if p)


@dataclass
class Totals:
    """A session's figures: sums of its replies' (so no ratio here disagrees with theirs)::

        >>> t = Totals()
        >>> for n, secs in ((35, 0.977), (35, 0.977), (34, 0.99)):
        ...     t.add(ReplyFigures(n_tokens=n, n_generated=n, t_gen_s=secs))
        >>> round(t.tokens_per_s, 1)          # the replies ran at 34.8, 34.8 and 33.3 tok/s
        34.3
        >>> t.figures.mean_acceptance_length is None
        True
    """

    replies: int = 0
    n_tokens: int = 0
    n_generated: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_accepted_shown: int = 0
    n_steps: int = 0
    t_gen_s: float = 0.0
    #: tokens after each reply's first (the ones its speed counts)
    n_after_first: int = 0
    n_accept_calls: int = 0
    n_acc_tokens: int = 0

    def add(self, f: ReplyFigures) -> None:
        self.replies += 1
        self.n_tokens += f.n_tokens
        self.n_generated += f.n_generated
        self.n_drafted += f.n_drafted
        self.n_accepted += f.n_accepted
        self.n_accepted_shown += f.n_accepted_shown
        self.n_steps += f.n_steps
        self.t_gen_s += f.t_gen_s
        self.n_after_first += max(0, f.n_generated - 1)
        self.n_accept_calls += f.n_accept_calls
        self.n_acc_tokens += f.n_acc_tokens

    @property
    def figures(self) -> ReplyFigures:
        return ReplyFigures(self.n_tokens, self.n_generated, self.n_drafted, self.n_accepted,
                            self.n_accepted_shown, self.n_steps, self.t_gen_s,
                            n_accept_calls=self.n_accept_calls, n_acc_tokens=self.n_acc_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.n_after_first / self.t_gen_s if self.t_gen_s > 0 else 0.0


@dataclass
class SessionStats:
    """Figures of the finished replies of this session, plus the live one."""

    totals: Totals = field(default_factory=Totals)
    speculators: dict[str, SpeculatorStats] = field(default_factory=dict)
    #: accepted draft tokens shown in replies, per speculator
    shown_by: Counter = field(default_factory=Counter)
    #: the adaptive controller's decisions, summed over replies (a ``ControllerStats``), when it ran
    controller: Any = None

    def add(self, stats: GenerationStats, tokens: Sequence[TokenEvent]) -> None:
        f = ReplyFigures.from_reply(tokens, stats.to_dict())
        self.totals.add(f)
        self.shown_by.update(f.shown_by)
        for name, s in stats.speculators.items():
            cur = self.speculators.get(name)
            self.speculators[name] = s.copy() if cur is None else cur + s
        ctl = getattr(stats, "controller", None)
        if ctl is not None:
            self.controller = ctl.copy() if self.controller is None else self.controller + ctl

    def with_live(self, live: GenerationStats | None, tokens: Sequence[TokenEvent] = ()) -> "SessionStats":
        """A copy that includes the reply still being written."""
        out = SessionStats(Totals(**self.totals.__dict__), {k: v.copy() for k, v in self.speculators.items()},
                           Counter(self.shown_by), self.controller.copy() if self.controller is not None else None)
        if live is not None:
            out.add(live, tokens)
            out.totals.replies -= 1
        return out
