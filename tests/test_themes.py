"""Themes as data: the built-in ones, user themes, broken ones."""

from __future__ import annotations

import pytest

import themes
from speculators.types import PRIORITY


def test_three_builtin_themes_each_colour_every_speculator():
    t = themes.load_builtin()
    assert list(t)[:3] == ["dark", "light", "high-contrast"]
    assert t["dark"].dark and not t["light"].dark
    for theme in t.values():
        assert set(theme.draft) == {p.value for p in PRIORITY}, theme.name
        for key in ("primary", "background", "foreground"):
            assert key in theme.colors
        # the draft colours are distinct within a theme
        assert len({str(s) for s in theme.draft.values()}) == len(theme.draft)
    assert t["high-contrast"].draft["ngram-mod"].bg is not None


def test_user_themes_add_to_and_replace_builtins_and_fill_missing_types(tmp_path):
    (tmp_path / "mine.toml").write_text('name = "mine"\nlabel = "Mine"\n[colors]\nprimary = "#abc"\n'
                                        '[draft]\n"ngram-mod" = "bold #112233 on #445566"\n')
    (tmp_path / "light.toml").write_text('name = "light"\ndark = false\n[colors]\nprimary = "#000000"\n')
    all_, errors = themes.load_all(tmp_path)
    assert errors == []
    mine = all_["mine"]
    assert mine.colors["primary"] == "#aabbcc"
    d = mine.draft["ngram-mod"]
    assert (d.fg, d.bg, d.bold) == ("#112233", "#445566", True)
    assert mine.draft["ngram-simple"] == all_["dark"].draft["ngram-simple"]  # filled from dark
    assert all_["light"].source.endswith("light.toml")
    assert all_["light"].draft["ngram-mod"] == themes.load_builtin()["light"].draft["ngram-mod"]


@pytest.mark.parametrize("body, msg", [
    ('name = "x"\n[colors]\nprimary = "red"\n', "expected a colour"),
    ('name = "x"\n[draft]\n"ngram-nope" = "#fff"\n', "unknown speculator type"),
    ('name = "x"\n[colors]\nprimary = "#fff"\nmauve = "#fff"\n', "unknown colour"),
    ('name = "bad name!"\n', "'name'"),
    ('name = "x"\n[draft]\n"ngram-mod" = "#fff on"\n', "followed by a colour"),
    ('this is not toml', "broken.toml"),
])
def test_a_broken_user_theme_is_reported_not_fatal(tmp_path, body, msg):
    (tmp_path / "broken.toml").write_text(body)
    (tmp_path / "fine.toml").write_text('name = "fine"\n[colors]\nprimary = "#123456"\n')
    all_, errors = themes.load_all(tmp_path)
    assert "fine" in all_ and "x" not in all_
    assert len(errors) == 1 and msg in errors[0] and "broken.toml" in errors[0]


def test_no_user_dir_is_fine(tmp_path):
    all_, errors = themes.load_all(tmp_path / "missing")
    assert list(all_) == ["dark", "light", "high-contrast"] and errors == []


# -- speculator colours must be told apart ---------------------------------
#
# A token's colour says which speculator drafted it, so every pair of draft
# colours in a built-in theme must differ clearly: in truecolor and after a
# 256-colour terminal has rounded them to the xterm palette the way Textual
# does (Strip.render_ansi -> rich Color.downgrade(EIGHT_BIT)). Thresholds:
#  * CIEDE2000 >= 15 between any two draft colours (the dark theme's old
#    ngram-mod/ngram-cache ambers, reported as indistinguishable, were 13.3
#    apart; ~2 is just noticeable for large patches, small glyphs need far more);
#  * distinct 256-palette indices;
#  * WCAG contrast >= 3 for the token's text on what it is drawn on (the
#    theme's background, surface and panel, or the style's own `on` colour);
#  * CIEDE2000 >= 10 from the theme's foreground, so a coloured token never
#    passes for plain text.

MIN_DE_PAIR = 15.0
MIN_DE_TEXT = 15.0
MIN_CONTRAST = 3.0
BACKGROUNDS = ("background", "surface", "panel")


def _reduce(hexcol: str, mode: str):
    """(rgb, 256-index or None) of a colour as the terminal shows it."""
    from rich.color import Color, ColorSystem

    if mode == "truecolor":
        return themes.hex_to_rgb(hexcol), None
    c = Color.parse(hexcol).downgrade(ColorSystem.EIGHT_BIT)
    t = c.get_truecolor()
    return (t.red, t.green, t.blue), c.number


def _marker(style):
    """The colour that tells the type apart: the block colour, else the text colour."""
    return style.bg or style.fg


BUILTIN = themes.load_builtin()


def test_textual_reduces_colours_for_256_colour_terminals_the_way_this_test_does():
    from rich.color import ColorSystem
    from rich.style import Style

    from textual.strip import Strip

    for theme in BUILTIN.values():
        for name, st in theme.draft.items():
            codes = Strip.render_ansi(Style.parse(str(st)), ColorSystem.EIGHT_BIT).split(";")
            sent = {codes[i]: int(codes[i + 2]) for i in range(len(codes) - 2) if codes[i] in ("38", "48")
                    and codes[i + 1] == "5"}
            assert sent["38"] == _reduce(st.fg, "256")[1], (theme.name, name, codes)
            if st.bg:
                assert sent["48"] == _reduce(st.bg, "256")[1], (theme.name, name, codes)


