"""Settings in ``config.toml`` (read with tomllib, written with tomli-w).

Layout::

    [model]        path, ctx_size, threads, n_gpu_layers, extra_bufts (auto|on|off)
    [sampling]     temperature, top_k, top_p, min_p, seed
    [speculation]  types = ["ngram-mod", ...], and one table per type:
    [speculation.draft] n_max, n_min, p_min, ...
    [speculation.ngram_mod] n_match, n_min, n_max
    [ui]           theme, colouring, ...

Flags given on the command line win over the file.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from speculators.params import ParamError, SpecParams
from speculators.sampling import SamplingParams

from . import paths
from .fileutil import atomic_write_bytes
from .options import ModelOptions


class ConfigError(ValueError):
    pass


#: what the chat does when the conversation outgrows the context (see app.session.fit_to_context)
OVERFLOW_POLICIES = ("rolling", "truncate-middle", "stop")


#: ``[ui]`` keys the chat app reads, with their defaults
UI_DEFAULTS: dict[str, Any] = {
    "theme": "dark",            # a theme name from themes/ or the user themes folder
    "colouring": True,          # colour drafted tokens (False: the off view below)
    "off_view": "markdown",     # "markdown" or "plain": how replies look uncoloured
    "stats_panel": False,       # show the statistics panel at start
}


@dataclass
class Config:
    model: ModelOptions = field(default_factory=ModelOptions)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: ``auto`` unless config.toml names the types (a file that lists them keeps them)
    spec: SpecParams = field(default_factory=SpecParams.auto)
    ui: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 1024
    system_prompt: str = ""
    #: what the chat does when the conversation outgrows the context: "rolling" (drop the
    #: oldest turns), "truncate-middle" (keep the first exchange, drop the ones after it), "stop"
    overflow: str = "rolling"

    def ui_get(self, key: str) -> Any:
        """A ``[ui]`` value, or its default when unset or of the wrong type."""
        default = UI_DEFAULTS.get(key)
        value = self.ui.get(key, default)
        if default is not None and not isinstance(value, type(default)):
            return default
        if key == "off_view" and value not in ("markdown", "plain"):
            return default
        return value

    def to_toml_dict(self) -> dict[str, Any]:
        model = {"ctx_size": self.model.ctx_size}
        if self.model.model:
            model["path"] = self.model.model
        if self.model.threads:
            model["threads"] = self.model.threads
        if self.model.n_gpu_layers is not None:
            model["n_gpu_layers"] = self.model.n_gpu_layers
        if self.model.extra_bufts != "auto":
            model["extra_bufts"] = self.model.extra_bufts
        return {
            "max_tokens": self.max_tokens,
            "system_prompt": self.system_prompt,
            "context_overflow": self.overflow,
            "model": model,
            "sampling": dataclasses.asdict(self.sampling),
            "speculation": self.spec.to_dict(),
            "ui": dict(self.ui),
        }

    @classmethod
    def from_toml_dict(cls, data: dict[str, Any]) -> "Config":
        c = cls()
        try:
            c.max_tokens = int(data.get("max_tokens", c.max_tokens))
            c.system_prompt = str(data.get("system_prompt", ""))
            c.overflow = str(data.get("context_overflow", c.overflow))
            if c.overflow not in OVERFLOW_POLICIES:
                raise ConfigError(f"context_overflow must be one of {', '.join(OVERFLOW_POLICIES)}, "
                                  f"not {c.overflow!r}")
            m = data.get("model", {})
            c.model = ModelOptions(model=m.get("path"), ctx_size=int(m.get("ctx_size", 4096)),
                                   threads=m.get("threads"), n_gpu_layers=m.get("n_gpu_layers"),
                                   extra_bufts=str(m.get("extra_bufts", "auto")))
            if c.model.extra_bufts not in ("auto", "on", "off"):
                raise ConfigError(f"model.extra_bufts must be auto, on or off, not {c.model.extra_bufts!r}")
            s = data.get("sampling", {})
            known = {f.name for f in dataclasses.fields(SamplingParams)}
            unknown = set(s) - known
            if unknown:
                raise ConfigError(f"unknown setting sampling.{sorted(unknown)[0]}")
            c.sampling = SamplingParams(**{k: type(getattr(SamplingParams(), k))(v) for k, v in s.items()})
            c.sampling.validate()
            spec_data = dict(data.get("speculation", {}))
            c.spec = SpecParams.from_dict(spec_data)
            if "types" not in spec_data:
                c.spec.types = SpecParams.auto().types   # nothing configured: automatic
            c.spec.validate()
            c.ui = dict(data.get("ui", {}))
        except ParamError as e:
            raise ConfigError(f"bad value in config: {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"bad value in config: {e}") from None
        return c


def load(path: Path | None = None) -> Config:
    """Read the config; a missing file gives the defaults.

    A file that does not parse raises :class:`ConfigError` naming the file
    and the line; the file is left untouched.
    """
    path = path or paths.config_file()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Config()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    try:
        return Config.from_toml_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def save(config: Config, path: Path | None = None) -> Path:
    path = path or paths.config_file()
    atomic_write_bytes(path, tomli_w.dumps(config.to_toml_dict()).encode("utf-8"))
    return path
