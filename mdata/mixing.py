"""Mixture schedules and exact apportionment of a global batch among sources.

A *mixture schedule* says which fraction of each step's global batch comes from each source. It is
an extension point shaped like distributed's plugins: subclass :class:`MixtureSchedule`, override
``weights``; hooks take keyword arguments and tolerate new ones. Three ready-made schedules cover
the common cases (:class:`StaticMixture`, :class:`StagedMixture` for curricula,
:class:`LinearRamp`), and :class:`MetricMixturePolicy` is the hook for mixtures that follow the
metrics trainers report (loss per source, ...).

Weights are fractions; the batch holds whole samples. :class:`ExactApportioner` turns the weights of
each step into integer counts that sum to the global batch ``N`` by largest remainder *with carry*:
it tracks the cumulative target ``T_i(s) = sum_t N * w_i(t)`` and keeps every source's cumulative
count ``C_i(s)`` within one sample of it, so long-run proportions are exact rather than only
expected, even when the weights change every step. Its whole state is one float per source (the
carry ``T_i - C_i``), which is what makes checkpoints tiny.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from mdata.errors import PlanError

__all__ = [
    "MetricsRecord",
    "MixtureSchedule",
    "StaticMixture",
    "StagedMixture",
    "LinearRamp",
    "MetricMixturePolicy",
    "ExactApportioner",
    "as_schedule",
    "validate_weights",
]


@dataclass(frozen=True)
class MetricsRecord:
    """One metrics report from a trainer: the step it concerns, the reporting rank, the values."""

    step: int
    rank: int
    metrics: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (what a checkpoint keeps of a policy's metrics)."""
        return {"step": int(self.step), "rank": int(self.rank),
                "metrics": {str(k): float(v) for k, v in self.metrics.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MetricsRecord":
        """The record :meth:`to_dict` wrote."""
        return cls(int(data["step"]), int(data["rank"]), dict(data["metrics"]))


def validate_weights(
    weights: Mapping[str, float], names: Sequence[str], *, where: str = "mixture"
) -> np.ndarray:
    """Check ``weights`` against the plan's source ``names`` and return them normalised.

    Returns a float64 vector in the order of ``names`` summing to 1; sources the mapping omits get
    weight 0. Raises :class:`PlanError` naming the offending source for an unknown source, a
    negative, NaN or infinite weight, or when every weight is zero.
    """
    index = {name: i for i, name in enumerate(names)}
    vector = np.zeros(len(names), dtype=np.float64)
    for name, value in weights.items():
        if name not in index:
            raise PlanError(
                f"{where}: unknown source {name!r}; the plan's sources are {list(names)} "
                "(add the source to the plan or remove it from the weights)"
            )
        try:
            w = float(value)
        except (TypeError, ValueError):
            raise PlanError(f"{where}: weight of source {name!r} is {value!r}, not a number") from None
        if not math.isfinite(w) or w < 0:
            raise PlanError(
                f"{where}: weight of source {name!r} is {w!r}; weights must be finite and >= 0"
            )
        vector[index[name]] = w
    total = float(vector.sum())
    if total <= 0.0:
        raise PlanError(
            f"{where}: all weights are zero; give at least one source a positive weight"
        )
    return vector / total


class MixtureSchedule:
    """Base of every mixture schedule: the weights of the sources at a step.

    Subclasses override :meth:`weights`. Hooks take keyword arguments and ``**kwargs`` so that new
    arguments can be added without breaking user subclasses. A schedule that keeps state between
    steps (for example one that follows reported metrics) sets ``stateful = True`` and implements
    :meth:`state_dict` / :meth:`load_state_dict`; that state goes into checkpoints.
    """

    #: True when weights depend on more than the step (metrics): the Planner then records the
    #: weights it used per planned step, so a resumed job reproduces them exactly.
    stateful: ClassVar[bool] = False

    def weights(
        self, step: int, metrics_history: Sequence[MetricsRecord] = (), **kwargs: Any
    ) -> Mapping[str, float]:
        """The (unnormalised) weights at ``step``; sources left out get weight 0."""
        raise NotImplementedError(f"{type(self).__name__} must implement weights(step, ...)")

    def sources(self) -> frozenset[str] | None:
        """Source names the schedule mentions (checked against the plan), or None if unknown."""
        return None

    def config(self) -> dict[str, Any]:
        """JSON-safe description that goes into the plan's fingerprint."""
        return {"class": f"{type(self).__module__}.{type(self).__qualname__}"}

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state to checkpoint; stateless schedules return ``{}``."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def weights_vector(
        self,
        step: int,
        names: Sequence[str],
        metrics_history: Sequence[MetricsRecord] = (),
    ) -> np.ndarray:
        """Normalised float64 weights in the order of ``names`` (validated with PlanError).

        The default calls :meth:`weights` and validates the result; built-in schedules override it
        with cached vectors because the Planner calls it once per step for up to thousands of
        sources.
        """
        return validate_weights(
            self.weights(step, metrics_history), names, where=f"{type(self).__name__} at step {step}"
        )


class StaticMixture(MixtureSchedule):
    """The same weights at every step, e.g. ``StaticMixture({"web": 0.7, "code": 0.3})``."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        if not isinstance(weights, Mapping) or not weights:
            raise PlanError(f"StaticMixture needs a non-empty mapping source -> weight, got {weights!r}")
        validate_weights(weights, list(weights), where="StaticMixture")
        self._weights = {str(k): float(v) for k, v in weights.items()}
        self._cache: tuple[tuple[str, ...], np.ndarray] | None = None

    def weights(self, step: int, metrics_history: Sequence[MetricsRecord] = (), **kwargs: Any):
        return dict(self._weights)

    def sources(self) -> frozenset[str]:
        return frozenset(self._weights)

    def config(self) -> dict[str, Any]:
        return {"class": "StaticMixture", "weights": dict(sorted(self._weights.items()))}

    def weights_vector(self, step, names, metrics_history=()):
        key = tuple(names)
        if self._cache is None or self._cache[0] != key:
            vector = validate_weights(self._weights, key, where="StaticMixture")
            vector.flags.writeable = False  # shared with every step that uses it
            self._cache = (key, vector)
        return self._cache[1]

    def __repr__(self) -> str:
        return f"StaticMixture({self._weights!r})"


class StagedMixture(MixtureSchedule):
    """Piecewise-constant weights: a curriculum of stages ``[(start_step, weights), ...]``.

    The first stage must start at step 0; stage starts must increase strictly. The weights of a
    stage hold from its start step until the next stage starts.
    """

    def __init__(self, stages: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        stages = list(stages)
        if not stages:
            raise PlanError("StagedMixture needs at least one stage: [(0, {source: weight}), ...]")
        starts: list[int] = []
        for i, stage in enumerate(stages):
            try:
                start, weights = stage
            except (TypeError, ValueError):
                raise PlanError(
                    f"StagedMixture stage {i} is {stage!r}; expected (start_step, {{source: weight}})"
                ) from None
            if not isinstance(start, (int, np.integer)) or isinstance(start, bool) or start < 0:
                raise PlanError(f"StagedMixture stage {i}: start step {start!r} must be an int >= 0")
            if starts and start <= starts[-1]:
                raise PlanError(
                    f"StagedMixture stage {i}: start step {start} must be greater than the previous "
                    f"stage's start {starts[-1]}"
                )
            validate_weights(weights, list(weights), where=f"StagedMixture stage {i} (step {start})")
            starts.append(int(start))
        if starts[0] != 0:
            raise PlanError(f"StagedMixture: the first stage must start at step 0, not {starts[0]}")
        self._starts = starts
        self._stages = [{str(k): float(v) for k, v in w.items()} for _, w in stages]
        self._cache_key: tuple[str, ...] | None = None
        self._vectors: list[np.ndarray] = []

    def stage_at(self, step: int) -> int:
        """Index of the stage in force at ``step``."""
        return bisect_right(self._starts, step) - 1

    def weights(self, step: int, metrics_history: Sequence[MetricsRecord] = (), **kwargs: Any):
        return dict(self._stages[self.stage_at(step)])

    def sources(self) -> frozenset[str]:
        return frozenset(name for stage in self._stages for name in stage)

    def config(self) -> dict[str, Any]:
        return {
            "class": "StagedMixture",
            "stages": [[s, dict(sorted(w.items()))] for s, w in zip(self._starts, self._stages)],
        }

    def weights_vector(self, step, names, metrics_history=()):
        key = tuple(names)
        if self._cache_key != key:
            self._vectors = [
                validate_weights(w, key, where=f"StagedMixture stage starting at step {s}")
                for s, w in zip(self._starts, self._stages)
            ]
            for vector in self._vectors:
                vector.flags.writeable = False
            self._cache_key = key
        return self._vectors[self.stage_at(step)]

    def __repr__(self) -> str:
        return f"StagedMixture({list(zip(self._starts, self._stages))!r})"


class LinearRamp(MixtureSchedule):
    """Weights that move linearly from ``from_weights`` at ``start`` to ``to_weights`` at ``end``.

    Before ``start`` the weights are ``from_weights``, from ``end`` on ``to_weights``. Both ends
    are normalised first, so the interpolated weights always sum to one.
    """

    def __init__(
        self,
        start: int,
        end: int,
        from_weights: Mapping[str, float],
        to_weights: Mapping[str, float],
    ) -> None:
        for label, value in (("start", start), ("end", end)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise PlanError(f"LinearRamp: {label} step {value!r} must be an int >= 0")
        if end <= start:
            raise PlanError(f"LinearRamp: end step {end} must be greater than start step {start}")
        names = sorted(set(from_weights) | set(to_weights))
        self._names = tuple(names)
        self._from = validate_weights(from_weights, names, where="LinearRamp from_weights")
        self._to = validate_weights(to_weights, names, where="LinearRamp to_weights")
        self.start, self.end = int(start), int(end)
        self._raw = ({str(k): float(v) for k, v in from_weights.items()},
                     {str(k): float(v) for k, v in to_weights.items()})
        self._cache: tuple[tuple[str, ...], np.ndarray, np.ndarray] | None = None

    def _fraction(self, step: int) -> float:
        return min(1.0, max(0.0, (step - self.start) / (self.end - self.start)))

    def weights(self, step: int, metrics_history: Sequence[MetricsRecord] = (), **kwargs: Any):
        f = self._fraction(step)
        mixed = (1.0 - f) * self._from + f * self._to
        return {name: float(w) for name, w in zip(self._names, mixed)}

    def sources(self) -> frozenset[str]:
        return frozenset(self._names)

    def config(self) -> dict[str, Any]:
        return {"class": "LinearRamp", "start": self.start, "end": self.end,
                "from": dict(sorted(self._raw[0].items())), "to": dict(sorted(self._raw[1].items()))}

    def weights_vector(self, step, names, metrics_history=()):
        key = tuple(names)
        if self._cache is None or self._cache[0] != key:
            self._cache = (
                key,
                validate_weights(self._raw[0], key, where="LinearRamp from_weights"),
                validate_weights(self._raw[1], key, where="LinearRamp to_weights"),
            )
        f = self._fraction(step)
        return (1.0 - f) * self._cache[1] + f * self._cache[2]

    def __repr__(self) -> str:
        return f"LinearRamp({self.start}, {self.end}, {self._raw[0]!r}, {self._raw[1]!r})"


class MetricMixturePolicy(MixtureSchedule):
    """Hook for mixtures driven by the metrics trainers report (e.g. loss per source).

    Subclass it and implement ``weights(step, metrics_history)``; ``metrics_history`` holds the
    last ``history_size`` :class:`MetricsRecord` reports, oldest first. Keep any other state in
    attributes and expose it through :meth:`state_dict` / :meth:`load_state_dict` (JSON-safe), so
    checkpoints carry it. The Planner asks for the weights of a step when that step enters its
    planning window and records them, so a resumed job replays exactly the weights the
    uninterrupted job used.
    """

    stateful: ClassVar[bool] = True
    #: How many recent metrics reports the Planner keeps (and checkpoints) for this policy.
    history_size: ClassVar[int] = 64

    def __init__(self, initial_weights: Mapping[str, float] | None = None) -> None:
        if initial_weights is not None:
            validate_weights(initial_weights, list(initial_weights), where=type(self).__name__)
        self.initial_weights = None if initial_weights is None else dict(initial_weights)

    def sources(self) -> frozenset[str] | None:
        return None if self.initial_weights is None else frozenset(self.initial_weights)

    def config(self) -> dict[str, Any]:
        base = super().config()
        if self.initial_weights is not None:
            base["initial_weights"] = dict(sorted(self.initial_weights.items()))
        return base


def as_schedule(mixture: MixtureSchedule | Mapping[str, float]) -> MixtureSchedule:
    """Accept a schedule or a plain ``{source: weight}`` dict (a static mixture)."""
    if isinstance(mixture, MixtureSchedule):
        return mixture
    if isinstance(mixture, Mapping):
        return StaticMixture(mixture)
    raise PlanError(
        f"a mixture must be a dict {{source: weight}} or a MixtureSchedule, not {type(mixture).__name__}"
    )


class ExactApportioner:
    """Integer per-source counts per step that sum to ``global_batch``, exact in the long run.

    Each call of :meth:`counts` adds ``global_batch * w_i`` to every source's cumulative target and
    hands out whole samples so that each source's cumulative count stays within one sample of its
    target: the desired count ``d_i = N*w_i + carry_i`` is rounded down, the remaining samples go to
    the largest fractional parts (ties to the lower source index, so the result is the same in
    every process), and the new carry is ``d_i - count_i``. A source whose target is behind what it
    already received (negative ``d_i``) gets nothing and keeps its debt as carry.
    """

    def __init__(self, num_sources: int, global_batch: int) -> None:
        if num_sources < 1:
            raise PlanError(f"ExactApportioner needs at least one source, got {num_sources}")
        if global_batch < 1:
            raise PlanError(f"global batch must be >= 1 sample, got {global_batch}")
        self.num_sources = int(num_sources)
        self.global_batch = int(global_batch)
        self.carry = np.zeros(self.num_sources, dtype=np.float64)

    def counts(self, weights: np.ndarray) -> np.ndarray:
        """Counts (int64, summing to ``global_batch``) for the next step; advances the carry."""
        counts, carry = self.preview(weights)
        self.carry = carry
        return counts

    def preview(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The counts and new carry of the next step, without advancing."""
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (self.num_sources,):
            raise PlanError(
                f"ExactApportioner: got {weights.shape[0] if weights.ndim else 0} weights for "
                f"{self.num_sources} sources"
            )
        n = self.global_batch
        desired = n * weights + self.carry
        base = np.maximum(np.floor(desired), 0.0)
        remaining = n - int(base.sum())
        if remaining > 0:
            frac = desired - base
            frac[desired < 0] = -1.0  # debtors never get a bonus while others can take it
            base[_largest(frac, remaining)] += 1.0
        elif remaining < 0:
            # Only reachable when many sources carry debts at once: take the surplus back from
            # the smallest fractional parts, which moves the fewest targets furthest.
            frac = np.where(base > 0, desired - base, np.inf)
            order = np.argsort(frac, kind="stable")
            base[order[:-remaining]] -= 1.0
        counts = base.astype(np.int64)
        return counts, desired - base

    def state_dict(self) -> dict[str, Any]:
        """The carries (JSON-safe): a resumed job keeps every source within one sample of its
        cumulative target, as if it had never stopped."""
        return {"carry": [float(c) for c in self.carry]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the carries :meth:`state_dict` returned (one per source, or PlanError)."""
        carry = np.asarray(state["carry"], dtype=np.float64)
        if carry.shape != (self.num_sources,):
            raise PlanError(
                f"apportioner state has {carry.shape[0]} carries for {self.num_sources} sources"
            )
        self.carry = carry.copy()


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values, ties to the lower index: the first ``k`` of a stable
    argsort of ``-values`` as a set, in O(n) (that sort was most of apportioning 10k sources)."""
    n = values.size
    if k <= 0 or k >= n:
        return np.arange(min(max(k, 0), n))
    kth = np.partition(values, n - k)[n - k]  # the k-th largest value
    above = np.flatnonzero(values > kth)
    return np.concatenate([above, np.flatnonzero(values == kth)[: k - above.size]])
