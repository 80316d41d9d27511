"""One descriptor per speculator type, declared beside its implementation.

A :class:`SpecDescriptor` says everything the rest of draftlight needs to
know about a type: its name and priority rank, its kind, its parameters
(the :class:`~speculators.params.SpecParams` section and its draft length),
its parameters (each a :class:`~speculators.param_kinds.Param`, declared
once: its command-line flag and its settings-pane field derive from it, its
default from the section's dataclass), its one-line description,
what it needs (and what to say when that is missing), what it needs the
target to load, and its theme colour slot. Each implementation module
(``speculators/ngram_*.py``, ``speculators/draft_*.py``) declares its
types with :func:`declare` and registers their factories with
:func:`speculators.chain.register`; these modules are imported on first
need (:func:`ensure_loaded`), never when :mod:`speculators.types` is. The
declarations are kept by :mod:`speculators.registry`, which this module and
:mod:`speculators.types` read (one way: the registry imports neither).

Derived from the declarations (live: a type declared later shows in them):
the priority order and the kind sets (:mod:`speculators.types`), the CLI
flag map (:mod:`app.options`), the settings pane's tables and availability
(:mod:`app.settings_form`, :mod:`app.model_files`), Automatic's plan (:mod:`speculators.auto`), the
draft length (:meth:`SpecParams.n_max_configured`) and the theme's colour
lookup (:mod:`themes`).

Adding a type is one new module plus a colour in the theme files (see
:class:`SpecDescriptor` for a worked example).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import registry
from .param_kinds import Flag, Param, Setting, derive
from .params import SpecParams
from .registry import (FACTORIES, IMPL_PREFIXES, descriptors, ensure_loaded, find, get, impl_modules,
                       section_factory)
from .types import _BUILTIN, _INTERNED, SpecType, attr_name

__all__ = ["NGRAM", "MODEL", "HIDDEN", "KINDS", "IMPL_PREFIXES", "FACTORIES", "Flag", "Setting", "Param",
           "Have", "Need", "Nothing", "DraftModel", "Drafter", "MtpHeads", "SpecDescriptor", "declare",
           "unregister", "registered", "descriptors", "find", "get", "ensure_loaded", "impl_modules",
           "section_factory", "drafter_archs", "load_needs", "draft_model_types"]

#: the kinds of speculator
NGRAM = "n-gram"          # drafts from the text alone
MODEL = "model"           # drafts with a separate draft model
HIDDEN = "hidden-state"   # drafts from the target's hidden states (or a drafter bound to the target)
KINDS = (NGRAM, MODEL, HIDDEN)

@dataclass(frozen=True)
class Have:
    """What the needs are checked against: the target's and the draft model's GGUF headers."""

    #: model-based types the target's GGUF supports by itself (``draft-mtp``: its MTP heads)
    target_types: frozenset = frozenset()
    #: the configured draft model's path (None: none is set)
    draft_model: str | None = None
    #: its architecture from its header (None: not read, or it cannot be read)
    draft_arch: str | None = None
    #: the types its GGUF is a drafter for
    draft_types: frozenset = frozenset()
    #: a loaded draft model was passed to the chain (with none configured)
    draft_passed: bool = False

    @property
    def draft_name(self) -> str:
        import os
        return os.path.basename(self.draft_model) if self.draft_model else ""


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


class Need:
    """What a type needs, for Automatic (:meth:`auto`) and for the settings pane (:meth:`missing`)."""

    def auto(self, d: "SpecDescriptor", have: Have) -> tuple[bool, str]:
        """Whether Automatic uses the type, and why (or why not)."""
        raise NotImplementedError

    def missing(self, d: "SpecDescriptor", have: Have) -> str | None:
        """Why the settings pane cannot switch the type on (None: it can)."""
        raise NotImplementedError

    def from_params(self, params: Any) -> bool:
        """Whether the settings alone (no file read) make the type usable (the draft length under auto)."""
        return False


@dataclass(frozen=True)
class Nothing(Need):
    """Needs nothing but the text: always available (``reason``: what Automatic says)."""

    reason: str = "always available"

    def auto(self, d: "SpecDescriptor", have: Have) -> tuple[bool, str]:
        return True, self.reason

    def missing(self, d: "SpecDescriptor", have: Have) -> str | None:
        return None

    def from_params(self, params: Any) -> bool:
        return True


@dataclass(frozen=True)
class DraftModel(Need):
    """Needs an ordinary draft model with the target's vocabulary (``-md``)."""

    def auto(self, d: "SpecDescriptor", have: Have) -> tuple[bool, str]:
        name = have.draft_name
        if not have.draft_model:
            if have.draft_passed:
                return True, "the draft model passed in"
            return False, "no draft model is set"
        if have.draft_arch is None:
            return False, f"the draft model {name} cannot be read"
        if have.draft_types or have.draft_arch.lower() in drafter_archs():
            return False, f"the draft model {name} is a {have.draft_arch} drafter, not an ordinary model"
        return True, f"draft model {name}"

    def missing(self, d: "SpecDescriptor", have: Have) -> str | None:
        return None if have.draft_model else "needs a draft model: set its path below"

    def from_params(self, params: Any) -> bool:
        return bool(params.draft.model)


