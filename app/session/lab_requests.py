"""The Lab's requests to the session: which prompts and types it may use, and a run on the loaded model.

The Lab's screen (:mod:`app.ui.lab`) calls :meth:`LabMixin.run_lab` in a worker thread; the
run itself is :func:`app.lab.run_lab`, on the session's engine under its lock, and the chat's
own speculation is put back afterwards. Touches nothing else of the session.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

from speculators.params import SpecParams

from .conversation import SessionError
from .engine import stop_strings, uses_lookup_caches

__all__ = ["LabMixin"]


class LabMixin:
    """The session's Lab job (a part of :class:`app.session.ChatSession`)."""

    def lab_prompts(self) -> list[tuple[int, str]]:
        """The person's messages the Lab can run on: (turn index, text), the latest last."""
        return [(i, t.text) for i, t in enumerate(self.turns) if t.role == "user" and t.text.strip()]

    def lab_usable_types(self) -> list[str]:
        """The types this model can use (as Automatic judges them, draft model included)."""
        from speculators.auto import auto_plan
        path = str(getattr(getattr(self.engine, "model", None), "path", "") or "") or None
        sp = self.config.spec.copy()
        sp.types = SpecParams.auto().types
        try:
            return [c.name for c in auto_plan(sp, path) if c.used]
        except Exception:
            return ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]

    def run_lab(self, configs: Sequence[Any], *, turn: int | None = None, text: str | None = None,
                served: int | None = None, rounds: int = 3, max_tokens: int = 128,
                progress: Callable[[int, int, str], None] | None = None,
                cancel: Callable[[], bool] | None = None) -> Any:
        """Run the Lab (:func:`app.lab.run_lab`) on the loaded model, in the calling thread.

        The prompt is the conversation up to the person's message at ``turn`` (default: their
        latest), ``text`` alone (as the person's message), or the served request ``served`` (its
        id in :attr:`served`): its messages through the model's template, or its text as it was
        sent (raw, as a completion's prompt). The chat's own speculation is put back afterwards,
        whatever happens. Raises :class:`SessionError` while a reply is being written, no model
        is loaded, or that request is no longer kept. (A request that gave token ids is run on them.)
        """
        from ..lab import run_lab
        if self.job is not None:
            raise SessionError("wait for the reply to finish")
        engine = self.engine
        if engine is None:
            raise SessionError("no model is loaded")
        raw_text: str | None = None
        msgs: list[dict] | None = None
        ids: list[int] | None = None
        if served is not None:
            req = self.served_request(served)
            if req is None:
                raise SessionError(f"served request #{served} is no longer kept")
            if req.messages is not None:
                msgs = [dict(m) for m in req.messages]
            elif req.prompt_ids is not None:
                ids = list(req.prompt_ids)
            else:
                raw_text = req.text or ""
            label = req.label
        elif text is None:
            prompts = self.lab_prompts()
            if not prompts:
                raise SessionError("no message to run the Lab on: send one, or give a file")
            idx = turn if turn is not None else prompts[-1][0]
            msgs = self.conversation(upto=idx + 1)
            label = self.turns[idx].text
        else:
            msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []) \
                + [{"role": "user", "content": text}]
            label = text
        store = self.store
        with self.engine_lock:
            try:
                if ids is not None:
                    prompt = ids
                elif raw_text is not None:
                    prompt = engine.prompt_tokens(text=raw_text, raw=True)
                else:
                    prompt = engine.prompt_tokens(messages=msgs)
                n_ctx = int(getattr(getattr(engine, "ctx", None), "n_ctx", 0) or 0)
                if n_ctx and len(prompt) + max_tokens >= n_ctx:
                    raise SessionError(f"the prompt ({len(prompt)} tokens) and {max_tokens} more do not fit the "
                                       f"context of {n_ctx}: fewer tokens, or a larger context (F3)")
                stop = stop_strings(engine)
                return run_lab(engine, prompt, configs, rounds=rounds, max_tokens=max_tokens, stop=stop,
                               prompt_text=label, cancel=cancel, progress=progress,
                               resources=lambda sp: store.resources() if store is not None and
                               uses_lookup_caches(sp) else None)
            finally:
                # the chat's own speculation back, as it was
                with contextlib.suppress(Exception):
                    engine.set_spec(self.config.spec.copy(),
                                    resources=store.resources() if store is not None else None)
