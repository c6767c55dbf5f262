"""Per-sample cost models: how much GPU time one sample costs a trainer rank.

Balancing needs a number per sample that is additive over the documents packed into a rank's
micro-batches. With variable-length (``cu_seqlens``) attention, a packed sequence of documents of
lengths ``l_1..l_k`` costs ``sum_i (a*l_i^2 + b*l_i)``: the quadratic attention term is per
document, the linear layers are per token. Token count alone is therefore a poor proxy: one 16k
document costs up to 16x more attention than sixteen 1k documents with the same tokens.

A cost model is any callable ``(num_tokens, num_patches) -> float64 array`` of the same length (a
plugin point: users can pass their own function). The classes here are frozen, picklable values with
a ``name`` and ``describe()`` so a Plan can show them in Jupyter. :func:`evaluate_cost` calls any
model and checks its output, so a faulty plugin fails with a message that names it.

Each built-in model also names the *module* of the network its cost is spent in (``module``:
``"llm"`` for :class:`AttentionCost`, ``"vision"`` for :class:`ImagePatchCost` and
:class:`VideoCost`): with pipeline parallelism the vision encoder runs on the first stage only,
so :class:`~mdata.module_cost.ModuleCost` keeps the modules' costs apart and says which stages
each runs on, and the balancer balances every stage (docs/concepts.md, "Balancing by module").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from mdata.errors import PlanError

__all__ = [
    "AttentionCost",
    "CombinedCost",
    "CostModel",
    "ImagePatchCost",
    "VideoCost",
    "cost_unit",
    "evaluate_cost",
]

#: Hidden size the default :class:`AttentionCost` is calibrated for (a 7B-class model).
DEFAULT_HIDDEN = 4096


@runtime_checkable
class CostModel(Protocol):
    """The shape of a cost model: per-sample cost from token and image-patch counts."""

    def __call__(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray: ...


#: What a cost axis says when the cost model is not calibrated to GPU time.
RELATIVE = "relative cost"


def cost_unit(model: Callable) -> str:
    """The unit a dashboard or report labels ``model``'s costs with: its ``unit`` attribute when it
    declares one (a model fitted to measured step times sets ``unit = "GPU-ms"``), else
    :data:`RELATIVE`: the built-in models' coefficients only fix ratios between samples, which is
    all balancing needs. A :class:`CombinedCost` has a unit when every part declares the same."""
    if isinstance(model, CombinedCost):
        units = {cost_unit(m) for m in model.models}
        return units.pop() if len(units) == 1 else RELATIVE
    unit = getattr(model, "unit", None)
    return unit if isinstance(unit, str) and unit.strip() else RELATIVE


def _model_name(model: Callable) -> str:
    return getattr(model, "name", None) or getattr(model, "__name__", None) or type(model).__name__


def _as_float(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def evaluate_cost(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray],
    num_tokens: np.ndarray,
    num_patches: np.ndarray | None = None,
) -> np.ndarray:
    """Call ``model`` and check that it returned one finite, non-negative float per sample.

    ``num_patches`` defaults to zeros (text-only samples). Raises :class:`PlanError` naming the
    model and the first offending sample, so a buggy user-supplied cost function is easy to find.
    """
    tokens = np.asarray(num_tokens)
    patches = np.zeros(tokens.shape, np.int64) if num_patches is None else np.asarray(num_patches)
    if tokens.shape != patches.shape or tokens.ndim != 1:
        raise PlanError(
            f"cost model {_model_name(model)!r}: num_tokens and num_patches must be 1-d arrays of "
            f"the same length, got shapes {tokens.shape} and {patches.shape}"
        )
    out = np.asarray(model(tokens, patches), dtype=np.float64)
    if out.shape != tokens.shape:
        raise PlanError(
            f"cost model {_model_name(model)!r} returned shape {out.shape} for {tokens.shape[0]} "
            f"samples; it must return one cost per sample"
        )
    bad = ~np.isfinite(out) | (out < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise PlanError(
            f"cost model {_model_name(model)!r} returned {float(out[i])} for sample {i} "
            f"(num_tokens={tokens[i]}, num_patches={patches[i]}); costs must be finite and >= 0"
        )
    return out


def _check_coefficient(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PlanError(f"{owner}: {name} must be a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or value < 0:
        raise PlanError(f"{owner}: {name} must be finite and >= 0, got {value}")
    return value


@dataclass(frozen=True)
class AttentionCost:
    """Transformer cost of one text sequence of ``l`` tokens: ``a*l**2 + b*l``.

    Calibration: per layer and token, the linear layers (QKV, output projection, 4x MLP) cost
    about ``24*h^2`` forward FLOPs and attention scores plus the weighted sum cost ``4*h*l``,
    halved by the causal mask. So for hidden size ``h`` and ``L`` layers, ``a = 2*h*L`` and
    ``b = 24*h^2*L``; only the ratio ``b/a = 12*h`` matters for balancing, which is why the default
    is ``a=1, b=12*4096`` (a 4096-hidden model: attention dominates past about 49k tokens, and is a
    quarter of the cost of a 16k document). Use :meth:`for_model` for other sizes, or fit ``a`` and
    ``b`` to measured step times of packed sequences of different document lengths. ``b=0`` gives
    pure attention cost, the worst case for imbalance.
    """

    a: float = 1.0
    b: float = 12.0 * DEFAULT_HIDDEN

    def __post_init__(self) -> None:
        object.__setattr__(self, "a", _check_coefficient("AttentionCost", "a", self.a))
        object.__setattr__(self, "b", _check_coefficient("AttentionCost", "b", self.b))

    @classmethod
    def for_model(cls, hidden: int, layers: int, *, causal: bool = True) -> "AttentionCost":
        """Forward-FLOP coefficients of a dense transformer with ``hidden`` size and ``layers``."""
        for name, value in (("hidden", hidden), ("layers", layers)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise PlanError(f"AttentionCost.for_model: {name} must be an int >= 1, got {value!r}")
        attention = (2.0 if causal else 4.0) * hidden * layers
        return cls(a=attention, b=24.0 * hidden * hidden * layers)

    @property
    def name(self) -> str:
        return "attention"

    @property
    def module(self) -> str:
        """The network module this cost is spent in: the language model's layers."""
        return "llm"

    def describe(self) -> str:
        """The formula with its coefficients, as plan reports print it."""
        return f"attention cost {self.a:g}*l^2 + {self.b:g}*l per document (l = tokens)"

    def __call__(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray:
        length = _as_float(num_tokens)
        return self.a * length * length + self.b * length


@dataclass(frozen=True)
class ImagePatchCost:
    """Vision-encoder cost of one sample's ``p`` image patches: ``per_patch*p + per_patch_sq*p**2``.

    A ViT encodes each image's patches with full attention, so ``per_patch_sq`` plays the role of
    ``a`` and ``per_patch`` the role of ``b`` in :class:`AttentionCost`, in the same unit. Combine
    with the language model's cost via :class:`CombinedCost`.
    """

    per_patch: float = 1.0
    per_patch_sq: float = 0.0

    def __post_init__(self) -> None:
        for name in ("per_patch", "per_patch_sq"):
            value = _check_coefficient("ImagePatchCost", name, getattr(self, name))
            object.__setattr__(self, name, value)

    @property
    def name(self) -> str:
        return "image_patches"

    @property
    def module(self) -> str:
        """The network module this cost is spent in: the vision encoder."""
        return "vision"

    def describe(self) -> str:
        """The formula with its coefficients, as plan reports print it."""
        return f"image patch cost {self.per_patch:g}*p + {self.per_patch_sq:g}*p^2 (p = patches)"

    def __call__(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray:
        patches = _as_float(num_patches)
        return self.per_patch * patches + self.per_patch_sq * patches * patches


@dataclass(frozen=True)
class VideoCost:
    """Vision-encoder cost of a video sample's ``p`` patches, in frames of ``frame_patches``.

    A video encoder with divided space-time attention (TimeSformer, and the factorised encoders
    of video VLMs) lets each patch attend to the patches of its own frame and to the patches at
    its position in the other frames, so one sample costs
    ``per_patch*p + per_pair*p*(min(p, frame_patches) + frames)`` with
    ``frames = ceil(p / frame_patches)``; ``temporal=False`` drops the second term (frames encoded
    one by one, as image encoders do). Samples with no patches cost nothing. The unit is that of
    the other models of the plan (see :class:`ImagePatchCost`).
    """

    per_patch: float = 1.0
    per_pair: float = 0.0
    frame_patches: int = 256
    temporal: bool = True

    def __post_init__(self) -> None:
        for name in ("per_patch", "per_pair"):
            object.__setattr__(self, name, _check_coefficient("VideoCost", name, getattr(self, name)))
        frame = self.frame_patches
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)) or frame < 1:
            raise PlanError(f"VideoCost: frame_patches must be an int >= 1, got {frame!r}")
        object.__setattr__(self, "frame_patches", int(frame))
        if not isinstance(self.temporal, (bool, np.bool_)):
            raise PlanError(f"VideoCost: temporal must be True or False, got {self.temporal!r}")
        object.__setattr__(self, "temporal", bool(self.temporal))

    @property
    def name(self) -> str:
        return "video"

    @property
    def module(self) -> str:
        """The network module this cost is spent in: the vision encoder."""
        return "vision"

    def describe(self) -> str:
        """The formula with its coefficients, as plan reports print it."""
        frames = " + ceil(p/f)" if self.temporal else ""
        return (f"video cost {self.per_patch:g}*p + {self.per_pair:g}*p*(min(p, f){frames}) "
                f"(p = patches, f = {self.frame_patches} patches per frame)")

    def __call__(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray:
        patches = _as_float(num_patches)
        pairs = np.minimum(patches, float(self.frame_patches))
        if self.temporal:
            pairs = pairs + np.ceil(patches / self.frame_patches)
        return self.per_patch * patches + self.per_pair * patches * pairs


@dataclass(frozen=True, init=False)
class CombinedCost:
    """The sum of several cost models (e.g. language model + vision encoder)."""

    models: tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], ...]

    def __init__(self, *models: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
        if not models:
            raise PlanError("CombinedCost needs at least one cost model")
        for model in models:
            if not callable(model):
                raise PlanError(
                    f"CombinedCost: {model!r} is not a cost model; pass callables "
                    f"(num_tokens, num_patches) -> costs such as AttentionCost()"
                )
        object.__setattr__(self, "models", tuple(models))

    @property
    def name(self) -> str:
        return "+".join(_model_name(m) for m in self.models)

    def describe(self) -> str:
        """Each model's description, joined by ``+``."""
        parts = [m.describe() if hasattr(m, "describe") else _model_name(m) for m in self.models]
        return " + ".join(parts)

    def __call__(self, num_tokens: np.ndarray, num_patches: np.ndarray) -> np.ndarray:
        total = np.zeros(np.shape(num_tokens), dtype=np.float64)
        for model in self.models:
            total += evaluate_cost(model, num_tokens, num_patches)
        return total
