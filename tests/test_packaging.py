"""The wheel and sdist, and a real install with pipx, run from outside the source tree.

The wheel is built from the sdist (``python -m build``), so both are checked
at once. The pipx install goes into a temporary PIPX_HOME/PIPX_BIN_DIR, a
clean venv (no system site-packages), and takes llama-cpp-python only as a
prebuilt wheel from pip's cache (``--only-binary``): llama.cpp is never
recompiled here. The other dependencies come from the package index
(pip's HTTP cache makes later runs quick).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from app import __version__

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "speculators", "themes")
#: the environment as it was before the per-test XDG dirs (pip's cache lives under the real one)
ORIGINAL_ENV = dict(os.environ)
DATA_FILES = ("app/data/draftlight.desktop", "app/data/draftlight-terminal", "app/data/draftlight.command",
              "app/data/draftlight-app-launcher", "app/data/icons/draftlight.svg",
              *(f"app/data/icons/draftlight-{s}.png" for s in (48, 128, 256, 512)))


def _junk(rel: str) -> bool:
    return "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo"))


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_wheel_holds_the_packages_and_their_data_and_nothing_else(dists):
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    dist_info = f"draftlight-{__version__}.dist-info/"
    tops = {n.split("/", 1)[0] + "/" for n in names}
    assert tops == {f"{p}/" for p in PACKAGES} | {dist_info}, tops
    assert not any(n.startswith("tests/") or "conftest" in n or _junk(n) for n in names)
    # every file of the three packages on disk (data files included) is in the wheel
    on_disk = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
               if p.is_file() and not _junk(str(p.relative_to(ROOT)))}
    in_wheel = {n for n in names if not n.startswith(dist_info)}
    assert on_disk == in_wheel, (on_disk ^ in_wheel)
    for f in DATA_FILES:
        assert f in names, f
    z = zipfile.ZipFile(dists["wheel"])
    assert "draftlight = app.cli:entry" in z.read(dist_info + "entry_points.txt").decode()
    meta = z.read(dist_info + "METADATA").decode()
    assert "Requires-Dist: llama-cpp-python" in meta and "Requires-Dist: textual" in meta


def test_sdist_holds_sources_tests_packaging_and_ci(dists):
    with tarfile.open(dists["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for f in ("pyproject.toml", "README.md", ".ci/run", "packaging/README.md", "tests/conftest.py",
              "tests/test_packaging.py", "app/cli.py", "docs/measurements.md", "docs/chat.svg", *DATA_FILES):
        assert f in names, f
    assert not any(_junk(n) or n.startswith((".venv/", ".git/", "dist/")) for n in names)


def test_packaging_folder_points_at_the_shipped_files():
    """packaging/ holds the docs and links to the files the wheel ships (one copy of each)."""
    for link, target in [("linux/draftlight.desktop", "draftlight.desktop"),
                         ("linux/draftlight-terminal", "draftlight-terminal"),
                         ("macos/draftlight.command", "draftlight.command"),
                         ("icons/draftlight.svg", "icons/draftlight.svg")]:
        p = ROOT / "packaging" / link
        assert p.exists(), link
        assert p.read_bytes() == (ROOT / "app" / "data" / target).read_bytes()
    for script in ("draftlight-terminal", "draftlight.command", "draftlight-app-launcher"):
        assert os.access(ROOT / "app" / "data" / script, os.X_OK), script
    text = (ROOT / "packaging" / "README.md").read_text()
    for needle in ('CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on" pipx install . --force', "pipx reinstall",
                   "-DGGML_VULKAN=on", "draftlight rpc-server --host", "--allow-remote", "no authentication",
                   "-DGGML_NATIVE=on", "Metal", "install-desktop", "draftlight.command"):
        assert needle in text, needle


def pip_cache_dir() -> str | None:
    r = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True,
                       timeout=60, env=ORIGINAL_ENV)
    return r.stdout.strip() or None if r.returncode == 0 else None


def cached_llama_wheels() -> list[Path]:
    """Prebuilt llama-cpp-python wheels (the installed version) in pip's cache that fit this Python."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    version = metadata.version("llama-cpp-python")
    found = []
    extra = os.environ.get("DRAFTLIGHT_WHEELHOUSE")
    candidates = list(Path(extra).glob("llama_cpp_python-*.whl")) if extra else []
    r = subprocess.run([sys.executable, "-m", "pip", "cache", "list", "llama_cpp_python", "--format=abspath"],
                       capture_output=True, text=True, timeout=60, env=ORIGINAL_ENV)
    if r.returncode == 0:
        candidates += [Path(line.strip()) for line in r.stdout.splitlines() if line.strip().endswith(".whl")]
    ours = set(sys_tags())
    for whl in candidates:
        try:
            _, v, _, tags = parse_wheel_filename(whl.name)
        except Exception:
            continue
        if str(v) == version and tags & ours and whl.is_file():
            found.append(whl)
    return found


