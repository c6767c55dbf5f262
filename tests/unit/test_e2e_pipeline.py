"""The e2e benchmark's pipelines: interleaved 1F1B, the balanced layer split, a step's fixed part."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.e2e_model import VLM, PipelineTimes, one_f_one_b
from benchmarks.e2e_pipeline import Fabric, fixed_seconds, interleaved_order, layer_split, pipeline_makespan


def _equal(m: int, p: int) -> PipelineTimes:
    return PipelineTimes(np.full((m, p), 1.0), np.full((m, p), 2.0))


@pytest.mark.parametrize("m,p", [(1, 1), (5, 3), (8, 4), (2, 4), (16, 8)])
def test_one_chunk_is_plain_one_f_one_b(m: int, p: int) -> None:
    rng = np.random.default_rng(m * 10 + p)
    f = rng.random((m, p))
    t = PipelineTimes(f, 2 * f * rng.random((m, p)))
    assert pipeline_makespan(t, 1) == pytest.approx(one_f_one_b(t))


@pytest.mark.parametrize("m,p,v", [(4, 4, 2), (8, 4, 2), (8, 2, 4), (12, 4, 3)])
def test_interleaving_cuts_the_bubble_by_the_chunk_count(m: int, p: int, v: int) -> None:
    # Narayanan et al. (2021): with v chunks per device the bubble is (p - 1) / v micro-batch times.
    assert pipeline_makespan(_equal(m, p), v) == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)
    assert pipeline_makespan(_equal(m, p), v) < pipeline_makespan(_equal(m, p), 1)


def test_interleaved_order_runs_every_operation_once() -> None:
    m, p, v = 8, 4, 2
    for d in range(p):
        ops = interleaved_order(m, p, v, d)
        assert sorted(ops) == sorted((f, i, c) for f in (True, False) for i in range(m) for c in range(v))
    with pytest.raises(ValueError, match="divisible"):
        interleaved_order(6, 4, 2, 0)


def test_layer_split_puts_fewer_layers_beside_the_vision_encoder() -> None:
    model = VLM(llm_layers=28)
    assert layer_split(model, 4, 0.0) == (7, 7, 7, 7)
    assert layer_split(model, 1, 5.0) == (28,)
    split = layer_split(model, 4, 5.0)
    assert sum(split) == 28 and split[0] < min(split[1:])


@pytest.mark.parametrize("pp,vit", [(2, 1.5), (3, 2.0), (3, 0.4), (4, 3.7)])
def test_layer_split_is_the_best_split_of_whole_layers(pp: int, vit: float) -> None:
    model = VLM(llm_layers=9)
    split = layer_split(model, pp, vit)
    best = min(max(c[0] + vit, *c[1:]) for c in itertools.product(range(10), repeat=pp)
               if sum(c) == 9 and min(c[1:]) >= 1)
    assert max(split[0] + vit, *split[1:]) == pytest.approx(best)


def test_fixed_seconds_by_hand() -> None:
    model = VLM(llm_params=8e9, llm_layers=8, vit_params=1e9)
    fabric = Fabric(bus_bytes_per_s=1e10, hbm_bytes_per_s=1e12, grad_bytes=4, param_bytes=2,
                    optimizer_bytes=30)
    # Stage 0 holds 2 layers (2e9) and the encoder (1e9) over tp 2: 1.5e9 parameters per GPU.
    ring = 7 / 8 * 1.5e9 * 6 / 1e10
    adam = 1.5e9 / 8 * 30 / 1e12
    got = fixed_seconds(model, (2, 3, 3), tp=2, dp=4, cp=2, fabric=fabric)
    assert got == pytest.approx(ring + adam)
    alone = fixed_seconds(model, (2, 3, 3), tp=2, dp=1, cp=1, fabric=fabric)
    assert alone == pytest.approx(1.5e9 * 30 / 1e12)  # no ring with one replica
