"""Themes as data: the built-in ``*.toml`` files beside this module, plus user themes.

A theme file names the interface colours and one style per speculator
type, used to colour the tokens that type drafted and the model accepted::

    name = "dark"            # what config.toml's ui.theme refers to
    label = "Dark"           # shown in the command palette
    dark = true

    [colors]                 # the app's palette (#rgb or #rrggbb)
    primary = "#7aa2f7"
    background = "#1a1b26"
    ...

    [draft]                  # "FG", "FG on BG", plus bold/italic/underline
    "ngram-mod" = "#e0af68"
    "ngram-simple" = "bold #000000 on #00ffff"

The ``[draft]`` keys are the speculator types' theme slots (each type's
descriptor names its slot, by default its name: :mod:`speculators.descriptor`);
adding a type adds its colour to each theme file. A type a theme has no
colour for takes its descriptor's ``color``, else the theme's accent colour.

User themes live in ``paths.user_themes_dir()`` (``<config dir>/themes``).
A broken user theme is reported (see :func:`load_all`) and skipped; a
type missing from a user theme takes the colour of the built-in theme of
the same darkness. This module does not import Textual.

Speculator colours must stay told apart at a glance, also once a 256-colour
terminal has rounded them to the xterm palette: :func:`delta_e2000` (CIEDE2000
colour difference in CIELAB) and :func:`contrast_ratio` (WCAG) measure that;
the built-in themes are tested with them (tests/test_themes.py).

>>> t = parse_theme({"name": "x", "colors": {"primary": "#123"}, "draft": {"ngram-mod": "#ff0"}})
>>> t.draft["ngram-mod"].fg
'#ffff00'
>>> parse_draft_style("bold #000 on #0ff").bg
'#00ffff'
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from speculators import descriptor as _descriptor

BUILTIN_DIR = Path(__file__).resolve().parent
BUILTIN_ORDER = ("dark", "light", "high-contrast")
DEFAULT_THEME = "dark"

COLOR_KEYS = ("primary", "secondary", "accent", "foreground", "background", "surface", "panel",
              "boost", "success", "warning", "error")


def __getattr__(name: str) -> Any:
    # SPEC_NAMES: the speculator types' names in priority order, SPEC_SLOTS: their theme slots
    # (what a theme's [draft] names); both live, as the declared types are
    if name == "SPEC_NAMES":
        return tuple(d.name for d in _descriptor.descriptors())
    if name == "SPEC_SLOTS":
        return spec_slots()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec_slots() -> tuple[str, ...]:
    """The theme slots of the declared types, in priority order (the keys a theme's ``[draft]`` may have)."""
    return tuple(dict.fromkeys(d.slot for d in _descriptor.descriptors()))

_HEX = re.compile(r"^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ThemeError(ValueError):
    """A theme file is malformed (the message says where)."""


@dataclass(frozen=True)
class DraftStyle:
    fg: str | None = None
    bg: str | None = None
    bold: bool = False
    italic: bool = False
    underline: bool = False

    def __str__(self) -> str:
        words = [w for w, on in (("bold", self.bold), ("italic", self.italic),
                                  ("underline", self.underline)) if on]
        if self.fg:
            words.append(self.fg)
        if self.bg:
            words += ["on", self.bg]
        return " ".join(words)


@dataclass
class ThemeData:
    name: str
    label: str
    dark: bool = True
    colors: dict[str, str] = field(default_factory=dict)
    draft: dict[str, DraftStyle] = field(default_factory=dict)
    source: str = "built-in"

    def draft_style(self, spec_type: str) -> DraftStyle:
        """The style of the tokens ``spec_type`` drafted: the theme's for its slot, else its
        descriptor's colour, else the theme's accent colour."""
        d = _descriptor.find(spec_type)
        style = self.draft.get(d.slot if d is not None else str(spec_type))
        if style is not None:
            return style
        if d is not None and d.color:
            return DraftStyle(fg=d.color)
        return DraftStyle(fg=self.colors.get("accent") or "#ffaf00")


def _norm_hex(value: str, where: str) -> str:
    if not isinstance(value, str) or not _HEX.match(value.strip()):
        raise ThemeError(f"{where}: expected a colour like #rrggbb, got {value!r}")
    v = value.strip().lower()
    if len(v) == 4:
        v = "#" + "".join(c * 2 for c in v[1:])
    return v


def parse_draft_style(text: str, where: str = "draft") -> DraftStyle:
    """Parse ``"[bold] [italic] [underline] [FG] [on BG]"``."""
    if not isinstance(text, str) or not text.strip():
        raise ThemeError(f"{where}: expected a style string such as '#e0af68' or 'bold #000 on #ff0'")
    fg = bg = None
    flags = {"bold": False, "italic": False, "underline": False}
    words = text.split()
    i = 0
    while i < len(words):
        w = words[i].lower()
        if w in flags:
            flags[w] = True
        elif w == "on":
            if i + 1 >= len(words):
                raise ThemeError(f"{where}: 'on' must be followed by a colour")
            bg = _norm_hex(words[i + 1], where)
            i += 1
        else:
            if fg is not None:
                raise ThemeError(f"{where}: unexpected {words[i]!r}")
            fg = _norm_hex(words[i], where)
        i += 1
    return DraftStyle(fg=fg, bg=bg, **flags)


def parse_theme(data: dict[str, Any], source: str = "built-in",
                fallback: "ThemeData | None" = None) -> ThemeData:
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ThemeError("'name' must be a short name made of letters, digits, '-', '_' or '.'")
    label = data.get("label", name.replace("-", " ").title())
    if not isinstance(label, str):
        raise ThemeError("'label' must be text")
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeError("'dark' must be true or false")
    colors_in = data.get("colors", {})
    if not isinstance(colors_in, dict):
        raise ThemeError("[colors] must be a table")
    colors: dict[str, str] = {}
    for k, v in colors_in.items():
        if k not in COLOR_KEYS:
            raise ThemeError(f"colors.{k}: unknown colour (known: {', '.join(COLOR_KEYS)})")
        colors[k] = _norm_hex(v, f"colors.{k}")
    if "primary" not in colors:
        if fallback is not None and "primary" in fallback.colors:
            colors["primary"] = fallback.colors["primary"]
        else:
            raise ThemeError("colors.primary is required")
    draft_in = data.get("draft", {})
    if not isinstance(draft_in, dict):
        raise ThemeError("[draft] must be a table")
    draft: dict[str, DraftStyle] = {}
    slots = spec_slots()
    for k, v in draft_in.items():
        if k not in slots:
            raise ThemeError(f"draft.{k}: unknown speculator type (known: {', '.join(slots)})")
        draft[k] = parse_draft_style(v, f"draft.{k}")
    if fallback is not None:
        for k in slots:
            if k not in draft and k in fallback.draft:
                draft[k] = fallback.draft[k]
    return ThemeData(name=name, label=label, dark=dark, colors=colors, draft=draft, source=source)


def load_file(path: Path, fallbacks: dict[str, ThemeData] | None = None) -> ThemeData:
    """Read one theme file; raises :class:`ThemeError` naming the file."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ThemeError(f"{path}: {e}") from None
    fb = None
    if fallbacks:
        fb = fallbacks.get("dark" if data.get("dark", True) is not False else "light")
    try:
        return parse_theme(data, source=str(path), fallback=fb)
    except ThemeError as e:
        raise ThemeError(f"{path}: {e}") from None


def load_builtin() -> dict[str, ThemeData]:
    """The built-in themes, in their fixed order (dark, light, high-contrast, ...)."""
    found = {}
    for p in sorted(BUILTIN_DIR.glob("*.toml")):
        t = load_file(p)
        t.source = "built-in"
        found[t.name] = t
    ordered = {n: found.pop(n) for n in BUILTIN_ORDER if n in found}
    ordered.update(found)
    return ordered


def load_user(directory: Path, builtin: dict[str, ThemeData] | None = None
              ) -> tuple[dict[str, ThemeData], list[str]]:
    """User themes from ``directory``: (themes by name, error messages)."""
    themes: dict[str, ThemeData] = {}
    errors: list[str] = []
    try:
        files = sorted(Path(directory).glob("*.toml"))
    except OSError as e:  # pragma: no cover - unreadable dir
        return themes, [f"{directory}: {e}"]
    for p in files:
        try:
            t = load_file(p, builtin)
        except ThemeError as e:
            errors.append(str(e))
            continue
        t.source = str(p)
        themes[t.name] = t
    return themes, errors


def load_all(user_dir: Path | None) -> tuple[dict[str, ThemeData], list[str]]:
    """Built-in themes then user themes (a user theme may replace a built-in one)."""
    builtin = load_builtin()
    themes = dict(builtin)
    errors: list[str] = []
    if user_dir is not None and Path(user_dir).is_dir():
        user, errors = load_user(user_dir, builtin)
        themes.update(user)
    return themes, errors


# -- colour measures -------------------------------------------------------

def hex_to_rgb(value: str) -> tuple[int, int, int]:
    """``"#rgb"`` or ``"#rrggbb"`` as an (r, g, b) triplet of 0..255."""
    v = _norm_hex(value, "colour")
    return int(v[1:3], 16), int(v[3:5], 16), int(v[5:7], 16)


def _linear(c: int) -> float:
    x = c / 255
    return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4


def relative_luminance(rgb: tuple[int, int, int]) -> float:
    r, g, b = (_linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """WCAG 2 contrast ratio of two sRGB colours, 1 (same) .. 21 (black on white).

    >>> round(contrast_ratio((0, 0, 0), (255, 255, 255)), 1)
    21.0
    """
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def rgb_to_lab(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """sRGB (D65) to CIELAB (D65 white)."""
    r, g, b = (_linear(c) for c in rgb)
    x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047
    y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b
    z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """CIEDE2000 colour difference (Sharma, Wu & Dalal 2005); about 1 is just noticeable.

    >>> round(delta_e2000((50, 2.6772, -79.7751), (50, 0, -82.7485)), 4)
    2.0425
    """
    l1, a1, b1 = lab1
    l2, a2, b2 = lab2
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean ** 7 / (c_mean ** 7 + 25 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dl = l2 - l1
    dc = c2p - c1p
    if c1p * c2p == 0:
        dh = 0.0
    else:
        dh = h2p - h1p
        if dh > 180:
            dh -= 360
        elif dh < -180:
            dh += 360
    dhh = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    l_mean = (l1 + l2) / 2
    cp_mean = (c1p + c2p) / 2
    if c1p * c2p == 0:
        hp_mean = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        hp_mean = (h1p + h2p) / 2
    elif h1p + h2p < 360:
        hp_mean = (h1p + h2p + 360) / 2
    else:
        hp_mean = (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hp_mean - 30)) + 0.24 * math.cos(math.radians(2 * hp_mean))
         + 0.32 * math.cos(math.radians(3 * hp_mean + 6)) - 0.20 * math.cos(math.radians(4 * hp_mean - 63)))
    d_theta = 30 * math.exp(-(((hp_mean - 275) / 25) ** 2))
    r_c = 2 * math.sqrt(cp_mean ** 7 / (cp_mean ** 7 + 25 ** 7))
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c = 1 + 0.045 * cp_mean
    s_h = 1 + 0.015 * cp_mean * t
    r_t = -math.sin(math.radians(2 * d_theta)) * r_c
    return math.sqrt((dl / s_l) ** 2 + (dc / s_c) ** 2 + (dhh / s_h) ** 2 + r_t * (dc / s_c) * (dhh / s_h))
