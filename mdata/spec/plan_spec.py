"""A Plan as a declarative spec (plain data) and back: what crosses to the scheduler and what a
plan file holds.

The spec is a dict of plain values (see docs/plan-files.md for the schema)::

    {"mdata_plan": 1,
     "sources": [{"name": "web", "url": "s3://b/web/*.parquet", "transform": {...}, ...}, "names"],
     "mixture": {"type": "static", "weights": {"web": 0.7, "code": 0.3}},
     "cost": {"type": "mdata.cost:AttentionCost", "args": {"a": 1.0, "b": 49152.0}},
     "balance": {"micro_batches": 4, "max_tokens": 16384, "global_batch": 512},
     "mesh": {"dp": 8, "pp": 1, "cp": 1, "tp": 4, "order": "tp-cp-dp-pp"},
     "broadcast": "tp", "seed": 1234, "window": 4, "shuffle_chunks": 4,
     "special_tokens": {"pad_id": 0, "image_token_id": null}}

Settings a plan leaves unset are written as null and read back as unset, so a round trip gives
the same Plan (same fingerprint, same simulation). Reading goes through the Plan builder, so a spec
is validated exactly like the Python calls it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from mdata.errors import PlanError
from mdata.mesh import ClientPlaceTree
from mdata.mixing import LinearRamp, MixtureSchedule, StagedMixture, StaticMixture
from mdata.spec.origin import SpecOrigin
from mdata.spec.refs import Trust, encode, is_reference, resolve
from mdata.spec.sources import SOURCE_KEYS, SourceSpec, source_spec
from mdata.spec.version import SCHEMA_KEY, SCHEMA_VERSION, check_version

__all__ = ["plan_to_spec", "plan_from_spec", "SPEC_KEYS"]

SPEC_KEYS = (SCHEMA_KEY, "sources", "mixture", "cost", "balance", "mesh", "broadcast", "seed",
             "window", "shuffle_chunks", "special_tokens")
BALANCE_KEYS = ("micro_batches", "max_tokens", "global_batch")
MESH_KEYS = ("dp", "pp", "cp", "tp", "order")
TOKEN_KEYS = ("pad_id", "image_token_id")
_MIXTURES = {StaticMixture: "static", StagedMixture: "staged", LinearRamp: "ramp"}

#: The plan class ``plan_from_spec`` builds: :class:`mdata.plan.Plan`, passed in by
#: ``Plan.from_spec``. The Plan imports this module (``Plan.to_spec``), never the other way round.
PlanT = TypeVar("PlanT")


# -- writing -------------------------------------------------------------------------------------
def plan_to_spec(plan: Any) -> dict[str, Any]:
    """``plan`` (a :class:`~mdata.plan.Plan`) as plain data; PlanError naming what cannot be
    described as data."""
    cfg = plan._cfg
    balance, mesh = cfg.balance, cfg.mesh
    return {
        SCHEMA_KEY: SCHEMA_VERSION,
        "sources": [s if isinstance(s, str) else source_spec(s).to_dict() for s in cfg.sources],
        "mixture": None if cfg.mixture is None else mixture_to_spec(cfg.mixture),
        "cost": None if cfg.cost_model is None else encode(cfg.cost_model, "cost"),
        "balance": None if balance is None else {
            "micro_batches": balance.micro_batches, "max_tokens": balance.max_tokens,
            "global_batch": balance.global_batch},
        "mesh": None if mesh is None else {
            "dp": mesh.dp, "pp": mesh.pp, "cp": mesh.cp, "tp": mesh.tp, "order": mesh.order},
        "broadcast": cfg.broadcast,
        "seed": cfg.seed,
        "window": cfg.window,
        "shuffle_chunks": cfg.shuffle_chunks,
        "special_tokens": {"pad_id": cfg.pad_id, "image_token_id": cfg.image_token_id},
    }


def mixture_to_spec(mixture: MixtureSchedule) -> dict[str, Any]:
    """Built-in schedules as their own data; any other schedule as a reference."""
    kind = _MIXTURES.get(type(mixture))
    if kind is None:
        return encode(mixture, "mixture")
    config = mixture.config()
    if kind == "static":
        return {"type": "static", "weights": dict(config["weights"])}
    if kind == "staged":
        return {"type": "staged",
                "stages": [{"start": int(s), "weights": dict(w)} for s, w in config["stages"]]}
    return {"type": "ramp", "start": config["start"], "end": config["end"],
            "from": dict(config["from"]), "to": dict(config["to"])}


# -- reading -------------------------------------------------------------------------------------
def plan_from_spec(spec: Mapping[str, Any], *, plan_cls: type[PlanT], build_sources: bool = True,
                   trust: Trust | None = None, origin: SpecOrigin | None = None) -> PlanT:
    """The Plan a spec describes, built with the builder calls of ``plan_cls`` (``Plan.from_spec``
    passes the Plan class: a value type never imported by what it uses).

    ``build_sources``: turn each source into a :class:`~mdata.sources.Source` (importing its
    transform); False keeps :class:`SourceSpec` values, which is how the scheduler plans without
    importing a client's code. ``trust`` decides which cost models and mixture policies may be
    imported (everything by default; the scheduler passes :func:`~mdata.spec.refs.scheduler_trust`).
    ``origin``: the plan file the spec was read from; its errors then start with the file and
    line, and a source the mixture leaves out is warned about there (a spec without an origin was
    written by a Plan, whose ``mix`` warned already).
    """
    if not isinstance(spec, Mapping):
        raise PlanError(f"a plan spec is a mapping (what Plan.to_spec() returns), not {type(spec).__name__}")
    at = origin or SpecOrigin()
    with at.about(SCHEMA_KEY):
        check_version(spec)
    unknown = sorted(set(map(str, spec)) - set(SPEC_KEYS))
    if unknown:
        raise PlanError(f"{at.prefix(unknown[0])}plan spec has unknown keys {unknown}; its keys are "
                        f"{list(SPEC_KEYS)}")
    trust = trust or Trust()
    sources = spec.get("sources")
    if not isinstance(sources, (list, tuple)) or not sources:
        raise PlanError(f"{at.prefix('sources')}plan spec needs 'sources': a non-empty list of sources "
                        "(or source names)")
    plan = plan_cls([_source(entry, i, build_sources, at) for i, entry in enumerate(sources)])
    if spec.get("mixture") is not None:
        with at.about("mixture"):
            plan = plan._mixed(mixture_from_spec(spec["mixture"], trust),
                               where=None if origin is None else at.prefix("mixture"))
    if spec.get("cost") is not None:
        with at.about("cost"):
            plan = plan.cost(resolve(_reference(spec["cost"], "cost"), trust, "cost model"))
    if spec.get("balance") is not None:
        with at.about("balance", *_first_unknown(spec["balance"], BALANCE_KEYS)):
            plan = plan.balance(**_fields(spec["balance"], "balance", BALANCE_KEYS))
    if spec.get("mesh") is not None:
        with at.about("mesh", *_first_unknown(spec["mesh"], MESH_KEYS)):
            plan = plan.distribute(ClientPlaceTree(**_fields(spec["mesh"], "mesh", MESH_KEYS, required=1)))
    for key, method in (("broadcast", "broadcast_at"), ("seed", "seed"), ("window", "window"),
                        ("shuffle_chunks", "shuffle")):
        if key == "broadcast" or spec.get(key) is not None:  # broadcast: null is a setting too
            with at.about(key):
                plan = getattr(plan, method)(spec.get(key))
    if spec.get("special_tokens") is not None:
        with at.about("special_tokens", *_first_unknown(spec["special_tokens"], TOKEN_KEYS)):
            plan = plan.special_tokens(**_fields(spec["special_tokens"], "special_tokens", TOKEN_KEYS,
                                                 required=0))
    return plan


def _first_unknown(value: Any, known: tuple[str, ...]) -> tuple[str, ...]:
    """The first key of the mapping ``value`` not in ``known``, as a path step (an error about
    the block then points at that key's line), or () when there is none."""
    if isinstance(value, Mapping):
        for key in value:
            if str(key) not in known:
                return (str(key),)
    return ()


def _source(entry: Any, i: int, build: bool, at: SpecOrigin) -> Any:
    """Source ``i`` of the spec: its name as is, or its SourceSpec (built into a Source when
    ``build``). Its errors name it by its name (by its place in the list only when it has none)
    and, read from a file, the file and line."""
    if isinstance(entry, str):
        return entry
    name = entry.get("name") if isinstance(entry, Mapping) else None
    where = f"source {name!r}" if isinstance(name, str) else f"source #{i + 1} of 'sources'"
    with at.about("sources", i, *_first_unknown(entry, SOURCE_KEYS)):
        spec = SourceSpec.from_dict(entry, where)
        return spec.build() if build else spec


def _reference(value: Any, what: str) -> Mapping[str, Any]:
    if not is_reference(value):
        raise PlanError(f"plan spec {what!r} must be {{'type': 'module:Name', 'args': {{...}}}} "
                        f"(or {{'type': 'module:function'}}), got {value!r:.120}")
    return value


def _fields(value: Any, what: str, names: tuple[str, ...], required: int | None = None) -> dict:
    """The keyword arguments of one settings block; ``required`` of them (all by default) must be
    present."""
    if not isinstance(value, Mapping):
        raise PlanError(f"plan spec {what!r} must be a mapping with keys {list(names)}, got {value!r:.80}")
    unknown = sorted(set(map(str, value)) - set(names))
    missing = [n for n in names[: len(names) if required is None else required] if n not in value]
    if unknown or missing:
        raise PlanError(f"plan spec {what!r} has keys {sorted(map(str, value))}; it takes {list(names)}"
                        + (f" and needs {missing}" if missing else ""))
    return {k: v for k, v in value.items()}


def mixture_from_spec(value: Any, trust: Trust) -> MixtureSchedule:
    """A mixture block back to its schedule (built-ins without any import)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise PlanError(f"plan spec 'mixture' must be a mapping with a 'type', got {value!r:.80}")
    kind = value["type"]
    if kind == "static":
        return StaticMixture(_fields(value, "mixture", ("type", "weights"))["weights"])
    if kind == "staged":
        stages = _fields(value, "mixture", ("type", "stages"))["stages"]
        if not isinstance(stages, (list, tuple)):
            raise PlanError(f"plan spec 'mixture' stages must be a list, got {stages!r:.80}")
        pairs = [_fields(s, f"mixture stage {i}", ("start", "weights")) for i, s in enumerate(stages)]
        return StagedMixture([(p["start"], p["weights"]) for p in pairs])
    if kind == "ramp":
        f = _fields(value, "mixture", ("type", "start", "end", "from", "to"))
        return LinearRamp(f["start"], f["end"], f["from"], f["to"])
    schedule = resolve(_reference(value, "mixture"), trust, "mixture")
    if not isinstance(schedule, MixtureSchedule):
        raise PlanError(f"mixture {kind!r} built a {type(schedule).__name__}, not a MixtureSchedule")
    return schedule
