"""Plans cross to the scheduler as data: the scheduler never unpickles what a client sends and
never imports a client's code, transforms are imported (and checked) on the loaders that run them,
and every handler refuses out-of-range arguments with a clear error.

The cluster of this module gives its workers one more folder on ``sys.path`` (a worker preload): a
module written there exists for the loaders only, never for the scheduler, which runs in this test
process, and this process never imports it either. The workers trust one of the two modules there
(``mdata.workers.trusted-modules``), not the other.
"""

from __future__ import annotations

import pickle
import sys
import textwrap
import uuid

import dask
import distributed  # noqa: F401  its config defaults must exist before dask.config.set below:
import pytest       # otherwise leaving the set would delete the whole 'distributed' section

import mdata.config  # noqa: F401  the same for mdata's (mdata.workers.trusted-modules below)

from mdata.cost import AttentionCost, ImagePatchCost
from mdata.data.example import example_sources
from mdata.driver import PoolSpec, start_cluster, submit_job
from mdata.errors import PlanError, UntrustedSourceError
from mdata.mesh import ClientPlaceTree
from mdata.module_cost import ModuleCost
from mdata.plan import Plan
from mdata.spec import SourceSpec
from mdata.trainer import Loader
from mdata.wire.errors import InvalidRequestError, MessageError

from conftest import run_loaders

pytestmark = pytest.mark.cluster

USER_MODULE = f"mdata_worker_only_{uuid.uuid4().hex[:8]}"
UNTRUSTED_MODULE = f"mdata_worker_untrusted_{uuid.uuid4().hex[:8]}"
USER_CODE = '''
"""A user transform that exists only on the workers of the test cluster."""
from dataclasses import dataclass

from mdata.sources import TokenizeText


@dataclass(frozen=True)
class UpperText(TokenizeText):
    """TokenizeText of the upper-cased text."""

    def __call__(self, columns, *, context, **kwargs):
        upper = {k: [v.upper() if isinstance(v, str) else v for v in vals] for k, vals in columns.items()}
        return super().__call__(upper, context=context, **kwargs)
'''


