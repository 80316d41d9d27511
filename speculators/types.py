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
"""

from __future__ import annotations

import enum


class SpecType(str, enum.Enum):
    NONE = "none"
    DRAFT_SIMPLE = "draft-simple"
    DRAFT_EAGLE3 = "draft-eagle3"
    DRAFT_MTP = "draft-mtp"
    DRAFT_DFLASH = "draft-dflash"
    DRAFT_DSPARK = "draft-dspark"
    NGRAM_SIMPLE = "ngram-simple"
    NGRAM_MAP_K = "ngram-map-k"
    NGRAM_MAP_K4V = "ngram-map-k4v"
    NGRAM_MOD = "ngram-mod"
    NGRAM_CACHE = "ngram-cache"
    #: draftlight's own: the types this model can use, under the adaptive controller
    AUTO = "auto"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


#: Declaration order of the reference enum (what ``--help`` lists after ``auto``).
ALL_TYPES: tuple[SpecType, ...] = tuple(t for t in SpecType if t is not SpecType.AUTO)

#: The order in which the chain asks speculators for a draft: the first
#: one that returns a non-empty draft wins.
PRIORITY: tuple[SpecType, ...] = (
    SpecType.NGRAM_SIMPLE,
    SpecType.NGRAM_MAP_K,
    SpecType.NGRAM_MAP_K4V,
    SpecType.NGRAM_MOD,
    SpecType.NGRAM_CACHE,
    SpecType.DRAFT_SIMPLE,
    SpecType.DRAFT_EAGLE3,
    SpecType.DRAFT_MTP,
    SpecType.DRAFT_DFLASH,
    SpecType.DRAFT_DSPARK,
)

NGRAM_TYPES = frozenset(PRIORITY[:5])
MODEL_TYPES = frozenset(PRIORITY[5:])
#: Types that need hidden states or a drafter bound to the target.
HIDDEN_STATE_TYPES = frozenset(
    {SpecType.DRAFT_EAGLE3, SpecType.DRAFT_MTP, SpecType.DRAFT_DFLASH, SpecType.DRAFT_DSPARK}
)


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
