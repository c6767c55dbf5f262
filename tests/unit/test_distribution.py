"""mdata as installed: its extras and their hints, the core without them, and the two Dask-side
packages with generic names, which another package of the same name must not replace.

The shadowing cases put a real second package called ``workers`` (or ``scheduler_plugins``)
first on ``PYTHONPATH`` of a fresh interpreter, the way a project folder or another installed
distribution would come first, and check that mdata refuses it, naming both locations, before the
foreign code runs. The installed-wheel side (files replaced by another distribution) is in
tests/e2e/test_user_install.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from distributed.protocol.pickle import dumps

from mdata.distribution import DISTRIBUTION, EXTRAS, install_hint

REPO = Path(__file__).resolve().parents[2]
FOREIGN_RAN = "FOREIGN PACKAGE CODE RAN"


def _run(code: str, *path_first: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``path_first`` ahead of this checkout on PYTHONPATH,
    from a directory that holds neither."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path_first), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=path_first[0] if path_first else "/")


def _foreign(tmp_path: Path, name: str) -> Path:
    """A folder holding a real, unrelated package called ``name`` that says when its code runs."""
    root = tmp_path / f"foreign-{name}"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"print({FOREIGN_RAN!r})\nPOOL_SIZE = 4\n")
    return root


def _refused(proc: subprocess.CompletedProcess, name: str, foreign: Path) -> str:
    """The last line of a run that failed with PackageShadowedError naming both locations."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert FOREIGN_RAN not in proc.stdout, "the foreign package's code ran"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mdata.errors.PackageShadowedError: "), proc.stderr[-3000:]
    assert f"the package {name!r} is found at {foreign / name / '__init__.py'} first" in last, last
    assert f"ships its own at {REPO / name / '__init__.py'}" in last, last
    return last


def test_every_extra_of_the_distribution_has_a_hint_and_the_name_is_ours():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "mdata-orchestrator"
    assert set(project["optional-dependencies"]) == set(EXTRAS) | {"bench"}  # bench: benchmarks/
    assert install_hint("s3") == "pip install 'mdata-orchestrator[s3]'"
    with pytest.raises(ValueError, match="unknown extra 'gpu'"):
        install_hint("gpu")
    core = " ".join(project["dependencies"]).lower()
    for optional in ("s3fs", "pillow", "bokeh", "matplotlib", "av>", "pytest", "hypothesis", "moto"):
        assert optional not in core, f"{optional} is in the core dependencies"


def test_a_workers_package_first_on_the_path_is_refused_before_the_planner_imports_it(tmp_path):
    foreign = _foreign(tmp_path, "workers")
    _refused(_run("import scheduler_plugins.planner", foreign), "workers", foreign)


def test_the_worker_plugin_refuses_a_foreign_workers_package_where_it_is_unpickled(tmp_path):
    """A Dask worker unpickles the plugin the Planner sends (Worker.plugin_add): that is where a
    worker whose ``workers`` is another package's finds out, in a clear error."""
    import pickle

    from workers.plugin import MdataWorkerPlugin

    payload = dumps(MdataWorkerPlugin())
    assert type(pickle.loads(payload)) is MdataWorkerPlugin  # unshadowed: mdata's own plugin
    (tmp_path / "plugin.pickle").write_bytes(payload)
    foreign = _foreign(tmp_path, "workers")
    code = f"import pickle; pickle.loads(open({str(tmp_path / 'plugin.pickle')!r}, 'rb').read())"
    _refused(_run(code, foreign), "workers", foreign)


@pytest.mark.parametrize("name", ["scheduler_plugins", "workers"])
def test_the_driver_refuses_to_start_a_cluster_whose_scheduler_would_import_another_package(tmp_path, name):
    foreign = _foreign(tmp_path, name)
    last = _refused(_run("from mdata.driver import start_cluster; start_cluster([])", foreign),
                    name, foreign)
    assert "take the folder that holds that" in last and "off sys.path or PYTHONPATH" in last


def test_the_core_runs_without_the_extras_and_each_feature_names_its_extra():
    """Every process's modules import with s3fs, Pillow, Bokeh and matplotlib unimportable (as in
    a plain ``pip install mdata-orchestrator``); what needs one says which extra installs it."""
    code = r"""
import logging, sys
for name in ("s3fs", "PIL", "bokeh", "matplotlib"):
    sys.modules[name] = None  # import of NAME halted: as if not installed
logging.basicConfig(level=logging.WARNING, format="%(message)s")
import numpy as np
import mdata.cli, mdata.data.example, mdata.driver, mdata.plan, mdata.sources, mdata.trainer
import scheduler_plugins.planner, workers.plugin
from mdata.errors import ExampleDataError, PlanError, SourceError
from mdata.sources import DecodeImageCaption, Source, list_shards
from mdata.sources.transforms import ChunkContext
from scheduler_plugins.dashboard.pages import register_pages

def says(call, error):
    try:
        call()
    except error as exc:
        print(exc)
    else:
        raise AssertionError(f"{call} did not raise {error}")

says(lambda: list_shards(Source("web", "s3://bucket/web/*.parquet")), SourceError)
context = ChunkContext(source="captions", shard=0, shard_path="/data/c-0.parquet", rows=np.arange(1))
says(lambda: DecodeImageCaption()({"image": [b"x"], "caption": ["a cat"]}, context=context), SourceError)
says(lambda: mdata.data.example.build_example_corpus("/nonexistent/corpus"), ExampleDataError)
from mdata.plan_plots import write_plots
says(lambda: write_plots(None, "/nonexistent/plots"), PlanError)
print("pages registered:", register_pages({}))
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0].startswith("source 'web': cannot open URL 's3://bucket/web/*.parquet': ImportError")
    assert out[0].endswith(f"(s3:// needs s3fs, the s3 extra: {install_hint('s3')})")
    assert out[1] == ("source 'captions', shard '/data/c-0.parquet': decoding images needs Pillow, "
                      f"which is not installed: {install_hint('images')}")
    assert out[2] == f"building the example corpus: decoding images needs Pillow, which is not installed: {install_hint('images')}"
    assert out[3] == f"--plots needs matplotlib: {install_hint('plots')}"
    assert out[4:] == ["pages registered: []"]
    warning = [line for line in proc.stderr.splitlines() if "dashboard pages not registered" in line]
    assert warning and install_hint("dashboard") in warning[-1], proc.stderr[-3000:]


def test_no_install_hint_names_the_other_projects_mdata():
    """`pip install mdata` would install an unrelated project from the index."""
    wrong = re.compile(r"pip install [\"']?(?:-\S+ )*mdata(?![\w-])")
    places = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "notebooks").glob("*.ipynb")]
    for folder in ("mdata", "scheduler_plugins", "workers", "benchmarks", "scripts"):
        places += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh", ".md", ".yaml")]
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in places
            for n, line in enumerate(p.read_text().splitlines(), 1) if wrong.search(line)]
    assert not hits, "\n".join(hits)
    assert wrong.search("pip install 'mdata[plots]'") and not wrong.search(install_hint("plots"))
