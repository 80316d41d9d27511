"""The one registry of declared speculator types: their descriptors by name and their factories.

It holds the declarations (:func:`store`, :func:`withdraw`) and answers
what is declared (:func:`descriptors`, :func:`find`); the implementation
modules (``speculators/ngram_*``, ``speculators/draft_*``) are imported on
first need (:func:`ensure_loaded`) and declare their types as they load.
It imports nothing of draftlight's: :mod:`speculators.types` (the names and
their live views) and :mod:`speculators.descriptor` (what a declaration
says, and :func:`~speculators.descriptor.declare`) both read it, never the
other way round. :func:`generation` changes with every declaration and
withdrawal, so that views computed from the declarations know when to
recompute.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from typing import Any, Callable

#: the implementation modules of ``speculators`` (imported on first need; each declares its types)
IMPL_PREFIXES = ("ngram_", "draft_")
#: the names that are no speculator type (never looked for in the implementation modules)
_SPECIAL_NAMES = frozenset({"none", "auto"})

_LOCK = threading.RLock()
_DESCRIPTORS: dict[str, Any] = {}
#: type -> factory(params, resources); :func:`speculators.chain.register` fills it
FACTORIES: dict[Any, Callable] = {}
#: bumped by every declaration and withdrawal (the live views recompute)
_GENERATION = 0
_ORDERED: tuple[int, tuple[Any, ...]] = (-1, ())
_loaded = False
#: the threads importing the implementation modules now (a declaration's own lookups see what is declared so far)
_loading: set[int] = set()


def generation() -> int:
    """A number that changes whenever a type is declared or withdrawn."""
    return _GENERATION


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


def store(desc: Any, check: Callable[[Any], None] | None = None) -> None:
    """Keep ``desc`` as the declaration of its name (``check(other)`` is called, under the lock,
    for every other declaration first; it raises to refuse)."""
    global _GENERATION
    with _LOCK:
        if check is not None:
            for other in _DESCRIPTORS.values():
                check(other)
        _DESCRIPTORS[desc.name] = desc
        _GENERATION += 1


def withdraw(name: str, t: Any = None) -> Any:
    """Forget the declaration of ``name`` (and the factory of its type ``t``); the descriptor is returned."""
    global _GENERATION
    with _LOCK:
        desc = _DESCRIPTORS.pop(name, None)
        if t is not None:
            FACTORIES.pop(t, None)
        _GENERATION += 1
        return desc


def descriptors() -> tuple[Any, ...]:
    """Every declared type's descriptor, in priority order (its ``rank``)."""
    global _ORDERED
    ensure_loaded()
    gen, ordered = _ORDERED
    if gen != _GENERATION:
        with _LOCK:
            ordered = tuple(sorted(_DESCRIPTORS.values(), key=lambda d: d.rank))
            _ORDERED = (_GENERATION, ordered)
    return ordered


def find(name: Any) -> Any:
    """The descriptor of ``name`` (a SpecType or its name), None if no such type is declared."""
    name = str(name)
    d = _DESCRIPTORS.get(name)
    if d is None and name not in _SPECIAL_NAMES:
        ensure_loaded()
        d = _DESCRIPTORS.get(name)
    return d


def get(name: Any) -> Any:
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
