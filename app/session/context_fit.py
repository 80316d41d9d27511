"""Fitting the conversation into the model's context: which older messages the model no longer sees.

Pure logic: the engine is asked only to turn messages into prompt tokens (its chat template),
nothing is generated. The reply thread (:mod:`app.session.reply`) calls :func:`fit_to_context`
before each reply; the read-ahead (:mod:`app.session.read_ahead`) uses :func:`reply_room` to
tell whether the next reply's prompt will start as the conversation does.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import UserError
from .engine import engine_n_ctx

__all__ = ["ContextOverflow", "system_tokens", "reply_room", "suggest_ctx", "fit_to_context"]


class ContextOverflow(UserError):
    """The conversation (or one message) does not fit the context under the chosen policy."""


def system_tokens(engine: Any, messages: list[dict]) -> int:
    """Tokens the system prompt takes at the start of the prompt (1: just BOS, when there is none)."""
    if not messages or messages[0]["role"] != "system":
        return 1
    head = engine.prompt_tokens(messages=messages[:1])
    full = engine.prompt_tokens(messages=messages)
    n = 0
    while n < min(len(head), len(full)) and head[n] == full[n]:
        n += 1
    return max(1, n)


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the reply when older turns must go: a quarter of the context at most.

    >>> reply_room(4096, 512), reply_room(1024, 512)
    (512, 256)
    """
    return max(1, min(max_tokens, n_ctx // 4))


def suggest_ctx(n_needed: int) -> int:
    """The next context size (a multiple of 256) that holds ``n_needed`` tokens and a reply
    (a third more).

    >>> suggest_ctx(100), suggest_ctx(303), suggest_ctx(3000)
    (256, 512, 4096)
    """
    n = max(256, n_needed + n_needed // 3)
    return -(-n // 256) * 256


def fit_to_context(engine: Any, messages: list[dict], max_tokens: int, policy: str,
                   turn_index: Sequence[int] | None = None) -> tuple[list[int], tuple[int, int] | None]:
    """The prompt for ``messages``, with older turns left out if it does not fit.

    Returns ``(prompt tokens, cut)``; ``cut`` is None when everything fits,
    else ``(index in turns of the first message kept, messages dropped)``
    (``turn_index[i]`` is the turn of the i-th non-system message). Whole
    messages are dropped, so the template's special tokens are never split:

    - ``rolling``: the oldest messages after the system prompt go first;
    - ``truncate-middle``: the first exchange stays, the ones after it go;
    - ``stop``: nothing is dropped; a conversation that does not fit is an error.

    The last message (the person's) always stays; if it cannot fit on its own,
    :class:`ContextOverflow` says by how much and which context size would do.
    """
    n_ctx = engine_n_ctx(engine)
    prompt = engine.prompt_tokens(messages=messages)
    room = reply_room(n_ctx, max_tokens)
    if len(prompt) + room <= n_ctx:
        return prompt, None
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    body = messages[len(system):]
    last = body[-1:]
    alone = engine.prompt_tokens(messages=system + last)
    if len(alone) + room > n_ctx:
        need = len(alone) + room
        raise ContextOverflow(
            f"this message needs {len(alone)} tokens of context (with the system prompt) plus room for "
            f"the reply, {need} in all, but the context holds {n_ctx}; shorten it, or raise the context "
            f"size to {suggest_ctx(need)} (settings F3, or -c {suggest_ctx(need)})")
    if policy == "stop":
        if len(prompt) < n_ctx - 1:
            return prompt, None   # the reply stops when the context is full
        raise ContextOverflow(
            f"the conversation has {len(prompt)} tokens and the context holds {n_ctx} (with room for a reply); "
            f"start a new chat (Ctrl+N), raise the context size, or choose a rolling window in settings (F3)")
    keep_head = 2 if policy == "truncate-middle" and len(body) > 3 else 0
    k, toks = _drop_oldest(engine, system, body, keep_head, n_ctx - room)
    first_kept_msg = keep_head + k
    idx = list(turn_index) if turn_index is not None else list(range(len(body)))
    first_kept = idx[first_kept_msg] if first_kept_msg < len(idx) else (idx[-1] if idx else 0)
    return toks, (first_kept, k)


def _drop_oldest(engine: Any, system: list[dict], body: list[dict], keep_head: int,
                 fits: int) -> tuple[int, list[int]]:
    """The fewest whole messages to drop from ``body`` after its first ``keep_head`` so that the
    prompt is ``fits`` tokens at most (the last message always stays): (how many, the prompt).
    Pairs stay together where they can, so the model never sees a reply without its question."""
    head = body[:keep_head]

    def build(k: int) -> list[dict]:
        return system + head + body[keep_head + k:]

    lo, hi = 1, len(body) - keep_head - 1   # drop k messages from the middle/oldest; the last stays
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        toks = engine.prompt_tokens(messages=build(mid))
        if len(toks) <= fits:
            best, hi = (mid, toks), mid - 1
        else:
            lo = mid + 1
    if best is None:
        k = len(body) - keep_head - 1
        best = (k, engine.prompt_tokens(messages=build(k)))
    k, toks = best
    # a kept reply whose question was dropped: drop it too (never start with the model's own words)
    if keep_head + k < len(body) - 1 and body[keep_head + k]["role"] == "assistant":
        k += 1
        toks = engine.prompt_tokens(messages=build(k))
    return k, toks
