"""docs/architecture.md stays true: every module, class, method and path it names exists.

The page names modules by dotted path (```app.session```), classes and events by name
(```ChatSession```), methods as ```Class.method``` and files or folders by their path
(```tests/test_import_hygiene.py```, ```speculators/```). Each module is imported, each class
is looked up among the modules the page names, each method on its class, each path on disk:
renaming or moving any of them without the page fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"

#: a module of the project, by dotted path (no globs such as ``app.cmd_*``)
MODULE = re.compile(r"^(?:app|speculators|themes)(?:\.[a-z_][a-z0-9_]*)*$")
#: a class or event by name, optionally with one attribute: ``ChatSession``, ``Engine.set_spec``
CLASS = re.compile(r"^([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)(?:\.([a-z_][a-z0-9_]*))?$")
#: a file or folder of the repository: has a slash, and no glob or placeholder
PATH = re.compile(r"^\.?[A-Za-z0-9_][A-Za-z0-9_./-]*/[A-Za-z0-9_./-]*$")


def spans(text: str) -> list[str]:
    """The page's inline code spans, fenced blocks left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def named(text: str) -> tuple[list[str], list[tuple[str, str | None]], list[str]]:
    """(modules, (class, attribute or None), paths) named on the page, each once, in order."""
    modules, classes, paths = [], [], []
    for s in dict.fromkeys(spans(text)):
        if MODULE.match(s):
            modules.append(s)
        elif m := CLASS.match(s):
            classes.append((m.group(1), m.group(2)))
        elif PATH.match(s):
            paths.append(s)
    return modules, classes, paths


def test_the_reader_finds_what_a_page_names():
    """The extraction itself: a page's names are found, prose and fenced code are not."""
    text = ("`app.session` holds `ChatSession`; `ChatSession.send` starts a reply, `TokenEvent` comes\n"
            "back; see `tests/test_import_hygiene.py` and `speculators/`. Not names: `auto`, `c(k)`,\n"
            "`app.cmd_*`, `config.toml`, `E_k`, `-ngl`.\n```\n`app.nothing`\n```\n")
    modules, classes, paths = named(text)
    assert modules == ["app.session"]
    assert classes == [("ChatSession", None), ("ChatSession", "send"), ("TokenEvent", None)]
    assert paths == ["tests/test_import_hygiene.py", "speculators/"]


@pytest.fixture(scope="module")
def page() -> tuple[list[str], list[tuple[str, str | None]], list[str]]:
    modules, classes, paths = named(PAGE.read_text(encoding="utf-8"))
    # the page is the map of the code: it names the layers' main modules and the token's path
    for must in ("app.session", "app.runner", "app.ui.app", "speculators.engine", "speculators.events"):
        assert must in modules, must
    for must in ("ChatSession", "RunnerEngine", "Engine", "TokenEvent", "DraftlightApp"):
        assert must in {c for c, _ in classes}, must
    return modules, classes, paths


def test_every_module_it_names_imports(page):
    modules, _, _ = page
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing.append(f"{name}: {e}")
    assert not missing, "docs/architecture.md names modules that do not exist:\n" + "\n".join(missing)


def test_every_class_event_and_method_it_names_exists(page):
    modules, classes, _ = page
    where: dict[str, list[object]] = {}
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError:
            continue  # reported by test_every_module_it_names_imports
        for attr, value in vars(mod).items():
            if isinstance(value, type):
                where.setdefault(attr, []).append(value)
    missing = []
    for cls, attr in classes:
        found = where.get(cls)
        if not found:
            missing.append(f"{cls}: no class of that name in the modules the page names")
        elif attr is not None and not any(hasattr(c, attr) for c in found):
            missing.append(f"{cls}.{attr}: {cls} has no {attr!r}")
    assert not missing, "docs/architecture.md names what does not exist:\n" + "\n".join(missing)


def test_every_path_it_names_is_there(page):
    _, _, paths = page
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that are not there: {missing}"
