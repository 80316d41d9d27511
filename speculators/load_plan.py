"""The load plan: how a target is loaded for a speculation spec (its MTP layers, its
recurrent-state snapshots), worked out in one place for :class:`~speculators.engine.Engine`,
the app's runtime and the tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .params import SpecParams
from .types import HIDDEN_STATE_TYPES, SpecType


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
