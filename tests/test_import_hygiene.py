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


def _textual_modules_after(statements: str) -> str:
    """The Textual modules loaded in a fresh interpreter after ``statements`` (printed as a list)."""
    code = ("import sys; sys.path.insert(0, %r); %s; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))") % (str(ROOT), statements)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_chat_command_does_not_import_textual_until_it_runs():
    assert _textual_modules_after("import app.cli as c; c.build_parser()") == "[]"


def _module_level_imports(path: Path, module: str, is_package: bool) -> set[str]:
    """The draftlight modules ``module`` imports when it is imported (its top-level statements, and
    the branches of a top-level ``if``/``try``; never inside a function or under TYPE_CHECKING)."""
    import ast
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                    visit(part)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = ".".join(p for p in (base if node.level else "", node.module or "") if p)
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)
    visit(tree.body)
    return out


def test_no_two_modules_import_each_other_at_module_level():
    """One way only: where module A imports B when it loads, B does not import A when it loads."""
    modules: dict[str, tuple[Path, bool]] = {}
    for top in ("app", "speculators", "themes"):
        for p in (ROOT / top).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (p, is_package)
    # (a module's own packages are loaded before it: importing from them is no circle)
    imports = {m: {t for t in _module_level_imports(p, m, pkg) if t in modules and not (m + ".").startswith(t + ".")}
               for m, (p, pkg) in modules.items()}
    both = sorted({tuple(sorted((a, b))) for a, targets in imports.items() for b in targets
                   if a in imports.get(b, ())})
    assert both == []


def test_the_settings_form_and_the_model_files_load_without_textual():
    """The settings pane's logic is tested without the UI: its modules never load Textual."""
    assert _textual_modules_after("import app.settings_form, app.model_files") == "[]"


def _every_import(path: Path) -> set[str]:
    """Every module named by an import anywhere in ``path`` (functions included), relative ones as written."""
    import ast
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            out.update(f"{mod}.{a.name}" if not node.module else mod for a in node.names)
    return out


def test_the_registry_of_types_is_read_one_way():
    """speculators.registry imports nothing of draftlight's but its own package; the type names
    (types.py) and the parameters (params.py) read it, never the descriptor module (which imports them)."""
    reg = _every_import(ROOT / "speculators" / "registry.py")
    assert {m for m in reg if m.startswith(".") or m.split(".")[0] in ("speculators", "app")} == {"speculators"}
    for name in ("types.py", "params.py", "param_kinds.py"):
        assert not any("descriptor" in m for m in _every_import(ROOT / "speculators" / name)), name
