"""The declarative plan: what a job wants, composed from a few primitives.

```
plan = (
    Plan(sources)                          # Source objects, or just names to explore without data
    .mix({"web": 0.7, "code": 0.3})        # a dict, a schedule, or a metric-driven policy
    .cost(AttentionCost())                 # per-sample cost model
    .balance(micro_batches=4, max_tokens=16384, global_batch=512)
    .distribute(ClientPlaceTree(dp=8, tp=4))
    .broadcast_at("tp")
    .seed(1234)
)
```

A Plan is an immutable value: every call returns a new Plan, so a notebook can branch variants
of one plan and compare their simulations. Each call validates its argument (and its combination
with what is already set) and raises :class:`~mdata.errors.PlanError` saying what to change.
``mdata.planner.simulate(plan, steps, metadata)`` runs the Planner's own state machine on sample
metadata, so what a notebook shows is what the cluster will do. (The plan is a value: it names no
consumer of itself, so the planner may import it without a cycle.)
"""

from __future__ import annotations

import hashlib
import html
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from mdata.cost import AttentionCost
from mdata.errors import PlanError, UnmixedSourceWarning
from mdata.identity import plan_fingerprint
from mdata.mesh import BroadcastAxis, ClientPlaceTree, _check_broadcast_axis
from mdata.mixing import MixtureSchedule, as_schedule

__all__ = ["Plan", "BalanceSpec", "DEFAULT_CHUNK_ROWS"]

#: Rows per chunk for sources given by name only (a Source object carries its own).
DEFAULT_CHUNK_ROWS = 256


@dataclass(frozen=True)
class BalanceSpec:
    """How each global step is packed: ``global_batch`` samples per step, ``micro_batches`` per
    DP rank (at least), at most ``max_tokens`` tokens per micro-batch (longer samples are cut)."""

    micro_batches: int
    max_tokens: int
    global_batch: int


@dataclass(frozen=True)
class _Config:
    names: tuple[str, ...]
    sources: tuple[Any, ...]  # Source objects or the names themselves
    chunk_rows: tuple[int, ...]
    mixture: MixtureSchedule | None = None
    cost_model: Callable | None = None
    balance: BalanceSpec | None = None
    mesh: ClientPlaceTree | None = None
    broadcast: BroadcastAxis = None
    seed: int = 0
    window: int = 4
    shuffle_chunks: int = 4
    pad_id: int = 0
    image_token_id: int | None = None
    # name -> position in ``names`` (a tuple's .index is linear: 10k sources took 2 s to register)
    positions: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)


