"""A damaged config.toml never stops draftlight: defaults for what cannot be read, the file kept,
and a message that names the key (or line) and how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import config as config_mod
from app import paths

DAMAGE = {
    "bad TOML": (b"max_tokens = 64\n[model\nctx_size = 512\n", "not valid TOML", "line 2"),
    "bad bytes": (b"max_tokens = 64\n\xff\xfe\n", "not UTF-8", "line 2"),
    "bad value": (b"max_tokens = 64\n[model]\nctx_size = \"big\"\n", "model.ctx_size = 'big'",
                  "expected a whole number"),
}


def write_config(data: bytes) -> Path:
    p = paths.config_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_file_gives_defaults_names_the_problem_and_is_kept(kind):
    data, what, where = DAMAGE[kind]
    p = write_config(data)
    loaded = config_mod.load_lenient()
    assert loaded.damaged and p.read_bytes() == data
    notice = loaded.notice()
    assert what in notice and where in notice and "--no-config" in notice and str(p) in notice
    if kind == "bad value":
        # the rest of the file still counts
        assert loaded.config.max_tokens == 64 and loaded.config.model.ctx_size == 4096
    else:
        assert loaded.config.to_toml_dict() == config_mod.Config().to_toml_dict()


def test_several_bad_values_are_each_named_and_the_good_ones_kept():
    write_config(b'[sampling]\ntemperature = "hot"\ntop_k = 5\n[speculation]\ntypes = ["ngram-mod", "bogus"]\n'
                 b'[model]\nextra_bufts = "sometimes"\nthreads = 3\n')
    loaded = config_mod.load_lenient()
    keys = [p.split(" = ")[0] for p in loaded.problems]
    assert keys == ["sampling.temperature", "speculation.types", "model.extra_bufts"]
    c = loaded.config
    assert (c.sampling.top_k, c.model.threads, c.sampling.temperature) == (5, 3, 0.8)
    assert c.spec.is_auto


async def test_the_chat_starts_says_so_and_never_writes_over_the_file():
    from app import cli, cmd_chat
    from app.ui.scripted import ScriptedEngine
    data = DAMAGE["bad value"][0]
    p = write_config(data)
    args = cli.build_parser().parse_args(["chat"])
    engine = ScriptedEngine([(None, ["Hi"])])
    app = cmd_chat.make_app(args, engine_factory=lambda m, s, pr: engine)
    async with app.run_test() as pilot:
        deadline = 100
        while app.engine is None and deadline:
            await pilot.pause(0.05)
            deadline -= 1
        shown = [n.message for n in app._notifications]
        assert any("model.ctx_size = 'big'" in m and "--no-config" in m for m in shown), shown
        await pilot.press("f5")          # a setting the app would save...
    assert p.read_bytes() == data        # ...is not written over the damaged file


@pytest.mark.slow
def test_generate_runs_with_a_warning_naming_the_key(default_model_path):
    data = DAMAGE["bad value"][0]
    p = write_config(data)
    r = subprocess.run([sys.executable, "-m", "app", "generate", "-m", str(default_model_path), "-p", "Hi",
                        "-n", "4", "--temp", "0", "-t", "2"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ), cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr
    warn = [l for l in r.stderr.splitlines() if l.startswith("draftlight: warning:")]
    assert len(warn) == 1 and "model.ctx_size = 'big'" in warn[0] and "--no-config" in warn[0]
    assert r.stdout.strip() and p.read_bytes() == data


def test_doctor_reports_the_problems(capsys):
    from app.cli import main
    write_config(DAMAGE["bad value"][0])
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "HAS PROBLEMS" in out and "model.ctx_size = 'big'" in out