@pytest.mark.slow
def test_pipx_install_runs_outside_the_source_tree(dists, tmp_path, private_dirs):
    wheels = cached_llama_wheels()
    if not wheels:
        pytest.skip("no prebuilt llama-cpp-python wheel in pip's cache (or $DRAFTLIGHT_WHEELHOUSE): "
                    "installing would compile llama.cpp for ~9 minutes")
    pipx_home = tmp_path / "pipx"
    bin_dir = tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIPX_HOME=str(pipx_home), PIPX_BIN_DIR=str(bin_dir), PIPX_MAN_DIR=str(tmp_path / "man"),
               PIPX_DEFAULT_PYTHON=sys.executable)
    cache = pip_cache_dir()
    if cache:  # pip's real cache (the per-test XDG_CACHE_HOME would hide it): dependencies download once
        env["PIP_CACHE_DIR"] = cache
    find_links = " ".join(f"--find-links {shlex.quote(str(d))}" for d in sorted({w.parent for w in wheels}))
    # --only-binary: take llama-cpp-python's wheel or fail, never compile it
    pip_args = f"{find_links} --only-binary llama-cpp-python --no-compile"
    try:
        r = subprocess.run([sys.executable, "-m", "pipx", "install", "--pip-args", pip_args, str(dists["wheel"])],
                           env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        draftlight = bin_dir / "draftlight"
        assert draftlight.exists()
        venv = pipx_home / "venvs" / "draftlight"
        cfg = (venv / "pyvenv.cfg").read_text()
        assert "include-system-site-packages = false" in cfg  # a clean venv

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()

        def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
            res = subprocess.run([str(draftlight), *args], env=env, capture_output=True, text=True,
                                 timeout=timeout, cwd=elsewhere)
            assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
            assert "Traceback" not in res.stderr
            return res

        assert run("--version").stdout.strip() == f"draftlight {__version__}"

        report = json.loads(run("doctor", "--json").stdout)
        # the installed copy runs, not the source tree, with its own llama.cpp
        assert Path(report["draftlight"]["location"]).is_relative_to(venv)
        assert Path(report["llama_cpp"]["lib_dir"]).is_relative_to(venv)
        assert report["packages"]["llama-cpp-python"] == metadata.version("llama-cpp-python")
        assert report["devices"] and Path(report["paths"]["data"]["path"]).is_relative_to(private_dirs)
        assert report["default_model"]["exists"] is False

        gen = run("generate", "--prompt", "hi", "-n", "8", "--temp", "0", timeout=300)
        assert gen.stdout.strip()
        # the first run assembled and verified the default model into the (temp) data dir
        report = json.loads(run("doctor", "--json").stdout)
        assert report["default_model"]["exists"] and report["default_model"]["verified"]
    finally:
        shutil.rmtree(pipx_home, ignore_errors=True)  # a few hundred MB


def test_the_readme_test_command_runs_the_docstring_examples():
    """``python -m pytest`` (no arguments) collects every module's worked examples."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    doctests = {i.split("::")[0] for i in ids if not i.startswith("tests/")}
    for module in ("speculators/ngram_map.py", "speculators/controller/__init__.py", "app/lookup_store/store.py",
                   "themes/__init__.py"):
        assert module in doctests, (module, out.stdout[-2000:])
