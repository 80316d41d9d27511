#!/usr/bin/env python3
"""Mutation testing of the modules where a silent bug costs the person most (issue 53).

    python tools/mutation.py [MODULE ...] [--jobs N] [--min-score P] [--changed REF] [--keep]

Each MODULE (default: all of :data:`MODULES`; ``python tools/mutation.py --list`` names them) is
mutated by `mutmut <https://mutmut.readthedocs.io>`_ 3 and checked against the fast tests that
cover it: its test files, its ``tests/test_mut_<module>.py`` if there is one, and the module's
own doctests. mutmut runs in a scratch copy of the working tree (the tracked and the untracked,
not ignored files) under the temporary folder, configured by a ``setup.cfg`` written there, so a
run never writes into the checkout and several runs can go on side by side.

Printed per module, then over all of them as the last line::

    chain: killed K of N mutants (P %)
    killed K of N mutants (P %)

*Killed* counts the mutants a test failed on, including those that made a test run past
mutmut's time limit or crash the test process (a mutant that loops forever is found). *N* is
every mutant mutmut made in the module's functions minus the ones listed, with the reason, in
``tools/mutation-equivalent.toml`` as equivalent (no test can tell them from the original); they
are counted on a line of their own. Every other surviving mutant is printed with its diff: kill
it with a test (``tests/test_mut_<module>.py``) or list it as equivalent, saying why.

``--changed REF`` keeps the modules that a change since ``REF`` touched (the module or one of its
test files; a change to this script alone selects none): what CI runs (``docs/mutation.md``).

A module whose :attr:`Module.functions` names some of its functions has only those mutated and
counted (``mutmut run`` is given their mutants' names); ``--list`` shows them.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import difflib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "tools" / "mutation-equivalent.toml"


@dataclass(frozen=True)
class Module:
    """One module under mutation testing and the fast tests that cover it."""

    name: str
    path: str                          #: the source file, relative to the repository root
    tests: tuple[str, ...]             #: test files (or node ids) that cover it
    pytest_args: tuple[str, ...] = ()  #: extra pytest arguments for this module's runs
    what: str = ""
    #: where not empty, only these functions are mutated (``name`` or ``Class.method``, as a
    #: survivor's line names them): a large module's part that the module is tested for
    functions: tuple[str, ...] = ()

    @property
    def dotted(self) -> str:
        return self.path[:-3].replace("/", ".")

    def mutant_patterns(self) -> list[str]:
        """``mutmut run``'s arguments that keep to :attr:`functions` (none: every function)."""
        out = []
        for f in self.functions:
            cls, _, fn = f.rpartition(".")
            out.append(f"{self.dotted}.{f'xǁ{cls}ǁ{fn}' if cls else f'x_{fn}'}__mutmut_*")
        return out

    def test_selection(self, root: Path) -> list[str]:
        """The tests mutmut runs: the module's test files, its ``test_mut_`` file, its doctests."""
        sel = [t for t in self.tests if (root / t.split("::")[0]).exists()]
        extra = f"tests/test_mut_{self.name}.py"
        if (root / extra).exists() and extra not in sel:
            sel.append(extra)
        sel.append(self.path)          # --doctest-modules (pyproject's addopts): its doctests
        return sel


_NOT_SLOW = ("-m", "not slow")

