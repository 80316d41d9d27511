"""config.toml pinned down where mutation testing found it loose (tools/mutation.py).

``tests/test_config_roundtrip.py`` and ``tests/test_config_damage.py`` check that every setting
round-trips and that a damaged file is kept and named. Here, byte for byte: where the app's write
puts a new table and how the file then ends (a blank line between tables, none added at the end
of a file that had none, one kept at the end of a file that had one), a setting three tables deep
removed, a save without ``since`` onto a missing file, a save onto a config.toml that cannot be
read, and the messages of ``load`` and of a headless command's warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app import config as config_mod
from app import paths
from app.config import Config, ConfigError


def edited(tmp_path: Path, text: str, change) -> str:
    """config.toml's text after the app saves ``change`` (made on the settings it read)."""
    p = tmp_path / "config.toml"
    p.write_text(text, encoding="utf-8")
    since = config_mod.load(p)
    cfg = since.copy()
    change(cfg)
    config_mod.save(cfg, p, since=since)
    return p.read_text(encoding="utf-8")


def draft_n_max(cfg: Config) -> None:
    cfg.spec.draft.n_max = 7


def test_a_new_table_among_a_tables_own_tables_is_set_apart_by_a_blank_line(tmp_path):
    text = '[speculation]\ntypes = ["ngram-mod"]\n\n[ui]\ntheme = "dark"\n'
    assert edited(tmp_path, text, draft_n_max) == (
        '[speculation]\ntypes = ["ngram-mod"]\n\n[speculation.draft]\nn_max = 7\n\n[ui]\ntheme = "dark"\n')


def test_a_table_added_last_ends_the_file_as_the_file_ended(tmp_path):
    # the file ended with one newline: so does the new one
    assert edited(tmp_path, '[speculation]\ntypes = ["ngram-mod"]\n', draft_n_max) == (
        '[speculation]\ntypes = ["ngram-mod"]\n\n[speculation.draft]\nn_max = 7\n')
    # it ended with a blank line: kept
    assert edited(tmp_path, '[speculation]\ntypes = ["ngram-mod"]\n\n', draft_n_max) == (
        '[speculation]\ntypes = ["ngram-mod"]\n\n[speculation.draft]\nn_max = 7\n\n')
    # a table made with the table it is in adds no blank line of its own
    assert edited(tmp_path, "max_tokens = 5\n\n", draft_n_max) == (
        "max_tokens = 5\n\n[speculation.draft]\nn_max = 7\n")


def test_a_setting_three_tables_deep_is_removed_and_its_neighbours_kept(tmp_path):
    def no_draft_model(cfg: Config) -> None:
        cfg.spec.draft.model = None
    text = '[speculation.draft]\nmodel = "/m/d.gguf"\nn_max = 7\n'
    assert edited(tmp_path, text, no_draft_model) == "[speculation.draft]\nn_max = 7\n"


def test_a_save_without_since_onto_a_missing_file_writes_what_differs_from_the_defaults(tmp_path):
    p = tmp_path / "config.toml"
    cfg = Config()
    cfg.max_tokens = 64
    assert config_mod.save(cfg, p) == p
    assert p.read_text(encoding="utf-8") == "max_tokens = 64\n"


def test_a_config_that_cannot_be_read_is_not_written_over(tmp_path):
    p = tmp_path / "config.toml"
    p.mkdir()                                     # read_bytes() fails: IsADirectoryError
    cfg = Config()
    cfg.max_tokens = 64
    with pytest.raises(ConfigError) as e:
        config_mod.save(cfg, p)
    assert str(e.value) == (f"settings not saved: config.toml has problems ({p}): it cannot be read "
                            f"(Is a directory); fix it in an editor")
    assert p.is_dir() and list(p.iterdir()) == []


def test_a_text_tomlkit_cannot_parse_is_not_edited():
    with pytest.raises(ConfigError) as e:
        config_mod._edited("x = [1,\n", [(("max_tokens",), 5)])
    assert str(e.value).startswith("it cannot be edited keeping its layout (")


