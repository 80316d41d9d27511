"""draft-simple: a small model of the same family drafts, the target verifies.

This is ``common_speculative_impl_draft_simple`` of llama.cpp, together
with the part of its server that keeps the draft context in step with the
target (``server-context.cpp``):

* The draft model has its own context, as large as the target's unless
  ``params.draft.n_ctx`` says otherwise.
* :meth:`DraftSimple.process` feeds the draft context every batch the
  target decodes (the prompt, then each ``[id_last] + draft``), so its KV
  cache mirrors the target's.
* :meth:`DraftSimple.draft` decodes ``id_last`` at ``pos0`` on the draft
  model, then repeatedly takes the most probable token of a top-k 10
  sampler (the reference samples with top-k 10 and a ``dist`` sampler,
  but drafts the *first candidate after sorting*, i.e. the argmax; its
  probability is the softmax over those 10 logits). It stops when that
  probability is below ``p_min``, or the draft reaches ``n_max`` (or the
  request's limit); a draft shorter than ``n_min`` is dropped. Each
  drafted token except the last is decoded on the draft model to get the
  next one. Afterwards the draft's own tokens are removed from its KV
  cache again (the target's batch brings the accepted ones back).
* :meth:`DraftSimple.accept` rolls the draft KV cache back to what the
  target kept: ``id_last`` and the accepted draft tokens, whoever drafted.

Where a draft context cannot drop a partial sequence (recurrent/hybrid
draft models), state checkpoints are used instead, as the server does.

The draft :class:`~speculators.llama.Model` is loaded once and kept in a
module-level cache keyed by ``(real path, n_gpu_layers, size, mtime)``
(see :func:`acquire_draft_model`), so ``Engine.set_spec`` can rebuild the
chain (e.g. once per type in ``bench``) without reloading it; only the
draft *context* is per speculator. At most two unused draft models stay
loaded; :func:`clear_draft_model_cache` frees them. A caller that loaded
its own draft model can pass it as ``resources["draft_model"]`` instead.

Cost accounting: the chain times :meth:`draft` into ``stats.t_draft_us``
(so ``t_draft_us / n_gen_tokens`` is the draft model's cost per drafted
token) and :meth:`process` into ``stats.t_process_us`` (mirroring the
target's batches). :meth:`DraftSimple.cost` sums both up.

Pausing the mirroring (beyond the reference): the adaptive controller calls
:meth:`DraftSimple.set_upkeep` ``(False)`` while the draft model is not worth
asking. :meth:`process` then only notes what the target holds; the next
:meth:`draft` (or :meth:`process` once resumed) decodes every token the
draft context missed in one batch, so that before it drafts its KV cache
holds exactly the target's tokens, as if it had mirrored every batch. That
catch-up is counted as process time too.
"""

from __future__ import annotations

import os
import threading
from typing import Sequence

import numpy as np

from .base import DraftRequest, Speculator, common_prefix
from .chain import Unavailable, register
from .compat import check_compatible
from .descriptor import MODEL, DraftModel, SpecDescriptor, declare
from .llama import Context, ContextFull, DecodeError, Model, ModelError
from .param_kinds import FLOAT, INT, NGL, PATH, STR, Param
from .params import SpecParams
from .types import SpecType

__all__ = ["DraftSimple", "acquire_draft_model", "release_draft_model", "clear_draft_model_cache",
           "DRAFT_TOP_K"]

#: the reference drafts from a top-k 10 sampler
DRAFT_TOP_K = 10


# -- the draft model cache ---------------------------------------------------------

class _Entry:
    __slots__ = ("model", "users", "tick")

    def __init__(self, model: Model):
        self.model = model
        self.users = 0
        self.tick = 0


_cache_lock = threading.RLock()
_cache: dict[tuple, _Entry] = {}
_tick = 0
#: how many draft models may stay loaded while no speculator uses them
MAX_IDLE_MODELS = 2


