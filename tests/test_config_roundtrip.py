"""config.toml round-trips: every setting is read and written back, and the app's writes change only
the keys that changed (the person's comments, unknown keys, later edits and symlink kept); every text
file the app writes is UTF-8 whatever the locale."""

from __future__ import annotations

import codecs
import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app import config as config_mod
from app import paths
from app.options import ModelOptions
from app.session import ChatSession
from speculators.params import SpecParams
from speculators.sampling import SamplingParams
from speculators.types import parse_types

ROOT = Path(__file__).resolve().parent.parent

#: a value unlike the default for every setting config.toml holds (key path -> value as in TOML)
KEYS: dict[tuple[str, ...], Any] = {
    ("max_tokens",): 77,
    ("system_prompt",): "Answer in French.",
    ("context_overflow",): "truncate-middle",
    ("model", "path"): "/models/some.gguf",
    ("model", "ctx_size"): 2048,
    ("model", "threads"): 3,
    ("model", "n_gpu_layers"): 7,
    ("model", "extra_bufts"): "off",
    ("model", "rpc"): "192.168.1.20:50052",
    ("model", "device"): "CUDA0",
    ("model", "split_mode"): "row",
    ("model", "tensor_split"): "3,1",
    ("model", "main_gpu"): 1,
    ("sampling", "temperature"): 0.3,
    ("sampling", "top_k"): 5,
    ("sampling", "top_p"): 0.5,
    ("sampling", "min_p"): 0.1,
    ("sampling", "seed"): 1234,
    ("speculation", "types"): ["ngram-simple", "ngram-mod"],    # in priority order, as parse_types keeps them
    ("speculation", "synth_len"): 2.5,
    ("speculation", "synth_rates"): [0.5, 0.25],
    ("speculation", "adaptive"): True,
    ("speculation", "draft", "n_max"): 7,
    ("speculation", "draft", "n_min"): 1,
    ("speculation", "draft", "p_min"): 0.5,
    ("speculation", "draft", "p_split"): 0.2,
    ("speculation", "draft", "model"): "/models/draft.gguf",
    ("speculation", "draft", "n_gpu_layers"): 4,
    ("speculation", "draft", "n_ctx"): 512,
    ("speculation", "draft", "n_threads"): 2,
    ("speculation", "draft", "device"): "CPU",
    ("speculation", "ngram_simple", "size_n"): 5,
    ("speculation", "ngram_simple", "size_m"): 20,
    ("speculation", "ngram_simple", "min_hits"): 2,
    ("speculation", "ngram_map_k", "size_n"): 6,
    ("speculation", "ngram_map_k", "size_m"): 21,
    ("speculation", "ngram_map_k", "min_hits"): 3,
    ("speculation", "ngram_map_k4v", "size_n"): 7,
    ("speculation", "ngram_map_k4v", "size_m"): 22,
    ("speculation", "ngram_map_k4v", "min_hits"): 4,
    ("speculation", "ngram_mod", "n_match"): 10,
    ("speculation", "ngram_mod", "n_max"): 30,
    ("speculation", "ngram_mod", "n_min"): 20,
    ("speculation", "ngram_cache", "lookup_cache_static"): "/caches/static.bin",
    ("speculation", "ngram_cache", "lookup_cache_dynamic"): "/caches/dynamic.bin",
    ("ui", "theme"): "light",
    ("ui", "colouring"): False,
    ("ui", "off_view"): "markdown",
    ("ui", "stats_panel"): True,
}

#: settings that cannot be set together (SpecParams.validate)
APART = {("speculation", "synth_rates")}


def _owner(config: config_mod.Config, key: tuple[str, ...]) -> tuple[Any, str]:
    """The object and attribute that hold ``key``'s setting in a Config."""
    top = {"max_tokens": (config, "max_tokens"), "system_prompt": (config, "system_prompt"),
           "context_overflow": (config, "overflow")}
    if len(key) == 1:
        return top[key[0]]
    if key[0] == "model":
        return config.model, "model" if key[1] == "path" else key[1]
    if key[0] == "sampling":
        return config.sampling, key[1]
    if key[0] == "speculation":
        return (config.spec, key[1]) if len(key) == 2 else (getattr(config.spec, key[1]), key[2])
    raise KeyError(key)


def get(config: config_mod.Config, key: tuple[str, ...]) -> Any:
    """The setting at ``key`` as TOML says it."""
    if key[0] == "ui":
        return config.ui.get(key[1])
    obj, attr = _owner(config, key)
    value = getattr(obj, attr)
    return [t.value for t in value] if key == ("speculation", "types") else value


