"""Parameter kinds and the one declaration of a speculator parameter.

A :class:`Kind` knows how one kind of value is read from the command line
(:meth:`Kind.from_flag`), read from a settings field (:meth:`Kind.parse`),
shown in one (:meth:`Kind.format`) and described by its default
(:meth:`Kind.hint`). :data:`KINDS` is the registry of kinds by name
(``int``, ``float``, ``ngl``, ``path``, ``str``, ``optint``, ``seed``):
the name is what a :class:`Flag` or :class:`Setting` carries.

A :class:`Param` declares one speculator parameter once: its key
(``"section.name"`` of :class:`~speculators.params.SpecParams`), its kind,
its settings-pane label and its command-line flags. Its default is read from
the params dataclass, never written into its help; the descriptor derives
its :class:`Flag` and :class:`Setting` from it (a field with no hint of its
own says what its kind says of the default, read when the pane shows it)::

    >>> from speculators.params import NgramModParams
    >>> p = Param("ngram_mod.n_match", "match length", INT, flags=("--spec-ngram-mod-n-match",),
    ...           help="ngram-mod lookup length")
    >>> p.flag(NgramModParams()).help, p.flag(NgramModParams()).dest
    ('ngram-mod lookup length (default 24)', 'spec_ngram_mod_n_match')
    >>> p.setting(NgramModParams())
    Setting(key='ngram_mod.n_match', label='match length', kind='int', hint=None)
    >>> INT.hint(NgramModParams().n_match)
    'default 24'

This module imports nothing of draftlight's: the descriptor, the app's
flag map and the settings form import it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple


class Flag(NamedTuple):
    """A command-line flag that sets one parameter (``target``: ``"section.name"`` of SpecParams).

    ``kind``: the name of its :class:`Kind` in :data:`KINDS` (how the value is read).
    """

    names: tuple[str, ...]
    dest: str
    target: str
    kind: str
    help: str
    metavar: str | None = None


class Setting(NamedTuple):
    """A settings-pane field: ``key`` (``"section.name"``), its label, its kind's name in
    :data:`KINDS` and its hint (None: what the kind says of the default value)."""

    key: str
    label: str
    kind: str
    hint: str | None = None


class Kind:
    """How one kind of value is read, shown and described (see the module docstring).

    :meth:`parse` and :meth:`from_flag` raise :class:`ValueError` with a short
    message ("expected a whole number") when the text is not one.
    """

    #: the name flags and settings carry (a key of :data:`KINDS`)
    name: str = "str"
    #: a settings field of this kind is a wide one (paths and free text)
    wide: bool = False

    def parse(self, text: str) -> Any:
        """The value of a settings field's text (None: empty)."""
        return text.strip() or None

    def from_flag(self, text: str) -> Any:
        """The value of a command-line argument (as given, unless the kind reads it)."""
        return text

    #: whether :meth:`from_flag` reads the argument (False: argparse keeps the text as given)
    reads_flag: bool = False

    def format(self, value: Any) -> str:
        """How a value shows in a settings field (None: empty)."""
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    def hint(self, default: Any) -> str:
        """The note beside a field that has no hint of its own."""
        return f"default {self.format(default)}"


