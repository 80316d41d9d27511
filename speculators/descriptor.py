"""One descriptor per speculator type, declared beside its implementation.

A :class:`SpecDescriptor` says everything the rest of draftlight needs to
know about a type: its name and priority rank, its kind, its parameters
(the :class:`~speculators.params.SpecParams` section and its draft length),
its command-line flags and settings-pane fields, its one-line description,
what it needs (and what to say when that is missing), what it needs the
target to load, and its theme colour slot. Each implementation module
(``speculators/ngram_*.py``, ``speculators/draft_*.py``) declares its
types with :func:`declare` and registers their factories with
:func:`speculators.chain.register`; these modules are imported on first
need (:func:`ensure_loaded`), never when :mod:`speculators.types` is.

Derived from the declarations (live: a type declared later shows in them):
the priority order and the kind sets (:mod:`speculators.types`), the CLI
flag map (:mod:`app.options`), the settings pane's tables and availability
(:mod:`app.ui.screens`), Automatic's plan (:mod:`speculators.auto`), the
draft length (:meth:`SpecParams.n_max_configured`) and the theme's colour
lookup (:mod:`themes`).

Adding a type is one new module plus a colour in the theme files (see
:class:`SpecDescriptor` for a worked example).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

from .types import _BUILTIN, _INTERNED, _SPECIAL, SpecType, attr_name

#: the kinds of speculator
NGRAM = "n-gram"          # drafts from the text alone
MODEL = "model"           # drafts with a separate draft model
HIDDEN = "hidden-state"   # drafts from the target's hidden states (or a drafter bound to the target)
KINDS = (NGRAM, MODEL, HIDDEN)

#: the implementation modules of ``speculators`` (imported on first need; each declares its types)
IMPL_PREFIXES = ("ngram_", "draft_")


class Flag(NamedTuple):
    """A command-line flag that sets one parameter (``target``: ``"section.name"`` of SpecParams).

    ``kind``: how the value is read: ``int``, ``float``, ``ngl`` (a number,
    ``auto`` or ``all``) or ``str``.
    """

    names: tuple[str, ...]
    dest: str
    target: str
    kind: str
    help: str
    metavar: str | None = None


class Setting(NamedTuple):
    """A settings-pane field: ``key`` (``"section.name"``), its label, its kind
    (``int``, ``float``, ``ngl``, ``path``, ``str``) and its hint (None: the default value)."""

    key: str
    label: str
    kind: str
    hint: str | None = None


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
    #: its command-line flags
    flags: tuple[Flag, ...] = ()
    #: its fields in the settings pane
    fields: tuple[Setting, ...] = ()
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


_LOCK = threading.RLock()
_DESCRIPTORS: dict[str, SpecDescriptor] = {}
#: type -> factory(params, resources); :func:`speculators.chain.register` fills it
FACTORIES: dict[SpecType, Callable] = {}
#: bumped by every declaration and withdrawal (the live views recompute)
_GENERATION = 0
_ORDERED: tuple[int, tuple[SpecDescriptor, ...]] = (-1, ())
_loaded = False
#: the threads importing the implementation modules now (a declaration's own lookups see what is declared so far)
_loading: set[int] = set()


def impl_modules() -> tuple[str, ...]:
    """The implementation modules: ``speculators/ngram_*.py`` and ``speculators/draft_*.py``."""
    import speculators
    return tuple(sorted(m.name for m in pkgutil.iter_modules(speculators.__path__)
                        if m.name.startswith(IMPL_PREFIXES)))


def ensure_loaded() -> None:
    """Import the implementation modules (once); each declares its types and registers their factories."""
    global _loaded
    me = threading.get_ident()
    if _loaded or me in _loading:
        return
    _loading.add(me)
    try:
        for name in impl_modules():
            try:
                importlib.import_module(f"speculators.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"speculators.{name}":
                    raise
        _loaded = True
    finally:
        _loading.discard(me)


def declare(desc: SpecDescriptor) -> SpecType:
    """Declare a type (again: replaces its declaration); its SpecType is returned.

    Two types cannot share a rank.
    """
    global _GENERATION
    with _LOCK:
        for other in _DESCRIPTORS.values():
            if other.rank == desc.rank and other.name != desc.name:
                raise ValueError(f"{desc.name}: rank {desc.rank} is taken by {other.name}")
        t = desc.type
        _DESCRIPTORS[desc.name] = desc
        attr = attr_name(desc.name)
        if getattr(SpecType, attr, None) is None:
            setattr(SpecType, attr, t)
        _GENERATION += 1
        return t


def unregister(name: str) -> None:
    """Withdraw a type's declaration and factory (tests; a type declared by a module stays withdrawn
    until it is declared again)."""
    global _GENERATION
    name = str(name)
    with _LOCK:
        desc = _DESCRIPTORS.pop(name, None)
        t = _INTERNED.get(name)
        if t is not None:
            FACTORIES.pop(t, None)
        if desc is not None:
            attr = attr_name(name)
            if name not in _BUILTIN and getattr(SpecType, attr, None) is t:
                delattr(SpecType, attr)
        _GENERATION += 1


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


def descriptors() -> tuple[SpecDescriptor, ...]:
    """Every declared type, in priority order."""
    global _ORDERED
    ensure_loaded()
    gen, ordered = _ORDERED
    if gen != _GENERATION:
        with _LOCK:
            ordered = tuple(sorted(_DESCRIPTORS.values(), key=lambda d: d.rank))
            _ORDERED = (_GENERATION, ordered)
    return ordered


def find(name: Any) -> SpecDescriptor | None:
    """The descriptor of ``name`` (a SpecType or its name), None if no such type is declared."""
    name = str(name)
    d = _DESCRIPTORS.get(name)
    if d is None and name not in _SPECIAL:
        ensure_loaded()
        d = _DESCRIPTORS.get(name)
    return d


def get(name: Any) -> SpecDescriptor:
    d = find(name)
    if d is None:
        raise KeyError(f"no such speculator type: {name}")
    return d


def section_factory(section: str) -> Callable[[], Any] | None:
    """For a SpecParams section that a declared type adds: what makes its defaults."""
    for d in descriptors():
        if d.section == section and d.section_factory is not None:
            return d.section_factory
    return None


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

