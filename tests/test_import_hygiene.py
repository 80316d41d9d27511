"""speculators/ never needs Textual (or the app): it imports with both blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCKED = textwrap.dedent("""
    import importlib, pkgutil, sys
    sys.path.insert(0, {root!r})

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top in ("textual", "app", "themes"):
                raise ImportError(f"blocked import of {{name}}")
            return None

    sys.meta_path.insert(0, Blocker())
    import speculators
    names = []
    for m in pkgutil.iter_modules(speculators.__path__):
        importlib.import_module("speculators." + m.name)
        names.append(m.name)
    from speculators.chain import _ensure_registered
    _ensure_registered()
    assert not any(n.split(".")[0] in ("textual", "app") for n in sys.modules), "leaked"
    print("ok", len(names))
""")


def test_speculators_import_without_textual_or_the_app():
    out = subprocess.run([sys.executable, "-c", BLOCKED.format(root=str(ROOT))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_textual_is_only_imported_by_the_ui():
    offenders = []
    for p in list((ROOT / "app").glob("*.py")) + list((ROOT / "speculators").rglob("*.py")) \
            + list((ROOT / "themes").rglob("*.py")):
        if p.name == "cmd_chat.py":
            continue
        text = p.read_text(encoding="utf-8")
        for line in text.splitlines():
            s = line.strip()
            if s.startswith(("import textual", "from textual")):
                offenders.append(f"{p.relative_to(ROOT)}: {s}")
    assert offenders == []


def test_the_chat_command_does_not_import_textual_until_it_runs():
    code = ("import sys; sys.path.insert(0, %r); import app.cli as c; c.build_parser(); "
            "print('textual' in sys.modules)") % str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
