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