class IntKind(Kind):
    name = "int"
    reads_flag = True

    def parse(self, text: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError("expected a whole number") from None

    def from_flag(self, text: str) -> int:
        return self.parse(text)


class FloatKind(Kind):
    name = "float"
    reads_flag = True

    def from_flag(self, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number") from None

    def parse(self, text: str) -> float:
        v = self.from_flag(text.strip())
        if not math.isfinite(v):
            raise ValueError("expected a finite number")
        return v


class NglKind(IntKind):
    """GPU layers: a number, ``auto`` (-1) or ``all`` (999); an empty field is ``auto``."""

    name = "ngl"

    def from_flag(self, text: str) -> int:
        if text in ("all", "auto"):
            return -1 if text == "auto" else 999
        return super().parse(text)

    def parse(self, text: str) -> int:
        t = text.strip()
        return -1 if t == "" else self.from_flag(t)

    def format(self, value: Any) -> str:
        return "auto" if value == -1 else super().format(value)


class OptIntKind(IntKind):
    """A whole number or nothing (empty or ``auto``: None)."""

    name = "optint"

    def parse(self, text: str) -> int | None:
        t = text.strip()
        return None if t in ("", "auto") else super().parse(t)


class SeedKind(IntKind):
    """The sampling seed: empty or ``random`` is 0xFFFFFFFF (llama.cpp's random seed)."""

    name = "seed"
    RANDOM = 0xFFFFFFFF

    def parse(self, text: str) -> int:
        t = text.strip()
        return self.RANDOM if t in ("", "random") else super().parse(t)

    def format(self, value: Any) -> str:
        return "" if value == self.RANDOM else super().format(value)

    def hint(self, default: Any) -> str:
        return "empty: random"


class PathKind(Kind):
    """A file path (``~`` expanded in a settings field); empty: None."""

    name = "path"
    wide = True

    def parse(self, text: str) -> str | None:
        t = text.strip()
        return os.path.expanduser(t) if t else None

    def hint(self, default: Any) -> str:
        return "optional"


class StrKind(Kind):
    """Free text; empty: None."""

    name = "str"
    wide = True


INT, FLOAT, NGL, OPTINT, SEED, PATH, STR = (IntKind(), FloatKind(), NglKind(), OptIntKind(), SeedKind(),
                                            PathKind(), StrKind())
#: every kind by its name
KINDS: dict[str, Kind] = {k.name: k for k in (INT, FLOAT, NGL, OPTINT, SEED, PATH, STR)}


@dataclass(frozen=True)
class Param:
    """One speculator parameter, declared once; its flag and its settings field derive from it.

    ``default_text``: what the flag's help says of the default where the
    value itself says nothing (``"target's"`` for 0); ``""``: the help says
    no default. ``default_note``: said after the default value
    (``"4 under auto"``).
    """

    #: ``"section.name"`` of SpecParams
    key: str
    #: the settings pane's label (None: no field in the pane)
    label: str | None
    kind: Kind
    #: its command-line names (empty: no flag)
    flags: tuple[str, ...] = ()
    #: what the flag sets, without its default
    help: str = ""
    #: argparse's dest (None: ``spec_<section>_<name>``)
    dest: str | None = None
    metavar: str | None = None
    #: the settings field's note (None: what the kind says of the default)
    hint: str | None = None
    default_text: str | None = None
    default_note: str | None = None

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def attr(self) -> str:
        return self.key.split(".", 1)[1]

    def default(self, section_defaults: Any) -> Any:
        """Its default: the attribute of the section's defaults (an instance of its dataclass)."""
        return getattr(section_defaults, self.attr)

    def _default_said(self, section_defaults: Any) -> str | None:
        value = self.default(section_defaults)
        if value is None:
            return None
        said = self.kind.format(value)
        return f"{said}; {self.default_note}" if self.default_note else said

    def flag(self, section_defaults: Any) -> Flag | None:
        """Its command-line flag (None: it has none)."""
        if not self.flags:
            return None
        if self.default_text is not None:
            help = f"{self.help} (default: {self.default_text})" if self.default_text else self.help
        else:
            said = self._default_said(section_defaults)
            help = f"{self.help} (default {said})" if said is not None else self.help
        return Flag(self.flags, self.dest or f"spec_{self.section}_{self.attr}", self.key, self.kind.name,
                    help, self.metavar)

    def setting(self, section_defaults: Any) -> Setting | None:
        """Its settings-pane field (None: it has none)."""
        if self.label is None:
            return None
        hint = self.hint
        if hint is None and self.default_note:
            hint = f"default {self._default_said(section_defaults)}"
        return Setting(self.key, self.label, self.kind.name, hint)


def derive(params: tuple[Param, ...], section_defaults: Callable[[str], Any]) -> tuple[tuple[Flag, ...],
                                                                                     tuple[Setting, ...]]:
    """The flags and the settings fields of ``params``; ``section_defaults(section)``: an instance of
    the section's dataclass with its defaults."""
    flags: list[Flag] = []
    fields: list[Setting] = []
    for p in params:
        defaults = section_defaults(p.section)
        f, s = p.flag(defaults), p.setting(defaults)
        if f is not None:
            flags.append(f)
        if s is not None:
            fields.append(s)
    return tuple(flags), tuple(fields)
