"""Speculation parameters, with llama.cpp's defaults and validation.

Every field mirrors ``common_params_speculative`` in llama.cpp's
``common/common.h``; ranges follow the checks of ``common/arg.cpp``.

>>> p = SpecParams()
>>> (p.ngram_mod.n_match, p.ngram_mod.n_min, p.ngram_mod.n_max)
(24, 48, 64)
>>> p.validate()
>>> SpecParams(draft=DraftParams(n_max=-1)).validate()
Traceback (most recent call last):
...
speculators.params.ParamError: draft.n_max: must be >= 0
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from . import registry
from .types import SpecType, parse_types


class ParamError(ValueError):
    """A parameter value is out of range. ``field`` names it (dotted)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass
class DraftParams:
    """Parameters for the draft-model types (draft-simple, eagle3, mtp, ...)."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    p_split: float = 0.1
    model: str | None = None
    n_gpu_layers: int = -1
    n_ctx: int = 0
    n_threads: int = 0
    #: where the draft model's offloaded layers go (``-devd``; None: as the target's ``--device``)
    device: str | None = None

    def check(self, name: str = "draft") -> None:
        if self.n_max < 0:
            raise ParamError(f"{name}.n_max", "must be >= 0")
        if self.n_min < 0:
            raise ParamError(f"{name}.n_min", "must be >= 0")
        if not (0.0 <= self.p_min <= 1.0) or math.isnan(self.p_min):
            raise ParamError(f"{name}.p_min", "must be within [0, 1]")
        if not (0.0 <= self.p_split <= 1.0) or math.isnan(self.p_split):
            raise ParamError(f"{name}.p_split", "must be within [0, 1]")


@dataclass
class NgramMapParams:
    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1

    def check(self, name: str) -> None:
        if not 1 <= self.size_n <= 1024:
            raise ParamError(f"{name}.size_n", "must be between 1 and 1024 inclusive")
        if not 1 <= self.size_m <= 1024:
            raise ParamError(f"{name}.size_m", "must be between 1 and 1024 inclusive")
        if self.min_hits < 1:
            raise ParamError(f"{name}.min_hits", "must be at least 1")


@dataclass
class NgramModParams:
    n_match: int = 24
    n_max: int = 64
    n_min: int = 48

    def check(self, name: str = "ngram_mod") -> None:
        if not 1 <= self.n_match <= 1024:
            raise ParamError(f"{name}.n_match", "must be between 1 and 1024 inclusive")
        if not 0 <= self.n_min <= 1024:
            raise ParamError(f"{name}.n_min", "must be between 0 and 1024 inclusive")
        if not 0 <= self.n_max <= 1024:
            raise ParamError(f"{name}.n_max", "must be between 0 and 1024 inclusive")


@dataclass
class NgramCacheParams:
    lookup_cache_static: str | None = None
    lookup_cache_dynamic: str | None = None


@dataclass
class SpecParams:
    """The speculation settings: the types, and one section per type's parameters.

    A type declared outside this module with its own section (its
    descriptor's ``section`` and ``section_factory``) finds it here as an
    attribute too; those sections are kept in :attr:`extra`.
    """

    types: list[SpecType] = field(default_factory=list)
    synth_len: float | None = None
    synth_rates: list[float] = field(default_factory=list)
    draft: DraftParams = field(default_factory=DraftParams)
    ngram_simple: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_map_k: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_map_k4v: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_mod: NgramModParams = field(default_factory=NgramModParams)
    ngram_cache: NgramCacheParams = field(default_factory=NgramCacheParams)
    #: the adaptive controller (speculators.controller): None = on with ``auto``, off
    #: with an explicit type list (llama.cpp's behaviour); True/False force it
    adaptive: bool | None = None
    #: the sections of types declared elsewhere (by section name), made on first use
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        # only for names the dataclass does not have: a declared type's own section
        if name.startswith("_") or name == "extra":
            raise AttributeError(name)
        make = registry.section_factory(name)
        extra = self.__dict__.get("extra")
        if make is None or extra is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name not in extra:
            extra[name] = make()
        return extra[name]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        if any(getattr(self, f.name) != getattr(other, f.name) for f in dataclasses.fields(self) if f.compare):
            return False
        return all(getattr(self, k) == getattr(other, k) for k in set(self.extra) | set(other.extra))

    def sections(self) -> list[tuple[str, Any]]:
        """(name, section) for every parameter section: this module's, then the declared types' own."""
        out = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name != "extra" and dataclasses.is_dataclass(getattr(self, f.name))]
        return out + list(self.extra.items())

    @classmethod
    def auto(cls, **kw: Any) -> "SpecParams":
        """``--spec-type auto``: the types this model can use, under the adaptive controller."""
        return cls(types=[SpecType.AUTO], **kw)

    @property
    def is_auto(self) -> bool:
        return SpecType.AUTO in self.types

    @property
    def adaptive_on(self) -> bool:
        """Whether the adaptive controller decides the drafts."""
        if self.adaptive is not None:
            return bool(self.adaptive) and bool(self.types)
        return self.is_auto

    @classmethod
    def from_types(cls, types: str | list[str] | list[SpecType], **kw: Any) -> "SpecParams":
        return cls(types=parse_types([str(t.value if isinstance(t, SpecType) else t) for t in types])
                   if not isinstance(types, str) else parse_types(types), **kw)

    @property
    def has_synth(self) -> bool:
        return self.synth_len is not None or bool(self.synth_rates)

    def copy(self) -> "SpecParams":
        def dup(v: Any) -> Any:
            return dataclasses.replace(v) if dataclasses.is_dataclass(v) else copy.deepcopy(v)
        return dataclasses.replace(
            self,
            types=list(self.types),
            synth_rates=list(self.synth_rates),
            extra={k: dup(v) for k, v in self.extra.items()},
            **{name: dup(v) for name, v in self.sections() if name not in self.extra},
        )

    def n_max_configured(self) -> int:
        """``common_speculative_n_max(params)``: the largest draft any enabled type asks for.

        Each type's draft length is its descriptor's ``n_max``; under auto, the
        types the settings alone make usable (the n-gram types, draft-simple
        with a draft model set).
        """
        if SpecType.AUTO in self.types:
            descs = [d for d in registry.descriptors() if d.needs.from_params(self)]
        else:
            descs = [d for d in (registry.find(t) for t in self.types) if d is not None]
        return max([d.n_max(self) for d in descs if d.n_max is not None] + [0])

    def validate(self) -> None:
        """Raise :class:`ParamError` for the first value llama.cpp would refuse.

        Each section with a ``check(name)`` method checks itself.
        """
        for name, section in self.sections():
            check = getattr(section, "check", None)
            if callable(check):
                check(name)
        if self.synth_len is not None and self.synth_rates:
            raise ParamError("synth", "synthetic acceptance length and rates are mutually exclusive")

    # -- (de)serialisation for config.toml -------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(out.pop("extra"))
        out["types"] = [t.value for t in self.types]
        # TOML has no null: drop Nones.
        def strip(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items() if v is not None}
            return x
        return strip(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SpecParams":
        p = cls()
        for key, value in data.items():
            if key == "types":
                p.types = parse_types(value if isinstance(value, (list, str)) else [])
            elif key == "adaptive":
                if value is not None and not isinstance(value, bool):
                    raise ParamError("adaptive", "must be true or false")
                p.adaptive = value
            elif key in ("synth_len",):
                p.synth_len = None if value is None else float(value)
            elif key == "synth_rates":
                p.synth_rates = [float(v) for v in value]
            elif hasattr(p, key) and dataclasses.is_dataclass(getattr(p, key)):
                sub = getattr(p, key)
                names = {f.name: f for f in dataclasses.fields(sub)}
                for k2, v2 in dict(value).items():
                    if k2 not in names:
                        raise ParamError(f"{key}.{k2}", "unknown setting")
                    cur = getattr(sub, k2)
                    if isinstance(cur, bool) or cur is None or isinstance(cur, str):
                        setattr(sub, k2, v2)
                    elif isinstance(cur, int):
                        setattr(sub, k2, int(v2))
                    elif isinstance(cur, float):
                        setattr(sub, k2, float(v2))
                    else:
                        setattr(sub, k2, v2)
            else:
                raise ParamError(key, "unknown setting")
        return p