#: the modules, in the order they run: the speculators' accounting and core first, then the
#: person's data (chat history and storage, config, the lookup store's save/load/merge)
MODULES: dict[str, Module] = {m.name: m for m in (
    Module("chain", "speculators/chain.py", ("tests/test_chain.py",),
           what="the chain's accounting: priority, first drafter wins, accept statistics, synthetic rates"),
    Module("sampling", "speculators/sampling.py", ("tests/test_sampling_accept.py",),
           # an F16 copy of the default model in a session fixture: ~12 s per mutant (a fork
           # sets its session fixtures up again); tests/test_mut_sampling.py checks the same
           # native sampler chain on a tiny model's context
           ("--deselect", "tests/test_sampling_accept.py::test_sampling_never_draws_the_models_suppress_tokens"),
           what="sampling and acceptance: the target's sampler and the verify rule"),
    Module("ngram_simple", "speculators/ngram_simple.py", ("tests/test_ngram_speculators.py",),
           what="ngram-simple and the shared n-gram search helpers"),
    Module("ngram_map", "speculators/ngram_map.py", ("tests/test_ngram_speculators.py",),
           what="ngram-map-k / ngram-map-k4v"),
    Module("ngram_mod", "speculators/ngram_mod.py", ("tests/test_ngram_speculators.py",),
           what="ngram-mod's hashed table"),
    Module("storage", "app/storage.py", ("tests/test_storage.py",) + tuple(
               f"tests/test_history_faults.py::{t}" for t in (
                   "test_a_write_that_fails_is_a_history_error_saying_why_and_where",
                   "test_the_history_and_its_wal_files_are_private_in_a_private_data_folder",
                   "test_an_older_readable_history_is_made_private",
                   "test_a_folder_the_person_named_keeps_its_mode_and_a_new_one_is_private")),
           _NOT_SLOW, what="chat history and storage"),
    Module("config", "app/config.py", ("tests/test_config_damage.py", "tests/test_config_roundtrip.py"),
           # the Textual app's writes (save() through a session, which the other round-trip tests
           # call directly) and text files under an ASCII locale (app.fileutil): seconds per mutant
           _NOT_SLOW + tuple(a for t in ("test_the_app_keeps_comments_through_f4_and_a_theme_change",
                                         "test_text_files_are_utf8_under_an_ascii_locale")
                             for a in ("--deselect", f"tests/test_config_roundtrip.py::{t}")),
           what="the config file"),
    Module("lookup_store", "app/lookup_store/store.py",
           ("tests/test_lookup_store.py", "tests/test_lookup_files_safety.py"),
           # left out: a real engine's replies, and the tests of several processes (writers killed
           # mid-save, two saving at once, files read under a memory limit, a FIFO): 6 to 25 s
           # each, paid by every mutant they reach. What they check in this process (a save
           # merging another store's file, what is kept or moved aside, the refusals) the other
           # tests and tests/test_mut_lookup_store.py check
           _NOT_SLOW + tuple(a for t in (
               "test_lookup_store.py::test_a_learned_dynamic_cache_drafts_and_accepts_more",
               "test_lookup_store.py::test_a_writer_killed_mid_save_leaves_the_old_or_the_new_file",
               "test_lookup_store.py::test_two_processes_saving_concurrently_keep_each_others_ngrams",
               "test_lookup_files_safety.py::test_drafting_never_passes_an_out_of_vocabulary_id_to_llama_cpp",
               "test_lookup_files_safety.py::test_multi_gigabyte_files_are_refused_without_being_read",
               "test_lookup_files_safety.py::test_files_that_are_not_regular_files_are_refused_unread")
               for a in ("--deselect", f"tests/{t}")),
           what="the lookup store's save / load / merge",
           # the person's data: the dynamic cache as it is learned, loaded (judged, moved aside,
           # kept), merged with another process's file, pruned and saved. Not: fingerprints and
           # their memo, the vocabulary-only model, static-cache building, lookup stats'
           # simulation, escapes, `lookup info` and the settings pane's figures
           functions=("_sig", "_digest", "_still", "move_aside", "_cleanup_tmp", "_read_cache",
                      "_read_cache_state", "_reason", "_kept_unread", "prune_cache", "learn_tokens",
                      "Learner.new_from", "LookupStore.__init__", "LookupStore._lock_path", "LookupStore.load",
                      "LookupStore.learn", "LookupStore.save", "LookupStore._save_locked", "LookupStore._put_back",
                      "LookupStore.close", "LookupStore.clear_dynamic")),
)}

