"""Loading the model and putting settings to use: the engine's lifecycle, as the session runs it.

:meth:`LoadingMixin.load` starts a thread that calls the engine factory (by default a runner
process: :class:`app.runner.RunnerEngine`), opens the lookup caches where ngram-cache is in use
(:mod:`app.session.lookup`) and sets the speculation; it posts :class:`EngineReady` or
:class:`EngineFailed`. A settings change either rebuilds the chain in a thread
(:class:`SpecApplied`) or loads the model again, as the engine's one load plan has it
(:func:`speculators.engine.loaded_as_needed`). Touches the session's engine, its lock and its
lookup store; the owner thread applies the events (the ``_on_*`` handlers here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any

from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from ..errors import describe
from ..options import ModelOptions
from .events import EngineFailed, EngineReady, LoadProgress, RunnerStopped, SpecApplied

__all__ = ["LoadingMixin"]


class LoadingMixin:
    """The session's load and settings job (a part of :class:`app.session.ChatSession`)."""

    def _init_loading(self) -> None:
        self.loading = False
        self.load_error: str | None = None
        #: (engine, store) a settings change opened whose SpecApplied is not applied yet; its own
        #: lock (the owner thread must never wait for engine_lock, which a reply holds throughout)
        self._spec_store: tuple[Any, Any] | None = None
        self._spec_store_lock = threading.Lock()

    def load(self, model: ModelOptions | None = None) -> None:
        """Load (or reload) the model in a thread; :class:`EngineReady` or :class:`EngineFailed` follows."""
        if model is not None:
            self.config.model = model
        self._stop_warm()
        old, self.engine = self.engine, None
        old_store, self.store = self.store, None
        self.loading = True
        self.load_error = None
        self._start(self._load_thread, dataclasses.replace(self.config.model), self.config.spec.copy(),
                    old, old_store, name="load")

    def _load_thread(self, model: ModelOptions, spec: SpecParams, old: Any, old_store: Any) -> None:
        if old is not None:
            with self.engine_lock:
                old.close()
        if old_store is not None:
            with contextlib.suppress(Exception):
                old_store.close()
        t0 = time.perf_counter()
        last = [0.0]

        def progress(done: int, total: int, phase: str) -> None:
            now = time.perf_counter()
            if done >= total or now - last[0] > 0.05:
                last[0] = now
                self.post(LoadProgress(phase, done, total))

        try:
            engine = self.engine_factory(model, spec, progress)
        except Exception as e:  # every failure becomes an event, never a traceback
            self.post(EngineFailed(describe(e), model.model))
            return
        if hasattr(engine, "on_idle_death"):   # a runner: a death between replies is said, not silent
            engine.on_idle_death = lambda msg, gave_up: self.post(RunnerStopped(msg, gave_up))
        store, warnings, spec_error = None, list(getattr(engine, "load_warnings", None) or []), None
        try:
            with self.engine_lock:
                store, store_warnings = self._open_store(engine, spec)
                warnings += store_warnings
                engine.set_spec(spec, resources=store.resources() if store is not None else None)
        except Exception as e:
            spec_error = describe(e)
        self.post(EngineReady(engine, time.perf_counter() - t0, store, warnings, spec_error))

    # -- settings --------------------------------------------------------------------------
    def apply_settings(self, spec: SpecParams, sampling: SamplingParams, model: ModelOptions,
                       max_tokens: int, overflow: str | None = None) -> str:
        """Use (and save) new settings. Returns ``"reload"``, ``"rebuild"`` or ``"saved"``."""
        old_model = self.config.model
        spec_changed = spec.to_dict() != self.config.spec.to_dict()
        model_changed = _model_key(model) != _model_key(old_model)
        for cfg in (self.config, self.saved_config):
            cfg.spec = spec.copy()
            cfg.sampling = dataclasses.replace(sampling)
            cfg.model = ModelOptions(**model.__dict__)
            cfg.max_tokens = max_tokens
            if overflow is not None:
                cfg.overflow = overflow
        self.save_config()
        if model_changed:
            self.stop()
            self.load(ModelOptions(**model.__dict__))
            return "reload"
        if spec_changed and self.engine is not None:
            return self._apply_spec(spec)
        return "saved"

    def rebuild_chain(self) -> bool:
        """Build the chain for the configured speculation again (e.g. settings applied while loading);
        the model is loaded again where that speculation needs it loaded another way."""
        if self.engine is None:
            return False
        self._apply_spec(self.config.spec)
        return True

    def _apply_spec(self, spec: SpecParams) -> str:
        """Stop the reply and put ``spec`` to use on the loaded model: ``"rebuild"`` (its chain, in
        a thread), or ``"reload"`` where it needs the model loaded another way (its MTP layers,
        state snapshots: loaded again, as the engine's load plan has it for this spec)."""
        self.stop()
        if not self._loaded_for(spec):
            self.load()
            return "reload"
        self._start(self._spec_thread, self.engine, spec.copy(), name="apply")
        return "rebuild"

    def _loaded_for(self, spec: SpecParams) -> bool:
        """Whether the loaded model is loaded as ``spec`` needs it (:func:`speculators.engine.loaded_as_needed`:
        the one load plan the chat, ``generate`` and ``bench`` share). True where it cannot be told
        (a scripted engine)."""
        engine = self.engine
        m = getattr(engine, "model", None)
        path = getattr(m, "path", None)
        if not path or not isinstance(getattr(m, "load_mtp", None), bool):
            return True
        from speculators.engine import LoadPlan, loaded_as_needed
        recurrent = bool(getattr(m, "is_recurrent", False) or getattr(m, "is_hybrid", False))
        try:
            return loaded_as_needed(str(path), spec, LoadPlan(m.load_mtp, int(getattr(engine, "n_rs_seq", 0) or 0)),
                                    recurrent)
        except Exception:
            return True

    def _spec_thread(self, engine: Any, spec: SpecParams) -> None:
        with self.engine_lock:
            # a store an earlier change opened (its SpecApplied not applied yet) is the one to use:
            # two quick changes open the caches once
            store, warnings = self.store, []
            with self._spec_store_lock:
                if store is None and self._spec_store is not None and self._spec_store[0] is engine:
                    store = self._spec_store[1]
            if store is None:
                store, warnings = self._open_store(engine, spec)
                with self._spec_store_lock:
                    self._spec_store = (engine, store) if store is not None else None
            try:
                chain = engine.set_spec(spec, resources=store.resources() if store is not None else None)
            except Exception as e:
                self.post(SpecApplied(dict(getattr(engine.chain, "skipped", {}) or {}), describe(e), store, warnings,
                                      engine))
                return
            self.post(SpecApplied(dict(getattr(chain, "skipped", {}) or {}), None, store, warnings, engine))

    # -- applying its events (owner thread) ------------------------------------------------
    def _on_EngineReady(self, ev: EngineReady) -> None:
        if self.closed:
            with contextlib.suppress(Exception):
                ev.engine.close()
            self._closing_store(ev.store)
            return
        self.engine = ev.engine
        self.store = ev.store
        self.loading = False
        self.warm()

    def _on_EngineFailed(self, ev: EngineFailed) -> None:
        self.loading = False
        self.load_error = ev.error

    def _on_SpecApplied(self, ev: SpecApplied) -> None:
        if ev.engine is not None and ev.engine is not self.engine:
            # for a model that has been unloaded since: its caches are of no use
            self._closing_store(ev.store)
            return
        if ev.store is not None and ev.store is not self.store:
            old, self.store = self.store, ev.store
            self._closing_store(old)
        with self._spec_store_lock:
            if self._spec_store is not None and self._spec_store[1] is self.store:
                self._spec_store = None
        self.warm()     # a drafter that reads the target's states has the whole context read again


def _model_key(m: ModelOptions) -> tuple:
    """What a model is loaded with: a change of any of it loads the model again."""
    ngl = -1 if m.n_gpu_layers is None else m.n_gpu_layers   # None and -1 both mean "automatic"
    placement = tuple(getattr(m, k, None) for k in ("rpc", "device", "split_mode", "tensor_split", "main_gpu"))
    return (m.model or None, m.ctx_size, m.threads, ngl, getattr(m, "extra_bufts", "auto"), *placement)
