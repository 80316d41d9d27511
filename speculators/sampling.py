"""Target-side sampling and draft verification.

:meth:`Sampler.sample_and_accept_n` is ``common_sampler_sample_and_accept_n``:
it samples the target at each verified row with the target's own sampler
and stops at the first disagreement with the draft, so the accepted tokens
are exactly those plain decoding would have produced.

Greedy sampling is an argmax in numpy (the first maximum, as llama.cpp's
greedy sampler picks); temperature sampling runs llama.cpp's own sampler
chain (top-k, top-p, min-p, temperature, then a seeded distribution).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import llama_cpp as lc

from .llama import Context, Model

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: pick a random seed


@dataclass
class SamplingParams:
    """llama.cpp's defaults; ``temperature <= 0`` means greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        from .params import ParamError
        if self.temperature < 0 or self.temperature != self.temperature:
            raise ParamError("temperature", "must be >= 0")
        if self.top_k < 0:
            raise ParamError("top_k", "must be >= 0 (0 disables)")
        if not 0.0 <= self.top_p <= 1.0:
            raise ParamError("top_p", "must be within [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ParamError("min_p", "must be within [0, 1]")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise ParamError("seed", "must be within [0, 4294967295]")


@dataclass
class Flip:
    """A position where a forced run's model picked another token than the forced one."""

    index: int     #: position in the reply (0: its first token)
    forced: int    #: the forced token
    own: int       #: the token the model's sampler picked
    margin: float  #: greedy only: the own token's logit minus the forced one's (nan otherwise)


class Sampler:
    """The target's sampler.

    ``forced``: a teacher-forced run (benchmarks): each position still samples as usual (the
    same work), then the forced token is taken in its place while any are left, so that runs
    of different speculative types write the same text. Where the model's own pick differs,
    :attr:`flips` records it, with the logit margin (greedy) that shows whether it was a
    near-tie. A restore (:meth:`save` / :meth:`restore`) rewinds the forced position too.

        >>> class _Model:
        ...     suppress_tokens = None
        ...     def is_eog(self, t): return False
        >>> class _Ctx:
        ...     def logits(self, i): return np.array([0.0, 2.0, 1.5])  # the model picks 1
        >>> s = Sampler(SamplingParams(temperature=0.0), _Model(), forced=[1, 2])
        >>> s.sample_and_accept_n(_Ctx(), [0, 1], [1])  # draft [1]: accepted, then 2 is forced
        [1, 2]
        >>> s.flips
        [Flip(index=1, forced=2, own=1, margin=0.5)]
    """

    def __init__(self, params: SamplingParams, model: Model, forced: Sequence[int] | None = None):
        params.validate()
        self.params = params
        self.model = model
        self._chain = None
        self._forced = list(forced) if forced is not None else None
        self._pos = 0  # tokens sampled (the reply's next position)
        self.flips: list[Flip] = []
        #: token ids the model never lets be sampled (None: none)
        self._suppress = getattr(model, "suppress_tokens", None)
        self.seed = params.seed
        if not params.greedy:
            if self.seed == DEFAULT_SEED:
                self.seed = random.getrandbits(32) & 0x7FFFFFFF
            cp = lc.llama_sampler_chain_default_params()
            chain = lc.llama_sampler_chain_init(cp)
            if self._suppress is not None:
                # as common_sampler: the model's suppress tokens as a -inf logit bias, first
                n = len(self._suppress)
                self._bias = (lc.llama_logit_bias * n)(*[lc.llama_logit_bias(int(t), float("-inf"))
                                                       for t in self._suppress])
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(model.n_vocab, n, self._bias))
            if params.top_k > 0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(self.seed))
            self._chain = chain

    def sample(self, ctx: Context, idx: int) -> int:
        """Sample (and accept) one token from output row ``idx``."""
        if self._forced is None:
            return self._sample(ctx, idx)
        own = self._sample(ctx, idx)
        i = self._pos
        self._pos += 1
        if i >= len(self._forced):
            return own
        tok = self._forced[i]
        if tok != own:
            margin = float("nan")
            if self._chain is None:
                logits = ctx.logits(idx)
                margin = float(logits[own] - logits[tok])
            self.flips.append(Flip(i, tok, own, round(margin, 4)))
        return tok

    def _sample(self, ctx: Context, idx: int) -> int:
        if self._chain is None:
            logits = ctx.logits(idx)
            if self._suppress is not None:
                logits = logits.copy()
                logits[self._suppress] = -np.inf
            return int(np.argmax(logits))
        return int(lc.llama_sampler_sample(self._chain, ctx.ptr, idx))

    def sample_and_accept_n(self, ctx: Context, idxs: Sequence[int], draft: Sequence[int]) -> list[int]:
        """Tokens the target accepts: the agreeing draft prefix plus one of its own.

        No draft token after an end-of-generation token is accepted.
        """
        assert len(idxs) == len(draft) + 1
        out: list[int] = []
        n = len(draft)
        for i in range(n):
            tok = self.sample(ctx, idxs[i])
            out.append(tok)
            if draft[i] != tok or (i + 1 < n and self.model.is_eog(tok)):
                return out
        out.append(self.sample(ctx, idxs[n]))
        return out

    def save(self):
        """What :meth:`restore` needs after a verify that is undone: a copy of the native chain
        (its RNG state too; llama-server's ``common_sampler_clone``) and the reply position."""
        return (lc.llama_sampler_clone(self._chain) if self._chain is not None else None,
                self._pos, len(self.flips))

    def restore(self, saved) -> None:
        """Back to what :meth:`save` copied (``saved`` is consumed)."""
        if saved is None:
            return
        chain, self._pos, n_flips = saved
        del self.flips[n_flips:]
        if chain is None:
            return
        old, self._chain = self._chain, chain
        if old is not None:
            lc.llama_sampler_free(old)

    @staticmethod
    def drop(saved) -> None:
        """Free a :meth:`save` copy that was not needed."""
        if saved is not None and saved[0] is not None:
            lc.llama_sampler_free(saved[0])

    def close(self) -> None:
        if self._chain is not None:
            lc.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
