"""The benchmark harness end to end: ``benchmarks/run.py --quick`` in a subprocess writes JSON.

Checks that the mixture and balance modules run on the real example corpus through the harness
and report their named figures side by side (mdata, baseline, ratio). Speeds are never asserted
here; what is asserted is the shape of the report and properties that hold on any machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_cli import quick_benchmarks


def assert_quiet(proc) -> None:
    """A run that starts an mdata cluster and trainers ends without a traceback: one at shutdown
    (a client reconnecting to a closed scheduler, a long poll cut by a closing comm) reads as a
    failure to whoever runs the benchmarks, and hides real ones."""
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    assert "Failed to reconnect" not in proc.stderr, proc.stderr[-6000:]


def test_quick_run_reports_mixture_and_balance_figures(tmp_path: Path) -> None:
    proc, figures = quick_benchmarks(tmp_path, "mixture", "balance", timeout=280)
    assert figures["_quick"] is True
    assert figures["_not_measured"] == {}

    for name in ("mixture.max_abs_deviation", "mixture.cumulative_abs_deviation",
                 "mixture.max_abs_deviation_vs_torchdata", "mixture.makespan_vs_lb"):
        assert isinstance(figures[name], float), name
        assert isinstance(figures[f"{name}.baseline"], float), name
    # Exact apportionment with carry: every step within 2 samples of its target, the run within one.
    assert figures["mixture.max_abs_deviation"] < 2 / 256
    # A makespan never beats its lower bound.
    assert figures["mixture.makespan_vs_lb"] >= 1.0
    assert figures["mixture.makespan_vs_lb.baseline"] >= 1.0

    # balance.py was fed the corpus's real token lengths (run.py passes workload.py's profile),
    # so its figures carry no "_synthetic" suffix.
    for context in ("16k", "32k"):
        assert figures[f"balance.makespan_vs_lb_{context}"] >= 1.0
        assert f"balance.speedup_vs_token_budget_baseline_{context}" in figures
    assert not [k for k in figures if k.endswith("_synthetic")]
    assert "| mixture.max_abs_deviation |" in proc.stdout


@pytest.mark.slow  # the longest quick run; `python benchmarks/run.py --only e2e --quick` runs it too
def test_quick_run_reports_end_to_end_figures(tmp_path: Path) -> None:
    """``--only e2e --quick``: both systems ran in processes, the at-scale simulation reported,
    and the ratio's breakdown multiplies back to the ratio."""
    proc, figures = quick_benchmarks(tmp_path, "e2e", timeout=300)  # with its control sweep
    assert figures["_not_measured"] == {}
    for name in ("e2e.tokens_per_s", "e2e.tokens_per_s.baseline", "e2e.tokens_per_s.ratio"):
        assert isinstance(figures[name], float) and figures[name] > 0, name
    product = 1.0
    for part in ("balance", "bubbles", "data_stalls", "flops_per_token"):
        product *= figures[f"e2e.breakdown.{part}"]
    assert abs(product - figures["e2e.tokens_per_s.ratio"]) < 1e-6 * product
    # At scale: every baseline in every regime, at equal work, and mdata beside the ideal.
    for regime in ("vlm", "text4k", "text8k", "text16k", "text32k", "video", "sources306"):
        for baseline in ("dataloader", "megatron", "local_best", "bridge"):
            assert figures[f"e2e.ratio.{baseline}.{regime}"] > 0
            assert 0.97 < figures[f"e2e.tokens_per_step_ratio.{baseline}.{regime}"] < 1.03
            assert figures[f"e2e.micro_batches.{baseline}.{regime}"] == \
                figures[f"e2e.micro_batches.mdata.{regime}"]
            # the quick run's one point of the loader-cores sweep (1 core per GPU)
            assert figures[f"e2e.cores_sweep.{regime}.1.ratio.{baseline}"] > 0
            assert 0 <= figures[f"e2e.cores_sweep.{regime}.1.stall.{baseline}"] < 1
        assert 0.97 < figures[f"e2e.tokens_per_step_ratio.{regime}"] < 1.03
        assert figures[f"e2e.vs_ideal.{regime}"] > 0
        # mdata pays its scheduler (measured here: the control benchmark did not run before)
        assert figures[f"e2e.scheduler_s_per_step.{regime}"] > 0
        assert figures[f"e2e.scheduler_stall_s_per_step.{regime}"] >= 0
    # The video regime's clips were decoded for real: their loader CPU was measured here.
    assert figures["e2e.loader_cpu_ms_per_sample.videos"] > 0
    # Work and bubbles are never negative; each system trained something.
    for side in ("mdata", "baseline"):
        assert figures[f"e2e.seconds.work.{side}"] > 0
        assert figures[f"e2e.seconds.bubble.{side}"] >= -1e-9


@pytest.mark.slow  # 60 s; `python benchmarks/run.py --only control --quick` runs the same (docs/benchmarks.md)
def test_quick_run_reports_control_plane_figures(tmp_path: Path) -> None:
    """``--only control --quick``: the real scheduler served real Loaders at two world sizes in
    each sweep, and the figures the scale docs quote are all there and physical."""
    proc, figures = quick_benchmarks(tmp_path, "control", timeout=330)
    assert figures["_not_measured"] == {}
    assert_quiet(proc)
    for n in (8, 24):
        assert figures[f"control.scheduler_cpu_ms_per_step_{n}"] > 0, n
        assert figures[f"control.scheduler_cpu_ms_per_step_dp{n}"] > 0, n
        assert figures[f"control.steps_per_s_{n}"] > 0, n
    for name in ("control.locate_p50_ms", "control.locate_p99_ms", "control.ack_ms_on_loop",
                 "control.ack_ms_on_loop_p99", "control.loop_blocked_ms_p99"):
        assert figures[name] >= 0, name
    assert figures["control.locate_p99_ms"] >= figures["control.locate_p50_ms"]
    # the loop's own holds are the lateness less its run-queue wait: never more than the lateness
    assert 0 <= figures["control.loop_held_ms_p99"] <= figures["control.loop_blocked_ms_p99"] + 1e-6
    assert figures["control.full_gc_ms"] > 0 and figures["control.full_gc_max_ms"] >= 0
    assert figures["control.max_ranks_at_1_step_per_s"] > 0
    # the fixed-DP worlds under broadcast_at("tp") (TP 1 at 8 ranks: the fixed-DP point itself)
    assert figures["control.scheduler_cpu_ms_per_step_24_bcast_tp"] > 0
    assert figures["control.max_ranks_at_1_step_per_s_bcast_tp"] > 0
    # what a host costs, measured directly, and in Dask's floor for one request
    assert figures["control.scheduler_cpu_us_per_host_step"] >= 0
    assert 0 < figures["control.dask_request_floor_us"] < 100_000
    assert figures["control.host_cost_in_requests"] >= 0
    assert figures["control.group_cost_in_requests_bcast_tp"] > 0
    # the ranks of a host share a client, so they asked where their batches are together
    assert figures["control.asks_per_request"] > 1
    assert figures["control.scheduler_cpu_ms_per_step_24_ranks_alone"] > 0
    assert figures["control.host_requests_cpu_ratio"] > 0
    # the per-rank part measured alone: every rank's tell taken (a refused one fails the run)
    assert 0 < figures["control.consume_us_per_rank"] < 10_000
    assert "| control.scheduler_cpu_us_per_rank_step |" in proc.stdout