def draft_devices(d, resources: dict | None, shares_target: str | None = None) -> str | None:
    """The draft model's ``-devd`` devices; unset, it follows the target's ``--device`` (llama.cpp).

    ``shares_target``: the drafter's graph uses tensors of the target (the hidden-state
    drafters borrow its output and embedding matrices), so its devices must include every
    device that holds target layers: ggml aborts the process on a tensor in a buffer that
    none of the drafter's devices can run. Such a ``-devd`` is refused here, with the reason.
    """
    engine = (resources or {}).get("engine")
    cfg = getattr(engine, "config", None)
    target = getattr(cfg, "devices", None)
    if getattr(d, "device", None) is None:
        return target
    if shares_target and int(getattr(cfg, "n_gpu_layers", 0) or 0) != 0:
        from . import devices as dv
        used = ([n.strip() for n in target.split(",") if n.strip() and n.strip() != "none"] if target is not None
                else [x.name for x in dv.offload_devices()])
        mine = {n.strip() for n in d.device.split(",")}
        missing = [n for n in used if n not in mine]
        if missing:
            raise Unavailable(
                f"its drafter uses the target's output and embedding tensors, which are on "
                f"{', '.join(missing)}; -devd {d.device} leaves {'it' if len(missing) == 1 else 'them'} out, "
                f"which llama.cpp cannot run: leave --spec-draft-device unset (the drafter follows the target) "
                f"or name {'it' if len(missing) == 1 else 'them'} too")
    return d.device


def _cache_key(path: str, n_gpu_layers: int, devices: str | None = None) -> tuple:
    real = os.path.realpath(os.path.expanduser(path))
    try:
        st = os.stat(real)
        ident = (st.st_size, st.st_mtime_ns)
    except OSError:
        ident = (None, None)
    return (real, int(n_gpu_layers), devices, *ident)


def acquire_draft_model(path: str, n_gpu_layers: int = -1, devices: str | None = None) -> Model:
    """The loaded draft model for ``path`` (loading it on first use).

    Pair every call with :func:`release_draft_model`. Raises
    :class:`~speculators.llama.ModelError` when the file cannot be loaded.
    """
    global _tick
    key = _cache_key(path, n_gpu_layers, devices)
    with _cache_lock:
        e = _cache.get(key)
        if e is None or not getattr(e.model, "ptr", None):
            try:
                m = Model(os.path.expanduser(path), n_gpu_layers=n_gpu_layers, devices=devices)
            except ModelError as err:
                raise ModelError(f"the draft model cannot be used: {err}") from None
            e = _Entry(m)
            _cache[key] = e
        e.users += 1
        _tick += 1
        e.tick = _tick
        _evict_idle()
        return e.model


def release_draft_model(model: Model) -> None:
    """One user of ``model`` is done; idle models beyond the limit are freed."""
    with _cache_lock:
        for e in _cache.values():
            if e.model is model:
                e.users = max(0, e.users - 1)
                break
        _evict_idle()


def _evict_idle(keep: int | None = None) -> None:
    keep = MAX_IDLE_MODELS if keep is None else keep
    idle = sorted(((k, e) for k, e in _cache.items() if e.users == 0), key=lambda ke: ke[1].tick)
    for k, e in idle[:max(0, len(idle) - keep)]:
        del _cache[k]
        e.model.close()


def clear_draft_model_cache() -> None:
    """Free every draft model no speculator is using."""
    with _cache_lock:
        _evict_idle(keep=0)


def cached_draft_models() -> list[str]:
    """Paths of the draft models loaded now (for diagnostics)."""
    with _cache_lock:
        return [k[0] for k in _cache]


# -- the speculator ----------------------------------------------------------------