def test_load_names_the_file_and_every_problem(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text('max_tokens = "many"\n[model]\nctx_size = "big"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        config_mod.load(p)
    assert str(e.value) == (f"{p}: max_tokens = 'many': expected a whole number; "
                            f"model.ctx_size = 'big': expected a whole number")


def test_a_headless_command_warns_once_and_uses_what_could_be_read(capsys):
    p = paths.config_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('max_tokens = 64\n[model]\nctx_size = "big"\n', encoding="utf-8")
    cfg = config_mod.load_for_command(no_config=False)
    assert (cfg.max_tokens, cfg.model.ctx_size) == (64, 4096)
    err = capsys.readouterr().err
    assert err == f"draftlight: warning: {config_mod.load_lenient().notice()}\n"
    assert err.startswith(f"draftlight: warning: config.toml has problems ({p}): model.ctx_size = 'big': ")
    assert config_mod.load_for_command(no_config=True).to_toml_dict() == Config().to_toml_dict()
    assert capsys.readouterr().err == ""


def test_a_change_that_would_leave_the_file_unreadable_is_not_written(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text("max_tokens = 64\n", encoding="utf-8")
    since = config_mod.load(p)
    cfg = since.copy()
    cfg.overflow = "sideways"
    with pytest.raises(ConfigError) as e:
        config_mod.save(cfg, p, since=since)
    assert str(e.value) == f"settings not saved: the change would leave {p} unreadable"
    assert p.read_text(encoding="utf-8") == "max_tokens = 64\n"


TWO_BAD = 'max_tokens = "many"\n[model]\nctx_size = "big"\n'
TWO_PROBLEMS = "max_tokens = 'many': expected a whole number; model.ctx_size = 'big': expected a whole number"


def test_a_save_onto_a_file_with_problems_names_every_one(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text(TWO_BAD, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        config_mod.save(Config(), p)
    assert str(e.value) == f"settings not saved: config.toml has problems ({p}): {TWO_PROBLEMS}; fix it in an editor"
    assert p.read_text(encoding="utf-8") == TWO_BAD


def test_the_notice_of_a_damaged_file_word_for_word(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text(TWO_BAD, encoding="utf-8")
    assert config_mod.load_lenient(p).notice() == (
        f"config.toml has problems ({p}): {TWO_PROBLEMS}. Those settings use their defaults for now and the "
        f"file is left as it is (settings changed in the app are not saved until it is fixed); fix it in an "
        f"editor, or start with --no-config.")


def test_ui_values_of_the_wrong_type_or_unknown_read_as_their_default():
    c = Config(ui={"theme": 5, "off_view": "sideways", "stats_panel": True, "future": 3})
    assert c.ui_get("theme") == "dark"                 # not a string: the default
    assert c.ui_get("off_view") == "plain"             # neither "plain" nor "markdown"
    assert c.ui_get("stats_panel") is True and c.ui_get("colouring") is True
    assert c.ui_get("future") == 3 and c.ui_get("unset") is None   # keys this version does not know
    assert Config(ui={"off_view": "markdown"}).ui_get("off_view") == "markdown"


def test_a_list_and_a_string_of_its_items_are_different_settings():
    assert config_mod._changes({"k": "ab"}, {"k": ["a", "b"]}) == [(("k",), ["a", "b"])]
    assert config_mod._changes({"k": ["a", "b"]}, {"k": "ab"}) == [(("k",), "ab")]
    assert config_mod._changes({"k": 1}, {"k": [1]}) == [(("k",), [1])]


def test_a_bad_value_among_good_ones_of_its_table_is_the_only_one_named(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text('[model]\nthreads = 3\nctx_size = "big"\nn_gpu_layers = 2\n[sampling]\ntemperature = "hot"\n',
                 encoding="utf-8")
    got = config_mod.load_lenient(p)
    assert got.problems == ["model.ctx_size = 'big': expected a whole number",
                            "sampling.temperature = 'hot': expected a number"]
    assert (got.config.model.threads, got.config.model.n_gpu_layers, got.config.model.ctx_size) == (3, 2, 4096)


def test_setting_extra_bufts_back_to_auto_removes_it_from_the_file(tmp_path):
    def auto(cfg: Config) -> None:
        cfg.model.extra_bufts = "auto"
    assert edited(tmp_path, '[model]\nctx_size = 2048\nextra_bufts = "off"\n', auto) == "[model]\nctx_size = 2048\n"


def test_a_missing_file_is_the_defaults_with_no_problems(tmp_path):
    p = tmp_path / "config.toml"
    got = config_mod.load_lenient(p)
    assert (got.problems, got.path, got.damaged) == ([], p, False)
    assert got.config.to_toml_dict() == Config().to_toml_dict()


def test_a_file_without_a_system_prompt_has_none(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text("max_tokens = 5\n", encoding="utf-8")
    assert config_mod.load(p).system_prompt == ""


def test_the_choices_of_a_bad_choice_are_named(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text('context_overflow = "sideways"\n[model]\nextra_bufts = "sometimes"\n', encoding="utf-8")
    assert config_mod.load_lenient(p).problems == [
        "context_overflow = 'sideways': context_overflow must be one of rolling, truncate-middle, stop, "
        "not 'sideways'",
        "model.extra_bufts = 'sometimes': model.extra_bufts must be auto, on, repack or off, not 'sometimes'"]


def test_a_good_file_has_no_problems_and_bad_placements_and_keys_are_named(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text("max_tokens = 5\n", encoding="utf-8")
    got = config_mod.load_lenient(p)
    assert (got.problems, got.path) == ([], p)
    p.write_text('[model]\nsplit_mode = "diagonal"\n[sampling]\nbogus = 1\ntemperature = -1.0\n', encoding="utf-8")
    assert config_mod.load_lenient(p).problems == [
        "model.split_mode = 'diagonal': model.split_mode: invalid split mode 'diagonal': one of none, layer, row, "
        "tensor",
        "sampling.bogus = 1: unknown setting sampling.bogus",
        "sampling.temperature = -1.0: temperature: must be >= 0"]
