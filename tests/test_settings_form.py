"""The settings pane's logic without Textual (app/settings_form.py, speculators/param_kinds.py): how a
field's text is read and shown by its kind, what is wrong with a value, and the notes beside fields."""

from __future__ import annotations

import pytest

from app import settings_form as form
from speculators.param_kinds import KINDS
from speculators.params import SpecParams


@pytest.mark.parametrize("kind, text, value", [
    ("int", " 12 ", 12), ("float", "0.5", 0.5), ("ngl", "", -1), ("ngl", "auto", -1), ("ngl", "all", 999),
    ("ngl", "7", 7), ("optint", "", None), ("optint", "auto", None), ("optint", "4", 4),
    ("seed", "", 0xFFFFFFFF), ("seed", "random", 0xFFFFFFFF), ("seed", "42", 42),
    ("str", "  ", None), ("str", " a,b ", "a,b"), ("path", "", None)])
def test_a_field_is_read_by_its_kind(kind, text, value):
    assert form.parse_value(text, kind) == value


def test_a_path_field_expands_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert form.parse_value(" ~/d.gguf ", "path") == str(tmp_path / "d.gguf")


@pytest.mark.parametrize("kind, text, message", [
    ("int", "five", "expected a whole number"), ("ngl", "some", "expected a whole number"),
    ("float", "x", "expected a number"), ("float", "nan", "expected a finite number"),
    ("float", "inf", "expected a finite number"), ("seed", "x", "expected a whole number")])
def test_a_field_that_cannot_be_read_says_what_was_expected(kind, text, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        form.parse_value(text, kind)


@pytest.mark.parametrize("kind, value, text", [
    ("int", None, ""), ("int", 3, "3"), ("float", 0.0, "0"), ("float", 0.25, "0.25"), ("ngl", -1, "auto"),
    ("ngl", 999, "999"), ("seed", 0xFFFFFFFF, ""), ("seed", 5, "5"), ("path", "/m.gguf", "/m.gguf")])
def test_a_value_is_shown_by_its_kind(kind, value, text):
    assert form.format_value(value, kind) == text
    if text:
        assert form.format_value(form.parse_value(text, kind), kind) == text


def test_the_command_line_reads_a_value_as_the_field_does_except_where_it_must_be_given():
    assert KINDS["ngl"].from_flag("auto") == -1 and KINDS["ngl"].from_flag("all") == 999
    with pytest.raises(ValueError):
        KINDS["ngl"].from_flag("")                 # a flag needs a value; an empty field means auto
    assert KINDS["float"].from_flag("1e-3") == 0.001
    assert not KINDS["path"].reads_flag and not KINDS["str"].reads_flag   # as given (no ~ expansion)


def test_the_notes_beside_the_fields():
    assert form.field_hint("sampling.seed", "seed") == "empty: random"
    assert form.field_hint("sampling.top_k", "int") == "default 40"
    assert form.field_hint("chat.max_tokens", "int") == "default 1024"
    assert form.field_hint("model.threads", "optint") == "empty: physical cores"
    assert form.field_hint("draft.n_gpu_layers", "ngl") == "auto, all or a number (-ngld)"
    assert form.field_hint("draft.p_min", "float") == "default 0"
    assert form.field_hint("draft.model", "path") == "a GGUF with the target's vocabulary"


def test_what_is_wrong_with_a_value_beyond_the_parameters_checks(tmp_path):
    there = tmp_path / "m.gguf"
    there.write_bytes(b"GGUF")
    missing = str(tmp_path / "gone.gguf")
    assert form.field_error("model.ctx_size", "int", -1) == "must be >= 0"
    assert form.field_error("model.ctx_size", "int", 0) is None
    assert form.field_error("model.threads", "optint", 0) == "must be at least 1 (empty: automatic)"
    assert form.field_error("model.threads", "optint", None) is None
    assert form.field_error("model.n_gpu_layers", "ngl", -2) == "must be -1 (auto) or more"
    assert form.field_error("model.model", "path", missing) == "no such file"
    assert form.field_error("model.model", "path", str(there)) is None
    assert "expected HOST:PORT" in form.field_error("model.rpc", "str", "localhost")
    assert form.field_error("chat.max_tokens", "int", 0) == "must be at least 1"
    assert form.field_error("draft.model", "path", missing) == "no such file"
    assert form.field_error("ngram_cache.lookup_cache_static", "path", missing) == "no such file"
    assert form.field_error("ngram_cache.lookup_cache_dynamic", "path", missing) is None   # made as you chat
    assert form.field_error("sampling.temperature", "float", -1.0) is None      # validate() says that one


def test_every_out_of_range_value_is_found_at_once():
    spec = SpecParams()
    spec.draft.n_max, spec.ngram_mod.n_match = -1, 0
    sampling = form.default_sampling()
    sampling.top_p = 2.0
    errors = form.collect_errors(spec, sampling)
    assert set(errors) == {"draft.n_max", "ngram_mod.n_match", "sampling.top_p"}
    assert errors["draft.n_max"] == "must be >= 0"
