"""Speculator type names and their fixed priority order.

The names and the order are those of llama.cpp's ``common/speculative.cpp``:

>>> parse_types("ngram-mod,ngram-simple")
[<SpecType.NGRAM_SIMPLE: 'ngram-simple'>, <SpecType.NGRAM_MOD: 'ngram-mod'>]
>>> parse_types("ngram-mod,none")
[]

``auto`` lets draftlight pick the types this model can use, under the
adaptive controller (:mod:`speculators.auto`):

>>> parse_types("auto")
[<SpecType.AUTO: 'auto'>]

Each type is declared by its own :class:`~speculators.descriptor.SpecDescriptor`,
beside its implementation, and kept in :mod:`speculators.registry` (which this
module reads; the registry imports neither this module nor the descriptor's);
:data:`PRIORITY`, :data:`ALL_TYPES`,
:data:`NGRAM_TYPES`, :data:`MODEL_TYPES` and :data:`HIDDEN_STATE_TYPES` are
live views of those declarations (a type declared later shows in them):

>>> [str(t) for t in PRIORITY][:3]
['ngram-simple', 'ngram-map-k', 'ngram-map-k4v']
>>> SpecType.DRAFT_MTP in HIDDEN_STATE_TYPES, SpecType.NGRAM_MOD in MODEL_TYPES
(True, False)

A :class:`SpecType` is a string (``"ngram-mod"``); one object per name:

>>> SpecType("ngram-mod") is SpecType.NGRAM_MOD, SpecType.NGRAM_MOD == "ngram-mod"
(True, True)
>>> SpecType("ngram-fancy")
Traceback (most recent call last):
...
ValueError: 'ngram-fancy' is not a valid SpecType
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, ClassVar, Iterator

from . import registry


class _SpecTypeMeta(type):
    """Iterating over :class:`SpecType` gives ``none``, the declared types (as :data:`ALL_TYPES`), ``auto``."""

    def __iter__(cls) -> Iterator["SpecType"]:
        yield from ALL_TYPES
        yield cls.AUTO  # type: ignore[attr-defined]

    def __len__(cls) -> int:
        return len(ALL_TYPES) + 1


#: name -> the one SpecType object for it (also names whose declaration was withdrawn)
_INTERNED: dict[str, "SpecType"] = {}


class SpecType(str, metaclass=_SpecTypeMeta):
    """A speculator type's name, as a string; ``SpecType(name)`` finds a declared type.

    The reference types are class attributes (``SpecType.NGRAM_MOD``); a type
    declared elsewhere (:func:`speculators.descriptor.declare`) becomes one
    too. Like the enum this used to be: ``.value`` and ``.name``, ``str()``
    is the name, one object per name (``is`` works), and pickling keeps it.
    """

    __slots__ = ()

    NONE: ClassVar["SpecType"]
    DRAFT_SIMPLE: ClassVar["SpecType"]
    DRAFT_EAGLE3: ClassVar["SpecType"]
    DRAFT_MTP: ClassVar["SpecType"]
    DRAFT_DFLASH: ClassVar["SpecType"]
    DRAFT_DSPARK: ClassVar["SpecType"]
    NGRAM_SIMPLE: ClassVar["SpecType"]
    NGRAM_MAP_K: ClassVar["SpecType"]
    NGRAM_MAP_K4V: ClassVar["SpecType"]
    NGRAM_MOD: ClassVar["SpecType"]
    NGRAM_CACHE: ClassVar["SpecType"]
    #: draftlight's own: the types this model can use, under the adaptive controller
    AUTO: ClassVar["SpecType"]

    def __new__(cls, value: Any) -> "SpecType":
        if type(value) is cls:
            return value
        name = str(value)
        t = _INTERNED.get(name)
        if t is not None and (t in _SPECIAL or _declared(name)):
            return t
        if t is None and _declared(name):
            return _INTERNED[name]
        raise ValueError(f"{value!r} is not a valid SpecType")

    @classmethod
    def _intern(cls, name: str) -> "SpecType":
        """The one object for ``name`` (made on first use; no check that it is declared)."""
        t = _INTERNED.get(name)
        if t is None:
            t = str.__new__(cls, name)
            _INTERNED[name] = t
        return t

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def name(self) -> str:
        """The attribute name: ``NGRAM_MAP_K4V`` for ``ngram-map-k4v``."""
        return attr_name(str.__str__(self))

    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<SpecType.{self.name}: {str.__str__(self)!r}>"

    def __reduce__(self) -> tuple:
        return (_restore, (str.__str__(self),))

    def __copy__(self) -> "SpecType":
        return self

    def __deepcopy__(self, memo: dict) -> "SpecType":
        return self


def _restore(name: str) -> SpecType:
    """Unpickling: the same object (a name not declared in this process still comes back as one)."""
    return SpecType._intern(name)


def attr_name(name: str) -> str:
    """``ngram-map-k4v`` -> ``NGRAM_MAP_K4V`` (the class attribute a type is reachable as)."""
    return name.upper().replace("-", "_")


#: llama.cpp's types (declared by their implementation modules; reachable as class attributes before that)
_BUILTIN = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
            "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
for _name in ("none",) + _BUILTIN + ("auto",):
    setattr(SpecType, attr_name(_name), SpecType._intern(_name))
del _name

#: the names that are no speculator: ``none`` and ``auto``
_SPECIAL = frozenset({SpecType.NONE, SpecType.AUTO})


def _declared(name: str) -> bool:
    return registry.find(name) is not None


# -- live views of the declarations -------------------------------------------

def _generation() -> int:
    registry.ensure_loaded()
    return registry.generation()


class _Cached:
    def __init__(self, compute: Callable[[], Any], doc: str = ""):
        self._compute = compute
        self._gen = -1
        self._value: Any = None
        self.__doc__ = doc

    def _get(self) -> Any:
        gen = _generation()
        if gen != self._gen:
            self._value = self._compute()
            self._gen = gen
        return self._value

    # what every live view reads straight from its current value
    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator:
        return iter(self._get())

    def __contains__(self, x: object) -> bool:
        return x in self._get()

    def __repr__(self) -> str:
        return repr(self._get())


class LiveTuple(_Cached, collections.abc.Sequence):
    """A tuple computed from the declared types, recomputed after a declaration."""

    def __getitem__(self, i):  # type: ignore[override]
        return self._get()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list, LiveTuple)):
            return self._get() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other):
        return self._get() + tuple(other)

    def __radd__(self, other):
        return tuple(other) + self._get()


class LiveSet(_Cached, collections.abc.Set):
    """A frozenset computed from the declared types, recomputed after a declaration."""

    @classmethod
    def _from_iterable(cls, it):  # what ``|``, ``&``, ``-`` return
        return frozenset(it)


class LiveMapping(_Cached, collections.abc.Mapping):
    """A dict computed from the declared types, recomputed after a declaration."""

    def __getitem__(self, key):
        return self._get()[key]


def _descs():
    return registry.descriptors()


#: The order in which the chain asks speculators for a draft: the first
#: one that returns a non-empty draft wins (each descriptor's ``rank``).
PRIORITY: LiveTuple = LiveTuple(lambda: tuple(d.type for d in _descs()), "types in priority order")

#: ``none`` and the types in llama.cpp's enum order (what ``--help`` lists after ``auto``):
#: the model-based types, then the n-gram types, each in priority order.
ALL_TYPES: LiveTuple = LiveTuple(
    lambda: (SpecType.NONE,) + tuple(d.type for d in _descs() if not d.is_ngram)
    + tuple(d.type for d in _descs() if d.is_ngram), "none and the types in llama.cpp's enum order")

#: Types that draft from the text alone (kind ``n-gram``).
NGRAM_TYPES: LiveSet = LiveSet(lambda: frozenset(d.type for d in _descs() if d.is_ngram), "n-gram types")
#: Types that draft with a model (kinds ``model`` and ``hidden-state``).
MODEL_TYPES: LiveSet = LiveSet(lambda: frozenset(d.type for d in _descs() if not d.is_ngram), "model types")
#: Types that need hidden states or a drafter bound to the target.
HIDDEN_STATE_TYPES: LiveSet = LiveSet(lambda: frozenset(d.type for d in _descs() if d.is_hidden),
                                      "hidden-state types")


class UnknownSpecType(ValueError):
    pass


def all_types_str() -> str:
    return ",".join([SpecType.AUTO.value] + [t.value for t in ALL_TYPES])


def parse_types(value: str | list[str] | tuple[str, ...] | None) -> list[SpecType]:
    """Parse a comma list (or list of names) into types in priority order.

    ``none`` anywhere means no speculation (an empty list). Duplicates fold.
    An unknown name raises :class:`UnknownSpecType` listing the valid names,
    and so does ``auto`` next to other types (it picks them itself).
    """
    if value is None:
        return []
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",")]
    else:
        names = [str(n).strip() for n in value]
    names = [n for n in names if n]
    found: set[SpecType] = set()
    for name in names:
        try:
            t = SpecType(name)
        except ValueError:
            raise UnknownSpecType(
                f"unknown speculative type: {name!r} (valid: {all_types_str()})"
            ) from None
        if t is SpecType.NONE:
            return []
        found.add(t)
    if SpecType.AUTO in found:
        if len(found) > 1:
            others = ",".join(t.value for t in PRIORITY if t in found)
            raise UnknownSpecType(f"'auto' picks the types itself and cannot be combined with {others}")
        return [SpecType.AUTO]
    return [t for t in PRIORITY if t in found]