def put(config: config_mod.Config, key: tuple[str, ...], value: Any) -> None:
    """Set the setting at ``key`` as the app does (on the Config's own objects)."""
    if key[0] == "ui":
        config.ui[key[1]] = value
        return
    obj, attr = _owner(config, key)
    setattr(obj, attr, parse_types(value) if key == ("speculation", "types") else value)


def toml_of(settings: dict[tuple[str, ...], Any]) -> str:
    import tomlkit
    doc = tomlkit.document()
    for key, value in settings.items():
        table = doc
        for part in key[:-1]:
            if part not in table:
                table[part] = tomlkit.table()
            table = table[part]
        table[key[-1]] = value
    return tomlkit.dumps(doc)


def write_config(text: str) -> Path:
    p = paths.config_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def start_session() -> ChatSession:
    """A chat session on config.toml as the app starts one (cmd_chat: the file's settings saved)."""
    loaded = config_mod.load_lenient()
    assert not loaded.damaged, loaded.problems
    return ChatSession(config_mod.Config.from_toml_dict(loaded.config.to_toml_dict()), post=lambda ev: None,
                       history=None, open_history=False, saved_config=loaded.config)


def read_config() -> str:
    return paths.config_file().read_text(encoding="utf-8")


MINE = """\
# my settings: keep this comment
max_tokens = 300  # long answers

[model]
ctx_size = 8192
future_option = "from a newer draftlight"  # unknown here

[ui]
# the theme I like
theme = "dark"
"""


# -- every key round-trips ----------------------------------------------------------------------

def test_the_table_names_every_setting_config_toml_has():
    """A setting added to the dataclasses without a line in KEYS fails here, so every key is tested."""
    want = {("max_tokens",), ("system_prompt",), ("context_overflow",)}
    want |= {("model", "path" if f.name == "model" else f.name) for f in dataclasses.fields(ModelOptions)
             if f.name != "extra"}
    want |= {("sampling", f.name) for f in dataclasses.fields(SamplingParams)}
    spec = SpecParams()
    want |= {("speculation", f.name) for f in dataclasses.fields(SpecParams)
             if f.name != "extra" and not dataclasses.is_dataclass(getattr(spec, f.name))}
    want |= {("speculation", name, f.name) for name, section in spec.sections()
             for f in dataclasses.fields(section)}
    want |= {("ui", k) for k in config_mod.UI_DEFAULTS}
    assert set(KEYS) == want
    defaults = config_mod.Config()
    assert [k for k in KEYS if get(defaults, k) == KEYS[k]] == []


@pytest.mark.parametrize("key", list(KEYS), ids=".".join)
def test_every_key_is_read(key):
    write_config(toml_of({key: KEYS[key]}))
    loaded = config_mod.load_lenient()
    assert not loaded.damaged, loaded.problems
    assert get(loaded.config, key) == KEYS[key]


def test_every_key_is_read_all_together():
    settings = {k: v for k, v in KEYS.items() if k not in APART}
    write_config(toml_of(settings))
    c = config_mod.load()
    assert {k: get(c, k) for k in settings} == settings


@pytest.mark.parametrize("key", list(KEYS), ids=".".join)
def test_every_key_the_app_changes_is_written_back(key):
    p = write_config(MINE)
    s = start_session()
    put(s.saved_config, key, KEYS[key])
    assert s.save_config() is None
    assert get(config_mod.load(), key) == KEYS[key]
    text = p.read_text(encoding="utf-8")
    assert "# my settings: keep this comment" in text and 'future_option = "from a newer draftlight"' in text


# -- the app's writes change only what changed --------------------------------------------------

def test_a_theme_change_and_f4_keep_comments_unknown_keys_and_order():
    write_config(MINE)
    s = start_session()
    assert s.remember_ui(theme="light") is None            # a theme change
    assert s.remember_ui(stats_panel=True) is None         # F4
    assert read_config() == MINE.replace('theme = "dark"', 'theme = "light"') + "stats_panel = true\n"


def test_settings_applied_in_the_app_change_only_their_keys():
    write_config(MINE)
    s = start_session()
    sampling = dataclasses.replace(s.config.sampling, top_k=9)
    s.apply_settings(s.config.spec.copy(), sampling, s.config.model, s.config.max_tokens)
    assert read_config() == MINE.replace('theme = "dark"\n', 'theme = "dark"\n\n[sampling]\ntop_k = 9\n')


