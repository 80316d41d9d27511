"""The generation loop: draft, verify in one batch, accept, roll back or replay, emit.

One step, as llama.cpp's server does it::

    draft    = chain.draft(history, id_last)            # may be empty
    decode([id_last] + draft) at n_past, logits for every row
    accepted = sampler.sample_and_accept_n(rows, draft)  # agreeing prefix + 1
    chain.accept(len(accepted) - 1)
    drop the KV cells of the rejected draft tokens       # or restore a checkpoint
    emit accepted; id_last = accepted[-1]

Because every emitted token is the one the target's own sampler picks at
that position, the output equals plain decoding (up to the numerical
differences between batched and one-token evaluation).

:class:`GenerationLoop` is one generation: :meth:`Engine.generate
<speculators.engine.Engine.generate>` makes one per call and yields what its
:meth:`~GenerationLoop.run` yields. Each step of the loop is a method:
:meth:`~GenerationLoop._draft`, :meth:`~GenerationLoop._verify`,
:meth:`~GenerationLoop._accept`, :meth:`~GenerationLoop._roll_back` (a
checkpoint restored: the step is replayed), :meth:`~GenerationLoop._keep`
(the accepted tokens kept in the context) and :meth:`~GenerationLoop._emit`;
:meth:`~GenerationLoop._finish` ends the generation.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from .base import DraftRequest
from .chain import SpeculatorChain
from .context_shift import chain_blockers
from .controller import Controller
from .events import (
    STOP_CANCELLED, STOP_CONTEXT, STOP_EOG, STOP_LENGTH, STOP_STRING,
    Event, FinishEvent, GenerationResult, GenerationStats, StatsEvent, StepEvent, TokenEvent,
)
from .llama import ContextFull, DecodeAborted
from .reply_builder import ReplyBuilder, sentence_end
from .sampling import DEFAULT_SEED, Sampler

if TYPE_CHECKING:  # the engine imports this module, never the other way round
    from .engine import Engine


class GenerationLoop:
    """One generation on ``engine``: the prompt's prefill, then steps until the reply ends.

    It holds the generation's state (what was a long function's locals): the tokens in the
    target's context (``history``, ``n_past`` of them) and the last sampled token not yet
    decoded (``id_last``), the reply being written, and a step's checkpoint and replay.

    ``ctrl``: the adaptive controller of the engine's chain (None: off). ``shift_keep``: the
    tokens a context shift keeps (None: no shift, the reply ends when the context is full).
    """

    def __init__(self, engine: Engine, prompt: list[int], sampler: Sampler, stats: GenerationStats, *,
                 max_tokens: int, stop: Sequence[str] = (), cancel: Callable[[], bool] | None = None,
                 stats_interval_s: float = 0.25, ctrl: Controller | None = None,
                 shift_keep: int | None = None):
        self.engine = engine
        self.model, self.ctx = engine.model, engine.ctx
        chain = engine.chain
        assert chain is not None
        self.chain: SpeculatorChain = chain
        self.prompt = prompt
        self.sampler = sampler
        self.stats = stats
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.cancel = cancel
        self.stats_interval_s = stats_interval_s
        self.ctrl = ctrl
        self.shift_keep = shift_keep
        #: synthetic acceptance (benchmarks): per draft position, the chance a token is accepted
        self.synth_probs = chain.synth_probs
        self.synth_rng = random.Random(None if sampler.seed == DEFAULT_SEED else sampler.seed)
        #: the chain's and the controller's counts before this generation (theirs accumulate)
        self.base_spec_stats = chain.stats()
        self.base_ctrl_stats = None
        self.n_ctx = self.ctx.n_ctx
        #: a recurrent or hybrid target keeps its state only whole ("partial" state_get/state_set)
        self.partial = self.model.is_hybrid or self.model.is_recurrent
        # the generation's state, set by _start
        self.history: list[int] = []   # tokens in the KV cache, in order
        self.n_past = 0                # len(history): where the next batch is decoded
        self.id_last = -1              # the last sampled token, decoded by the next step
        self.reply = ReplyBuilder(self.model, self.stop, max_tokens)
        self.finish: str | None = None
        self.no_shift = ""             # why the context cannot shift ("": it can, or was not asked to)
        self.t_prompt0 = 0.0           # when the prefill started
        self.t_gen0 = 0.0              # when the reply's first token was sampled
        self.last_stats = 0.0          # when the last StatsEvent was sent
        # the step in progress: the controller's decision, when the step's cost started to count,
        # the step's checkpoint and the sampler's copy from before the verify (for a restore)
        self.dec = None
        self.t_step = 0.0
        self.ckpt: bytearray | None = None
        self.smpl_save = None
        # A checkpointed step whose rejected drafts cannot be dropped (llama-server's verify loop in
        # server-context.cpp): the target state goes back to the step's checkpoint, the sampler to
        # its state before the verify, and nothing is emitted or accepted yet. The next step then
        # *replays* the accepted tokens (the agreeing drafts and the target's own token) as its
        # draft: no new draft, one decode of [id_last] + replay with every row's logits, verified
        # as any draft. Only then is the chain told, with the replay's count: the drafter's
        # per-speculator accept count includes the target's token it did not draft, while the
        # step's own count (GenerationStats.n_accepted, llama-server's draft_n_accepted) leaves
        # it out. The per-step checkpoint keeps no speculator state (spec_ckpt has no data_spec):
        # the replay's decode feeds the drafters again.
        self.replay: list[int] = []
        self.replay_by: str | None = None
        self.replay_n_draft = 0
        #: the restored step's decision and outcome, and its seconds so far: the controller is
        #: told once the replay is done, with the checkpoint's save, restore and replay in its time
        self.replay_obs: tuple | None = None

    # -- the generation --------------------------------------------------------
    def run(self) -> Iterator[Event]:
        """Yield :class:`StepEvent` s, :class:`StatsEvent` s, then one :class:`FinishEvent`."""
        first = self._start()
        if first is None:
            yield from self._stopped_in_prompt()
            return
        yield first
        while self.finish is None:
            event = self._step()
            if event is None:
                continue  # the step ended the reply, or was rolled back to be replayed
            yield event
            stats = self._stats_due()
            if stats is not None:
                yield stats
        yield from self._finish()

    def _start(self) -> StepEvent | None:
        """The prompt's prefill, the drafters told, and the reply's first token (None: the
        prefill was stopped)."""
        ctrl, stats, prompt = self.ctrl, self.stats, self.prompt
        self.base_ctrl_stats = ctrl.snapshot() if ctrl is not None else None
        if ctrl is not None:
            ctrl.begin()
        self.t_prompt0 = time.perf_counter()
        try:
            keep = self.engine._prefill(prompt)
        except DecodeAborted:
            return None
        stats.n_prompt_reused = keep
        self.chain.begin(prompt)
        self.chain.process(prompt[keep:], keep)
        if ctrl is not None:
            ctrl.prepare(prompt)
        self.id_last = self.sampler.sample(self.ctx, -1)
        t1 = time.perf_counter()
        stats.t_prompt_s = t1 - self.t_prompt0
        self.t_gen0 = self.last_stats = t1
        self.history = list(prompt)
        self.n_past = len(prompt)
        if ctrl is not None:
            ctrl.useful = self.reply.useful
            if ctrl.boundary is None:
                ctrl.boundary = sentence_end(self.model)
        events = self._emit([self.id_last], None, 0)
        stats.n_generated = self.reply.n_produced
        return StepEvent(events)

    def _stopped_in_prompt(self) -> Iterator[Event]:
        """Stopped while reading the prompt: nothing written."""
        self.stats.t_prompt_s = time.perf_counter() - self.t_prompt0
        yield StatsEvent(self.stats)
        yield FinishEvent(GenerationResult("", [], [], [], STOP_CANCELLED, self.stats,
                                           "stopped while reading the prompt"))

    def _step(self) -> StepEvent | None:
        """One step: draft (or replay), verify, accept, then roll back or keep and emit. None
        where the step wrote nothing (the reply ended before it, or it is to be replayed)."""
        if not self._room_to_go_on():
            return None
        is_replay = bool(self.replay)
        if is_replay:
            draft, drafter = self.replay, self.replay_by
        else:
            draft, drafter = self._draft()
        batch = [self.id_last] + draft
        if not self._verify(batch, draft, is_replay):
            return None
        accepted = self._accept(batch, draft, is_replay)
        n_rejected = len(batch) - len(accepted)
        restore = n_rejected > 0 and self.ckpt is not None and self.engine._needs_step_ckpt(n_rejected)
        if restore:
            self._roll_back(draft, drafter, is_replay)
        self._tell_controller(accepted, restore, is_replay)
        if restore:
            self.replay = accepted  # the next step replays them
            return None
        return self._keep(accepted, draft, drafter, is_replay, n_rejected)

    # -- the steps --------------------------------------------------------------
    def _room_to_go_on(self) -> bool:
        """Whether a step may run: not cancelled, and room in the context (made by a context
        shift where one is asked for and the chain allows it). Else sets :attr:`finish`."""
        if self.cancel is not None and self.cancel():
            self.finish = STOP_CANCELLED
            return False
        if self.n_past < self.n_ctx:
            return True
        blockers = chain_blockers(self.chain) if self.shift_keep is not None else []
        if self.shift_keep is None or blockers:
            if blockers:
                self.no_shift = f"context shift is not supported with {', '.join(blockers)}"
            self.finish = STOP_CONTEXT
            return False
        self.history = self.engine._shift(self.history, self.shift_keep, self.chain, self.reply.n_produced)
        self.n_past = len(self.history)
        if self.ctrl is not None:
            self.ctrl.begin()  # its pending proposals were scored at the old positions
        return True

    def _draft(self) -> tuple[list[int], str | None]:
        """A new draft (the controller's decision, or the chain's), and who drafted it; the
        step's checkpoint taken where its rejected drafts could not be dropped."""
        chain, ctrl = self.chain, self.ctrl
        self.ckpt = None
        remaining = self.max_tokens - self.reply.n_produced
        # as llama-server (get_n_draft_max): id_last's cell, and one more kept for a context shift
        room = self.n_ctx - self.n_past - 2
        # the verify batch must fit one decode call, or earlier rows lose their logits
        n_max = min(chain.n_max, remaining - 1, room, self.ctx.n_batch - 1)
        draft = []
        if ctrl is not None:
            self.dec = ctrl.decide(DraftRequest(prompt=self.history, id_last=self.id_last, pos0=self.n_past,
                                                n_max=max(0, n_max)))
            draft = self.dec.draft
        elif n_max > 0 and chain.speculators:
            draft = chain.draft(DraftRequest(prompt=self.history, id_last=self.id_last, pos0=self.n_past,
                                             n_max=n_max))
        drafter = chain.last_drafter if draft else None
        if draft:
            self.stats.n_drafted += len(draft)
        self.t_step = time.perf_counter()   # a drafted step's checkpoint is part of its cost
        if draft and self.engine._needs_step_ckpt(len(draft)):
            # one buffer for every step's checkpoint (it lives until the step is accepted)
            eng = self.engine
            self.ckpt = eng._step_ckpt = self.ctx.state_get(partial=self.partial, into=eng._step_ckpt)
        return draft, drafter

    def _verify(self, batch: list[int], draft: list[int], is_replay: bool) -> bool:
        """Decode ``batch`` (id_last and the draft) at n_past, every row's logits where there is
        a draft, and feed it to the drafters. False where the decode ended the reply."""
        # the sampler as it was before the verify, for a restore (llama-server's smpl_save)
        self.smpl_save = self.sampler.save() if self.ckpt is not None and draft else None
        if is_replay:
            self.t_step = time.perf_counter()
        try:
            self.ctx.decode(batch, self.n_past, logits="all" if draft else "last")
        except ContextFull:
            Sampler.drop(self.smpl_save)
            self.finish = STOP_CONTEXT
            return False
        except DecodeAborted:
            # stopped inside the verify: the context holds the history before it
            Sampler.drop(self.smpl_save)
            self.engine._keep_after_abort(self.history)
            self.finish = STOP_CANCELLED
            return False
        self.chain.process(batch, self.n_past)
        return True

    def _accept(self, batch: list[int], draft: list[int], is_replay: bool) -> list[int]:
        """The tokens the verify settles: the draft's agreeing prefix and the target's own next
        token (only the target's own where there was no draft)."""
        if not draft:
            return [self.sampler.sample(self.ctx, -1)]
        if self.synth_probs:
            return self._accept_synth(draft, replay=is_replay)
        return self.sampler.sample_and_accept_n(self.ctx, range(len(batch)), draft)

    def _accept_synth(self, draft: list[int], replay: bool = False) -> list[int]:
        """Synthetic acceptance (benchmarking): accept draft tokens at random.

        ``replay``: the draft is a replay after a restored checkpoint (already accepted): take
        it whole, as llama-server's server_sample_and_accept_synth does.
        """
        out: list[int] = []
        for i, d in enumerate(draft):
            tok = self.sampler.sample(self.ctx, i)
            if replay or (self.synth_rng.random() < self.synth_probs[i] and not self.model.is_eog(d)):
                out.append(d)
                continue
            out.append(tok)
            return out
        out.append(self.sampler.sample(self.ctx, len(draft)))
        return out

    def _roll_back(self, draft: list[int], drafter: str | None, is_replay: bool) -> None:
        """Back to the step's checkpoint (the target's state, the sampler's); the accepted tokens
        are replayed by the next step."""
        self.ctx.state_set(self.ckpt, partial=self.partial)
        self.ctx.seq_rm(self.n_past, -1)
        self.sampler.restore(self.smpl_save)
        self.engine.kv_tokens = list(self.history)
        if not is_replay:
            self.replay_by, self.replay_n_draft = drafter, len(draft)

    def _tell_controller(self, accepted: list[int], restore: bool, is_replay: bool) -> None:
        """Tell the controller the decided step's outcome and seconds (a replay continues the step
        it replays); a step rolled back is told once its replay is done."""
        told = self.replay_obs if is_replay else (self.dec, accepted, 0.0) if self.ctrl is not None else None
        if told is None:
            return
        spent = told[2] + time.perf_counter() - self.t_step
        self.replay_obs = (told[0], told[1], spent) if restore else None
        if restore:
            return
        if is_replay:
            # the replay wrote the restored step's tokens and one more of its own: the
            # controller is told all of them (what it scores must line up with the text)
            self.ctrl.observe(told[0], accepted, spent, n_accepted=len(told[1]) - 1)
        else:
            self.ctrl.observe(told[0], told[1], spent)

    def _keep(self, accepted: list[int], draft: list[int], drafter: str | None, is_replay: bool,
              n_rejected: int) -> StepEvent:
        """The accepted tokens kept: the chain and the counts told, the rejected drafts' cells
        dropped, and the tokens emitted."""
        stats = self.stats
        Sampler.drop(self.smpl_save)
        n_acc = len(accepted) - 1
        # of a replay, the last replayed token is the target's own, not a draft's
        n_step_acc = n_acc - 1 if is_replay and n_acc > 0 else n_acc
        if draft:
            self.chain.accept(n_acc)
            stats.n_accepted += n_step_acc
        # of a replay, only the first len(replay) - 1 tokens were drafted (its last is the target's)
        n_emit_drafted = min(n_acc, len(self.replay) - 1) if is_replay else n_acc
        n_step_draft = self.replay_n_draft if is_replay else len(draft)
        self.replay, self.ckpt = [], None
        stats.n_steps += 1
        # the KV cache now holds id_last and the accepted drafts
        self.history.append(self.id_last)
        self.history.extend(accepted[:-1])
        n_keep = self.n_past + len(accepted)
        if n_rejected > 0:
            self.ctx.seq_rm(n_keep, -1)
        self.n_past = n_keep
        self.engine.kv_tokens = list(self.history)
        self.id_last = accepted[-1]
        events = self._emit(accepted, drafter, n_emit_drafted)
        stats.n_generated = self.reply.n_produced
        return StepEvent(events, drafter, n_step_draft, n_step_acc)

    def _emit(self, tokens: Sequence[int], by: str | None, n_drafted: int) -> list[TokenEvent]:
        """The tokens added to the reply (the first ``n_drafted`` drafted by ``by``); the events
        of those it releases. Sets :attr:`finish` where one ends the reply."""
        reply = self.reply
        events: list[TokenEvent] = []
        for i, tok in enumerate(tokens):
            drafted = i < n_drafted
            out, reason = reply.add(tok, by if drafted else None, i if drafted else None)
            events.extend(out)
            if reason:
                self.finish = reason
                break
        return events

    def _stats_due(self) -> StatsEvent | None:
        """A snapshot of the statistics, once every ``stats_interval_s``."""
        now = time.perf_counter()
        if now - self.last_stats < self.stats_interval_s:
            return None
        self.last_stats = now
        self.stats.t_gen_s = now - self.t_gen0
        self._update_stats()
        return StatsEvent(self.stats)

    def _update_stats(self) -> None:
        """This generation's counts of the speculators and of the controller."""
        self.stats.speculators = spec_stats_since(self.chain, self.base_spec_stats)
        if self.ctrl is not None:
            self.stats.controller = self.ctrl.snapshot() - self.base_ctrl_stats

    # -- the end ----------------------------------------------------------------
    def _finish(self) -> Iterator[Event]:
        """What is held released, the last statistics, and the result."""
        finish, reply, stats = self.finish, self.reply, self.stats
        if finish in (STOP_EOG, STOP_LENGTH, STOP_STRING):
            self.engine._save_prefix_ckpt()  # the next turn of a chat starts with this reply
        tail = reply.finish(finish)
        if tail:
            yield StepEvent(tail)
        stats.t_gen_s = time.perf_counter() - self.t_gen0
        stats.n_generated = reply.n_produced
        stats.n_emitted = len(reply.tokens)
        self._update_stats()
        result = GenerationResult(reply.text, [t.id for t in reply.tokens],
                                  [t.drafted_by for t in reply.tokens], [t.draft_pos for t in reply.tokens],
                                  finish or STOP_EOG, stats, self._finish_message(), written=list(reply.written))
        yield StatsEvent(stats)
        yield FinishEvent(result)

    def _finish_message(self) -> str:
        """Why the reply ended, in words, and the context shifts it took."""
        message = {
            STOP_EOG: "the model ended its reply",
            STOP_STRING: "a stop string appeared",
            STOP_LENGTH: f"reached the limit of {self.max_tokens} tokens",
            STOP_CONTEXT: f"the context of {self.n_ctx} tokens is full"
                          + (f" ({self.no_shift})" if self.no_shift else ""),
            STOP_CANCELLED: "stopped",
        }.get(self.finish or "", "")
        shifts = self.engine.last_shifts
        if shifts:
            n_sh = len(shifts)
            dropped = sum(r.n_discard for r in shifts)
            message += (f"; the context was shifted {n_sh} time{'s' if n_sh != 1 else ''} "
                        f"({dropped} older tokens left out)")
        return message


def spec_stats_since(chain: SpeculatorChain, base) -> dict:
    """Per-speculator stats of this generation only (chain stats accumulate)."""
    return {name: (s - base[name]) if name in base else s for name, s in chain.stats().items()}