#: a pytest plugin written into each scratch copy. mutmut runs the tests once in its own process,
#: then forks a child per mutant that runs pytest again, session fixtures included:
#:
#: * the tests' session fixture ``cpu_extra_bufts`` probes the CPU in a throwaway process that
#:   loads the default model (~12 s on 2 cores), which every mutant would pay again (and which
#:   would read as a time-out): the plugin keeps the first probe's decision for the forks;
#: * Hypothesis sees a test class's property test called again from another instance in the same
#:   process and fails its ``differing_executors`` health check: the plugin's settings profile
#:   leaves that check out, and keeps no example database, so that every mutant is checked on the
#:   same examples (``--hypothesis-seed``) whatever ran before it.
PLUGIN_NAME = "_mutation_plugin"
PLUGIN = '''"""Written by tools/mutation.py into its scratch copy of the tree (see PLUGIN there)."""
import functools


def pytest_configure(config):
    from app import cpu_check
    if not getattr(cpu_check.probe_decision, "cache_info", None):
        cpu_check.probe_decision = functools.lru_cache(maxsize=None)(cpu_check.probe_decision)
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    settings.register_profile("mutation", database=None,
                              suppress_health_check=[HealthCheck.differing_executors])
    settings.load_profile("mutation")
'''

#: pytest arguments for every run: the plugin above, a fixed Hypothesis seed, so that a run is
#: repeatable, and one pytest cache folder for all runs (the tests keep the models they derive there)
PYTEST_ARGS = ("-p", PLUGIN_NAME, "--hypothesis-seed=0",
               "-o", f"cache_dir={Path(tempfile.gettempdir()) / 'draftlight-mutation-pytest-cache'}")

# mutmut's exit codes per mutant (mutmut/stats.py: status_by_exit_code)
_KILLED = {1, 3}
_TIMEOUT = {24, -24, 152, 255, 36}
_CRASHED = {-11, -9}
_SURVIVED = {0}
_NO_TESTS = {5, 33}
_SKIPPED = {34}


def resolve(name: str) -> Module:
    """A module by its short name, dotted name or path (``chain``, ``speculators.chain``,
    ``speculators/chain.py``)."""
    key = name.strip()
    for m in MODULES.values():
        if key in (m.name, m.dotted, m.path):
            return m
    raise SystemExit(f"unknown module {name!r}; known: {', '.join(MODULES)}")


# -- the equivalent mutants ---------------------------------------------------------------------

def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import toml
        return toml.loads(path.read_text(encoding="utf-8"))
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _norm(code: str) -> str:
    return "\n".join(" ".join(line.split()) for line in code.strip().splitlines())


@dataclass
class Equivalent:
    module: str
    function: str
    before: str
    after: str
    reason: str
    #: where the function has several mutants that change the same lines the same way (two
    #: ``return False`` made ``return True``): which one, counting from 1 in mutmut's order
    occurrence: int | None = None
    used: int = 0

    def matches(self, module: str, function: str, before: str, after: str, occurrence: int = 1) -> bool:
        return (self.module == module and self.function == function
                and _norm(self.before) == _norm(before) and _norm(self.after) == _norm(after)
                and self.occurrence in (None, occurrence))


def load_equivalents(path: Path = EQUIVALENT_FILE) -> list[Equivalent]:
    """``[[mutant]]`` entries: ``module``, ``function``, ``before``, ``after``, ``reason``, and
    ``occurrence`` where the same change is made at several places of the function.

    A mutant is identified by what it changes (the changed lines of the function), not by
    mutmut's number, which moves whenever the function changes."""
    if not path.exists():
        return []
    out = []
    for i, e in enumerate(_load_toml(path).get("mutant", [])):
        missing = [k for k in ("module", "function", "before", "after", "reason") if k not in e]
        if missing or not str(e["reason"]).strip():
            raise SystemExit(f"{path}: entry {i + 1} lacks {', '.join(missing) or 'a reason'}")
        out.append(Equivalent(e["module"], e["function"], e["before"], e["after"], e["reason"],
                              e.get("occurrence")))
    return out


# -- a scratch copy with mutmut's configuration -----------------------------------------------------

