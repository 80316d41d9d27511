"""draftlight's speculative decoding engine (no UI imports here, ever)."""

from .base import DraftRequest, Speculator, SpeculatorStats
from .chain import SpeculatorChain, Unavailable, register, resolve_synth_rates
from .params import ParamError, SpecParams
from .types import ALL_TYPES, PRIORITY, SpecType, UnknownSpecType, parse_types

__all__ = [
    "ALL_TYPES", "PRIORITY", "DraftRequest", "ParamError", "SpecParams", "SpecType",
    "Speculator", "SpeculatorChain", "SpeculatorStats", "Unavailable", "UnknownSpecType",
    "parse_types", "register", "resolve_synth_rates",
]