@pytest.mark.parametrize("pair, expected", [
    # Sharma, Wu & Dalal (2005), test data for CIEDE2000
    (((50, 2.6772, -79.7751), (50, 0, -82.7485)), 2.0425),
    (((50, -1.3802, -84.2814), (50, 0, -82.7485)), 1.0000),
    (((50, 0, 0), (50, -1, 2)), 2.3669),
    (((50, 2.49, -0.001), (50, -2.49, 0.0011)), 7.2195),
    (((50, 2.5, 0), (73, 25, -18)), 27.1492),
    (((50, 2.5, 0), (50, 3.1736, 0.5854)), 1.0000),
    (((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387)), 1.2644),
    (((22.7233, 20.0904, -46.694), (23.0331, 14.973, -42.5619)), 2.0373),
    (((90.9257, -0.5406, -0.9208), (88.6381, -0.8985, -0.7239)), 1.5381),
    (((6.7747, -0.2908, -2.4247), (5.8714, -0.0985, -2.2286)), 0.6377),
    (((90.8027, -2.0831, 1.4410), (91.1528, -1.6435, 0.0447)), 1.4441),
    (((2.0776, 0.0795, -1.1350), (0.9033, -0.0636, -0.5514)), 0.9082),
])
def test_delta_e2000_matches_the_published_test_data(pair, expected):
    assert themes.delta_e2000(*pair) == pytest.approx(expected, abs=1e-4)
    assert themes.delta_e2000(*reversed(pair)) == pytest.approx(expected, abs=1e-4)


def test_lab_and_contrast_of_known_colours():
    assert themes.rgb_to_lab((255, 255, 255)) == pytest.approx((100, 0, 0), abs=1e-3)
    assert themes.rgb_to_lab((255, 0, 0)) == pytest.approx((53.24, 80.09, 67.20), abs=0.02)
    assert themes.contrast_ratio((0, 0, 0), (255, 255, 255)) == pytest.approx(21)
    assert themes.contrast_ratio((0x76, 0x76, 0x76), (255, 255, 255)) == pytest.approx(4.54, abs=0.01)


def _measure(theme, mode):
    """Smallest pairwise CIEDE2000, the 256 indices, and every contrast/foreground check."""
    import itertools

    marks = {n: _reduce(_marker(s), mode) for n, s in theme.draft.items()}
    pairs = {(a, b): themes.delta_e2000(themes.rgb_to_lab(marks[a][0]), themes.rgb_to_lab(marks[b][0]))
             for a, b in itertools.combinations(sorted(marks), 2)}
    return marks, pairs


@pytest.mark.parametrize("mode", ["truecolor", "256"])
@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_pair_of_speculator_colours_can_be_told_apart(name, mode):
    theme = BUILTIN[name]
    assert set(theme.draft) == set(themes.SPEC_NAMES)
    marks, pairs = _measure(theme, mode)
    close = {p: round(d, 1) for p, d in pairs.items() if d < MIN_DE_PAIR}
    assert not close, f"{name} ({mode}): draft colours too close (CIEDE2000): {close}"
    if mode == "256":
        assert len({idx for _, idx in marks.values()}) == len(marks), f"{name}: two types share a 256-colour cell"


@pytest.mark.parametrize("mode", ["truecolor", "256"])
@pytest.mark.parametrize("name", list(BUILTIN))
def test_speculator_colours_are_readable_and_unlike_plain_text(name, mode):
    theme = BUILTIN[name]
    grounds = {k: _reduce(theme.colors[k], mode)[0] for k in BACKGROUNDS if k in theme.colors}
    assert "background" in grounds
    text = themes.rgb_to_lab(_reduce(theme.colors["foreground"], mode)[0])
    for spec, st in theme.draft.items():
        fg = _reduce(st.fg or theme.colors["foreground"], mode)[0]
        if st.bg:
            block = _reduce(st.bg, mode)[0]
            assert themes.contrast_ratio(fg, block) >= MIN_CONTRAST, (name, spec)
            # the block itself stands out from the theme's background
            assert themes.contrast_ratio(block, grounds["background"]) >= MIN_CONTRAST, (name, spec)
        else:
            for k, ground in grounds.items():
                ratio = themes.contrast_ratio(fg, ground)
                assert ratio >= MIN_CONTRAST, f"{name} ({mode}): {spec} on {k}: contrast {ratio:.2f}"
            de = themes.delta_e2000(themes.rgb_to_lab(fg), text)
            assert de >= MIN_DE_TEXT, f"{name} ({mode}): {spec} looks like plain text (CIEDE2000 {de:.1f})"


def test_a_user_theme_is_measured_the_same_way(tmp_path):
    """The measure catches the defect that was reported (two near-identical ambers)."""
    (tmp_path / "ambers.toml").write_text('name = "ambers"\n[colors]\nprimary = "#7aa2f7"\n'
                                          '[draft]\n"ngram-mod" = "#e0af68"\n"ngram-cache" = "#ff9e64"\n')
    all_, errors = themes.load_all(tmp_path)
    assert errors == []
    _, pairs = _measure(all_["ambers"], "truecolor")
    assert pairs[("ngram-cache", "ngram-mod")] < MIN_DE_PAIR
    # the types it leaves out come from the built-in dark theme, unchanged
    assert all_["ambers"].draft["draft-mtp"] == BUILTIN["dark"].draft["draft-mtp"]
