"""Module-aware cost models: several named costs per sample, and the pipeline stages each runs on.

Why: with pipeline parallelism a vision-language model does not spread a sample's cost evenly
over its stages. The vision encoder runs on the first stage, the language model's layers are
split over all of them, so an image-heavy micro-batch makes stage 0 the bottleneck even when
every micro-batch costs the same in total. A balancer that knows only the total cannot see that;
one that knows each module's cost and where it runs can balance every stage
(:func:`mdata.balance.balance_step_by_stage`).

::

    cost = ModuleCost({"llm": AttentionCost.for_model(3584, 28), "vision": ImagePatchCost(...)},
                      placement={"vision": "first", "llm": "all"}, layer_split=[6, 8, 8, 6])
    cost = ModuleCost.of(AttentionCost(), ImagePatchCost(), VideoCost())   # grouped by .module

A :class:`ModuleCost` is still a cost model: called as one it returns each sample's total (the
modules added up), which is what balancing without pipeline stages, reports and the per-rank
baseline use. Placement of a module (``placement[name]``):

* ``"all"``: split over every stage in proportion to ``layer_split`` (the language model's layers
  per stage; evenly when not given). The default for the module named ``"llm"``;
* ``"first"`` / ``"last"`` / an int ``k``: on that one stage. ``"first"`` is the default for every
  other module (encoders run before the language model);
* a list of per-stage weights (one per pipeline stage): that share on each stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np

from mdata.cost import CombinedCost, _model_name, evaluate_cost
from mdata.errors import PlanError

__all__ = ["ModuleCost", "Placement", "default_placement"]

#: Where a module runs: "all", "first", "last", a stage index, or per-stage weights.
Placement = Union[str, int, Sequence[float]]

_NAMED = ("all", "first", "last")


def default_placement(module: str) -> Placement:
    """The language model (``"llm"``) over all stages; any other module (an encoder) on stage 0."""
    return "all" if module == "llm" else "first"


def _weights(owner: str, values: Any, length: int | None = None) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise PlanError(f"{owner} must be a non-empty list of numbers, got {values!r:.80}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (
                np.isfinite(v) and v >= 0):
            raise PlanError(f"{owner} holds {v!r}; its entries must be finite numbers >= 0")
        out.append(float(v))
    if sum(out) <= 0:
        raise PlanError(f"{owner} is all zeros; give some stage a positive share")
    if length is not None and len(out) != length:
        raise PlanError(f"{owner} has {len(out)} entries but the mesh has pp={length} pipeline "
                        f"stages; give one per stage")
    return tuple(out)


def _check_placement(module: str, where: Any) -> Placement:
    owner = f"ModuleCost placement of {module!r}"
    if isinstance(where, str):
        if where not in _NAMED:
            raise PlanError(f"{owner} is {where!r}; use one of {list(_NAMED)}, a stage index or "
                            f"a list of per-stage weights")
        return where
    if isinstance(where, (int, np.integer)) and not isinstance(where, bool):
        if where < 0:
            raise PlanError(f"{owner} is stage {where}; stages count from 0")
        return int(where)
    return _weights(owner, where)


class ModuleCost:
    """Named per-module cost models and the pipeline stages each runs on (module docstring)."""

    __slots__ = ("_modules", "_placement", "_layer_split")

    def __init__(self, modules: Mapping[str, Callable[[np.ndarray, np.ndarray], np.ndarray]],
                 placement: Mapping[str, Placement] | None = None,
                 layer_split: Sequence[float] | None = None) -> None:
        if not isinstance(modules, Mapping) or not modules:
            raise PlanError("ModuleCost needs modules: a non-empty dict {name: cost model}, e.g. "
                            "{'llm': AttentionCost(), 'vision': ImagePatchCost()}")
        for name, model in modules.items():
            if not isinstance(name, str) or not name:
                raise PlanError(f"ModuleCost module names must be non-empty strings, got {name!r}")
            if not callable(model):
                raise PlanError(f"ModuleCost module {name!r}: {model!r:.80} is not a cost model "
                                "(a callable (num_tokens, num_patches) -> costs)")
        given = dict(placement or {})
        unknown = sorted(set(given) - set(modules))
        if unknown:
            raise PlanError(f"ModuleCost placement names unknown modules {unknown}; the modules "
                            f"are {list(modules)}")
        self._modules = dict(modules)
        self._placement = {k: _check_placement(k, v) for k, v in given.items()}
        self._layer_split = None if layer_split is None else _weights(
            "ModuleCost layer_split", layer_split)

    @classmethod
    def of(cls, *models: Callable, placement: Mapping[str, Placement] | None = None,
           layer_split: Sequence[float] | None = None) -> "ModuleCost":
        """Models grouped by their ``module`` (plain callables count as ``"llm"``); several in
        one module add up (:class:`~mdata.cost.CombinedCost`)."""
        groups: dict[str, list[Callable]] = {}
        for model in models:
            groups.setdefault(getattr(model, "module", None) or "llm", []).append(model)
        return cls({k: v[0] if len(v) == 1 else CombinedCost(*v) for k, v in groups.items()},
                   placement=placement, layer_split=layer_split)

    # -- as a value ------------------------------------------------------------------------------
    @property
    def modules(self) -> dict[str, Callable]:
        return dict(self._modules)

    @property
    def placement(self) -> dict[str, Placement]:
        """Every module's placement, defaults filled in."""
        return {k: self._placement.get(k, default_placement(k)) for k in self._modules}

    @property
    def layer_split(self) -> tuple[float, ...] | None:
        return self._layer_split

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._modules)

    @property
    def name(self) -> str:
        return "modules(" + ", ".join(f"{k}={_model_name(m)}" for k, m in self._modules.items()) + ")"

    def spec_args(self) -> dict[str, Any]:
        """The keyword arguments that rebuild it (what ``Plan.to_spec()`` writes)."""
        return {"modules": dict(self._modules),
                "placement": {k: list(v) if isinstance(v, tuple) else v
                              for k, v in self._placement.items()} or None,
                "layer_split": None if self._layer_split is None else list(self._layer_split)}

    def describe(self) -> str:
        """Each module's formula and placement, as plan reports print it."""
        parts = []
        for k, m in self._modules.items():
            text = m.describe() if hasattr(m, "describe") else _model_name(m)
            parts.append(f"{k} [{self.placement[k]}]: {text}")
        split = "" if self._layer_split is None else f"; layer split {list(self._layer_split)}"
        return "; ".join(parts) + split

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModuleCost) and self.spec_args() == other.spec_args()

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        return (f"ModuleCost({self._modules!r}, placement={self._placement!r}, "
                f"layer_split={self._layer_split!r})")

    def __getstate__(self) -> tuple:
        return self._modules, self._placement, self._layer_split

    def __setstate__(self, state: tuple) -> None:
        self._modules, self._placement, self._layer_split = state

    # -- costs -----------------------------------------------------------------------------------
    def module_costs(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray:
        """``costs[i, k]``: sample ``i``'s cost in module ``names[k]`` (each checked)."""
        cols = [evaluate_cost(m, num_tokens, num_patches) for m in self._modules.values()]
        return np.stack(cols, axis=1)

    def __call__(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray:
        """Each sample's total over the modules (balancing without pipeline stages uses it)."""
        costs = self.module_costs(num_tokens, num_patches)
        total = np.zeros(costs.shape[0], dtype=np.float64)
        for k in range(costs.shape[1]):
            total += costs[:, k]
        return total

    def stage_fractions(self, stages: int) -> np.ndarray:
        """``frac[k, s]``: the share of module ``names[k]``'s cost spent on stage ``s``."""
        p = int(stages)
        if p < 1:
            raise PlanError(f"stages must be >= 1, got {stages!r}")
        split = (np.full(p, 1.0 / p) if self._layer_split is None else
                 np.asarray(_weights("ModuleCost layer_split", self._layer_split, p)))
        split = split / split.sum()
        out = np.zeros((len(self._modules), p))
        for k, where in enumerate(self.placement.values()):
            name = self.names[k]
            if where == "all":
                out[k] = split
            elif isinstance(where, str) or isinstance(where, int):
                s = {"first": 0, "last": p - 1}.get(where, where)  # type: ignore[arg-type]
                if not 0 <= s < p:
                    raise PlanError(f"ModuleCost places {name!r} on stage {s}, but the mesh has "
                                    f"pp={p} stages (0..{p - 1})")
                out[k, s] = 1.0
            else:
                w = np.asarray(_weights(f"ModuleCost placement of {name!r}", where, p))
                out[k] = w / w.sum()
        return out

    def stage_costs(self, num_tokens: np.ndarray, num_patches: np.ndarray,
                    stages: int) -> np.ndarray:
        """``costs[i, s]``: sample ``i``'s cost on pipeline stage ``s`` (forward and backward)."""
        return self.module_costs(num_tokens, num_patches) @ self.stage_fractions(stages)
