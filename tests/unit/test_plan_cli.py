"""`mdata plan show` and `mdata plan simulate` on a plan file of the real example corpus."""

from __future__ import annotations

import re

import pytest

from mdata.cli import main
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.mixing import LinearRamp
from mdata.plan import Plan
from mdata.planner import simulate


@pytest.fixture(scope="module")
def plan_file(example_corpus, tmp_path_factory):
    from mdata.data.example import example_sources

    sources = example_sources(example_corpus)
    names = [s.name for s in sources]
    plan = (Plan(sources)
            .mix(LinearRamp(2, 8, {n: 1.0 for n in names}, {"code": 3.0, "chat": 1.0}))
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=2, max_tokens=4096, global_batch=24)
            .distribute(ClientPlaceTree(dp=3)).special_tokens(image_token_id=100_277).seed(5))
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    plan.to_file(path)
    return plan, path


def test_show_prints_every_source_and_setting(plan_file, capsys):
    plan, path = plan_file
    assert main(["plan", "show", str(path)]) == 0
    out = capsys.readouterr().out
    for src in plan.sources:
        row = re.search(rf"^\d+\s+{src.name}\s+parquet\s+256\s+0\.\d+\s+(\w+)\s+(\S+)$", out, re.M)
        assert row is not None, out
        assert row.group(1) == type(src.transform).__name__ and row.group(2) == src.url
    assert "linear ramp from step 2 to step 8" in out
    assert "24 samples/step, >= 2 micro-batches per DP rank of <= 4096 tokens" in out
    assert f"fingerprint     {plan.fingerprint()}" in out and "image_token_id=100277" in out


def test_simulate_prints_the_figures_of_the_planners_own_simulation(plan_file, capsys, tmp_path):
    from mdata.metadata import read_metadata

    plan, path = plan_file
    assert main(["plan", "simulate", str(path), "--steps", "12", "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("simulated 12 steps: 24 samples per step over 3 DP ranks")
    expected = simulate(plan, 12, read_metadata(plan.sources))
    for j, name in enumerate(expected.names):
        realised = f"{expected.realized_weights[:, j].mean():.3f}"
        assert re.search(rf"^{name}\s+\S+\s+{realised}\s", out, re.M), (name, out)
    first = expected.to_records()[0]
    counts = r"\s+".join(str(first[f"count/{n}"]) for n in expected.names)
    assert re.search(rf"^0\s+\S+\s+\S+\s+{first['max_over_lower_bound']:.3f}\s+{counts}$", out, re.M), out
    assert "... 2 more steps" in out
    assert (tmp_path / "plots" / "mixture.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "balance.png").stat().st_size > 1000


def test_plan_commands_fail_with_one_line_naming_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [web]\nmixture: {type: static, weights: {code: 1}}\n")
    assert main(["plan", "show", str(bad)]) == 2
    assert f"mdata: error: plan file {str(bad)!r}, line 2: mixture names unknown sources ['code']" in \
        capsys.readouterr().err
    names = tmp_path / "names.yaml"
    names.write_text("sources: [web]\nmixture: {type: static, weights: {web: 1}}\n"
                     "balance: {micro_batches: 1, max_tokens: 64, global_batch: 4}\n")
    assert main(["plan", "simulate", str(names), "--steps", "2"]) == 2
    assert "sources ['web'] are names only" in capsys.readouterr().err