def test_an_edit_made_after_start_up_survives_the_apps_write():
    p = write_config(MINE)
    s = start_session()
    edited = MINE.replace("ctx_size = 8192", "ctx_size = 1024\nthreads = 6  # added later") + "colouring = false\n"
    p.write_text(edited, encoding="utf-8")
    assert s.remember_ui(stats_panel=True) is None
    assert read_config() == edited + "stats_panel = true\n"
    c = config_mod.load()
    assert (c.model.ctx_size, c.model.threads, c.ui_get("colouring"), c.ui_get("stats_panel")) == (1024, 6, False,
                                                                                                   True)


def test_two_instances_keep_each_others_changes():
    write_config(MINE)
    one, two = start_session(), start_session()
    assert one.remember_ui(theme="light") is None
    assert two.remember_ui(off_view="markdown") is None
    two.set_system_prompt("Be brief.")
    c = config_mod.load()
    assert (c.ui_get("theme"), c.ui_get("off_view"), c.system_prompt) == ("light", "markdown", "Be brief.")


def test_a_setting_the_app_unsets_is_removed_and_the_rest_kept():
    write_config(MINE.replace("ctx_size = 8192", "ctx_size = 8192\nthreads = 4"))
    s = start_session()
    model = dataclasses.replace(s.config.model, threads=None)
    s.saved_config.model = model
    assert s.save_config() is None
    assert read_config() == MINE


def test_a_symlinked_config_stays_a_symlink_to_the_updated_file(tmp_path):
    real = tmp_path / "dotfiles" / "draftlight.toml"
    real.parent.mkdir()
    real.write_text(MINE, encoding="utf-8")
    link = paths.config_file()
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(real, link.parent)
    link.symlink_to(target)
    s = start_session()
    assert s.remember_ui(theme="light") is None
    assert link.is_symlink() and os.readlink(link) == target
    assert real.read_text(encoding="utf-8") == MINE.replace('theme = "dark"', 'theme = "light"')
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert [p.name for p in real.parent.iterdir()] == ["draftlight.toml"]   # no temp file left


def test_the_file_is_written_for_its_owner_only():
    p = write_config(MINE)
    os.chmod(p, 0o644)
    assert start_session().remember_ui(theme="light") is None
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_missing_file_gets_only_the_changed_setting():
    s = start_session()
    assert s.remember_ui(theme="light") is None
    assert read_config() == '[ui]\ntheme = "light"\n'


def test_a_file_damaged_after_start_up_is_not_written_over():
    p = write_config(MINE)
    s = start_session()
    damaged = MINE.replace("ctx_size = 8192", 'ctx_size = "big"').encode("utf-8")
    p.write_bytes(damaged)
    err = s.remember_ui(theme="light")
    assert err and "model.ctx_size = 'big'" in err and "not saved" in err
    assert p.read_bytes() == damaged
    p.write_text(MINE, encoding="utf-8")            # fixed: the change is saved at the next write
    assert s.remember_ui(stats_panel=True) is None
    c = config_mod.load()
    assert (c.ui_get("theme"), c.ui_get("stats_panel")) == ("light", True)


async def test_the_app_keeps_comments_through_f4_and_a_theme_change():
    from app import cli, cmd_chat
    from app.ui.scripted import ScriptedEngine
    p = write_config(MINE)
    app = cmd_chat.make_app(cli.build_parser().parse_args(["chat"]),
                            engine_factory=lambda m, s, pr: ScriptedEngine([(None, ["Hi"])]))
    async with app.run_test() as pilot:
        await pilot.press("f4")
        await pilot.pause()
        app.set_theme("light")
        await pilot.pause()
    text = p.read_text(encoding="utf-8")
    assert text.startswith(MINE.split("[ui]")[0]), text
    assert "# the theme I like" in text and 'theme = "light"' in text and "stats_panel = true" in text


# -- UTF-8 whatever the locale -------------------------------------------------------------------

CHILD = """
import codecs, locale, sys
from app.fileutil import atomic_write_text
print(codecs.lookup(locale.getpreferredencoding(False)).name)
atomic_write_text(sys.argv[1], sys.argv[2].encode("ascii").decode("unicode_escape"))
"""


def test_text_files_are_utf8_under_an_ascii_locale(tmp_path):
    text = "Party \U0001F389 caf\u00e9 \u2713"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LC_") and k not in ("LANG", "LANGUAGE", "PYTHONIOENCODING", "PYTHONUTF8",
                                                    "PYTHONCOERCECLOCALE")}
    env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    out = tmp_path / "chat.md"
    r = subprocess.run([sys.executable, "-X", "utf8=0", "-c", CHILD, str(out),
                        text.encode("unicode_escape").decode("ascii")],
                       cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() != codecs.lookup("utf-8").name    # the child's locale really is not UTF-8
    assert out.read_bytes() == text.encode("utf-8")
