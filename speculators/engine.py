"""The generation loop: draft, verify in one batch, accept, roll back.

One step, as llama.cpp's server does it::

    draft   = chain.draft(history, id_last)            # may be empty
    decode([id_last] + draft) at n_past, logits for every row
    ids     = sampler.sample_and_accept_n(rows, draft)  # agreeing prefix + 1
    chain.accept(len(ids) - 1)
    drop the KV cells of the rejected draft tokens      # or restore a checkpoint
    emit ids; id_last = ids[-1]

Because every emitted token is the one the target's own sampler picks at
that position, the output equals plain decoding (up to the numerical
differences between batched and one-token evaluation).

Usage::

    eng = Engine("model.gguf")
    eng.set_spec(SpecParams.from_types("ngram-mod"))
    for ev in eng.generate(eng.prompt_tokens(text="Hello"), max_tokens=16):
        if isinstance(ev, StepEvent):
            print("".join(t.text for t in ev.tokens), end="")
"""

from __future__ import annotations

import codecs
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import llama_cpp as lc
import numpy as np

from .base import DraftRequest, common_prefix
from .chain import SpeculatorChain
from .context_shift import ShiftRecord, chain_blockers, plan_shift, shift_context
from .controller import Controller, ControllerParams, CostModel
from .costcurve import CostCurve, curve_for
from .events import (
    STOP_CANCELLED, STOP_CONTEXT, STOP_EOG, STOP_LENGTH, STOP_STRING,
    Event, FinishEvent, GenerationResult, GenerationStats, StatsEvent, StepEvent, TokenEvent,
)
from .llama import Context, ContextFull, DecodeAborted, Model, ModelError
from .params import SpecParams
from .sampling import DEFAULT_SEED, SamplingParams, Sampler
from .template import MIN_CTX_FOR_EXAMPLES, ChatTemplate
from .types import HIDDEN_STATE_TYPES, SpecType


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


@dataclass
class LoadPlan:
    """How a target is loaded for a speculation spec (the chain may be built later).

    ``load_mtp``: load the target's NextN/MTP layers (draft-mtp is asked for, or
    ``auto`` on a target that has them). ``n_rs_seq``: recurrent-state snapshots per
    sequence, so that a hybrid/recurrent target rolls a rejected draft back without a
    checkpoint and replay, as llama-server sizes them (the draft length, when the spec
    uses a hidden-state type or is ``auto`` with MTP layers; else 0).
    """

    load_mtp: bool
    n_rs_seq: int

    def on_target(self, recurrent: bool, heads: bool) -> "LoadPlan":
        """What of this plan a target uses: its MTP layers where its GGUF has them (``heads``),
        state snapshots where it is recurrent or hybrid (``recurrent``).

        >>> LoadPlan(True, 3).on_target(recurrent=False, heads=False)
        LoadPlan(load_mtp=False, n_rs_seq=0)
        """
        return LoadPlan(self.load_mtp and heads, self.n_rs_seq if recurrent else 0)


def load_plan(model_path: str, spec: SpecParams | None, load_mtp: bool | None = None) -> LoadPlan:
    """The one place the load plan is worked out (:class:`Engine`, the app's runtime, the tools).

    >>> load_plan("any.gguf", None)
    LoadPlan(load_mtp=False, n_rs_seq=0)
    >>> load_plan("any.gguf", SpecParams.from_types("draft-mtp"))
    LoadPlan(load_mtp=True, n_rs_seq=3)
    """
    if spec is None:
        return LoadPlan(bool(load_mtp), 0)
    if load_mtp is None:
        # what the types' descriptors say the target must load; under auto, for the types the
        # target's GGUF supports by itself (its MTP heads)
        from .descriptor import load_needs
        types = spec.types
        if spec.is_auto:
            from .auto import target_types
            types = target_types(model_path)
        load_mtp = "mtp" in load_needs(types)
    hidden = any(t in HIDDEN_STATE_TYPES for t in spec.types)
    n_rs = spec.draft.n_max if (hidden or (spec.is_auto and load_mtp)) else 0
    return LoadPlan(bool(load_mtp), int(n_rs))


