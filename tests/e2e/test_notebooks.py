"""The two notebooks run top to bottom in a fresh kernel, with small settings, and show what they
promise: plots and tables from the offline plan exploration; a live job's status, a sample's story
and a checkpoint equal to what the trainers consumed.

Notebooks are committed without outputs; this test executes them the documented way,
``scripts/render_notebooks.sh`` (``jupyter execute --output``, in the venv's own Python, checked
below), and reads what the executed copy keeps, so a stale API in a notebook or a broken render
command fails CI rather than a reader.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
RENDER = REPO / "scripts" / "render_notebooks.sh"
CELL_TIMEOUT_S = 180


def _check_kernel_is_this_python() -> None:
    """The 'python3' kernel must start this interpreter (the venv with mdata installed)."""
    argv0 = KernelSpecManager().get_kernel_spec("python3").argv[0]
    # jupyter_client replaces a bare 'python' (or pythonX / pythonX.Y) with sys.executable
    bare = {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}
    if argv0 not in bare and Path(argv0).resolve() != Path(sys.executable).resolve():
        pytest.fail(f"kernel 'python3' starts {argv0}, not this interpreter {sys.executable}; "
                    f"run `{sys.executable} -m ipykernel install --sys-prefix`")


def _execute(name: str, out: Path) -> nbformat.NotebookNode:
    """Render ``name`` into ``out`` with the documented command; the executed copy, which keeps
    every code cell's outputs (the committed notebook has none)."""
    _check_kernel_is_this_python()
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]  # as committed, before nbformat fills in
    assert all("id" in cell for cell in cells), f"{name} has cells without an id (nbformat 4.5 needs them)"
    committed = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in committed.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name} is committed with outputs"
    env = {**os.environ, "PYTHON": sys.executable, "MDATA_NB_CELL_TIMEOUT": str(CELL_TIMEOUT_S)}
    proc = subprocess.run(["bash", str(RENDER), "--out", str(out), str(NOTEBOOKS / name)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]  # the failing cell's traceback
    rendered = out / name
    assert proc.stdout.strip().endswith(f"wrote {rendered}"), proc.stdout[-2000:]
    nb = nbformat.read(rendered, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert len(code) == sum(cell.cell_type == "code" for cell in committed.cells)
    assert all(cell.execution_count for cell in code), "a code cell was not executed"
    assert sum(bool(cell.outputs) for cell in code) >= len(code) // 2, "the copy kept no outputs"
    return nb


def _outputs(nb: nbformat.NotebookNode) -> tuple[str, list[str], int]:
    """(all stdout text, all HTML outputs, number of PNG images)."""
    text, htmls, images = [], [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{out.ename}: {out.evalue}"
            if out.output_type == "stream" and out.name == "stdout":
                text.append(out.text)
            data = out.get("data", {})
            htmls.extend([data["text/html"]] if "text/html" in data else [])
            images += "image/png" in data
    return "".join(text), htmls, images


def test_explore_plan_notebook(example_corpus, monkeypatch, tmp_path):
    monkeypatch.setenv("MDATA_EXAMPLE_DATA", str(example_corpus))
    monkeypatch.setenv("MDATA_NB_STEPS", "24")
    monkeypatch.setenv("MDATA_NB_DP", "4")
    text, htmls, images = _outputs(_execute("explore_plan.ipynb", tmp_path))
    assert images == 5  # lengths, mixture, per-rank cost, baseline, staged variant
    assert any(h.startswith("<div><strong>mdata Plan</strong>") for h in htmls)
    assert any(h.startswith("<div><strong>simulation: 24 steps, mean max/LB") for h in htmls)
    assert sum("per-rank greedy packing (baseline)" in h for h in htmls) == 1
    assert sum("mdata balance (LPT + refinement)" in h for h in htmls) == 1
    for name in ("chat", "scenes", "books", "code", "captions", "videos"):
        assert re.search(rf"^{name} +\d+ ", text, re.M), f"no length row for {name}"
    deviation = re.search(r"in samples: ([\d.]+) in one step, ([\d.]+) cumulated", text)
    assert deviation and float(deviation.group(2)) < 1.0  # exact apportionment with carry
    ratios = re.search(r"mean makespan/LB ([\d.]+) vs ([\d.]+)", text)
    assert ratios and 1.0 <= float(ratios.group(1)) <= float(ratios.group(2))
    fingerprints = re.findall(r"plan: +([0-9a-f]{16})", text)
    assert len(fingerprints) == 2 and fingerprints[0] != fingerprints[1]
    for name in ("chat", "captions"):  # the profile table, then a layout of 8 loader cores
        assert re.search(rf"^{name} +32 +[\d.]+ ", text, re.M), f"no profile row for {name}"
    layout = re.search(r"pool layout for [\d.]+ steps/s x 64 samples/step \(ramp (start|end) "
                       r"\(step \d+\)\): (\d+) pools, (\d+) workers, (\d+) cores", text)
    assert layout and int(layout.group(4)) <= 8
    assert len(re.findall(r'^dask worker tcp://SCHEDULER:8786 .* --resources "pool_', text, re.M)) == int(layout.group(2))


@pytest.mark.cluster
def test_live_cluster_notebook(example_corpus, monkeypatch, tmp_path):
    monkeypatch.setenv("MDATA_EXAMPLE_DATA", str(example_corpus))
    monkeypatch.setenv("MDATA_NB_STEPS", "3")
    monkeypatch.delenv("MDATA_SCHEDULER", raising=False)
    text, htmls, _ = _outputs(_execute("live_cluster.ipynb", tmp_path))
    assert re.search(r"worker tcp://\S+: resources \{'pool_chat': 1, 'pool_code': 1\}", text)
    assert re.search(r"worker tcp://\S+: resources \{'mdata_constructor': 2\}", text)
    assert "consumed step (handle): 3 | failure: None" in text
    sample = re.search(r"rank 0, step 2 received \['([a-z]+/\d+/\d+)'", text)
    assert sample, text
    story = text[text.index(f"{sample.group(1)} in job 'notebook':"):]
    assert re.search(r"- loaded in chunk \d+ on worker tcp://", story)
    assert "- planned for step 2, DP rank 0, micro-batch" in story
    assert "- consumed at step 2 by trainer ranks [0]" in story
    assert '"step": 3,' in text
    assert "trainers' state_dict checkpoints equal the Planner's: True" in text
    tables = [h for h in htmls if h.startswith("<table><tr><th>step</th><th>chat</th>")]
    assert len(tables) == 1 and tables[0].count("<tr>") >= 1 + 3
