"""What the engine tells its listeners: token events, stats, the end.

The flow is one way: ``Engine.generate`` yields these objects in order::

    StepEvent*  (one per verify step, carrying the tokens it accepted)
    StatsEvent* (now and then, a snapshot of the statistics)
    FinishEvent (once, with the reason and the whole result)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import SpeculatorStats, mean_acceptance_length
from .controller_stats import ControllerStats


@dataclass(slots=True)
class TokenEvent:
    """One emitted token.

    ``drafted_by`` names the speculator whose draft contained this token
    and that the target accepted; None when the target produced it itself.
    ``draft_pos`` is its 0-based position in that draft.
    ``text`` is the decoded text this token adds (may be empty while a
    multi-byte character is incomplete).
    """

    index: int
    id: int
    text: str
    drafted_by: str | None = None
    draft_pos: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "text": self.text,
                "drafted_by": self.drafted_by, "draft_pos": self.draft_pos}


@dataclass(slots=True)
class StepEvent:
    """One verify step: the draft that was tried and the tokens that came out."""

    tokens: list[TokenEvent]
    drafted_by: str | None = None
    n_drafted: int = 0
    n_accepted: int = 0


@dataclass
class GenerationStats:
    n_prompt: int = 0
    n_prompt_reused: int = 0
    n_generated: int = 0      # tokens the target produced (incl. any cut by a stop string)
    n_emitted: int = 0        # tokens in the reply
    n_steps: int = 0          # target decode calls after the prompt
    n_drafted: int = 0        # draft tokens sent to verification
    n_accepted: int = 0       # of those, accepted
    t_prompt_s: float = 0.0
    t_gen_s: float = 0.0
    synthetic: bool = False   # synthetic acceptance: output is not valid
    speculators: dict[str, SpeculatorStats] = field(default_factory=dict)
    #: the adaptive controller's decisions in this generation (None: controller off)
    controller: ControllerStats | None = None
    #: a forced run (``Engine.generate(forced=...)``): where the model's own pick differed
    #: (:class:`~speculators.sampling.Flip`); None when not forced
    forced_flips: list | None = None

    @property
    def tokens_per_s(self) -> float:
        """Generation speed after the first token."""
        n = self.n_generated - 1
        return n / self.t_gen_s if self.t_gen_s > 0 and n > 0 else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        n = self.n_prompt - self.n_prompt_reused
        return n / self.t_prompt_s if self.t_prompt_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def n_accept_calls(self) -> int:
        """Verifies of a draft (llama.cpp's ``n_call_accept``, summed over the speculators)."""
        return sum(s.n_call_accept for s in self.speculators.values())

    @property
    def mean_acceptance_length(self) -> float | None:
        """llama.cpp's ``mean acc len``: 1 + accepted draft tokens per verified draft (None
        when no draft was verified). Steps without a draft do not count::

            >>> from speculators.base import SpeculatorStats
            >>> g = GenerationStats(n_generated=2, n_steps=2)
            >>> g.mean_acceptance_length is None       # nothing drafted: no figure, not 1.00
            True
            >>> g.speculators["ngram-mod"] = SpeculatorStats(n_call_accept=4, n_acc_tokens=6)
            >>> g.mean_acceptance_length
            2.5
        """
        return mean_acceptance_length(sum(s.n_acc_tokens for s in self.speculators.values()), self.n_accept_calls)

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens the model produced per decode of the target (steps with and without drafts)."""
        return self.n_generated / self.n_steps if self.n_steps else None

    @property
    def contributors(self) -> list[str]:
        return [n for n, s in self.speculators.items() if s.n_acc_tokens > 0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_prompt": self.n_prompt,
            "n_prompt_reused": self.n_prompt_reused,
            "n_generated": self.n_generated,
            "n_emitted": self.n_emitted,
            "n_steps": self.n_steps,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "t_prompt_s": self.t_prompt_s,
            "t_gen_s": self.t_gen_s,
            "tokens_per_s": self.tokens_per_s,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "n_accept_calls": self.n_accept_calls,
            "tokens_per_step": self.tokens_per_step,
            "synthetic": self.synthetic,
            "valid": not self.synthetic,
            "speculators": {k: v.to_dict() for k, v in self.speculators.items()},
            "controller": self.controller.to_dict() if self.controller is not None else None,
        }


@dataclass
class StatsEvent:
    stats: GenerationStats


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    drafted_by: list[str | None]
    draft_pos: list[int | None]
    finish_reason: str
    stats: GenerationStats
    message: str = ""
    #: every token the model wrote, through the one that ended the reply: ``tokens`` and, where
    #: the reply ended on an end-of-generation token or a stop string, that token or the stop
    #: string's tokens (not shown). What a teacher-forced run (``forced``) must be given to write
    #: the same reply and end it where this one ended.
    written: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "drafted_by": self.drafted_by,
            "draft_pos": self.draft_pos,
            "finish_reason": self.finish_reason,
            "message": self.message,
            "stats": self.stats.to_dict(),
        }


#: finish reasons
STOP_EOG = "stop"            # the model ended its turn
STOP_STRING = "stop_string"  # a stop string appeared
STOP_LENGTH = "length"       # max tokens reached
STOP_CONTEXT = "context"     # the context window is full
STOP_CANCELLED = "cancelled"  # the caller asked to stop


@dataclass
class FinishEvent:
    result: GenerationResult

    @property
    def reason(self) -> str:
        return self.result.finish_reason


Event = StepEvent | StatsEvent | FinishEvent