@dataclass(frozen=True)
class Drafter(Need):
    """Needs the draft model to be a drafter of this type (``label``: how Automatic names it;
    the settings pane says the descriptor's ``drafter_label``). ``arch``: the drafter's GGUF
    architecture; without it, the header's tensors must say it is one of this type."""

    label: str = ""
    arch: str | None = None

    def _is_one(self, d: "SpecDescriptor", have: Have) -> bool:
        if self.arch is not None:
            return (have.draft_arch or "").lower() == self.arch
        return d.name in have.draft_types

    def auto(self, d: "SpecDescriptor", have: Have) -> tuple[bool, str]:
        name = have.draft_name
        label = self.label or d.drafter_label or d.name
        if not have.draft_model:
            return False, "no draft model is set"
        if have.draft_arch is None:
            return False, f"the draft model {name} cannot be read"
        if self._is_one(d, have):
            return True, f"{label} drafter {name}"
        return False, f"the draft model {name} is not {_article(label)} {label} drafter"

    def missing(self, d: "SpecDescriptor", have: Have) -> str | None:
        label = d.drafter_label or self.label or d.name
        if not have.draft_model:
            return f"needs {_article(label)} {label} drafter: set the draft model under draft-simple"
        if not self._is_one(d, have):
            return f"needs {_article(label)} {label} drafter; the draft model is not one"
        return None


@dataclass(frozen=True)
class MtpHeads(Need):
    """Needs multi-token-prediction heads: in the target's GGUF, or the draft model is such a file."""

    def auto(self, d: "SpecDescriptor", have: Have) -> tuple[bool, str]:
        if d.name in have.target_types:
            return True, "the model has multi-token-prediction heads"
        if have.draft_model and d.name in have.draft_types:
            return True, f"the draft model {have.draft_name} has multi-token-prediction heads"
        return False, "the model has no multi-token-prediction heads"

    def missing(self, d: "SpecDescriptor", have: Have) -> str | None:
        if d.name in have.target_types or d.name in have.draft_types:
            return None
        return "needs a model with MTP heads; this model has none"


_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")


