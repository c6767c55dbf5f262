"""Processes import only what they run: a trainer or a constructor never loads the readers.

Every Dask process and every trainer rank holds its imports for its whole life; pyarrow and
fsspec cost each such process ~15 MB of its own. They are imported where Parquet is read or a
schema checked (a loader's first load or listing), not by the modules other roles import.
"""

import os
import subprocess
import sys

import pytest

HEAVY = ("pyarrow", "fsspec")


def _imported(module: str) -> set[str]:
    code = (f"import sys, {module}; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["mdata.trainer.loader", "workers.plugin", "workers.constructor",
                                    "mdata.sources", "mdata.spec"])
def test_module_does_not_import_the_readers(module):
    assert _imported(module) == set()


def test_the_reader_modules_still_import_them():
    assert _imported("mdata.sources.load") == set(HEAVY)


def test_lazy_names_resolve_and_unknown_names_fail():
    import mdata.sources as sources

    assert sources.load_chunk.__module__ == "mdata.sources.load"
    assert set(sources.__all__) <= set(dir(sources))
    with pytest.raises(AttributeError):
        sources.no_such_name  # noqa: B018


def test_defaults_survive_a_config_block_entered_before_mdata_config_was_imported():
    """``with dask.config.set({"mdata.x": ...})`` before ``mdata.config`` is imported removes
    the whole ``mdata`` section on exit; mdata's defaults must come back, not read as None."""
    code = (
        "import dask.config\n"
        "with dask.config.set({'mdata.trainer.timeout': '3s'}):\n"
        "    from mdata import config\n"
        "    assert config.seconds('trainer.timeout') == 3\n"
        "assert config.get('cluster.host') == '127.0.0.1', config.get('cluster.host')\n"
        "assert config.seconds('trainer.timeout') == 120\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_defaults_survive_that_block_beside_an_environment_variable():
    """A ``DASK_MDATA__...`` variable makes a partial ``mdata`` section before mdata is imported;
    the block's exit restores that partial section. The defaults must come back beside it, and
    the variable's value must stay (it read as None before: a TypeError in ``seconds``)."""
    code = (
        "import dask.config\n"
        "with dask.config.set({'mdata.trainer.timeout': '3s'}):\n"
        "    from mdata import config\n"
        "assert config.seconds('trainer.timeout') == 120\n"
        "assert config.get('trainer.host-agent') is True\n"
        "assert config.get('no-such-key', 5) == 5\n"
    )
    env = {**os.environ, "DASK_MDATA__TRAINER__HOST_AGENT": "true"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