class _Touch:
    """A pickle that, once unpickled, creates a file: the proof nobody unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def cluster(example_corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("worker-only")
    (folder / f"{USER_MODULE}.py").write_text(textwrap.dedent(USER_CODE))
    (folder / f"{UNTRUSTED_MODULE}.py").write_text(textwrap.dedent(USER_CODE))
    sources = [s for s in example_sources(example_corpus) if s.name in ("chat", "code")]
    preload = f"import sys; sys.path.insert(0, {str(folder)!r})"  # workers only
    # the nannies hand this configuration to the workers they start: their own trust list
    with dask.config.set({"distributed.worker.preload": [preload],
                          "mdata.workers.trusted-modules": [USER_MODULE]}):
        with start_cluster(sources, pools=[PoolSpec("text", ("chat", "code"))], constructors=1,
                           constructor_threads=1) as c, c.client(set_as_default=False) as client:
            yield {"client": client, "sources": sources}


def _spec(sources, *, dp: int = 1, code_transform: dict | None = None) -> dict:
    plan = (Plan(sources).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=4 * dp)
            .distribute(ClientPlaceTree(dp=dp)).seed(3))
    spec = plan.to_spec()
    if code_transform is not None:
        (code,) = [s for s in spec["sources"] if s["name"] == "code"]
        code["transform"] = code_transform
    return spec


def test_a_transform_only_the_workers_can_import_runs_there_and_never_on_the_scheduler(cluster):
    client = cluster["client"]
    spec = _spec(cluster["sources"], code_transform={"type": f"{USER_MODULE}:UpperText",
                                                     "args": {"field": "text"}})
    plan = Plan.from_spec(spec, build_sources=False)  # this process cannot import the transform
    assert all(isinstance(s, SourceSpec) for s in plan.sources)
    info = submit_job(client, plan, job="worker-only")
    assert info["fingerprint"] == plan.fingerprint()
    batches = run_loaders(client, job="worker-only", world_size=1, steps=3)[0]
    assert [b["step"] for b in batches] == [0, 1, 2]
    assert {int(s) for b in batches for s in b["sample_ids"][:, 0].tolist()} == {0, 1}

    def imported(name=USER_MODULE):
        import sys

        return name in sys.modules

    assert client.run_on_scheduler(imported) is False
    assert USER_MODULE not in sys.modules  # the scheduler runs in this very process
    assert True in client.run(imported).values()  # the loaders imported it to run it
    client.sync(client.scheduler.mdata_close_job, job="worker-only", client=client.id)


def test_a_transform_no_loader_can_import_fails_registration_naming_it_and_the_worker(cluster):
    client = cluster["client"]
    missing = f"{USER_MODULE}.no_such_module:Shout"  # under a trusted module, so it is imported
    spec = _spec(cluster["sources"], code_transform={"type": missing, "args": {}})
    with pytest.raises(PlanError, match=r"source 'code' cannot be built on worker tcp://[\d.:]+: PlanError: "
                                        r"cannot import transform of source 'code' "
                                        rf"'{missing}': ModuleNotFoundError"):
        submit_job(client, Plan.from_spec(spec, build_sources=False), job="unimportable")
    assert "unimportable" not in client.sync(client.scheduler.mdata_jobs)


def test_workers_refuse_an_untrusted_transform_with_a_typed_error_to_the_registering_driver(
        cluster, tmp_path):
    """A plan naming code outside the workers' trust list (a stdlib function, a user module they
    can import but do not trust) is refused at registration, naming the source and the field,
    before anything of it is imported or run; the job is not registered."""
    client = cluster["client"]
    marker = tmp_path / "ran"
    cases = [
        ({"type": "os:system", "args": {"command": f"touch {marker}"}}, "'os:system'"),
        ({"type": f"{UNTRUSTED_MODULE}:UpperText", "args": {"field": "text"}}, f"'{UNTRUSTED_MODULE}:UpperText'"),
    ]
    for i, (transform, named) in enumerate(cases):
        spec = _spec(cluster["sources"], code_transform=transform)
        with pytest.raises(UntrustedSourceError, match=rf"source 'code': field 'transform': .*{named}, which "
                                                       r"is not in a trusted module on this loader worker"
                                                       rf".*trusted-modules: {USER_MODULE}\).*refused on "
                                                       r"worker tcp://127\.0\.0\.1:\d+") as info:
            submit_job(client, Plan.from_spec(spec, build_sources=False), job=f"untrusted-{i}")
        assert (info.value.source, info.value.field) == ("code", "transform")
        assert f"untrusted-{i}" not in client.sync(client.scheduler.mdata_jobs)
    # a trainer that registers the plan itself (Loader(plan=)) gets the same typed error
    spec = _spec(cluster["sources"], code_transform=cases[0][0])
    with pytest.raises(UntrustedSourceError, match=r"source 'code': field 'transform'"):
        with Loader(client, job="untrusted-rank", rank=0, world_size=1, steps=1, timeout=60,
                    plan=Plan.from_spec(spec, build_sources=False)) as loader:
            list(loader)
    assert "untrusted-rank" not in client.sync(client.scheduler.mdata_jobs)
    assert not marker.exists()

    def imported(name=UNTRUSTED_MODULE):
        import sys

        return name in sys.modules

    assert True not in client.run(imported).values()  # refused by name, never imported


def test_workers_refuse_urls_and_storage_options_outside_their_rule(cluster):
    client = cluster["client"]
    plain = _spec(cluster["sources"])
    (code,) = [s for s in plain["sources"] if s["name"] == "code"]
    for change, field, job in [
        ({"url": "http://127.0.0.1:1/code/*.jsonl"}, "url", "http"),
        ({"url": "simplecache::" + code["url"]}, "url", "chained"),
        ({"storage_options": {"profile": "prod"}}, "storage_options.profile", "profile"),
    ]:
        spec = _spec(cluster["sources"])
        (src,) = [s for s in spec["sources"] if s["name"] == "code"]
        src.update(change)
        with pytest.raises(UntrustedSourceError, match=rf"source 'code': field '{field}'") as info:
            submit_job(client, Plan.from_spec(spec, build_sources=False), job=job)
        assert info.value.field == field
        assert job not in client.sync(client.scheduler.mdata_jobs)


def test_a_client_cost_model_is_refused_by_the_scheduler(cluster):
    client = cluster["client"]
    spec = {**_spec(cluster["sources"]), "cost": {"type": f"{USER_MODULE}:cost", "args": {}}}
    with pytest.raises(PlanError, match=rf"cost model '{USER_MODULE}:cost' is not imported on the "
                                        r"scheduler: the scheduler never imports a client's code"):
        client.sync(client.scheduler.mdata_register_job, job="usercost", plan=spec, checkpoint=None)
    assert USER_MODULE not in sys.modules


def test_pickled_bytes_are_refused_and_never_unpickled(cluster, tmp_path):
    client = cluster["client"]
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Touch(str(marker)))
    with pytest.raises(MessageError, match=r"RegisterJobRequest message: field 'plan' is bytes \(a pickled "
                                           r"Plan\?\): mdata never unpickles what a client sends"):
        client.sync(client.scheduler.mdata_register_job, job="pickled", plan=payload, checkpoint=None)
    assert not marker.exists()
    assert "pickled" not in client.sync(client.scheduler.mdata_jobs)


def test_every_handler_refuses_arguments_out_of_range(cluster):
    client = cluster["client"]
    submit_job(client, Plan.from_spec(_spec(cluster["sources"], dp=2)), job="ranges")
    run_loaders(client, job="ranges", world_size=2, steps=1)
    s = client.scheduler
    call = client.sync
    cases = [
        (lambda: call(s.mdata_batch_location, job="ranges", rank=2, step=0, timeout=1.0),
         r"mdata_batch_location: rank 2 is outside the job's world of 2 ranks \(ranks 0..1\)"),
        (lambda: call(s.mdata_batch_location, job="ranges", rank=0, step=-1, timeout=1.0),
         r"mdata_batch_location: step -1 is negative"),
        (lambda: call(s.mdata_batch_location, job="ranges", rank=0, step=1, timeout=-5.0),
         r"mdata_batch_location: timeout -5.0 must be a number of seconds in \[0, 3600\]"),
        (lambda: call(s.mdata_batch_location, job="ranges", rank=0, step=1, timeout=float("inf")),
         r"timeout inf must be"),
        (lambda: call(s.mdata_ack, job="ranges", rank=-1, step=0), r"mdata_ack: rank -1 is outside"),
        (lambda: call(s.mdata_ack, job="ranges", rank=0, step=-3), r"mdata_ack: step -3 is negative"),
        (lambda: call(s.mdata_report_metrics, job="ranges", rank=9, step=0, metrics={"loss": 1.0}),
         r"mdata_report_metrics: rank 9 is outside"),
        (lambda: call(s.mdata_checkpoint, job="ranges", step=-1), r"mdata_checkpoint: step -1 is negative"),
        (lambda: call(s.mdata_lineage, job="ranges", steps=10**9),
         r"mdata_lineage: steps \(how many planned steps\) must be in 0\.\.\d+, got 1000000000"),
        (lambda: call(s.mdata_attach, job="ranges", rank=7, client="c", token="t", host="h", pid=1,
                      checkpoint=None), r"mdata_attach: rank 7 is outside"),
        (lambda: call(s.mdata_detach, job="ranges", rank=7, token="t"), r"mdata_detach: rank 7 is outside"),
        (lambda: call(s.mdata_status, job="nope"), r"no mdata job named 'nope'"),
        (lambda: call(s.mdata_register_job, job="bad name/..", plan=_spec(cluster["sources"]),
                      checkpoint=None), r"mdata_register_job: job name 'bad name/\.\.' is not accepted"),
    ]
    for make, message in cases:
        with pytest.raises(InvalidRequestError, match=message):
            make()
    from mdata.errors import CheckpointError

    with pytest.raises(CheckpointError):
        call(s.mdata_attach, job="ranges", rank=0, client="c", token="t", host="h", pid=1,
             checkpoint={"step": 0})
    with pytest.raises(CheckpointError):
        call(s.mdata_register_job, job="ranges", plan=_spec(cluster["sources"], dp=2),
             checkpoint={"no": "checkpoint"})
    # types were always checked where each request is read
    with pytest.raises(MessageError, match=r"AckRequest.*'rank' must be an integer, got str"):
        call(s.mdata_ack, job="ranges", rank="0", step=0)
    # the workers' handlers check what they serve
    def held(dask_scheduler):
        return {prefix: [(list(k), ts.who_has and next(iter(ts.who_has)).address)
                         for k, ts in dask_scheduler.tasks.items()
                         if isinstance(k, tuple) and k[0] == prefix and ts.who_has]
                for prefix in ("mdata-load", "mdata-construct")}

    keys = client.run_on_scheduler(held)
    (chunk_key, loader), (batch_key, constructor) = keys["mdata-load"][0], keys["mdata-construct"][0]

    async def ask(address, handler, **kwargs):
        return await getattr(client.rpc(address), handler)(**kwargs)

    with pytest.raises(InvalidRequestError, match=r"mdata_take_rows: indices must be in 0\.\.\d+ for chunk"):
        call(ask, loader, "mdata_take_rows", key=chunk_key, indices=[0, -1])
    with pytest.raises(InvalidRequestError, match=r"mdata_take_rows: .* is not a loaded chunk"):
        call(ask, constructor, "mdata_take_rows", key=batch_key, indices=[0])
    with pytest.raises(InvalidRequestError, match=r"mdata_get_batch: .* is not a built batch"):
        call(ask, loader, "mdata_get_batch", key=chunk_key, cp_rank=0, receives_tokens=True,
             receives_labels=True)
    # the job still runs after all that
    assert call(s.mdata_job_info, job="ranges")["world_size"] == 2
    call(s.mdata_close_job, job="ranges", client=client.id)


def test_module_costs_cross_as_data_and_the_scheduler_balances_by_stage(cluster):
    """A ModuleCost is one of the scheduler's built-ins: a pipelined job with one is registered
    from its spec and balanced by stage; a layer split that does not fit the mesh is refused at
    registration, naming both."""
    client = cluster["client"]
    cost = ModuleCost({"llm": AttentionCost(a=1.0, b=2048.0), "vision": ImagePatchCost()},
                      layer_split=[3, 5])
    plan = (Plan(cluster["sources"]).mix({"chat": 1.0, "code": 1.0}).cost(cost)
            .balance(micro_batches=2, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=2, pp=2)).seed(3))
    spec = plan.to_spec()
    submit_job(client, Plan.from_spec(spec, build_sources=False), job="by-stage")  # as data

    def by_stage(dask_scheduler):  # how the job's Planner balances, read on the scheduler
        assigner = dask_scheduler.extensions["mdata"].jobs["by-stage"].state.assigner
        return type(assigner.cost_model).__name__, assigner.by_stage

    assert client.run_on_scheduler(by_stage) == ("ModuleCost", True)
    batches = run_loaders(client, job="by-stage", world_size=4, steps=2)
    assert sorted(batches) == [0, 1, 2, 3]
    assert all([b["step"] for b in batches[r]] == [0, 1] for r in batches)

    def balance(dask_scheduler):  # what the dashboard's balance page and its JSON route show
        from scheduler_plugins.dashboard.figures import balance_figures

        return balance_figures(dask_scheduler.extensions["mdata"].jobs["by-stage"])

    shown = client.run_on_scheduler(balance)
    assert shown["measure"] == "1F1B makespan" and len(shown["steps"]) >= 2
    for makespans, bound, scalar in zip(shown["per_rank_cost"], shown["lower_bound"],
                                        shown["scalar_makespan"]):
        assert len(makespans) == 2 and bound <= max(makespans) * (1 + 1e-9) <= scalar * (1 + 1e-9)
    client.sync(client.scheduler.mdata_close_job, job="by-stage", client=client.id)
    bad = {**spec, "cost": {**spec["cost"], "args": {**spec["cost"]["args"], "layer_split": [1, 1, 1]}}}
    with pytest.raises(PlanError, match=r"layer_split has 3 entries but the mesh has pp=2"):
        client.sync(client.scheduler.mdata_register_job, job="bad-split", plan=bad, checkpoint=None)
    assert "bad-split" not in client.sync(client.scheduler.mdata_jobs)