def _tree_files(root: Path) -> list[str]:
    """The working tree's files: tracked, and untracked but not ignored (as CI would see them)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):  # not a checkout (an sdist): every file
        skip = {".git", ".venv", "mutants", "__pycache__", ".pytest_cache", ".hypothesis"}
        files = [str(p.relative_to(root)) for p in root.rglob("*")
                 if p.is_file() and not skip.intersection(p.relative_to(root).parts)]
    return [f for f in files if not f.startswith("mutants/") and (root / f).is_file()]


def _source_dirs(root: Path, files: list[str]) -> list[str]:
    """The top-level Python packages: mutmut copies them into ``mutants/`` (only the module
    under test is mutated; the others are copied as they are)."""
    tops = sorted({f.split("/")[0] for f in files if "/" in f})
    return [t for t in tops if (root / t / "__init__.py").exists() and t != "tests"]


def make_workdir(module: Module, base: Path) -> Path:
    work = base / module.name
    files = _tree_files(ROOT)
    for f in files:
        dst = work / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst)
    pyproject = work / "pyproject.toml"
    if pyproject.exists() and "mutmut" in _load_toml(pyproject).get("tool", {}):
        raise SystemExit("pyproject.toml has a [tool.mutmut] table: mutmut would ignore this "
                         "script's configuration (setup.cfg); remove it")
    (work / f"{PLUGIN_NAME}.py").write_text(PLUGIN)
    files.append(f"{PLUGIN_NAME}.py")
    packages = _source_dirs(work, files)
    others = sorted({f.split("/")[0] for f in files if "/" in f} - set(packages) - {"tests"})
    cfg = configparser.ConfigParser()
    cfg.read(work / "setup.cfg")
    if not cfg.has_section("mutmut"):
        cfg.add_section("mutmut")
    lines = lambda xs: "\n" + "\n".join(xs)  # noqa: E731 (setup.cfg's list syntax)
    cfg["mutmut"]["source_paths"] = lines(packages)
    cfg["mutmut"]["only_mutate"] = lines([module.path])
    cfg["mutmut"]["also_copy"] = lines(others + [f for f in files if "/" not in f])
    cfg["mutmut"]["pytest_add_cli_args_test_selection"] = lines(module.test_selection(work))
    cfg["mutmut"]["pytest_add_cli_args"] = lines(list(PYTEST_ARGS) + list(module.pytest_args))
    cfg["mutmut"]["use_git_change_detection"] = "false"
    with open(work / "setup.cfg", "w") as f:
        cfg.write(f)
    return work


# -- reading the results back ------------------------------------------------------------------

def _function_label(mutant: str) -> str:
    """``speculators.chain.xǁSpeculatorChainǁaccept__mutmut_7`` -> ``SpeculatorChain.accept``."""
    mangled = mutant.rpartition(".")[2].partition("__mutmut_")[0]
    if mangled.startswith("x_"):
        return mangled[2:]
    _, cls, fn = mangled.split("ǁ")
    return f"{cls}.{fn}"


def _functions(tree: ast.AST, source: str) -> dict[str, str]:
    """The generated functions' sources by name (by line numbers: get_source_segment would split
    the whole mutated file again for each one)."""
    lines = source.splitlines()
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            out[node.name] = "\n".join(lines[node.lineno - 1: node.end_lineno])
    return out


def mutant_diffs(work: Path, module: Module, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each mutant's changed lines: ``(before, after)``, read out of mutmut's mutated file."""
    mutated = (work / "mutants" / module.path).read_text(encoding="utf-8")
    funcs = _functions(ast.parse(mutated), mutated)
    out = {}
    for name in names:
        short = name.rpartition(".")[2]
        orig_name = short.partition("__mutmut_")[0] + "__mutmut_orig"
        orig, mut = funcs.get(orig_name), funcs.get(short)
        if orig is None or mut is None:
            out[name] = ("?", "?")
            continue
        plain = _function_label(name).rpartition(".")[2]
        orig, mut = orig.replace(orig_name, plain, 1), mut.replace(short, plain, 1)
        before, after = [], []
        for line in difflib.unified_diff(orig.splitlines(), mut.splitlines(), lineterm="", n=0):
            if line.startswith(("---", "+++", "@@")):
                continue
            text = line[1:].split("# type: ignore # mutmut generated")[0].strip()
            (before if line[0] == "-" else after).append(text)
        out[name] = ("\n".join(before), "\n".join(after))
    return out


