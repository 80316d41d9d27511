"""Settings in ``config.toml`` (read with tomllib, written with tomli-w).

Layout::

    [model]        path, ctx_size, threads, n_gpu_layers, extra_bufts (auto|on|repack|off),
                   rpc ("host:port,..."), device, split_mode, tensor_split, main_gpu
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
    "colouring": True,          # colour drafted tokens (F5)
    "off_view": "plain",        # "plain" or "markdown": how replies are laid out (F6), coloured or not
    "stats_panel": False,       # show the statistics panel at start
}


#: draftlight's default min-p (llama.cpp's is 0.05): tokens below this share of the likeliest one's
#: probability are never sampled. On small models it keeps replies on the likely words: the
#: embedded default model then copies what it is asked to copy instead of drifting off it
#: (tools/bench_copy.py: 50 of 60 copy requests copied with accepted drafts, 40 of 60 at 0.05)
DEFAULT_MIN_P = 0.2


def default_sampling() -> SamplingParams:
    """The sampling a chat, ``generate`` and the settings pane start from: llama.cpp's defaults
    (temperature 0.8, top-k 40, top-p 0.95) with :data:`DEFAULT_MIN_P`.

    >>> default_sampling().min_p, default_sampling().temperature
    (0.2, 0.8)
    """
    return SamplingParams(min_p=DEFAULT_MIN_P)


@dataclass
class Config:
    model: ModelOptions = field(default_factory=ModelOptions)
    sampling: SamplingParams = field(default_factory=default_sampling)
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
        for key in ("rpc", "device", "split_mode", "tensor_split", "main_gpu"):
            if getattr(self.model, key) is not None:
                model[key] = getattr(self.model, key)
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
            from .cpu_check import MODES
            if c.model.extra_bufts not in MODES:
                raise ConfigError(f"model.extra_bufts must be {', '.join(MODES[:-1])} or {MODES[-1]}, "
                                  f"not {c.model.extra_bufts!r}")
            for key in ("rpc", "device", "split_mode", "tensor_split"):
                if m.get(key) is not None:
                    setattr(c.model, key, str(m[key]))
            if m.get("main_gpu") is not None:
                c.model.main_gpu = int(m["main_gpu"])
            from .options import check_placement
            try:
                check_placement(c.model)
            except ParamError as e:
                raise ConfigError(f"bad value in config: model.{e}") from None
            s = data.get("sampling", {})
            known = {f.name for f in dataclasses.fields(SamplingParams)}
            unknown = set(s) - known
            if unknown:
                raise ConfigError(f"unknown setting sampling.{sorted(unknown)[0]}")
            base = default_sampling()
            c.sampling = dataclasses.replace(base, **{k: type(getattr(base, k))(v) for k, v in s.items()})
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
    """Read the config strictly; a missing file gives the defaults.

    A file with any problem raises :class:`ConfigError` naming the file and what is
    wrong (see :func:`load_lenient`, which the app uses); the file is left untouched.
    """
    got = load_lenient(path)
    if got.damaged:
        raise ConfigError(f"{got.path}: " + "; ".join(got.problems))
    return got.config


@dataclass
class Loaded:
    """config.toml as far as it could be read: the settings, and what was wrong with the file.

    ``problems`` is empty for a good (or missing) file. Where it is not, the settings are
    the defaults for whatever could not be read, and the file must not be written over
    (``damaged``): the person's own text stays as it is until they fix it.
    """

    config: Config
    problems: list[str] = field(default_factory=list)
    path: Path | None = None

    @property
    def damaged(self) -> bool:
        return bool(self.problems)

    def notice(self) -> str:
        """One message for people: what is wrong, what is used instead, how to fix it."""
        return (f"config.toml has problems ({self.path}): " + "; ".join(self.problems)
                + ". Those settings use their defaults for now and the file is left as it is (settings "
                  "changed in the app are not saved until it is fixed); fix it in an editor, or start "
                  "with --no-config.")


def _leaves(data: dict, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every setting in ``data``; a table of speculation parameters or
    ``[ui]`` counts key by key, a list (``types``) as one value."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for k, v in data.items():
        if isinstance(v, dict):
            out.extend(_leaves(v, prefix + (k,)))
        else:
            out.append((prefix + (k,), v))
    return out


def _with(data: dict, key: tuple[str, ...], value: Any) -> dict:
    """A copy of ``data`` with ``value`` set at ``key`` (the tables on the way made as needed)."""
    out = _copy_tree(data)
    cur = out
    for part in key[:-1]:
        cur = cur.setdefault(part, {})
    cur[key[-1]] = value
    return out


def _copy_tree(d: dict) -> dict:
    return {k: _copy_tree(v) if isinstance(v, dict) else v for k, v in d.items()}


def _plain(why: str) -> str:
    """Python's conversion errors, said for people."""
    if why.startswith("invalid literal for int()"):
        return "expected a whole number"
    if why.startswith("could not convert string to float"):
        return "expected a number"
    return why


def load_lenient(path: Path | None = None) -> Loaded:
    r"""Read the config, starting on the defaults for whatever cannot be read (never raises).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "config.toml"
    >>> _ = p.write_text('max_tokens = 64\n[model]\nctx_size = "big"\n')
    >>> got = load_lenient(p)
    >>> got.config.max_tokens, got.config.model.ctx_size, got.damaged
    (64, 4096, True)
    >>> got.problems
    ["model.ctx_size = 'big': expected a whole number"]
    """
    path = path or paths.config_file()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Loaded(Config(), [], path)
    except OSError as e:
        return Loaded(Config(), [f"it cannot be read ({e.strerror or e})"], path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        return Loaded(Config(), [f"line {line} is not UTF-8 text (byte 0x{raw[e.start]:02x}), so none of it "
                                 f"was read"], path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return Loaded(Config(), [f"it is not valid TOML ({e}), so none of it was read"], path)
    try:
        return Loaded(Config.from_toml_dict(data), [], path)
    except ConfigError:
        pass
    # keep every setting that is fine on its own with the ones kept before it; name the others
    good: dict = {}
    problems: list[str] = []
    for key, value in _leaves(data):
        trial = _with(good, key, value)
        try:
            Config.from_toml_dict(trial)
        except ConfigError as e:
            why = _plain(str(e).removeprefix("bad value in config: "))
            problems.append(f"{'.'.join(key)} = {value!r}: {why}")
            continue
        good = trial
    try:
        cfg = Config.from_toml_dict(good)
    except ConfigError as e:  # pragma: no cover - every kept key was checked
        return Loaded(Config(), [str(e)], path)
    return Loaded(cfg, problems or ["a setting could not be read"], path)


def save(config: Config, path: Path | None = None) -> Path:
    path = path or paths.config_file()
    atomic_write_bytes(path, tomli_w.dumps(config.to_toml_dict()).encode("utf-8"))
    return path