def _positive_int(what: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError(f"{what} must be an int >= {minimum}, got {value!r}")
    return int(value)


class Plan:
    """An immutable, validated job description (see the module docstring)."""

    __slots__ = ("_cfg",)

    def __init__(self, sources: Sequence[Any] | Any) -> None:
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
            sources = [sources] if hasattr(sources, "name") or isinstance(sources, str) else sources
        items = list(sources)
        if not items:
            raise PlanError("a Plan needs at least one source (a Source or a source name)")
        names: list[str] = []
        positions: dict[str, int] = {}
        chunk_rows: list[int] = []
        for i, src in enumerate(items):
            name = src if isinstance(src, str) else getattr(src, "name", None)
            if not isinstance(name, str) or not name:
                raise PlanError(
                    f"source {i} of the plan is {src!r}; give a Source or a non-empty source name"
                )
            if name in positions:
                raise PlanError(f"source {name!r} appears twice in the plan; names must be unique")
            rows = DEFAULT_CHUNK_ROWS if isinstance(src, str) else getattr(src, "chunk_rows", None)
            positions[name] = len(names)
            names.append(name)
            chunk_rows.append(_positive_int(f"chunk_rows of source {name!r}", rows))
        self._cfg = _Config(tuple(names), tuple(items), tuple(chunk_rows), positions=positions)

    @classmethod
    def _from(cls, cfg: _Config) -> "Plan":
        plan = cls.__new__(cls)
        plan._cfg = cfg
        return plan

    def _with(self, **changes: Any) -> "Plan":
        return Plan._from(replace(self._cfg, **changes))

    # -- primitives ----------------------------------------------------------------------------
    def mix(self, mixture: MixtureSchedule | Mapping[str, float]) -> "Plan":
        """Set the mixture: ``{source: weight}``, a schedule, or a :class:`MetricMixturePolicy`.

        A source of the plan that the mixture never mentions gets weight 0: that is warned about
        (:class:`~mdata.errors.UnmixedSourceWarning`), as it is usually a source forgotten in the
        weights; a weight of ``0`` says it on purpose and is silent."""
        return self._mixed(mixture, where="", stacklevel=2)  # the caller of mix

    def _mixed(self, mixture: MixtureSchedule | Mapping[str, float], *, where: str | None,
               stacklevel: int = 1) -> "Plan":
        """:meth:`mix`, with ``where`` (a plan file and line, or "": none) starting the warning;
        ``where=None`` warns not at all (a spec a Plan wrote: that Plan's ``mix`` warned).
        ``stacklevel``: the frame the warning points at, 1 being the caller of ``_mixed``."""
        schedule = as_schedule(mixture)
        mentioned = schedule.sources()
        if mentioned is not None:
            unknown = sorted(set(mentioned) - set(self._cfg.names))
            if unknown:
                raise PlanError(
                    f"mixture names unknown sources {unknown}; the plan's sources are "
                    f"{list(self._cfg.names)}"
                )
            schedule.weights_vector(0, self._cfg.names)  # all-zero over the plan -> PlanError
            left_out = [n for n in self._cfg.names if n not in mentioned]
            if left_out and where is not None:
                one = len(left_out) == 1
                warnings.warn(UnmixedSourceWarning(
                    f"{where}{'source' if one else 'sources'} {', '.join(map(repr, left_out))} of "
                    f"the plan {'is' if one else 'are'} not in the mixture, so never sampled; give "
                    f"{'it' if one else 'each'} a weight, or weight 0 to leave "
                    f"{'it' if one else 'them'} out on purpose"), stacklevel=stacklevel + 1)
        return self._with(mixture=schedule)

    def cost(self, model: Callable) -> "Plan":
        """Set the per-sample cost model: ``model(num_tokens, num_patches) -> float64 costs``."""
        if not callable(model):
            raise PlanError(f"a cost model must be callable (num_tokens, num_patches), got {model!r}")
        return self._with(cost_model=model)

    def balance(self, *, micro_batches: int, max_tokens: int, global_batch: int) -> "Plan":
        """Set packing: ``global_batch`` samples per step over the DP ranks, ``micro_batches`` per
        rank, ``max_tokens`` per micro-batch (samples longer than that are truncated, and counted)."""
        spec = BalanceSpec(
            _positive_int("micro_batches", micro_batches),
            _positive_int("max_tokens", max_tokens),
            _positive_int("global_batch", global_batch),
        )
        _check_batch_fits(spec, self._cfg.mesh)
        return self._with(balance=spec)

    def distribute(self, mesh: ClientPlaceTree) -> "Plan":
        """Set the trainers' mesh (DP x PP x CP x TP)."""
        if not isinstance(mesh, ClientPlaceTree):
            raise PlanError(f"distribute() takes a ClientPlaceTree, got {type(mesh).__name__}")
        _check_batch_fits(self._cfg.balance, mesh)
        return self._with(mesh=mesh)

    def broadcast_at(self, axis: BroadcastAxis) -> "Plan":
        """Who receives data in a DP group: every rank (None), TP rank 0 ("tp"), CP rank 0 ("cp")
        or the first pipeline stage ("pp"); the others get it by broadcast (docs/batch.md)."""
        _check_broadcast_axis(axis)
        return self._with(broadcast=axis)

    def seed(self, seed: int) -> "Plan":
        """Seed of every source's order (and of tie-breaking in balancing)."""
        return self._with(seed=_positive_int("seed", seed, minimum=0))

    def window(self, steps: int) -> "Plan":
        """How many steps ahead of the slowest consumer the Planner plans and loads."""
        return self._with(window=_positive_int("window", steps))

    def shuffle(self, window_chunks: int = 4) -> "Plan":
        """Rows are shuffled within windows of this many consecutive chunks of a source."""
        return self._with(shuffle_chunks=_positive_int("shuffle window_chunks", window_chunks))

    def special_tokens(self, *, pad_id: int = 0, image_token_id: int | None = None) -> "Plan":
        """Token ids the constructors write: padding, and the placeholder run that stands for an
        image's patches in ``input_ids`` (needed as soon as a source yields images)."""
        pad = _positive_int("pad_id", pad_id, minimum=0)
        image = None if image_token_id is None else _positive_int("image_token_id", image_token_id, minimum=0)
        return self._with(pad_id=pad, image_token_id=image)

    @property
    def pad_id(self) -> int:
        return self._cfg.pad_id

    @property
    def image_token_id(self) -> int | None:
        return self._cfg.image_token_id

    # -- accessors -----------------------------------------------------------------------------
    @property
    def source_names(self) -> tuple[str, ...]:
        """Source names in plan order; ``source_index`` in columnar data refers to this order."""
        return self._cfg.names

    @property
    def sources(self) -> tuple[Any, ...]:
        return self._cfg.sources

    def source_index(self, name: str) -> int:
        """The position of source ``name`` in the plan: the ``source_index`` of its sample ids."""
        try:
            return self._cfg.positions[name]
        except (KeyError, TypeError):
            raise PlanError(f"unknown source {name!r}; the plan's sources are {list(self._cfg.names)}") from None

    def chunk_rows(self, name: str) -> int:
        """Rows per load task of source ``name`` (its ``Source.chunk_rows``)."""
        return self._cfg.chunk_rows[self.source_index(name)]

    @property
    def mixture(self) -> MixtureSchedule:
        if self._cfg.mixture is None:
            raise PlanError("the plan has no mixture: call .mix({source: weight, ...}) first")
        return self._cfg.mixture

    @property
    def cost_model(self) -> Callable:
        return self._cfg.cost_model if self._cfg.cost_model is not None else AttentionCost()

    @property
    def balance_spec(self) -> BalanceSpec:
        if self._cfg.balance is None:
            raise PlanError(
                "the plan has no batch shape: call .balance(micro_batches=M, max_tokens=T, "
                "global_batch=N) first"
            )
        return self._cfg.balance

    @property
    def mesh(self) -> ClientPlaceTree:
        return self._cfg.mesh if self._cfg.mesh is not None else ClientPlaceTree(dp=1)

    @property
    def broadcast(self) -> BroadcastAxis:
        return self._cfg.broadcast

    @property
    def seed_value(self) -> int:
        return self._cfg.seed

    @property
    def window_steps(self) -> int:
        return self._cfg.window

    @property
    def shuffle_chunks(self) -> int:
        return self._cfg.shuffle_chunks

    def validate(self) -> "Plan":
        """Raise PlanError unless the plan can be planned (mixture and batch shape set); returns self."""
        _ = self.mixture, self.balance_spec
        return self

    def validate_for_delivery(self) -> "Plan":
        """Raise PlanError unless constructors can build this plan's batches; returns self.

        Planning (and :func:`mdata.planner.simulate`) only needs the mixture and the batch
        shape; building batches also needs the token id that stands for image patches when a
        source yields images. The runtime calls this when a job is submitted, so the error comes before any
        trainer waits.
        """
        self.validate()
        return self.check_image_token([
            src.name for src in self._cfg.sources
            if getattr(getattr(src, "transform", None), "produces_images", False)
        ])

    def check_image_token(self, sources_with_images: Sequence[str]) -> "Plan":
        """Raise PlanError when some sources yield images but no image token id is set; returns
        self. (The scheduler learns which sources yield images from the loaders, where the
        transforms are imported, since it never imports them itself.)"""
        if self._cfg.image_token_id is None and sources_with_images:
            raise PlanError(
                f"sources {list(sources_with_images)} yield images, so constructors need the token "
                "id that stands for image patches in input_ids: call "
                ".special_tokens(image_token_id=...) on the plan"
            )
        return self

    # -- as data ---------------------------------------------------------------------------------
    def to_spec(self) -> dict[str, Any]:
        """The plan as plain data (what msgpack, JSON and YAML carry; docs/plan-files.md).

        Sources become source specs whose transform is named by import path with its arguments;
        cost models and mixture policies likewise. Raises PlanError naming what cannot be
        described as data (a lambda, a class defined in a notebook...)."""
        from mdata.spec.plan_spec import plan_to_spec

        return plan_to_spec(self)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], *, build_sources: bool = True,
                  trust: Any = None, origin: Any = None) -> "Plan":
        """The Plan ``spec`` describes (validated like the builder calls it stands for).

        ``build_sources=False`` keeps each source as a :class:`~mdata.spec.SourceSpec` instead of
        importing its transform; ``trust`` (a :class:`~mdata.spec.Trust`) limits which cost models
        and mixture policies may be imported (everything by default); ``origin`` (a
        :class:`~mdata.spec.SpecOrigin`) is the file it was read from, named with the line in
        errors and warnings (None: a spec a Plan wrote)."""
        from mdata.spec.plan_spec import plan_from_spec

        return plan_from_spec(spec, plan_cls=cls, build_sources=build_sources, trust=trust,
                              origin=origin)

    def to_file(self, path: Any) -> Any:
        """Write the plan's spec to ``path`` (YAML; JSON for a ``.json`` name); returns the path."""
        from mdata.spec.files import write_spec

        return write_spec(self.to_spec(), path)

    @classmethod
    def from_file(cls, path: Any, *, build_sources: bool = True, trust: Any = None) -> "Plan":
        """Read a plan file written by :meth:`to_file` or by hand (docs/plan-files.md); what is
        wrong in it is reported with the file and line. ``build_sources`` and ``trust`` as for
        :meth:`from_spec` (``mdata cluster up`` reads with the scheduler's trust)."""
        from mdata.spec.files import read_plan_file

        spec, origin = read_plan_file(path)
        return cls.from_spec(spec, build_sources=build_sources, trust=trust, origin=origin)

    # -- identity ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """JSON-safe description of everything that decides what each trainer receives."""
        cfg = self._cfg
        mesh = self.mesh
        return {
            "sources": [[n, r] for n, r in zip(cfg.names, cfg.chunk_rows)],
            "mixture": None if cfg.mixture is None else cfg.mixture.config(),
            "cost": repr(self.cost_model),
            "balance": None if cfg.balance is None else [
                cfg.balance.micro_batches, cfg.balance.max_tokens, cfg.balance.global_batch],
            "mesh": [mesh.dp, mesh.pp, mesh.cp, mesh.tp, mesh.order],
            "broadcast": cfg.broadcast,
            "seed": cfg.seed,
            "shuffle_chunks": cfg.shuffle_chunks,
            "special_tokens": [cfg.pad_id, cfg.image_token_id],
        }

    def fingerprint(self, listings: Mapping[str, Any] | None = None) -> str:
        """Stable hash of the plan's canonical description (same in every process and run).

        Callables are described by import path and fields, never by ``repr`` (see
        :mod:`mdata.identity`). Without ``listings`` it works offline (a notebook); with each
        source's listing (``{source: [(shard name, rows), ...]}``) it is the job's full
        fingerprint. The planning window is left out on purpose: it changes how far ahead the
        Planner works, never which sample goes where, so a job may resume with a different window.
        """
        return plan_fingerprint(self, listings)

    # -- display -------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Plan(sources={list(self._cfg.names)}, fingerprint={self.fingerprint()})"

    def _repr_html_(self) -> str:
        cfg = self._cfg
        weights: list[str]
        try:
            vec = self.mixture.weights_vector(0, cfg.names)
            weights = [f"{w:.3f}" for w in vec]
        except PlanError:
            weights = ["-"] * len(cfg.names)
        rows = "".join(
            f"<tr><td>{i}</td><td>{html.escape(n)}</td><td>{r}</td><td>{w}</td></tr>"
            for i, (n, r, w) in enumerate(zip(cfg.names, cfg.chunk_rows, weights))
        )
        b = cfg.balance
        settings = {
            "mixture": type(cfg.mixture).__name__ if cfg.mixture else "(not set)",
            "cost": repr(self.cost_model),
            "balance": (f"{b.global_batch} samples/step, {b.micro_batches} micro-batches, "
                        f"{b.max_tokens} tokens each") if b else "(not set)",
            "mesh": self.mesh.describe(),
            "broadcast_at": str(cfg.broadcast),
            "seed": str(cfg.seed),
            "window": f"{cfg.window} steps",
            "shuffle": f"{cfg.shuffle_chunks} chunks",
            "fingerprint": self.fingerprint(),
        }
        settings_rows = "".join(
            f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in settings.items()
        )
        return (
            "<div><strong>mdata Plan</strong><table><tr><th>#</th><th>source</th>"
            f"<th>chunk rows</th><th>weight at step 0</th></tr>{rows}</table>"
            f"<table>{settings_rows}</table></div>"
        )


def _check_batch_fits(spec: BalanceSpec | None, mesh: ClientPlaceTree | None) -> None:
    if spec is None or mesh is None:
        return
    if spec.global_batch < mesh.dp:
        raise PlanError(
            f"global_batch={spec.global_batch} samples cannot feed {mesh.dp} DP ranks; every DP "
            f"rank needs at least one sample per step: use global_batch >= {mesh.dp} or a smaller dp"
        )