@dataclass
class Result:
    module: Module
    seconds: float
    killed: list[str] = field(default_factory=list)
    timeout: list[str] = field(default_factory=list)
    survived: list[str] = field(default_factory=list)       # survived, no tests, suspicious
    equivalent: list[str] = field(default_factory=list)
    skipped: int = 0
    diffs: dict[str, tuple[str, str]] = field(default_factory=dict)
    wrongly_equivalent: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)

    @property
    def k(self) -> int:
        return len(self.killed) + len(self.timeout)

    @property
    def n(self) -> int:
        return self.k + len(self.survived)


def score_line(k: int, n: int) -> str:
    p = 100.0 * k / n if n else 100.0
    return f"killed {k} of {n} mutants ({p:.1f} %)"


def collect(work: Path, module: Module, seconds: float, equivalents: list[Equivalent]) -> Result:
    import json

    meta = json.loads((work / "mutants" / (module.path + ".meta")).read_text())
    codes: dict[str, int | None] = meta["exit_code_by_key"]
    r = Result(module, seconds)
    if module.functions:
        codes = {k: v for k, v in codes.items() if _function_label(k) in module.functions}
    r.diffs = mutant_diffs(work, module, sorted(codes))
    seen: dict[tuple[str, str, str], int] = {}
    for name in sorted(codes, key=lambda s: (s.partition("__mutmut_")[0], int(s.rpartition("_")[2]))):
        code = codes[name]
        before, after = r.diffs[name]
        change = (_function_label(name), _norm(before), _norm(after))
        seen[change] = seen.get(change, 0) + 1
        eq = next((e for e in equivalents
                   if e.matches(module.name, _function_label(name), before, after, seen[change])), None)
        if code in _SKIPPED:
            r.skipped += 1
            continue
        if code in _KILLED or code in _TIMEOUT or code in _CRASHED:
            (r.killed if code in _KILLED else r.timeout).append(name)
            if eq is not None:
                eq.used += 1
                r.wrongly_equivalent.append(name)
            continue
        if eq is not None:
            eq.used += 1
            r.equivalent.append(name)
            continue
        r.survived.append(name)
        r.status[name] = ("survived" if code in _SURVIVED else "no tests" if code in _NO_TESTS
                          else "not checked" if code is None else f"suspicious (exit {code})")
    return r


# -- running --------------------------------------------------------------------------------------

def run_module(module: Module, base: Path, jobs: int, verbose: bool,
               equivalents: list[Equivalent]) -> Result | None:
    t0 = time.monotonic()
    work = make_workdir(module, base)
    log = work / "mutmut.log"
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *module.mutant_patterns()]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    only = f" [only {', '.join(module.functions)}]" if module.functions else ""
    print(f"== {module.name} ({module.path}{only}): {' '.join(module.test_selection(work))}", flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if verbose:
                sys.stdout.write(line)
        rc = proc.wait()
    seconds = time.monotonic() - t0
    meta = work / "mutants" / (module.path + ".meta")
    if rc != 0 or not meta.exists():
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail))
        print(f"{module.name}: mutmut failed (exit {rc}) after {seconds:.0f} s; its log: {log}")
        return None
    return collect(work, module, seconds, equivalents)


def report(r: Result) -> None:
    extra = []
    if r.timeout:
        extra.append(f"{len(r.timeout)} of the killed by a time-out or crash")
    if r.equivalent:
        extra.append(f"{len(r.equivalent)} equivalent not counted")
    if r.skipped:
        extra.append(f"{r.skipped} skipped")
    extra.append(f"{r.seconds:.0f} s")
    print(f"{r.module.name}: {score_line(r.k, r.n)}  [{'; '.join(extra)}]", flush=True)
    for name in r.survived:
        before, after = r.diffs[name]
        print(f"    {r.status[name]}: {_function_label(name)}  ({name})")
        for line in before.splitlines():
            print(f"        - {line}")
        for line in after.splitlines():
            print(f"        + {line}")
    for name in r.wrongly_equivalent:
        print(f"    listed as equivalent but a test kills it (remove its entry): {name}")


