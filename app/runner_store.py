"""The runner's lookup caches, as the session uses them: a proxy whose calls are requests to the runner.

The lookup caches (:class:`app.lookup_store.LookupStore`) of a chat live in the runner process,
beside the model: :meth:`app.runner.RunnerEngine.open_store` opens them there and returns a
:class:`RunnerStore`, which the session (:mod:`app.session.lookup`) uses as it would a store in
its own process. What it shows is the runner's last snapshot: reading it never waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import runner_protocol as rp
from .runner_link import Abandoned

if TYPE_CHECKING:
    from .runner import RunnerEngine

__all__ = ["RunnerStore", "STORE_MARK"]

Progress = Callable[[int, int, str], None]

#: marks the lookup store of the runner in ``set_spec`` resources
STORE_MARK = "__runner_store__"


class RunnerStore:
    """The runner's lookup store, as the session uses it. What it shows (:meth:`info`,
    :attr:`pending_entries`) is the runner's last snapshot: reading it never waits."""

    def __init__(self, engine: "RunnerEngine"):
        self.engine = engine
        info = engine.lookup
        self.folder = info.folder if info is not None else ""
        self.warnings = list(info.warnings) if info is not None else []

    def resources(self) -> dict:
        return {STORE_MARK: True}

    def learn(self, tokens: Sequence[int]) -> int:
        toks = list(tokens)
        return self.engine._request(lambda rid: rp.Learn(rid, toks))

    @property
    def pending_entries(self) -> int:
        info = self.engine.lookup
        return info.pending_entries if info is not None else 0

    def save(self) -> Any:
        return self.engine._request(lambda rid: rp.SaveStore(rid))

    def info(self) -> dict:
        info = self.engine.lookup
        return dict(info.caches) if info is not None else {}

    def close(self) -> None:
        """Have the runner save and close the caches, without waiting for it (the UI's thread
        closes a store when the speculation changes): the runner does it once the request before
        it ends, and a runner that is gone has nothing to close."""
        eng = self.engine
        eng._store_spec = None
        link = eng._link
        if eng.closed or link is None or link.gone:
            return
        call = eng._open(lambda rid: rp.CloseStore(rid), link)
        eng._calls.drop(call)        # its answer is not waited for

    def build_static(self, files: Sequence[str], progress: Progress | None = None,
                     cancel: Callable[[], bool] | None = None) -> Any:
        """Build the static cache in the runner. A cancel that the runner has not acted on
        :attr:`RunnerEngine.GRACE_S` later (a long piece of text) is not waited for: the build
        ends as cancelled here, and the runner stops at its next piece (its answer dropped)."""
        from .lookup_store import BuildCancelled
        names = [str(f) for f in files]
        call = self.engine._open(lambda rid: rp.BuildStatic(rid, names))
        gen = self.engine._answers(call, cancel=cancel, progress=progress, stuck="leave")
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            return stop.value
        except Abandoned:
            raise BuildCancelled() from None