class DraftSimple(Speculator):
    """Drafts with a second, smaller model; see the module docstring."""

    type = SpecType.DRAFT_SIMPLE

    def __init__(self, params: SpecParams, model: Model, *, n_ctx: int, n_batch: int = 512,
                 n_threads: int | None = None, use_checkpoints: bool | None = None,
                 owns_model: bool = False):
        d = params.draft
        super().__init__(n_max=d.n_max)
        self.p_min = float(d.p_min)
        self.n_min = int(d.n_min)
        self.n_max_param = int(d.n_max)
        self.model = model
        self._owns_model = owns_model
        self.ctx = Context(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        self.seq_rm_type = self.ctx.can_seq_rm()  # leaves the context empty
        if self.seq_rm_type == "no":
            self.ctx.close()
            raise ModelError(f"the draft model {model.path} has no memory to decode with")
        #: restore state checkpoints instead of dropping KV cells
        self.use_checkpoints = (self.seq_rm_type == "full") if use_checkpoints is None else use_checkpoints
        self._partial_state = bool(model.is_hybrid or model.is_recurrent)
        self._suppress = model.suppress_tokens
        #: tokens whose KV cells the draft context holds, by position
        self.kv: list[int] = []
        #: what the target's context holds, as far as we were told
        self.target: list[int] = []
        #: (pos0, n_tokens, checkpoint or None) of the last target batch
        self._last_batch: tuple[int, int, bytes | None] | None = None
        #: draft-model work: single-token decodes while drafting, mirrored tokens
        self.n_draft_decodes = 0
        self.n_process_tokens = 0
        self.last_p: list[float] = []
        #: mirror every target batch (False: paused; caught up before the next draft)
        self.upkeep = True
        #: catch-ups after a pause: how many, and the tokens they decoded
        self.n_catchups = 0
        self.n_catchup_tokens = 0
        #: the controller remembers what this drafter costs per draft model and thread count
        self.cost_key = f"draft-simple:{model.path}:{self.ctx.n_threads}"
        #: a drafted token's cost as a share of a target step, from the models' sizes (see
        #: :func:`size_prior`; None: measured only)
        self.cost_prior: float | None = None

    # -- KV bookkeeping ------------------------------------------------------------
    def _sync(self, want: list[int]) -> bool:
        """Make the draft context hold exactly ``want`` (positions 0..)."""
        kv = self.kv
        n = len(kv)
        if n <= len(want) and kv == want[:n]:
            common = n
        else:
            common = common_prefix(kv, want)
        if common < n:
            if not self.ctx.seq_rm(common, -1):
                self.ctx.clear()
                common = 0
            del kv[common:]
        if common < len(want):
            try:
                self.ctx.decode(want[common:], common, logits="none")
            except (ContextFull, DecodeError):
                self.ctx.clear()
                kv.clear()
                return False
            kv.extend(want[common:])
            self.n_process_tokens += len(want) - common
        return True

    def _checkpoint(self) -> bytes:
        return self.ctx.state_get(partial=self._partial_state)

    def _restore(self, ckpt: bytes, pos: int) -> None:
        """Back to the state saved when the context held ``pos`` tokens."""
        self.ctx.state_set(ckpt, partial=self._partial_state)
        self.ctx.seq_rm(pos, -1)
        del self.kv[pos:]

    # -- the speculator hooks ------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        # the target's context holds the prompt now; process() brings ours in step
        self.target = list(prompt)
        self._last_batch = None

    def set_upkeep(self, on: bool) -> None:
        """Mirror the target's batches (True) or only note them (False, until resumed)."""
        self.upkeep = bool(on)

    def _catch_up(self, want: list[int], tail: Sequence[int] = ()) -> tuple[bool, bool]:
        """:meth:`_sync` to ``want``, timed as process work (what mirroring would have cost).

        ``tail`` (decoded right after ``want`` with the last row's logits, not recorded in
        ``kv``) goes in the same batch as the tokens caught up on when those follow ``kv``.
        Returns (in step, tail decoded)."""
        import time
        t0 = time.perf_counter()
        n0 = self.n_process_tokens
        try:
            kv = self.kv
            n = len(kv)
            if tail and n < len(want) and want[:n] == kv:
                try:
                    self.ctx.decode(want[n:] + list(tail), n, logits="last")
                except (ContextFull, DecodeError):
                    self.ctx.clear()
                    kv.clear()
                    return False, False
                kv.extend(want[n:])
                self.n_process_tokens += len(want) - n
                return True, True
            return self._sync(want), False
        finally:
            if self.n_process_tokens > n0:
                self.n_catchups += 1
                self.n_catchup_tokens += self.n_process_tokens - n0
            self.stats.t_process_us += (time.perf_counter() - t0) * 1e6

    def process(self, tokens: Sequence[int], pos0: int) -> bool:
        tokens = list(tokens)
        if pos0 > len(self.target):
            # we were not told what precedes pos0: nothing sensible to mirror
            self.target = []
            self._last_batch = None
            return False
        self.target[pos0:] = tokens
        if not self.upkeep:
            # paused: only note what the target holds (accept() trims it to what it keeps;
            # the catch-up keeps what the draft context holds in common with it)
            self._last_batch = (pos0, len(tokens), None)
            return True
        ckpt = None
        if self.use_checkpoints and len(tokens) > 1:
            self._sync(self.target[:pos0])
            ckpt = self._checkpoint()
        self._last_batch = (pos0, len(tokens), ckpt)
        return self._sync(self.target)

    def accept(self, n_accepted: int, is_other: bool) -> None:
        lb = self._last_batch
        self._last_batch = None
        if lb is None:
            return
        pos0, n_batch, ckpt = lb
        keep = pos0 + n_accepted + 1
        if keep >= pos0 + n_batch:
            return
        del self.target[keep:]
        if ckpt is not None:
            self._restore(ckpt, pos0)
            self._sync(self.target)
        elif len(self.kv) > keep:
            if self.ctx.seq_rm(keep, -1):
                del self.kv[keep:]
            else:
                self._sync(self.target)

    def _pick(self, logits: np.ndarray) -> tuple[int, float]:
        """The reference's draft token: top-k 10, first candidate, its probability."""
        if self._suppress is not None:
            logits = logits.copy()
            logits[self._suppress] = -np.inf
        tok = int(np.argmax(logits))
        if self.p_min <= 0.0:
            return tok, 1.0  # the probability cannot stop the draft; skip the top-k work
        k = min(DRAFT_TOP_K, logits.shape[0])
        top = np.partition(logits, logits.shape[0] - k)[-k:].astype(np.float64)
        m = top.max()
        p = 1.0 / float(np.exp(top - m).sum())
        return tok, p

    def draft(self, req: DraftRequest) -> list[int]:
        prompt = req.prompt if isinstance(req.prompt, list) else list(req.prompt)
        pos0 = len(prompt)
        n_ctx = self.ctx.n_ctx
        if pos0 >= n_ctx:
            return []
        id_done = False
        if self.kv != prompt:
            # not in step (a paused drafter, or the first use of this context): catch up on
            # what the target holds; without checkpoints, id_last goes in the same batch
            self.target = list(prompt)
            ok, id_done = self._catch_up(self.target, () if self.use_checkpoints else (req.id_last,))
            if not ok:
                return []
        ckpt = self._checkpoint() if self.use_checkpoints else None
        result: list[int] = []
        self.last_p = []
        try:
            if not id_done:
                self.ctx.decode([req.id_last], pos0, logits="last")
            self.n_draft_decodes += 1
            i = 0
            while True:
                tok, p = self._pick(self.ctx.logits(-1))
                if p < self.p_min:  # only collect very high-confidence draft tokens
                    break
                result.append(tok)
                self.last_p.append(p)
                if self.n_max_param <= len(result) or (0 < req.n_max <= len(result)):
                    break
                pos = pos0 + i + 1
                if pos >= n_ctx:
                    break
                self.ctx.decode([tok], pos, logits="last")
                self.n_draft_decodes += 1
                i += 1
        except (ContextFull, DecodeError):
            pass
        finally:
            # drop the draft's own tokens; the target's batch brings back what it keeps
            if ckpt is not None:
                self._restore(ckpt, pos0)
            elif not self.ctx.seq_rm(pos0, -1):
                self.ctx.clear()
                self.kv.clear()
        if len(result) < self.n_min:
            return []
        return result

    # -- cost ---------------------------------------------------------------------------
    def cost(self) -> dict:
        """The draft model's own work so far (microseconds and tokens)."""
        s = self.stats
        t_process = getattr(s, "t_process_us", 0.0)
        return {
            "t_draft_us": s.t_draft_us,
            "t_process_us": t_process,
            "n_gen_tokens": s.n_gen_tokens,
            "n_draft_decodes": self.n_draft_decodes,
            "n_process_tokens": self.n_process_tokens,
            "draft_us_per_token": s.t_draft_us / s.n_gen_tokens if s.n_gen_tokens else None,
            "total_us_per_token": (s.t_draft_us + t_process) / s.n_gen_tokens if s.n_gen_tokens else None,
        }

    def close(self) -> None:
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
            self.ctx = None  # type: ignore[assignment]
        if self._owns_model and self.model is not None:
            release_draft_model(self.model)
            self.model = None  # type: ignore[assignment]


def draft_n_max(params: SpecParams) -> int:
    """The draft length of the draft-model types (``--spec-draft-n-max``)."""
    return max(0, params.draft.n_max)


declare(SpecDescriptor(
    name="draft-simple", rank=60, kind=MODEL,
    info="a small draft model, same vocabulary",
    needs=DraftModel(), section="draft", n_max=draft_n_max,
    # the draft-model flags: the hidden-state types share them (and the section)
    params=(Param("draft.model", "draft model", PATH, ("-md", "--spec-draft-model", "--model-draft"),
                  "draft model for draft-simple", metavar="FNAME", hint="a GGUF with the target's vocabulary"),
            Param("draft.n_max", "max draft tokens", INT, ("--spec-draft-n-max",), "max draft tokens"),
            Param("draft.n_min", "min draft tokens", INT, ("--spec-draft-n-min",), "min draft tokens"),
            Param("draft.p_min", "min probability", FLOAT, ("--spec-draft-p-min",), "min draft probability"),
            Param("draft.n_gpu_layers", "draft GPU layers", NGL, ("-ngld", "--spec-draft-ngl"),
                  "draft model layers on the GPU", dest="spec_draft_ngl", default_text="",
                  hint="auto, all or a number (-ngld)"),
            Param("draft.device", "draft devices", STR, ("-devd", "--spec-draft-device", "--device-draft"),
                  "devices for the draft model (none = the CPU only; default: as --device)", metavar="DEV1,DEV2",
                  hint="empty: as the model's · none: CPU only"),
            Param("draft.n_ctx", None, INT, ("--spec-draft-ctx",), "draft context size", dest="spec_draft_ctx",
                  default_text="target's"),
            Param("draft.n_threads", None, INT, ("-td", "--spec-draft-threads"), "draft threads",
                  dest="spec_draft_threads", default_text=""))))


def size_prior(target: Model, draft: Model) -> float | None:
    """What a drafted token should cost, as a share of a target step, before it is measured:
    the draft model's size over the target's, where both are placed alike (both on the CPU, or
    both offloaded whole), since decoding one token is mostly reading the weights; None where
    their placements differ (a draft on the GPU for a target on the CPU is far cheaper than its
    size says)."""
    if target.placement != draft.placement or target.placement == "split":
        return None
    t = target.size_bytes
    return draft.size_bytes / t if t > 0 else None


@register(SpecType.DRAFT_SIMPLE)
def make_draft_simple(params: SpecParams, resources: dict) -> DraftSimple:
    """The chain's factory: load (or reuse) the draft model, check it, build the speculator.

    ``resources``: ``model`` (the target, required), ``engine`` (for the
    context size, batch size and threads), optionally ``draft_model`` (a
    loaded draft model the caller owns) and ``n_ctx``.
    Raises :class:`~speculators.chain.Unavailable` when no draft model is
    set, :class:`~speculators.compat.IncompatibleDraftModel` when its
    vocabulary does not fit the target's, and
    :class:`~speculators.llama.ModelError` when it cannot be loaded.
    """
    d = params.draft
    target = resources.get("model")
    draft_model: Model | None = resources.get("draft_model")
    if draft_model is None and not d.model:
        raise Unavailable("no draft model is set (--spec-draft-model PATH)")
    if target is None:
        raise Unavailable("no target model is loaded")
    owned = draft_model is None
    if owned:
        draft_model = acquire_draft_model(d.model, d.n_gpu_layers, draft_devices(d, resources))  # type: ignore[arg-type]
    assert draft_model is not None
    try:
        check_compatible(target, draft_model)
        engine = resources.get("engine")
        ectx = getattr(engine, "ctx", None)
        n_ctx = d.n_ctx if d.n_ctx > 0 else (ectx.n_ctx if ectx is not None else int(resources.get("n_ctx") or 4096))
        n_batch = ectx.n_batch if ectx is not None else 512
        n_threads = d.n_threads if d.n_threads > 0 else (ectx.n_threads if ectx is not None else None)
        spec = DraftSimple(params, draft_model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                           owns_model=owned)
        spec.cost_prior = size_prior(target, draft_model)
        return spec
    except BaseException:
        if owned:
            release_draft_model(draft_model)
        raise
