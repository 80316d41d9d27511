"""The reply's text layout without Textual: word wrap in terminal cells (app.ui.wrapping) and the
alignment of rendered Markdown to its source (app.ui.alignment)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st
from rich.cells import cell_len

from app.ui.alignment import align_offsets
from app.ui.wrapping import wrap_lines

ROOT = Path(__file__).resolve().parent.parent


def lines_of(text: str, width: int) -> list[str]:
    return [text[a:b] for a, b in wrap_lines(text, 0, width)]


def test_words_wrap_at_spaces_and_a_word_longer_than_the_line_is_cut():
    # (a line keeps the space it broke after where that fits; spaces past the width are dropped)
    assert lines_of("the quick brown fox", 10) == ["the quick ", "brown fox"]
    assert lines_of("the quick  brown", 9) == ["the quick", "brown"]
    assert lines_of("abcdefghij klm", 4) == ["abcd", "efgh", "ij ", "klm"]
    # a line break ends a line, an empty line is a line, a text that ends with one has an empty last line
    assert lines_of("one\n\ntwo\n", 10) == ["one", "", "two", ""]


def test_wide_characters_take_two_cells():
    lines = lines_of("日本語のテキスト", 6)
    assert lines == ["日本語", "のテキ", "スト"]
    assert all(cell_len(line) <= 6 for line in lines)


texts = st.text(alphabet=st.sampled_from("ab  \n日é"), max_size=60)


@settings(max_examples=200, deadline=None)
@given(texts, st.integers(1, 12), st.integers(0, 60))
def test_appended_text_rewraps_from_the_last_line_only(text, width, cut):
    """What ReplyBody relies on: the lines before the last never change as the text grows, so
    wrapping the whole text and wrapping anew from the start of the old last line agree."""
    head = text[:cut]
    before = wrap_lines(head, 0, width)
    whole = wrap_lines(text, 0, width)
    assert whole[:len(before) - 1] == before[:-1]
    assert before[:-1] + wrap_lines(text, before[-1][0], width) == whole


@settings(max_examples=200, deadline=None)
@given(texts, st.integers(2, 12))
def test_lines_fit_their_width_and_keep_every_non_space_character_in_order(text, width):
    spans = wrap_lines(text, 0, width)
    assert all(cell_len(text[a:b]) <= width for a, b in spans)
    assert all(b0 <= a1 for (_, b0), (a1, _) in zip(spans, spans[1:]))
    kept = "".join(text[a:b] for a, b in spans).replace(" ", "")
    assert kept == text.replace(" ", "").replace("\n", "")


def test_markdown_alignment_skips_markup_and_gives_none_where_nothing_matches():
    src = "- **bold** item"
    shown = "• bold item"
    offs = align_offsets(shown, src)
    assert offs[0] is None                       # the bullet has no character in the source
    assert src[offs[2]:offs[2] + 4] == "bold" and offs[1] is not None
    assert align_offsets("abc", "abc") == [0, 1, 2]
    # matching searches only a window ahead of the last match
    assert align_offsets("ab", "a" + "x" * 10 + "b", window=5) == [0, None]


def test_the_text_layout_helpers_import_without_textual():
    code = ("import sys; sys.path.insert(0, %r)\n"
            "class Blocker:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'textual':\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, Blocker())\n"
            "import app.ui.wrapping, app.ui.alignment, app.ui.actions, app.ui.wording\n"
            "print('textual' in sys.modules)") % str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
