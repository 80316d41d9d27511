"""The bodies the server answers with: OpenAI's chat and text completions (whole and as
stream chunks) and llama.cpp's ``/completion``, each with llama-server's ``timings``
and draftlight's ``draftlight`` extension.

``timings`` is llama-server's ``server_slot_stats::to_json``: ``cache_n`` (prompt tokens
reused from the context), ``prompt_n`` / ``prompt_ms`` (the prompt tokens read and the
time to read them, through the first token), ``predicted_n`` / ``predicted_ms`` (the tokens
the model wrote and the time after the first), the per-token and per-second figures derived
from those (the first token is free: it comes with the prompt), and, where anything was
drafted, ``draft_n`` (draft tokens sent to verification) and ``draft_n_accepted`` (of those,
accepted by the model).

A chat reply leaves out the whitespace it begins with, as the chat shows it (a plain
transcript's ``Assistant:`` is followed by a space that is not part of the reply).

``draftlight`` says which speculator drafted the accepted tokens, with the definitions the
chat's footer uses (:class:`app.figures.ReplyFigures`)::

    "draftlight": {"drafted_by": {"ngram-simple": 41},   # accepted draft tokens in the reply
                   "accepted_past_end": 0,               # accepted past its end (a stop string)
                   "mean_acceptance_length": 8.2,        # llama.cpp's print_stats figure
                   "tokens": [[" jumps", "ngram-simple"], [" over", "ngram-simple"], ...]}

so ``sum(drafted_by.values()) + accepted_past_end == timings.draft_n_accepted``. ``tokens``
pairs each token's text with the speculator that drafted it (null: the model wrote it
itself); in a stream each chunk carries the pairs of its own tokens, and the last chunk the
counts.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any, Sequence

from speculators.events import (STOP_CANCELLED, STOP_CONTEXT, STOP_EOG, STOP_LENGTH, STOP_STRING,
                                GenerationResult, GenerationStats, StepEvent, TokenEvent)

from ..figures import ReplyFigures
from .schema import Job


def fingerprint() -> str:
    from .. import __version__
    return f"draftlight-{__version__}"


def timings(stats: GenerationStats, figures: ReplyFigures) -> dict[str, Any]:
    """llama-server's ``timings`` for a finished reply.

    >>> s = GenerationStats(n_prompt=10, n_prompt_reused=4, n_generated=5, n_drafted=6, n_accepted=3,
    ...                     t_prompt_s=0.06, t_gen_s=0.2)
    >>> t = timings(s, ReplyFigures(n_accepted=3))
    >>> (t["cache_n"], t["prompt_n"], t["predicted_n"], round(t["predicted_per_second"], 3), t["draft_n"],
    ...  t["draft_n_accepted"])
    (4, 6, 5, 20.0, 6, 3)
    """
    n_proc = max(stats.n_prompt - stats.n_prompt_reused, 0)
    prompt_ms = stats.t_prompt_s * 1e3
    n_gen = stats.n_generated
    steps = max(n_gen - 1, 0)            # the first token comes with the prompt
    gen_ms = stats.t_gen_s * 1e3
    out: dict[str, Any] = {
        "cache_n": stats.n_prompt_reused,
        "prompt_n": n_proc,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / n_proc if n_proc else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * n_proc if prompt_ms > 0 else 0.0,
        "predicted_n": n_gen,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 / gen_ms * steps if gen_ms > 0 else 0.0,
    }
    if stats.n_drafted > 0:              # as llama-server: only where something was drafted
        out["draft_n"] = stats.n_drafted
        out["draft_n_accepted"] = figures.n_accepted
    return out


def token_pairs(tokens: Sequence[TokenEvent]) -> list[list]:
    return [[t.text, t.drafted_by] for t in tokens]


def finish_reason(reason: str) -> str:
    """OpenAI's ``finish_reason`` for the engine's (a full context is ``length``, as in llama-server)."""
    return "length" if reason in (STOP_LENGTH, STOP_CONTEXT) else "stop"


def stop_type(reason: str) -> str:
    """llama.cpp's ``stop_type``: ``eos``, ``word`` or ``limit``."""
    return {STOP_EOG: "eos", STOP_STRING: "word", STOP_LENGTH: "limit", STOP_CONTEXT: "limit"}.get(reason, "none")