def load_plan_for(model_path: str, specs: Sequence[SpecParams]) -> LoadPlan:
    """One load for several specs run in turn on one engine (``bench``'s rows): the target's
    MTP layers where any of them needs them, and as many recurrent-state snapshots as the
    most that any of them keeps (each then rolls back as it would loaded by itself).

    >>> load_plan_for("any.gguf", [SpecParams(), SpecParams.from_types("draft-mtp")])
    LoadPlan(load_mtp=True, n_rs_seq=3)
    >>> load_plan_for("any.gguf", [])
    LoadPlan(load_mtp=False, n_rs_seq=0)
    """
    plans = [load_plan(model_path, sp) for sp in specs]
    return LoadPlan(any(p.load_mtp for p in plans), max((p.n_rs_seq for p in plans), default=0))


def loaded_as_needed(model_path: str, spec: SpecParams | None, loaded: LoadPlan, recurrent: bool) -> bool:
    """Whether a target loaded with ``loaded`` is loaded as :func:`load_plan` has it for ``spec``
    (else a new spec needs the model loaded again, as the chat does when it changes). Only what
    the target can use counts: its MTP layers where its GGUF has them, and state snapshots where
    it is recurrent or hybrid (``recurrent``); on other targets every spec loads them alike.

    >>> ngram, mtp = SpecParams.from_types("ngram-mod"), SpecParams.from_types("draft-mtp")
    >>> loaded_as_needed("any.gguf", mtp, LoadPlan(False, 0), recurrent=False)   # a transformer
    True
    >>> loaded_as_needed("any.gguf", mtp, LoadPlan(False, 0), recurrent=True)    # no snapshots
    False
    >>> loaded_as_needed("any.gguf", ngram, LoadPlan(False, 3), recurrent=True)  # 3 kept for nothing
    False
    """
    from .auto import target_types
    heads = SpecType.DRAFT_MTP in target_types(model_path)
    return load_plan(model_path, spec).on_target(recurrent, heads) == loaded.on_target(recurrent, heads)


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
        synth_rng = random.Random(None if sampler.seed == DEFAULT_SEED else sampler.seed)
        stats = GenerationStats(n_prompt=len(prompt), synthetic=bool(synth_probs))
        if forced is not None:
            stats.forced_flips = sampler.flips  # filled as the reply is written
        base_spec_stats = chain.stats()
        ctrl = self.controller if self.controller is not None and self.controller.chain is chain else None
        self.last_shifts = []
        if context_shift and prompt[0] == self.model.info.bos >= 0:
            n_keep = max(n_keep, 1)  # the BOS token is always kept (as llama-server does)
        try:
            yield from self._run(prompt, max_tokens, sampler, tuple(stop), cancel, chain, stats,
                                 synth_probs, synth_rng, stats_interval_s, base_spec_stats, ctrl,
                                 n_keep if context_shift else None)
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

    def _run(self, prompt, max_tokens, sampler: Sampler, stop, cancel, chain: SpeculatorChain,
             stats: GenerationStats, synth_probs, synth_rng, stats_interval_s, base_spec_stats,
             ctrl: Controller | None = None, shift_keep: int | None = None):
        model, ctx = self.model, self.ctx
        base_ctrl_stats = ctrl.snapshot() if ctrl is not None else None
        if ctrl is not None:
            ctrl.begin()
        dec = None
        n_ctx = ctx.n_ctx
        t0 = time.perf_counter()
        try:
            keep = self._prefill(prompt)
        except DecodeAborted:
            # stopped while reading the prompt: nothing written
            stats.t_prompt_s = time.perf_counter() - t0
            yield StatsEvent(stats)
            yield FinishEvent(GenerationResult("", [], [], [], STOP_CANCELLED, stats,
                                               "stopped while reading the prompt"))
            return
        stats.n_prompt_reused = keep
        chain.begin(prompt)
        chain.process(prompt[keep:], keep)
        if ctrl is not None:
            ctrl.prepare(prompt)
        id_last = sampler.sample(ctx, -1)
        t1 = time.perf_counter()
        stats.t_prompt_s = t1 - t0

        history: list[int] = list(prompt)  # tokens in the KV cache, in order
        n_past = len(prompt)
        reply = ReplyBuilder(model, stop, max_tokens)
        if ctrl is not None:
            ctrl.useful = reply.useful
            if ctrl.boundary is None:
                ctrl.boundary = sentence_end(model)
        finish: str | None = None
        last_stats = t1
        no_shift = ""  # why the context cannot shift ("": it can, or was not asked to)

        def emit(tokens: Sequence[int], by: str | None, n_draft: int) -> tuple[list[TokenEvent], str | None]:
            evs: list[TokenEvent] = []
            for i, tok in enumerate(tokens):
                drafted = i < n_draft
                out, reason = reply.add(tok, by if drafted else None, i if drafted else None)
                evs.extend(out)
                if reason:
                    return evs, reason
            return evs, None

        evs, finish = emit([id_last], None, 0)
        stats.n_generated = reply.n_produced
        yield StepEvent(evs)

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
        replay: list[int] = []
        replay_by: str | None = None
        replay_n_draft = 0
        #: the restored step's decision and outcome, and its seconds so far: the controller is
        #: told once the replay is done, with the checkpoint's save, restore and replay in its time
        replay_obs: tuple | None = None
        partial = model.is_hybrid or model.is_recurrent
        ckpt = None

        while finish is None:
            if cancel is not None and cancel():
                finish = STOP_CANCELLED
                break
            if n_past >= n_ctx:
                blockers = chain_blockers(chain) if shift_keep is not None else []
                if shift_keep is None or blockers:
                    if blockers:
                        no_shift = f"context shift is not supported with {', '.join(blockers)}"
                    finish = STOP_CONTEXT
                    break
                history = self._shift(history, shift_keep, chain, reply.n_produced)
                n_past = len(history)
                if ctrl is not None:
                    ctrl.begin()  # its pending proposals were scored at the old positions
            is_replay = bool(replay)
            if is_replay:
                draft, drafter = replay, replay_by
            else:
                ckpt = None
                remaining = max_tokens - reply.n_produced
                # as llama-server (get_n_draft_max): id_last's cell, and one more kept for a context shift
                room = n_ctx - n_past - 2
                # the verify batch must fit one decode call, or earlier rows lose their logits
                n_max = min(chain.n_max, remaining - 1, room, ctx.n_batch - 1)
                draft = []
                if ctrl is not None:
                    dec = ctrl.decide(DraftRequest(prompt=history, id_last=id_last, pos0=n_past, n_max=max(0, n_max)))
                    draft = dec.draft
                elif n_max > 0 and chain.speculators:
                    draft = chain.draft(DraftRequest(prompt=history, id_last=id_last, pos0=n_past, n_max=n_max))
                drafter = chain.last_drafter if draft else None
                if draft:
                    stats.n_drafted += len(draft)
                t_step = time.perf_counter()   # a drafted step's checkpoint is part of its cost
                if draft and self._needs_step_ckpt(len(draft)):
                    # one buffer for every step's checkpoint (it lives until the step is accepted)
                    ckpt = self._step_ckpt = ctx.state_get(partial=partial, into=self._step_ckpt)
            batch = [id_last] + draft
            # the sampler as it was before the verify, for a restore (llama-server's smpl_save)
            smpl_save = sampler.save() if ckpt is not None and draft else None
            if is_replay:
                t_step = time.perf_counter()
            try:
                ctx.decode(batch, n_past, logits="all" if draft else "last")
            except ContextFull:
                Sampler.drop(smpl_save)
                finish = STOP_CONTEXT
                break
            except DecodeAborted:
                # stopped inside the verify: the context holds the history before it
                Sampler.drop(smpl_save)
                self._keep_after_abort(history)
                finish = STOP_CANCELLED
                break
            chain.process(batch, n_past)
            if not draft:
                ids = [sampler.sample(ctx, -1)]
            elif synth_probs:
                ids = self._accept_synth(sampler, draft, synth_probs, synth_rng, replay=is_replay)
            else:
                ids = sampler.sample_and_accept_n(ctx, range(len(batch)), draft)
            n_rollback = len(batch) - len(ids)
            restore = n_rollback > 0 and ckpt is not None and self._needs_step_ckpt(n_rollback)
            if restore:
                # restore the step's checkpoint; the accepted tokens are replayed next
                ctx.state_set(ckpt, partial=partial)
                ctx.seq_rm(n_past, -1)
                sampler.restore(smpl_save)
                self.kv_tokens = list(history)
                if not is_replay:
                    replay_by, replay_n_draft = drafter, len(draft)
            # the decided step (a replay continues the one it replays) and its seconds so far:
            # told to the controller when no restore follows
            told = replay_obs if is_replay else (dec, ids, 0.0) if ctrl is not None else None
            if told is not None:
                spent = told[2] + time.perf_counter() - t_step
                replay_obs = (told[0], told[1], spent) if restore else None
                if not restore and is_replay:
                    # the replay wrote the restored step's tokens and one more of its own: the
                    # controller is told all of them (what it scores must line up with the text)
                    ctrl.observe(told[0], ids, spent, n_accepted=len(told[1]) - 1)
                elif not restore:
                    ctrl.observe(told[0], told[1], spent)
            if restore:
                replay = ids
                continue
            Sampler.drop(smpl_save)
            n_acc = len(ids) - 1
            if draft:
                chain.accept(n_acc)
                stats.n_accepted += n_acc - 1 if is_replay and n_acc > 0 else n_acc
            # of a replay, only the first len(replay) - 1 tokens were drafted (its last is the target's)
            n_emit_drafted = min(n_acc, len(replay) - 1) if is_replay else n_acc
            n_step_draft = replay_n_draft if is_replay else len(draft)
            n_step_acc = n_acc - 1 if is_replay and n_acc > 0 else n_acc
            replay, ckpt = [], None
            stats.n_steps += 1
            # the KV cache now holds id_last and the accepted drafts
            history.append(id_last)
            history.extend(ids[:-1])
            n_keep = n_past + len(ids)
            if n_rollback > 0:
                ctx.seq_rm(n_keep, -1)
            n_past = n_keep
            self.kv_tokens = list(history)
            id_last = ids[-1]
            evs, finish = emit(ids, drafter, n_emit_drafted)
            stats.n_generated = reply.n_produced
            yield StepEvent(evs, drafter, n_step_draft, n_step_acc)
            now = time.perf_counter()
            if now - last_stats >= stats_interval_s:
                last_stats = now
                stats.t_gen_s = now - t1
                stats.speculators = _diff_stats(chain, base_spec_stats)
                if ctrl is not None:
                    stats.controller = ctrl.snapshot() - base_ctrl_stats
                yield StatsEvent(stats)

        if finish in (STOP_EOG, STOP_LENGTH, STOP_STRING):
            self._save_prefix_ckpt()  # the next turn of a chat starts with this reply
        tail = reply.finish(finish)
        if tail:
            yield StepEvent(tail)
        stats.t_gen_s = time.perf_counter() - t1
        stats.n_generated = reply.n_produced
        stats.n_emitted = len(reply.tokens)
        stats.speculators = _diff_stats(chain, base_spec_stats)
        if ctrl is not None:
            stats.controller = ctrl.snapshot() - base_ctrl_stats
        message = {
            STOP_EOG: "the model ended its reply",
            STOP_STRING: "a stop string appeared",
            STOP_LENGTH: f"reached the limit of {max_tokens} tokens",
            STOP_CONTEXT: f"the context of {n_ctx} tokens is full" + (f" ({no_shift})" if no_shift else ""),
            STOP_CANCELLED: "stopped",
        }.get(finish or "", "")
        if self.last_shifts:
            n_sh = len(self.last_shifts)
            dropped = sum(r.n_discard for r in self.last_shifts)
            message += (f"; the context was shifted {n_sh} time{'s' if n_sh != 1 else ''} "
                        f"({dropped} older tokens left out)")
        result = GenerationResult(reply.text, [t.id for t in reply.tokens],
                                  [t.drafted_by for t in reply.tokens], [t.draft_pos for t in reply.tokens],
                                  finish or STOP_EOG, stats, message, written=list(reply.written))
        yield StatsEvent(stats)
        yield FinishEvent(result)

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

    def _accept_synth(self, sampler: Sampler, draft: list[int], probs: Sequence[float],
                      rng: random.Random, replay: bool = False) -> list[int]:
        """Synthetic acceptance (benchmarking): accept draft tokens at random.

        ``replay``: the draft is a replay after a restored checkpoint (already accepted): take
        it whole, as llama-server's server_sample_and_accept_synth does.
        """
        out: list[int] = []
        for i, d in enumerate(draft):
            tok = sampler.sample(self.ctx, i)
            if replay or (rng.random() < probs[i] and not self.model.is_eog(d)):
                out.append(d)
                continue
            out.append(tok)
            return out
        out.append(sampler.sample(self.ctx, len(draft)))
        return out

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


def _diff_stats(chain: SpeculatorChain, base) -> dict:
    """Per-speculator stats of this generation only (chain stats accumulate)."""
    return {name: (s - base[name]) if name in base else s for name, s in chain.stats().items()}