def changed_modules(ref: str) -> list[Module]:
    """The modules a change since ``ref`` touched: the module itself or one of its tests. (A
    change to this script alone selects none: run the modules it affects by hand, as CI's time
    would not hold all of them on top of the suite.)"""
    diff = subprocess.run(["git", "diff", "--name-only", ref], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
    new = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    touched = set(diff) | set(new)
    out = []
    for m in MODULES.values():
        mine = {m.path, f"tests/test_mut_{m.name}.py"} | {t.split("::")[0] for t in m.tests}
        if touched & mine:
            out.append(m)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", metavar="MODULE",
                    help="short name, dotted name or path (default: all; --list names them)")
    ap.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1),
                    help="mutants tested at once (default: %(default)s)")
    ap.add_argument("--changed", metavar="REF",
                    help="only the modules that a change since REF touched (CI)")
    ap.add_argument("--min-score", type=float, metavar="P",
                    help="exit 1 when the total is below P %%")
    ap.add_argument("--keep", action="store_true",
                    help="keep the scratch copies (cd there and `mutmut browse`, `mutmut show NAME`)")
    ap.add_argument("--verbose", "-v", action="store_true", help="show mutmut's own output")
    ap.add_argument("--list", action="store_true", help="name the modules and their tests")
    a = ap.parse_args(argv)

    if a.list:
        for m in MODULES.values():
            print(f"{m.name:13} {m.path:28} {' '.join(m.test_selection(ROOT))}"
                  f"{'  ' + shlex.join(m.pytest_args) if m.pytest_args else ''}"
                  f"{'  [only ' + ', '.join(m.functions) + ']' if m.functions else ''}")
        return 0
    if importlib.util.find_spec("mutmut") is None:
        print("mutmut is not installed: python -m pip install 'mutmut>=3.3'", file=sys.stderr)
        return 2
    if a.changed:
        modules = changed_modules(a.changed)
        if a.modules:
            wanted = {resolve(n).name for n in a.modules}
            modules = [m for m in modules if m.name in wanted]
        if not modules:
            print(f"no mutation-tested module changed since {a.changed}")
            return 0
    else:
        modules = [resolve(n) for n in a.modules] if a.modules else list(MODULES.values())
    equivalents = load_equivalents()

    base = Path(tempfile.mkdtemp(prefix="draftlight-mutation-"))
    t0 = time.monotonic()
    results, failed = [], []
    try:
        for m in modules:
            r = run_module(m, base, a.jobs, a.verbose, equivalents)
            if r is None:
                failed.append(m.name)
                a.keep = True       # the log is worth reading
                continue
            report(r)
            results.append(r)
    finally:
        if a.keep:
            print(f"scratch copies kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    ran = {r.module.name for r in results}
    for e in equivalents:
        if e.module in ran and not e.used:
            print(f"note: an equivalent mutant listed for {e.module} ({e.function}: "
                  f"{e.before!r} -> {e.after!r}) was not made this time: remove or update its entry")
    k = sum(r.k for r in results)
    n = sum(r.n for r in results)
    n_eq = sum(len(r.equivalent) for r in results)
    total = time.monotonic() - t0
    print(f"{len(results)} module(s) in {total / 60:.1f} min "
          f"({', '.join(f'{r.module.name} {r.seconds:.0f} s' for r in results)}); "
          f"{n_eq} equivalent mutant(s) listed in {EQUIVALENT_FILE.relative_to(ROOT)} not counted")
    if failed:
        print(f"mutmut failed on: {', '.join(failed)} (not counted)")
    print(score_line(k, n))
    if failed:
        return 1
    if a.min_score is not None and n and 100.0 * k / n < a.min_score:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
