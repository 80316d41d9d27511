"""The lookup caches ngram-cache drafts from, as the session keeps them.

Opening the caches of the loaded model's vocabulary (in the runner, beside the model, or in this
process for an in-process engine), learning a finished reply (the reply thread calls
:meth:`LookupMixin._save_lookup`), the figures the UI shows, and building the static cache from
files or the saved chats in a thread (:class:`StaticBuildProgress`, :class:`StaticBuilt`).
Touches the session's ``store`` and its history (read on the owner thread only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import time
from typing import Any, Sequence

from speculators.params import SpecParams

from ..errors import describe
from .conversation import SessionError
from .engine import uses_lookup_caches
from .events import LookupSaved, StaticBuildProgress, StaticBuilt

__all__ = ["LookupMixin"]


class LookupMixin:
    """The session's lookup-cache job (a part of :class:`app.session.ChatSession`)."""

    def _init_lookup(self, lookup_root: str | os.PathLike | None, use_lookup_store: bool) -> None:
        self.lookup_root = lookup_root
        self.use_lookup_store = use_lookup_store
        #: the lookup caches of the loaded model's vocabulary (when ngram-cache is in use)
        self.store: Any = None
        self.lookup_last_save: dict | None = None
        self._build_cancel: threading.Event | None = None

    def _open_store(self, engine: Any, spec: SpecParams) -> tuple[Any, list[str]]:
        """The lookup caches of the engine's vocabulary, loaded (None when ngram-cache is not used)."""
        if not (self.use_lookup_store and uses_lookup_caches(spec)):
            return None, []
        if hasattr(engine, "open_store"):
            # the runner keeps the caches beside the model
            try:
                return engine.open_store(spec, self.lookup_root)
            except Exception as e:
                return None, [f"lookup caches unavailable ({describe(e)}); ngram-cache runs without them"]
        model = getattr(engine, "model", None)
        if model is None or not hasattr(model, "token_bytes"):
            return None, []  # the scripted engine has no vocabulary
        from ..lookup_store import LookupStore, LookupStoreError
        nc = spec.ngram_cache
        try:
            store = LookupStore.for_model(model, static_path=nc.lookup_cache_static or None,
                                          dynamic_path=nc.lookup_cache_dynamic or None, root=self.lookup_root)
        except (LookupStoreError, OSError) as e:
            return None, [f"lookup caches unavailable ({describe(e)}); ngram-cache runs without them"]
        return store, list(store.warnings)

    def _closing_store(self, store: Any) -> None:
        if store is not None and store is not self.store:
            with contextlib.suppress(Exception):
                store.close()

    def _save_lookup(self, store: Any) -> None:
        try:
            res = store.save()
        except Exception as e:
            self.post(LookupSaved({"error": describe(e)}))
            return
        self.post(LookupSaved({"path": res.path, "skipped": res.skipped, "ngrams": res.ngrams,
                               "entries": res.entries, "added_entries": res.added_entries,
                               "warnings": list(res.warnings)}))

    # -- figures ---------------------------------------------------------------------------
    def lookup_figures(self) -> dict | None:
        """Cache sizes and what each cache contributed (None when ngram-cache is not in use)."""
        store = self.store
        if store is None:
            return None
        from ..lookup_store import LookupStore
        info = {k: dataclasses.asdict(v) for k, v in store.info().items()}
        engine = self.engine
        if engine is None:
            contrib = {}
        elif hasattr(engine, "lookup_contribution"):
            try:
                contrib = engine.lookup_contribution()
            except Exception:
                contrib = {}
        else:
            contrib = LookupStore.contribution(engine)
        return {"folder": str(store.folder), "caches": info, "sources": contrib,
                "pending_entries": store.pending_entries, "last_save": self.lookup_last_save}

    # -- the static cache ------------------------------------------------------------------
    def build_static_cache(self, files: Sequence[str] | None) -> None:
        """Build the static cache from ``files`` (None: from the saved chats) in a thread."""
        if self.store is None:
            raise SessionError("the lookup caches are not in use: turn ngram-cache (or Automatic) on first")
        if self._build_cancel is not None:
            raise SessionError("a static cache is already being built")
        # the saved chats are read here: the history belongs to the owner thread
        corpus = self._chats_corpus() if files is None else None
        if files is None and not corpus.strip():
            raise SessionError("there are no saved chats to learn from yet")
        self._build_cancel = threading.Event()
        self._start(self._build_thread, self.store, list(files) if files is not None else None, corpus,
                    self._build_cancel, name="build-static")

    def cancel_build(self) -> None:
        if self._build_cancel is not None:
            self._build_cancel.set()

    def _chats_corpus(self) -> str:
        if self.history is None:
            return ""
        parts = []
        for c in self.history.list_chats():
            with contextlib.suppress(KeyError):
                chat = self.history.load_chat(c.id)
                parts.extend(m.content for m in chat.messages if m.content.strip())
        return "\n\n".join(parts)

    def _build_thread(self, store: Any, files: list[str] | None, corpus: str | None,
                      cancel: threading.Event) -> None:
        from ..lookup_store import BuildCancelled
        tmp = None
        try:
            if files is None:
                fd, tmp = tempfile.mkstemp(prefix="chats-", suffix=".txt", dir=str(store.folder))
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(corpus or "")
                files = [tmp]

            last = [0.0]

            def progress(done: int, total: int, name: str) -> None:
                now = time.perf_counter()
                if done >= total or now - last[0] > 0.1:
                    last[0] = now
                    self.post(StaticBuildProgress(done, total, "saved chats" if name == tmp else
                                                  os.path.basename(name)))
            res = store.build_static(files, progress=progress, cancel=cancel.is_set)
            self.post(StaticBuilt(dataclasses.asdict(res)))
        except BuildCancelled:
            self.post(StaticBuilt(None, "cancelled: the static cache was left as it was"))
        except Exception as e:
            self.post(StaticBuilt(None, describe(e)))
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    # -- applying its events (owner thread) ------------------------------------------------
    def _on_StaticBuilt(self, ev: StaticBuilt) -> None:
        self._build_cancel = None

    def _on_LookupSaved(self, ev: LookupSaved) -> None:
        self.lookup_last_save = ev.info
