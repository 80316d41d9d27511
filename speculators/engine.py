"""The engine: a target model, its context and the speculator chain, and how a generation
starts (the prompt's prefill, with a cached prefix or a kept prompt state reused).

The generation loop itself (draft, verify in one batch, accept, roll back or replay, emit) is
:class:`~speculators.loop.GenerationLoop`; the reply it writes (stop strings, the text as it is
released) is :class:`~speculators.reply_builder.ReplyBuilder`; how a target is loaded for a
speculation spec is :mod:`speculators.load_plan`. Their names are importable from here too.

Usage::

    eng = Engine("model.gguf")
    eng.set_spec(SpecParams.from_types("ngram-mod"))
    for ev in eng.generate(eng.prompt_tokens(text="Hello"), max_tokens=16):
        if isinstance(ev, StepEvent):
            print("".join(t.text for t in ev.tokens), end="")
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import llama_cpp as lc
import numpy as np

from .base import common_prefix
from .chain import SpeculatorChain
from .context_shift import ShiftRecord, plan_shift, shift_context
from .controller import Controller, ControllerParams, CostModel
from .costcurve import CostCurve, curve_for
from .events import Event, FinishEvent, GenerationResult, GenerationStats
from .llama import Context, DecodeAborted, Model, ModelError
from .load_plan import LoadPlan, load_plan, load_plan_for, loaded_as_needed
from .loop import GenerationLoop
from .params import SpecParams
from .reply_builder import SENTENCE_END, ReplyBuilder, sentence_end
from .sampling import SamplingParams, Sampler
from .template import MIN_CTX_FOR_EXAMPLES, ChatTemplate

#: the names other modules import from here, whose homes are now load_plan, loop and reply_builder
__all__ = [
    "Engine", "EngineConfig", "GenerationError", "Request", "GenerationLoop",
    "LoadPlan", "load_plan", "load_plan_for", "loaded_as_needed",
    "ReplyBuilder", "SENTENCE_END", "sentence_end",
]


class GenerationError(ValueError):
    """The request cannot be served (empty prompt, prompt too long, ...)."""


@dataclass
class EngineConfig:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = 0
    #: use state checkpoints even when the context can drop a partial
    #: sequence (tests the path recurrent/hybrid models need)
    force_checkpoints: bool = False
    #: reuse the KV cache of a common prompt prefix between generations
    reuse_prefix: bool = True
    #: prompts whose state after the prefill is kept (the most recently used), so that running
    #: the same prompt again restores that state instead of decoding the prompt anew: bench's
    #: rounds and rows, which each start from a fresh prefill. The same memory and logits as
    #: the prefill's, so the same text; only where the prefix is not reused and no drafter
    #: reads the target's hidden states during the prefill; 0: none kept
    prompt_states: int = 0
    #: load the target's NextN/MTP layers (None: when the initial spec asks for draft-mtp,
    #: or is ``auto`` and the model has MTP heads)
    load_mtp: bool | None = None
    #: where the verify-cost curve measured for the adaptive controller is kept
    #: (one small JSON file per model file, device and thread count; None: not kept)
    cost_cache_dir: str | None = None
    #: on a context shift, clear the memory and decode the kept tokens again even where
    #: the memory could move positions in place (tests the path recurrent/hybrid and
    #: small sliding-window caches need)
    force_shift_redecode: bool = False
    #: recurrent-state snapshots the target keeps per sequence, so that a verify batch of
    #: up to that many drafts can be rolled back without a checkpoint (recurrent/hybrid
    #: targets only; None: as llama-server decides, the draft length when the initial
    #: spec uses a hidden-state type, or is ``auto`` on a target with MTP heads)
    n_rs_seq: int | None = None
    #: where the target's offloaded layers go (llama.cpp's ``--device``: comma-separated names
    #: as ``--list-devices`` shows them, "none" for the CPU only; None: every device, RPC
    #: servers' devices included once added, see :mod:`speculators.devices`)
    devices: str | None = None
    #: ``--split-mode`` (none, layer, row, tensor) and ``--tensor-split`` (shares per device)
    split_mode: str | None = None
    tensor_split: list[float] | None = None
    #: ``--main-gpu``: the device index used with split mode none
    main_gpu: int = 0

    def placement(self) -> dict:
        """The :class:`~speculators.llama.Model` keyword arguments that place the target."""
        return {"n_gpu_layers": self.n_gpu_layers, "devices": self.devices, "split_mode": self.split_mode,
                "tensor_split": self.tensor_split, "main_gpu": self.main_gpu}


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int = 512
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()


class Engine:
    """A target model, its context, and the speculator chain."""

    def __init__(self, model_path: str, config: EngineConfig | None = None,
                 spec: SpecParams | None = None, model: Model | None = None):
        self.config = config or EngineConfig()
        c = self.config
        plan = load_plan(model_path, spec, c.load_mtp)
        self.model = model or Model(model_path, load_mtp=plan.load_mtp, **c.placement())
        n_rs = plan.n_rs_seq if c.n_rs_seq is None else c.n_rs_seq
        if not (self.model.is_recurrent or self.model.is_hybrid):
            n_rs = 0
        self.ctx = Context(self.model, n_ctx=c.n_ctx, n_batch=c.n_batch, n_threads=c.n_threads,
                           overrides={"n_rs_seq": int(n_rs)} if n_rs > 0 else None)
        self.seq_rm_type = self.ctx.can_seq_rm()
        if self.seq_rm_type == "no":
            raise ModelError(f"the context of {self.model.path} has no memory to decode with")
        #: the target cannot drop any partial sequence ("full") or only a bounded one ("rs":
        #: up to n_rs_seq tokens back): prompts are cut and context checkpoints kept as
        #: llama-server does, and a verify batch is checkpointed when it could not be rolled back
        self.use_checkpoints = c.force_checkpoints or self.seq_rm_type in ("full", "rs")
        self.n_rs_seq = self.ctx.n_rs_seq
        self.n_swa = int(lc.llama_model_n_swa(self.model.ptr))
        bos = self.model.info.bos
        eos = self.model.info.eos
        self.template = ChatTemplate(
            self.model.chat_template(),
            bos_token=self.model.token_text(bos) if bos >= 0 else "",
            eos_token=self.model.token_text(eos) if eos >= 0 else "",
        )
        #: tokens whose KV cells are in the context (position i holds kv_tokens[i])
        self.kv_tokens: list[int] = []
        #: (n_tokens, partial state, the chain's state, that chain) checkpoints for prefix reuse
        #: when use_checkpoints (llama-server stashes the speculator state with each context
        #: checkpoint: common_speculative_get_state in create_checkpoint)
        self._prefix_ckpts: list[tuple[int, bytearray, bytes | None, SpeculatorChain | None]] = []
        self._step_ckpt: bytearray | None = None
        #: prompt -> (the target's state after its prefill, the logits it ended with), see
        #: EngineConfig.prompt_states
        self._prompt_states: OrderedDict[tuple[int, ...], tuple[bytearray, np.ndarray]] = OrderedDict()
        #: prefills served from a kept prompt state (see EngineConfig.prompt_states)
        self.n_prompt_states_used = 0
        self.spec = spec or SpecParams()
        self.chain: SpeculatorChain | None = None
        #: the next prefill decodes the whole prompt (see set_spec)
        self._refeed = False
        #: the verify-cost curve (measured or read from the cache when the controller first needs it;
        #: set it beforehand to use a given one)
        self.cost_curve: CostCurve | None = None
        #: the adaptive controller of the current chain (None when off)
        self.controller: Controller | None = None
        self.controller_params = ControllerParams()
        self._cost_model_obj: CostModel | None = None
        #: the context shifts of the last generation (see :meth:`generate`)
        self.last_shifts: list[ShiftRecord] = []
        #: what the caller should tell about how the model was loaded (e.g. an RPC server left out)
        self.load_warnings: list[str] = []
        self.set_spec(self.spec)

    # -- speculation ---------------------------------------------------------
    def set_spec(self, params: SpecParams, resources: dict | None = None) -> SpeculatorChain:
        """(Re)build the speculator chain; the target model stays loaded."""
        res = {"model": self.model, "engine": self}
        res.update(resources or {})
        chain = SpeculatorChain.from_params(params, res)
        controller = None
        if chain.adaptive and chain.speculators:
            try:
                controller = Controller(chain, self.shared_cost_model(), self.controller_params)
            except BaseException:
                chain.close()
                raise
        if self.chain is not None:
            self.chain.close()
        self.spec = params
        self.chain = chain
        self.controller = controller
        # a drafter fed by the target's batches (hidden states) sees only what is decoded from
        # now on: the next prompt is decoded whole, not from the cached prefix, or it would draft
        # without the conversation so far
        self._refeed = any(getattr(s, "fed_by_target", False) for s in chain.speculators)
        return chain

    @property
    def auto_plan(self) -> list | None:
        """With ``auto``: (type, used, reason) for every type; None otherwise."""
        return self.chain.auto_plan if self.chain is not None else None

    @property
    def cost_model(self) -> CostModel | None:
        """The controller's cost model (the measured curve and what steps taught it), once made."""
        return self._cost_model_obj

    def shared_cost_model(self) -> CostModel:
        """The cost model shared by every chain of this engine (what steps teach it is kept), made
        now if need be (the verify-cost curve measured or read from the cache)."""
        curve = self._cost_curve()
        if self._cost_model_obj is None or self._cost_model_obj.curve is not curve:
            self._cost_model_obj = CostModel(curve, self.controller_params)
        return self._cost_model_obj

    def _cost_curve(self) -> CostCurve:
        """The verify-cost curve: given, cached for this model and device, or measured now."""
        if self.cost_curve is None:
            c = self.config
            self.kv_tokens = []
            try:
                self.cost_curve = curve_for(self.ctx, self.model, str(self.model.path), self.ctx.n_threads,
                                            c.n_gpu_layers, c.cost_cache_dir, self._placement_key(),
                                            {"n_rs_seq": self.n_rs_seq} if self.n_rs_seq > 0 else None)
            finally:
                self.kv_tokens = []
        return self.cost_curve

    def lab_cost_curve(self, n_max: int = 16) -> list[float]:
        """The verify-cost curve, rel[k] for k = 0..n_max drafts (measured once, then cached)."""
        return self._cost_curve().to_list(n_max)

    def _placement_key(self) -> dict | None:
        """Where the target's layers are, for the cost curve's cache key (None: this machine's CPU
        or its one kind of device, as before devices could be chosen)."""
        c = self.config
        if not c.n_gpu_layers:
            return None
        from .devices import offload_devices
        try:
            devs = [f"{d.name}={d.endpoint or d.description}" for d in offload_devices()]
        except Exception:  # pragma: no cover - a build without the backend API
            devs = []
        if c.devices is None and not any("RPC" in d for d in devs) and c.tensor_split is None \
                and c.split_mode in (None, "layer"):
            return None
        return {"devices": c.devices, "offload": devs, "split_mode": c.split_mode, "tensor_split": c.tensor_split,
                "main_gpu": c.main_gpu}

    # -- prompts ---------------------------------------------------------------
    def prompt_tokens(self, messages: Sequence[dict] | None = None, text: str | None = None,
                      raw: bool = False) -> list[int]:
        """Tokens for a chat (rendered with the model's template) or raw text."""
        if raw or messages is None:
            if text is None:
                raise GenerationError("no prompt given")
            if raw:
                return self.model.tokenize(text, add_special=True, parse_special=False)
            messages = [{"role": "user", "content": text}]
        rendered = self.template.render(messages, add_generation_prompt=True,
                                        worked_examples=self.ctx.n_ctx >= MIN_CTX_FOR_EXAMPLES)
        toks = self.model.tokenize(rendered, add_special=False, parse_special=True)
        info = self.model.info
        if info.add_bos and info.bos >= 0 and (not toks or toks[0] != info.bos):
            toks.insert(0, info.bos)
        return toks

    # -- generation ----------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int = 512,
                 sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                 cancel: Callable[[], bool] | None = None,
                 stats_interval_s: float = 0.25, context_shift: bool = False,
                 n_keep: int = 0, forced: Sequence[int] | None = None) -> Iterator[Event]:
        """Yield :class:`StepEvent` s, :class:`StatsEvent` s, then one :class:`FinishEvent`.

        ``context_shift``: when the context fills up during the reply, keep
        its first ``n_keep`` tokens (at least the BOS token; the caller
        passes e.g. the tokens of the system turn), drop half of the rest and go on (as
        llama-server does; see :mod:`speculators.context_shift`) instead of
        ending with ``STOP_CONTEXT``. :attr:`last_shifts` lists the shifts
        of this generation. With a hidden-state drafter in the chain the
        reply still ends at the limit (the finish message says why).

        ``forced``: write these tokens (benchmarks: every type writes the same text, see
        :class:`~speculators.sampling.Sampler`); where the model would have picked another,
        ``stats.forced_flips`` says so.
        """
        sampling = sampling or SamplingParams()
        prompt = list(prompt)
        if not prompt:
            raise GenerationError("the prompt is empty")
        if max_tokens <= 0:
            raise GenerationError("max tokens must be at least 1")
        if n_keep < 0:
            raise GenerationError("n_keep must be 0 or more")
        n_ctx = self.ctx.n_ctx
        if len(prompt) >= n_ctx:
            raise GenerationError(
                f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}; "
                f"shorten it or raise the context size")
        chain = self.chain
        assert chain is not None
        synth_probs = chain.synth_probs
        if forced is not None and synth_probs:
            raise GenerationError("a forced text and synthetic acceptance do not go together")
        sampler = Sampler(sampling, self.model, forced=forced)
        stats = GenerationStats(n_prompt=len(prompt), synthetic=bool(synth_probs))
        if forced is not None:
            stats.forced_flips = sampler.flips  # filled as the reply is written
        ctrl = self.controller if self.controller is not None and self.controller.chain is chain else None
        self.last_shifts = []
        if context_shift and prompt[0] == self.model.info.bos >= 0:
            n_keep = max(n_keep, 1)  # the BOS token is always kept (as llama-server does)
        try:
            loop = GenerationLoop(self, prompt, sampler, stats, max_tokens=max_tokens, stop=stop,
                                  cancel=cancel, stats_interval_s=stats_interval_s, ctrl=ctrl,
                                  shift_keep=n_keep if context_shift else None)
            yield from loop.run()
        finally:
            sampler.close()

    def prefill(self, prompt: Sequence[int]) -> int:
        """Decode ``prompt`` into the context as a generation would start (its last logits
        readable); returns the tokens of it reused from the context."""
        return self._prefill(list(prompt))

    #: tokens read per piece by :meth:`warm` (a stop is seen between pieces)
    WARM_PIECE = 256

    def warm(self, prompt: Sequence[int], cancel: Callable[[], bool] | None = None) -> int:
        """Read ``prompt`` into the context ahead of a generation that will start with it, as
        that generation's start would (the target's prefill, the drafters told), so that its
        prompt is then a reused prefix: a chat reads its conversation while the person types.
        Returns the tokens read now (0 where the context already held them).

        It reads :attr:`WARM_PIECE` tokens at a time and stops between pieces once ``cancel()``
        says so; what it read by then is kept and reused like any prefix. The next
        generation reads the rest of its prompt, so the reply is the one it would have been
        with its whole prompt read then, up to how the prompt is batched (on quantized weights
        a near-tie may fall the other way, as in any later turn of a chat).
        """
        prompt = list(prompt)
        chain = self.chain
        if not prompt or chain is None or len(prompt) >= self.ctx.n_ctx:
            return 0
        have = common_prefix(self.kv_tokens, prompt)
        if have >= len(prompt) - 1 and not self._refeed:
            return 0          # a generation would decode only the prompt's last token
        read = 0
        end = 0 if self._refeed else have
        while end < len(prompt):
            if cancel is not None and cancel():
                break
            end = min(len(prompt), end + self.WARM_PIECE)
            piece = prompt[:end]
            keep = self._prefill(piece)
            chain.begin(piece)
            chain.process(piece[keep:], keep)
            read += end - keep
        return read

    def _prefill(self, prompt: list[int]) -> int:
        """Decode the prompt, reusing a cached prefix; returns tokens reused."""
        keep = 0
        if self.config.reuse_prefix and not self._refeed:
            kv = self.kv_tokens
            keep = common_prefix(kv, prompt, len(prompt) - 1)  # the last prompt token is always decoded
            drop = len(kv) - keep
            if self.n_swa > 0 and drop > self.ctx.n_batch // 2:
                keep = 0  # the sliding-window cache may no longer hold what we'd need
            if keep > 0 and self.use_checkpoints:
                # a recurrent state cannot be cut back: restart from the newest context
                # checkpoint inside the common prefix (llama-server's --ctx-checkpoints)
                ck = max((c for c in self._prefix_ckpts if c[0] <= keep), key=lambda c: c[0], default=None)
                if ck is None:
                    keep = 0
                else:
                    keep = ck[0]
                    try:
                        self.ctx.state_set(ck[1], partial=self.model.is_hybrid or self.model.is_recurrent)
                    except Exception:
                        keep = 0
                    else:
                        # and the speculators' state stashed with it (EAGLE3's deferred boundary), as
                        # llama-server restores it with the checkpoint (common_speculative_set_state)
                        if ck[2] is not None and ck[3] is self.chain and self.chain is not None:
                            self.chain.set_state(ck[2])
        self._prefix_ckpts = [c for c in self._prefix_ckpts if c[0] <= keep] if keep else []
        kept = keep == 0 and self._prompt_state_applies()
        if kept and self._restore_prompt_state(prompt):
            self._refeed = False
            return 0
        if keep == 0:
            self.ctx.clear()
        elif not self.ctx.seq_rm(keep, -1):
            self.ctx.clear()
            keep = 0
            self._prefix_ckpts = []
        self.kv_tokens = list(prompt[:keep])
        try:
            start = keep
            for cut in self._prompt_cuts(keep, len(prompt)):
                self.ctx.decode(prompt[start:cut], start, logits="none")
                start = cut
                self.kv_tokens = list(prompt[:cut])
                if cut == len(prompt) - self.CKPT_TAIL:
                    self._save_prefix_ckpt()
            self.ctx.decode(prompt[start:], start, logits="last")
        except DecodeAborted as e:
            self._keep_after_abort(prompt[:start + e.n_done])
            raise
        except Exception:
            self.ctx.clear()
            self.kv_tokens = []
            self._prefix_ckpts = []
            raise
        self._refeed = False
        self.kv_tokens = list(prompt)
        if kept:
            self._keep_prompt_state(prompt)
        return keep

    # -- a stop inside a decode ------------------------------------------------
    def enable_abort(self) -> bool:
        """Let :meth:`abort_decode` stop the target's decode in progress (see
        :meth:`speculators.llama.Context.enable_abort`); a generation so stopped ends as
        ``cancelled`` with what it had written. False where it cannot."""
        return self.ctx.enable_abort()

    def abort_decode(self) -> None:
        """Stop the target's decode in progress and every later one until :meth:`clear_abort`
        (from any thread; only where :meth:`enable_abort` said True)."""
        self.ctx.request_abort()

    def clear_abort(self) -> None:
        self.ctx.clear_abort()

    def _keep_after_abort(self, held: list[int]) -> None:
        """After an aborted decode: the context keeps ``held`` (llama.cpp dropped the aborted
        batch's positions) where it can cut a sequence back; a target that cannot, or whose
        drafters read its outputs as it decodes, starts again from nothing."""
        if self.use_checkpoints or self.ctx.decode_hooks or self._refeed or not self.ctx.seq_rm(len(held), -1):
            self.ctx.clear()
            held = []
        self.kv_tokens = list(held)
        self._prefix_ckpts = [c for c in self._prefix_ckpts if c[0] <= len(held)] if held else []

    def _prompt_state_applies(self) -> bool:
        """Whether a prefill from scratch may be kept and restored (EngineConfig.prompt_states):
        not on a checkpointed target (its prompt is cut and checkpointed as it is decoded), nor
        with a drafter that reads the target's outputs as the prompt is decoded."""
        return self.config.prompt_states > 0 and not self.use_checkpoints and not self.ctx.decode_hooks

    def _restore_prompt_state(self, prompt: list[int]) -> bool:
        key = tuple(prompt)
        kept = self._prompt_states.get(key)
        if kept is None:
            return False
        state, logits = kept
        self.ctx.clear()
        try:
            self.ctx.state_set(state, partial=False)
            ok = self.ctx.put_last_logits(logits)
        except Exception:
            ok = False
        if not ok:
            self.ctx.clear()
            self._prompt_states.pop(key, None)
            return False
        self._prompt_states.move_to_end(key)
        self.kv_tokens = list(prompt)
        self.n_prompt_states_used += 1
        return True

    def _keep_prompt_state(self, prompt: list[int]) -> None:
        key = tuple(prompt)
        self._prompt_states[key] = (self.ctx.state_get(partial=False), np.array(self.ctx.logits(-1)))
        self._prompt_states.move_to_end(key)
        while len(self._prompt_states) > self.config.prompt_states:
            self._prompt_states.popitem(last=False)

    #: a checkpointed target decodes its prompt's last tokens on their own, as llama-server does,
    #: and keeps a context checkpoint before them (the next turn's prompt usually agrees up to there)
    CKPT_TAIL = 4

    def _prompt_cuts(self, start: int, end: int) -> list[int]:
        """Where the prompt tokens ``start..end`` are split into separate decodes.

        On targets that cannot drop a partial sequence, llama-server ends a prompt
        batch ``4 + n_ubatch`` and ``4`` tokens before the prompt's end (to keep
        context checkpoints there); the split changes how the prompt is batched, so
        on quantized weights the logits (and near-tie tokens) follow it. The same
        cuts here give the same text as llama-server.
        """
        if not self.use_checkpoints:
            return []
        return [end - off for off in (self.CKPT_TAIL + self.ctx.n_ubatch, self.CKPT_TAIL) if start < end - off]

    #: context checkpoints kept for prefix reuse on targets that cannot drop a partial sequence
    MAX_PREFIX_CKPTS = 4

    def _needs_step_ckpt(self, n: int) -> bool:
        """Whether dropping ``n`` tokens of a verify batch needs the step's checkpoint (as
        llama-server's use_ckpt_tgt: a target that cannot drop a partial sequence, or one that
        keeps n_rs_seq recurrent snapshots and ``n`` is more than that)."""
        if not self.use_checkpoints:
            return False
        if self.seq_rm_type == "rs" and not self.config.force_checkpoints:
            return n > self.n_rs_seq
        return True

    def _save_prefix_ckpt(self) -> None:
        """Remember the recurrent state at len(kv_tokens), for the next prompt's prefix reuse."""
        if not (self.use_checkpoints and self.config.reuse_prefix):
            return
        n = len(self.kv_tokens)
        ck = [c for c in self._prefix_ckpts if c[0] != n]
        chain = self.chain
        ck.append((n, self.ctx.state_get(partial=self.model.is_hybrid or self.model.is_recurrent),
                   chain.get_state() if chain is not None else None, chain))
        self._prefix_ckpts = ck[-self.MAX_PREFIX_CKPTS:]

    def _shift(self, history: list[int], n_keep: int, chain: SpeculatorChain, n_reply: int) -> list[int]:
        """Cut the full context (keep ``n_keep``, drop half the rest); the kept history."""
        t0 = time.perf_counter()
        n_keep, n_discard = plan_shift(len(history), self.ctx.n_ctx, n_keep)
        try:
            kept, mode = shift_context(self.ctx, self.model, history, n_keep, n_discard, chain,
                                       redecode=self.config.force_shift_redecode)
        except Exception:
            self.ctx.clear()
            self.kv_tokens = []
            raise
        self.kv_tokens = list(kept)
        # positions moved: prefix checkpoints past the kept tokens describe another history
        self._prefix_ckpts = [c for c in self._prefix_ckpts if c[0] <= n_keep]
        self.last_shifts.append(ShiftRecord(len(history), n_keep, n_discard, mode,
                                            time.perf_counter() - t0, n_reply))
        return kept

    def run(self, prompt: Sequence[int], **kw) -> GenerationResult:
        """Generate to the end and return the result (no streaming)."""
        result = None
        for ev in self.generate(prompt, **kw):
            if isinstance(ev, FinishEvent):
                result = ev.result
        assert result is not None
        return result

    def close(self) -> None:
        self._prompt_states.clear()
        if self.chain is not None:
            self.chain.close()
            self.chain = None
        self.ctx.close()
        self.model.close()