@dataclass(frozen=True, eq=False)
class SpecDescriptor:
    """One speculator type: everything draftlight derives its tables from (see the module docstring).

    Adding a type is one new module plus a colour in the theme files. The
    module declares the type and registers its factory::

        ECHO = declare(SpecDescriptor(name="ngram-echo", rank=45, kind=NGRAM, ...))

        @register(ECHO)
        def make_echo(params, resources): ...

    A worked example (withdrawn again at the end of the ``with`` block), a
    type that always drafts the same two tokens, ranked between ngram-mod
    (40) and ngram-cache (50)::

        >>> from speculators.base import Speculator, DraftRequest
        >>> from speculators.chain import SpeculatorChain
        >>> from speculators.params import SpecParams
        >>> from speculators.types import PRIORITY, parse_types
        >>> class Echo(Speculator):
        ...     def draft(self, req):
        ...         return [7, 7]
        >>> echo = SpecDescriptor(name="ngram-echo", rank=45, kind=NGRAM, info="drafts 7 7",
        ...                       needs=Nothing("always available: drafts 7 7"), n_max=lambda p: 2)
        >>> with registered(echo, factory=lambda params, resources: Echo(2)) as t:
        ...     Echo.type = t
        ...     print([str(x) for x in PRIORITY][3:6])
        ...     chain = SpeculatorChain.from_params(SpecParams(types=parse_types("ngram-echo")))
        ...     print(chain.draft(DraftRequest(prompt=[1, 2], id_last=3, pos0=2, n_max=4)))
        ['ngram-mod', 'ngram-echo', 'ngram-cache']
        [7, 7]
        >>> "ngram-echo" in [str(x) for x in PRIORITY]
        False
    """

    #: the type's name (``--spec-type``, config.toml, statistics)
    name: str
    #: its place in the priority order (lower: asked first); llama.cpp's types are 10, 20, ... 100
    rank: int
    #: :data:`NGRAM`, :data:`MODEL` or :data:`HIDDEN`
    kind: str
    #: one line for the settings pane
    info: str = ""
    #: what it needs, and what Automatic and the settings pane say about that
    needs: Need = field(default_factory=Nothing)
    #: its draft length from the parameters (``common_speculative_n_max``); None: 0
    n_max: Callable[[Any], int] | None = None
    #: the SpecParams section that holds its parameters (None: it has none)
    section: str | None = None
    #: for a section SpecParams does not define: makes its defaults (a dataclass; an optional
    #: ``check(name)`` method validates it)
    section_factory: Callable[[], Any] | None = None
    #: its parameters, each declared once: its flags and its settings fields derive from them
    params: tuple[Param, ...] = ()
    #: its command-line flags, derived from ``params``
    flags: tuple[Flag, ...] = field(default=(), init=False)
    #: its fields in the settings pane, derived from ``params``
    fields: tuple[Setting, ...] = field(default=(), init=False)
    #: how the settings pane names the drafter it needs (EAGLE3, DFlash, ...)
    drafter_label: str | None = None
    #: what the target model must load for it (``"mtp"``: its MTP heads)
    load: frozenset = frozenset()
    #: whether a GGUF file holds what this type drafts with, from its header alone (a
    #: :class:`~speculators.gguf_detect.GGUFInfo` with tensor infos): llama.cpp's
    #: ``common_speculative_types_from_gguf``, one type's part of it (None: no file does)
    detect: Callable[[Any], bool] | None = None
    #: the theme's ``[draft]`` key for its colour (None: its name)
    theme_slot: str | None = None
    #: its colour where a theme has none for the slot (None: the theme's accent colour)
    color: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or self.name in ("none", "auto"):
            raise ValueError(f"invalid speculator type name: {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.params:
            flags, fields = derive(self.params, self._section_defaults)
            object.__setattr__(self, "flags", flags)
            object.__setattr__(self, "fields", fields)

    def _section_defaults(self, section: str) -> Any:
        """The defaults of a parameter section: SpecParams' own, or this type's ``section_factory``."""
        own = {f.name: f for f in dataclasses.fields(SpecParams)}
        if section in own and own[section].default_factory is not dataclasses.MISSING:
            return own[section].default_factory()
        if section == self.section and self.section_factory is not None:
            return self.section_factory()
        raise ValueError(f"{self.name}: no defaults for the parameter section {section!r}")

    @property
    def type(self) -> SpecType:
        return SpecType._intern(self.name)

    @property
    def slot(self) -> str:
        return self.theme_slot or self.name

    @property
    def is_ngram(self) -> bool:
        return self.kind == NGRAM

    @property
    def is_hidden(self) -> bool:
        return self.kind == HIDDEN

    def __repr__(self) -> str:
        return f"SpecDescriptor({self.name!r}, rank={self.rank}, kind={self.kind!r})"


def declare(desc: SpecDescriptor) -> SpecType:
    """Declare a type (again: replaces its declaration); its SpecType is returned.

    Two types cannot share a rank.
    """
    def check(other: SpecDescriptor) -> None:
        if other.rank == desc.rank and other.name != desc.name:
            raise ValueError(f"{desc.name}: rank {desc.rank} is taken by {other.name}")
    t = desc.type
    registry.store(desc, check)
    attr = attr_name(desc.name)
    if getattr(SpecType, attr, None) is None:
        setattr(SpecType, attr, t)
    return t


def unregister(name: str) -> None:
    """Withdraw a type's declaration and factory (tests; a type declared by a module stays withdrawn
    until it is declared again)."""
    name = str(name)
    t = _INTERNED.get(name)
    desc = registry.withdraw(name, t)
    if desc is not None:
        attr = attr_name(name)
        if name not in _BUILTIN and getattr(SpecType, attr, None) is t:
            delattr(SpecType, attr)


@contextlib.contextmanager
def registered(desc: SpecDescriptor, factory: Callable | None = None) -> Iterator[SpecType]:
    """Declare ``desc`` (and register ``factory``) for the ``with`` block; withdraw it afterwards."""
    ensure_loaded()
    t = declare(desc)
    try:
        if factory is not None:
            FACTORIES[t] = factory
        yield t
    finally:
        unregister(desc.name)


def drafter_archs() -> frozenset[str]:
    """The GGUF architectures that declared types take as their drafters (not ordinary models)."""
    return frozenset(d.needs.arch for d in descriptors() if isinstance(d.needs, Drafter) and d.needs.arch)


def load_needs(types: Any) -> frozenset:
    """What the target must load for ``types`` (e.g. ``{"mtp"}``)."""
    out: set = set()
    for t in types:
        d = find(t)
        if d is not None:
            out |= d.load
    return frozenset(out)


def draft_model_types() -> tuple[SpecType, ...]:
    """The types that draft from the configured draft model (``-md``), in priority order."""
    return tuple(d.type for d in descriptors() if isinstance(d.needs, (DraftModel, Drafter)))

