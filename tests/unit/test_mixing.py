"""Mixture schedules and the exact apportioner, through their public API."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdata.errors import PlanError
from mdata.mixing import (
    ExactApportioner,
    LinearRamp,
    MetricMixturePolicy,
    MetricsRecord,
    StagedMixture,
    StaticMixture,
    as_schedule,
    validate_weights,
)

NAMES = ("web", "code", "chat")


def test_static_mixture_normalises_in_plan_order():
    vec = StaticMixture({"chat": 1, "web": 3}).weights_vector(7, NAMES)
    assert vec.tolist() == [0.75, 0.0, 0.25]


@pytest.mark.parametrize(
    "weights, message",
    [
        ({"web": -1.0}, "weight of source 'web' is -1.0"),
        ({"web": float("nan")}, "weight of source 'web' is nan"),
        ({"web": float("inf")}, "weight of source 'web' is inf"),
        ({"web": 0.0, "code": 0}, "all weights are zero"),
        ({"books": 1.0}, "unknown source 'books'"),
        ({"web": "heavy"}, "weight of source 'web' is 'heavy', not a number"),
    ],
)
def test_validate_weights_rejects_bad_input(weights, message):
    with pytest.raises(PlanError, match=message):
        validate_weights(weights, NAMES)


def test_staged_mixture_is_piecewise_constant():
    sched = StagedMixture([(0, {"web": 1}), (10, {"code": 1}), (20, {"web": 1, "code": 1})])
    assert sched.weights_vector(9, NAMES).tolist() == [1, 0, 0]
    assert sched.weights_vector(10, NAMES).tolist() == [0, 1, 0]
    assert sched.weights_vector(19, NAMES).tolist() == [0, 1, 0]
    assert sched.weights_vector(1000, NAMES).tolist() == [0.5, 0.5, 0]
    assert sched.stage_at(15) == 1


@pytest.mark.parametrize(
    "stages, message",
    [
        ([], "at least one stage"),
        ([(5, {"web": 1})], "first stage must start at step 0"),
        ([(0, {"web": 1}), (0, {"code": 1})], "must be greater than the previous"),
        ([(0, {"web": -2})], "stage 0 .step 0.: weight of source 'web'"),
        ([("x", {"web": 1})], "start step 'x' must be an int"),
    ],
)
def test_staged_mixture_validation(stages, message):
    with pytest.raises(PlanError, match=message):
        StagedMixture(stages)


def test_linear_ramp_interpolates_and_clamps():
    ramp = LinearRamp(10, 20, {"web": 1}, {"code": 3})
    assert ramp.weights_vector(0, NAMES).tolist() == [1, 0, 0]
    assert ramp.weights_vector(15, NAMES).tolist() == [0.5, 0.5, 0]
    assert ramp.weights_vector(20, NAMES).tolist() == [0, 1, 0]
    assert ramp.weights_vector(99, NAMES).tolist() == [0, 1, 0]
    with pytest.raises(PlanError, match="end step 10 must be greater than start step 10"):
        LinearRamp(10, 10, {"web": 1}, {"code": 1})


def test_as_schedule_accepts_dicts_and_rejects_others():
    assert isinstance(as_schedule({"web": 1}), StaticMixture)
    with pytest.raises(PlanError, match="not list"):
        as_schedule([("web", 1)])


class LossChaser(MetricMixturePolicy):
    """Upweights 'code' once a reported loss exceeds a threshold; remembers the switch."""

    def __init__(self):
        super().__init__({"web": 1, "code": 1})
        self.switched_at = None

    def weights(self, step, metrics_history=(), **kwargs):
        if self.switched_at is None and any(r.metrics.get("loss", 0) > 2 for r in metrics_history):
            self.switched_at = step
        return {"web": 1, "code": 3} if self.switched_at is not None else {"web": 1, "code": 1}

    def state_dict(self):
        return {"switched_at": self.switched_at}

    def load_state_dict(self, state):
        self.switched_at = state["switched_at"]


def test_metric_policy_sees_history_and_keeps_state():
    policy = LossChaser()
    assert policy.stateful
    assert policy.weights_vector(0, NAMES, ()).tolist() == [0.5, 0.5, 0]
    history = (MetricsRecord(0, 0, {"loss": 2.5}),)
    assert policy.weights_vector(3, NAMES, history).tolist() == [0.25, 0.75, 0]
    fresh = LossChaser()
    fresh.load_state_dict(policy.state_dict())
    assert fresh.weights_vector(4, NAMES, ()).tolist() == [0.25, 0.75, 0]


def test_metric_policy_bad_weights_raise_plan_error():
    class Broken(MetricMixturePolicy):
        def weights(self, step, metrics_history=(), **kwargs):
            return {"web": float("nan")}

    with pytest.raises(PlanError, match="Broken at step 5: weight of source 'web' is nan"):
        Broken().weights_vector(5, NAMES)


def test_apportioner_static_counts_are_exact_over_time():
    app = ExactApportioner(3, 10)
    w = np.array([0.55, 0.3, 0.15])
    totals = np.zeros(3, np.int64)
    for _ in range(20):
        c = app.counts(w)
        assert c.sum() == 10
        totals += c
    assert totals.tolist() == [110, 60, 30]


def test_apportioner_state_round_trips():
    a = ExactApportioner(3, 7)
    w = np.array([0.5, 0.3, 0.2])
    for _ in range(5):
        a.counts(w)
    b = ExactApportioner(3, 7)
    b.load_state_dict(a.state_dict())
    assert [a.counts(w).tolist() for _ in range(9)] == [b.counts(w).tolist() for _ in range(9)]
    with pytest.raises(PlanError, match="2 carries for 3 sources"):
        b.load_state_dict({"carry": [0.0, 0.0]})


def _weights(n: int):
    # weights where every source either is off or expects at least one sample per step when N >= n
    return st.lists(st.floats(0.05, 1.0), min_size=n, max_size=n)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 6),
    extra=st.integers(0, 30),
    data=st.data(),
)
def test_apportioner_static_within_one_sample_of_target(n, extra, data):
    """Static weights with N*w_i >= 1: |C_i(s) - T_i(s)| < 1 at every step, and per window < 2."""
    N = n * 20 + extra
    raw = np.array(data.draw(_weights(n)))
    w = raw / raw.sum()
    w = np.where(N * w >= 1, w, 0)
    if w.sum() == 0:
        w[0] = 1
    w = w / w.sum()
    app = ExactApportioner(n, N)
    C = np.zeros(n)
    history_c, history_t = [np.zeros(n)], [np.zeros(n)]
    for s in range(1, 40):
        C += app.counts(w)
        T = s * N * w
        assert np.all(np.abs(C - T) < 1), (s, C, T)
        history_c.append(C.copy())
        history_t.append(T)
    for a in range(0, 40, 7):
        for b in range(a + 1, 40, 5):
            assert np.all(np.abs((history_c[b] - history_c[a]) - (history_t[b] - history_t[a])) < 2)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 6),
    N=st.integers(1, 40),
    steps=st.lists(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6), min_size=1, max_size=40),
)
def test_apportioner_arbitrary_weights_bounds(n, N, steps):
    """Any weights, changing every step: counts sum to N, are >= 0, never over-deliver by a whole
    sample, and never lag by two; a source's carry is all its state."""
    app = ExactApportioner(n, N)
    C = np.zeros(n)
    T = np.zeros(n)
    for raw in steps:
        w = np.array(raw[:n])
        if w.sum() == 0:
            w[0] = 1.0
        w = w / w.sum()
        c = app.counts(w)
        assert c.sum() == N and c.min() >= 0
        C += c
        T += N * w
        assert np.all(C - T < 1) and np.all(T - C < 2)
        np.testing.assert_allclose(app.carry, T - C, atol=1e-9)


def test_apportioner_rejects_wrong_weight_count():
    with pytest.raises(PlanError, match="got 2 weights for 3 sources"):
        ExactApportioner(3, 10).counts(np.array([0.5, 0.5]))
    with pytest.raises(PlanError, match="global batch must be >= 1"):
        ExactApportioner(3, 0)
    assert math.isclose(float(ExactApportioner(2, 5).carry.sum()), 0.0)


def test_largest_remainders_are_the_stable_sorts_first_k():
    """ExactApportioner's O(S) pick of the largest remainders is the same set as the first k of
    a stable argsort of their negation, ties (many equal remainders) to the lower index."""
    from mdata.mixing import _largest

    rng = np.random.default_rng(7)
    for trial in range(2000):
        n = int(rng.integers(1, 60))
        values = (rng.integers(-2, 4, n) / 2.0) if trial % 2 else rng.random(n)
        k = int(rng.integers(0, n + 2))
        got = _largest(values, k).tolist()
        assert len(got) == len(set(got)) == min(k, n)
        assert set(got) == set(np.argsort(-values, kind="stable")[:k].tolist())
