"""Settings in ``config.toml`` (read with tomllib, edited in place with tomlkit).

Layout::

    [model]        path, ctx_size, threads, n_gpu_layers, extra_bufts (auto|on|repack|off),
                   rpc ("host:port,..."), device, split_mode, tensor_split, main_gpu
    [sampling]     temperature, top_k, top_p, min_p, seed
    [speculation]  types = ["ngram-mod", ...], and one table per type:
    [speculation.draft] n_max, n_min, p_min, ...
    [speculation.ngram_mod] n_match, n_min, n_max
    [ui]           theme, colouring, ...

Flags given on the command line win over the file. The app changes the file only where a setting
changed (see :func:`save`): the person's comments, key order, keys this version does not know and
edits made while the app runs stay as they are.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomlkit
from tomlkit.exceptions import TOMLKitError

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

    def copy(self) -> "Config":
        """A copy that shares nothing with this one (what :func:`save` takes as ``since``)."""
        return copy.deepcopy(self)

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


def _read_text(path: Path) -> tuple[str | None, list[str]]:
    """The file's text (None where there is no file), or the problems that keep it from being read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, []
    except OSError as e:
        return None, [f"it cannot be read ({e.strerror or e})"]
    try:
        return raw.decode("utf-8"), []
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        return None, [f"line {line} is not UTF-8 text (byte 0x{raw[e.start]:02x}), so none of it was read"]


def _settings_of(text: str, path: Path) -> Loaded:
    """The settings in config.toml's ``text``: every setting that is fine on its own with the ones
    kept before it, and the others named as problems."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return Loaded(Config(), [f"it is not valid TOML ({e}), so none of it was read"], path)
    try:
        return Loaded(Config.from_toml_dict(data), [], path)
    except ConfigError:
        pass
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


def load_lenient(path: Path | None = None) -> Loaded:
    r"""Read the config, starting on the defaults for whatever cannot be read (never raises).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "config.toml"
    >>> _ = p.write_text('max_tokens = 64\n[model]\nctx_size = "big"\n', encoding="utf-8")
    >>> got = load_lenient(p)
    >>> got.config.max_tokens, got.config.model.ctx_size, got.damaged
    (64, 4096, True)
    >>> got.problems
    ["model.ctx_size = 'big': expected a whole number"]
    """
    path = path or paths.config_file()
    text, problems = _read_text(path)
    if problems:
        return Loaded(Config(), problems, path)
    if text is None:
        return Loaded(Config(), [], path)
    return _settings_of(text, path)


class _Gone:
    """A setting that a change removes from the file (its value became "not set")."""

    def __repr__(self) -> str:
        return "<gone>"


_GONE = _Gone()


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type (``1``, ``1.0`` and ``true`` are three different settings)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _changes(before: dict, after: dict) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, new value or :data:`_GONE`) of every setting that differs from ``before`` to
    ``after``; the ones set first, in ``after``'s order, then the ones gone.

    >>> _changes({"ui": {"theme": "dark", "x": 1}}, {"ui": {"theme": "light"}, "max_tokens": 9})
    [(('ui', 'theme'), 'light'), (('max_tokens',), 9), (('ui', 'x'), <gone>)]
    """
    old = dict(_leaves(before))
    new = dict(_leaves(after))
    out = [(key, value) for key, value in new.items() if key not in old or not _same(old[key], value)]
    return out + [(key, _GONE) for key in old if key not in new]


def _put(doc: Any, key: tuple[str, ...], value: Any) -> None:
    """Set (or, for :data:`_GONE`, remove) one setting in a tomlkit document, making its tables
    as needed; everything else in the document stays as it is."""
    table = doc
    for depth, part in enumerate(key[:-1]):
        if part not in table:
            if value is _GONE:
                return
            table[part] = _new_table(key[depth + 1:], value, among_tables=table is not doc)
            return
        table = table[part]
    if value is _GONE:
        if key[-1] in table:
            del table[key[-1]]
    else:
        table[key[-1]] = value


def _new_table(key: tuple[str, ...], value: Any, *, among_tables: bool) -> Any:
    """A new table holding ``value`` at ``key`` (tables within it as needed). One that goes among a
    table's own sub-tables ends with a blank line, as the tables around it do (tomlkit adds the
    blank line before a new top-level table itself)."""
    table = tomlkit.table()
    table[key[0]] = value if len(key) == 1 else _new_table(key[1:], value, among_tables=False)
    if among_tables:
        table.add(tomlkit.nl())
    return table


def _edited(text: str, changes: list[tuple[tuple[str, ...], Any]]) -> str:
    """config.toml's ``text`` with ``changes`` made, its comments, layout and other keys kept."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as e:
        raise ConfigError(f"it cannot be edited keeping its layout ({e})") from None
    for key, value in changes:
        _put(doc, key, value)
    out = tomlkit.dumps(doc)
    if out.endswith("\n\n") and not text.endswith("\n\n"):
        out = out.rstrip("\n") + "\n"     # a table added last ends the file as the file ended
    return out


def save(config: Config, path: Path | None = None, *, since: Config | None = None) -> Path:
    r"""Write ``config``'s settings to config.toml, changing nothing else in the file.

    Rules:

    * The file is read again now, and only the settings that differ from ``since`` to ``config`` are
      set (or removed, where ``config`` leaves them unset): ``since`` is what the file held when the
      caller last read or wrote it, so a change writes only its own keys. Comments, key order, keys
      this version does not know and settings edited in the file meanwhile (by the person, or another
      draftlight) stay as they are. Without ``since``: every setting where the file says otherwise
      (the file's settings become ``config``'s, its comments and unknown keys kept).
    * Nothing to change: the file is not touched.
    * A file with problems (:func:`load_lenient`'s ``damaged``) is never written over: raises
      :class:`ConfigError`, and so does a change that would make the file unreadable.
    * The new file replaces the old one at once (a temp file renamed over it), readable by its owner
      only (mode 0600). A symlinked config.toml stays a symlink: the file it points at is replaced.

    Returns the path written (``path``, the link where it is one).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "config.toml"
    >>> _ = p.write_text("# mine\nmax_tokens = 64 # short\nfuture = 1\n", encoding="utf-8")
    >>> c = load(p)
    >>> c.system_prompt = "Be brief."
    >>> _ = save(c, p, since=load(p))
    >>> print(p.read_text(encoding="utf-8"), end="")
    # mine
    max_tokens = 64 # short
    future = 1
    system_prompt = "Be brief."
    """
    path = path or paths.config_file()
    target = Path(os.path.realpath(path))
    text, problems = _read_text(target)
    on_disk = _settings_of(text, path) if text is not None else Loaded(Config(), problems, path)
    if on_disk.damaged:
        raise ConfigError(f"settings not saved: config.toml has problems ({path}): "
                          + "; ".join(on_disk.problems) + "; fix it in an editor")
    changes = _changes((since if since is not None else on_disk.config).to_toml_dict(), config.to_toml_dict())
    if not changes:
        return path
    new = _edited(text or "", changes)
    if _settings_of(new, path).damaged:
        raise ConfigError(f"settings not saved: the change would leave {path} unreadable")
    atomic_write_bytes(target, new.encode("utf-8"))
    return path


def load_for_command(no_config: bool) -> "Config":
    """A headless command's settings: config.toml's (a damaged file is said on stderr and left as it
    is: the defaults are used), or the defaults alone with ``--no-config``."""
    import sys
    if no_config:
        return Config()
    loaded = load_lenient()
    if loaded.damaged:
        print(f"draftlight: warning: {loaded.notice()}", file=sys.stderr)
    return loaded.config