class Reply:
    """One reply as it is written: what each stream chunk and the whole answer say."""

    def __init__(self, job: Job, model_id: str, prompt: Sequence[int], chain: Sequence[str] = ()):
        self.job = job
        self.model_id = model_id
        self.n_prompt = len(prompt)
        self.chain = list(chain)
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-"}.get(job.kind, "")
        self.id = prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.tokens: list[TokenEvent] = []
        self.result: GenerationResult | None = None
        self.figures: ReplyFigures | None = None
        self._lstrip = job.kind == "chat"

    # -- as it goes -----------------------------------------------------------------------------
    def add(self, step: StepEvent) -> list[TokenEvent]:
        toks = list(step.tokens)
        if self._lstrip:
            # as the chat shows a reply: a transcript's "Assistant:" is followed by a space the
            # reply does not begin with (the template puts it back when the reply is sent again)
            # (on copies: the step's tokens are also the Server screen's, which strips them itself)
            for i, t in enumerate(toks):
                toks[i] = t = dataclasses.replace(t, text=t.text.lstrip())
                if t.text:
                    self._lstrip = False
                    break
        self.tokens.extend(toks)
        return toks

    def finish(self, result: GenerationResult) -> None:
        self.result = result
        self.figures = ReplyFigures.from_reply(self.tokens, result.stats.to_dict())

    @property
    def reason(self) -> str:
        return self.result.finish_reason if self.result is not None else STOP_CANCELLED

    # -- the parts -------------------------------------------------------------------------------
    def usage(self) -> dict[str, Any]:
        s = self.result.stats
        return {"prompt_tokens": s.n_prompt, "completion_tokens": s.n_generated,
                "total_tokens": s.n_prompt + s.n_generated,
                "prompt_tokens_details": {"cached_tokens": s.n_prompt_reused}}

    def timings(self) -> dict[str, Any]:
        return timings(self.result.stats, self.figures)

    def extension(self, with_tokens: bool) -> dict[str, Any]:
        f = self.figures
        out: dict[str, Any] = {"drafted_by": dict(f.shown_by), "accepted_past_end": f.n_accepted_past,
                               "mean_acceptance_length": f.mean_acceptance_length,
                               "speculators": self.chain}
        if self.result.stats.synthetic:
            out["synthetic"] = True          # synthetic acceptance: the text is not the model's
        if with_tokens:
            out["tokens"] = token_pairs(self.tokens)
        return out

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id,
                "system_fingerprint": fingerprint()}

    # -- whole answers ---------------------------------------------------------------------------
    def body(self) -> dict[str, Any]:
        """The answer of a request that does not stream."""
        text = self.result.text
        if self.job.kind == "chat":
            text = text.lstrip()
            out = self._head("chat.completion")
            out["choices"] = [{"index": 0, "message": {"role": "assistant", "content": text},
                               "logprobs": None, "finish_reason": finish_reason(self.reason)}]
        elif self.job.kind == "completions":
            out = self._head("text_completion")
            out["choices"] = [{"index": 0, "text": text, "logprobs": None,
                               "finish_reason": finish_reason(self.reason)}]
        else:
            return self.completion_final(text, list(self.result.tokens) if self.job.return_tokens else [])
        out["usage"] = self.usage()
        out["timings"] = self.timings()
        out["draftlight"] = self.extension(with_tokens=True)
        return out

    def completion_final(self, content: str, token_ids: list[int]) -> dict[str, Any]:
        """llama.cpp's ``/completion`` answer (the last event of its stream, ``content`` empty there)."""
        s = self.result.stats
        j = self.job
        return {
            "index": 0, "content": content, "tokens": token_ids, "id_slot": 0, "stop": True,
            "model": self.model_id, "tokens_predicted": s.n_generated, "tokens_evaluated": s.n_prompt,
            "generation_settings": {
                "n_predict": j.max_tokens if j.max_tokens is not None else -1,
                "temperature": j.sampling.temperature, "top_k": j.sampling.top_k, "top_p": j.sampling.top_p,
                "min_p": j.sampling.min_p, "seed": j.sampling.seed, "stop": list(j.stop),
                "speculative.types": self.chain,
            },
            "prompt": j.text if j.text is not None else "",
            "has_new_line": "\n" in self.result.text,
            "truncated": False,
            "stop_type": stop_type(self.reason),
            # the engine cuts a stop string without saying which: named where only one was asked for
            "stopping_word": j.stop[0] if self.reason == STOP_STRING and len(j.stop) == 1 else "",
            "tokens_cached": s.n_prompt + s.n_generated,
            "timings": self.timings(),
            "draftlight": self.extension(with_tokens=True),
        }

    # -- stream chunks ---------------------------------------------------------------------------
    def first_chunks(self) -> list[dict[str, Any]]:
        """What a stream starts with (OpenAI's chat: the assistant's role, no text yet)."""
        if self.job.kind != "chat":
            return []
        out = self._head("chat.completion.chunk")
        out["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None}]
        if self.job.include_usage:
            out["usage"] = None
        return [out]

    def chunk(self, tokens: Sequence[TokenEvent]) -> dict[str, Any] | None:
        """The chunk for ``tokens`` (None: they add no text yet, e.g. half a character)."""
        text = "".join(t.text for t in tokens)
        if not text:
            return None
        ext = {"tokens": token_pairs(tokens)}
        if self.job.kind == "completion":
            return {"index": 0, "content": text, "tokens": [t.id for t in tokens], "stop": False, "id_slot": 0,
                    "tokens_predicted": len(self.tokens), "tokens_evaluated": self.n_prompt, "draftlight": ext}
        if self.job.kind == "chat":
            out = self._head("chat.completion.chunk")
            out["choices"] = [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]
        else:
            out = self._head("text_completion")
            out["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]
        if self.job.include_usage:
            out["usage"] = None
        out["draftlight"] = ext
        return out

    def final_chunks(self) -> list[dict[str, Any]]:
        """The stream's last events: the finish reason, then (``include_usage``) the usage; the
        last carries ``timings`` and the extension's counts, as llama-server puts its timings."""
        if self.job.kind == "completion":
            return [self.completion_final("", [])]
        if self.job.kind == "chat":
            last = self._head("chat.completion.chunk")
            last["choices"] = [{"index": 0, "delta": {}, "logprobs": None,
                                "finish_reason": finish_reason(self.reason)}]
        else:
            last = self._head("text_completion")
            last["choices"] = [{"index": 0, "text": "", "logprobs": None,
                                "finish_reason": finish_reason(self.reason)}]
        out = [last]
        if self.job.include_usage:
            last["usage"] = None
            usage = self._head(last["object"])
            usage["choices"] = []
            usage["usage"] = self.usage()
            out.append(usage)
        out[-1]["timings"] = self.timings()
        out[-1]["draftlight"] = self.extension(with_tokens=False)
        return out
