"""What a newcomer's plan mistakes say, without a cluster: a source left out of the mixture, an
unknown key in a plan file (named by the source's name, the file and the line), a trainer world
that is not the plan's mesh, and the story of a sample that was never planned."""

from __future__ import annotations

import json
import warnings

import pytest

from mdata.errors import MeshError, PlanError, SampleNotPlannedError, UnmixedSourceWarning
from mdata.lineage.ids import SampleId
from mdata.mesh import ClientPlaceTree
from mdata.mixing import StagedMixture
from mdata.plan import Plan
from mdata.lineage.sample_lookup import check_sample_exists, not_planned
from mdata.spec.origin import yaml_lines
from mdata.trainer.environment import world_size_mismatch

PLAN = """\
mdata_plan: 1
sources:
- name: notes
  url: /data/notes/*.jsonl
  format: jsonl
- name: code
  url: /data/code/*.parquet
  chunk_rows: 32
mixture: {type: static, weights: {notes: 1.0, code: 1.0}}
balance: {micro_batches: 1, max_tokens: 512, global_batch: 4}
mesh: {dp: 1}
"""


def _file(tmp_path, text: str, name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _read(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning is a failure unless a test expects it
        return Plan.from_file(path, build_sources=False)


def test_a_source_left_out_of_the_mixture_is_warned_about_naming_it_and_the_file(tmp_path):
    path = _file(tmp_path, PLAN.replace("weights: {notes: 1.0, code: 1.0}", "weights: {notes: 1.0}"))
    with pytest.warns(UnmixedSourceWarning) as caught:
        plan = Plan.from_file(path, build_sources=False)
    assert [str(w.message) for w in caught] == [
        f"plan file {str(path)!r}, line 9: source 'code' of the plan is not in the mixture, so never "
        "sampled; give it a weight, or weight 0 to leave it out on purpose"]
    assert plan.mixture.weights_vector(0, plan.source_names).tolist() == [1.0, 0.0]  # as before
    # weight 0 says it on purpose: silent, the same plan
    explicit = _read(_file(tmp_path, PLAN.replace("code: 1.0}", "code: 0}"), "zero.yaml"))
    assert explicit.mixture.weights_vector(0, explicit.source_names).tolist() == [1.0, 0.0]


def test_the_python_api_warns_at_the_callers_line_and_a_stage_counts_as_mentioning():
    plan = Plan(["web", "code", "chat"])
    with pytest.warns(UnmixedSourceWarning, match=r"^sources 'code', 'chat' of the plan are not in "
                      r"the mixture.*give each a weight, or weight 0 to leave them out") as caught:
        plan.mix({"web": 1})
    assert caught[0].filename == __file__  # points at this line, not inside mdata
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan.mix({"web": 1, "code": 0, "chat": 0})
        plan.mix(StagedMixture([(0, {"web": 1}), (5, {"code": 1, "chat": 1})]))  # later stages
        # a spec a Plan wrote was warned about where that Plan was mixed: reading it is silent
        Plan.from_spec(Plan(["web", "code"]).mix({"web": 1, "code": 0}).to_spec())


@pytest.mark.parametrize("change, line, message", [
    (("  chunk_rows: 32\n", "  chunk_rows: 32\n  colour: red\n"), 9,
     "source 'code' has unknown keys ['colour']; a source has ['name', 'url'"),
    (("  format: jsonl\n", "  format: jsonl\n  chunk_rows: 0\n"), 3,  # a bad value: its source's line
     "source 'notes': chunk_rows must be an int >= 1, got 0"),
    (("mesh: {dp: 1}\n", "mesh: {dp: 1}\nmixtures: {}\n"), 12, "plan spec has unknown keys ['mixtures']"),
    (("balance: {micro_batches: 1,", "balance: {micro: 1,"), 10,
     "plan spec 'balance' has keys ['global_batch', 'max_tokens', 'micro']"),
    (("mesh: {dp: 1}", "mesh: {dp: 0}"), 11, "mesh dp must be >= 1, got 0"),
])
def test_a_plan_files_mistake_names_the_file_the_line_and_the_source(tmp_path, change, line, message):
    path = _file(tmp_path, PLAN.replace(*change))
    with pytest.raises(PlanError) as caught:
        _read(path)
    text = str(caught.value)
    assert text.startswith(f"plan file {str(path)!r}, line {line}: "), text
    assert message in text, text
    assert "source 1" not in text and "source 0" not in text


def test_a_received_spec_names_the_source_by_name_and_a_json_file_by_its_name(tmp_path):
    spec = Plan.from_file(_file(tmp_path, PLAN), build_sources=False).to_spec()
    spec["sources"][1]["colour"] = "red"
    with pytest.raises(PlanError, match=r"^source 'code' has unknown keys \['colour'\]"):
        Plan.from_spec(spec, build_sources=False)
    del spec["sources"][1]["name"]
    with pytest.raises(PlanError, match=r"^source #2 of 'sources' has unknown keys"):
        Plan.from_spec(spec, build_sources=False)
    path = _file(tmp_path, json.dumps({**spec, "sources": [spec["sources"][0], {"url": "/x"}]}), "job.json")
    with pytest.raises(PlanError, match=rf"^plan file {str(path)!r}: source #2 of 'sources' has no 'name'"):
        _read(path)


def test_yaml_lines_follow_keys_and_list_items():
    lines = yaml_lines(PLAN)
    assert lines[("sources",)] == 2 and lines[("sources", 1)] == 6
    assert lines[("sources", 1, "chunk_rows")] == 8 and lines[("balance", "max_tokens")] == 10
    assert yaml_lines("sources: [web\n") == {}


def test_a_world_size_mismatch_says_which_torchrun_flags_or_which_mesh_fit():
    mesh = ClientPlaceTree(dp=2, cp=2)
    text = str(world_size_mismatch("default", mesh, 3, local_world_size=None))
    assert text.startswith("job 'default' plans for mesh dp=2 pp=1 cp=2 tp=1 (world size 4), but "
                           "this trainer says WORLD_SIZE=3. Start 4 trainer ranks: "
                           "`torchrun --nproc-per-node 4` on one host, or `--nnodes N "
                           "--nproc-per-node M` with N*M = 4; or change the plan's mesh so that "
                           "dp*pp*cp*tp = 3 (3 ranks are not a multiple of pp*cp*tp = 2)"), text
    text = str(world_size_mismatch("default", mesh, 2, local_world_size=2))
    assert "`torchrun --nnodes 2 --nproc-per-node 2`" in text
    assert "change the plan's mesh to dp=1 (pp=1 cp=2 tp=1 kept) for 2 ranks" in text
    assert isinstance(world_size_mismatch("j", mesh, 8), MeshError)


def test_a_sample_that_was_never_planned_says_why():
    sid = SampleId("notes", 1, 40)
    check_sample_exists(sid, "default", [30, 41])  # exists: nothing to say
    with pytest.raises(SampleNotPlannedError, match=r"^job 'default': no sample notes/2/0: source "
                       r"'notes' has 2 shard\(s\), numbered 0\.\.1$"):
        check_sample_exists(SampleId("notes", 2, 0), "default", [30, 41])
    with pytest.raises(SampleNotPlannedError, match=r"shard 1 of source 'notes' has 41 row\(s\), "
                       r"numbered 0\.\.40$"):
        check_sample_exists(SampleId("notes", 1, 41), "default", [30, 41])
    error = not_planned(sid, "default", 5, forgotten_before=2)
    assert isinstance(error, LookupError) and error.sample_id == "notes/1/40"
    assert str(error).startswith("job 'default': sample notes/1/40 has not been planned (not in "
                                 "steps 0..4, planned so far)")
    assert "lineage of steps before 2 is no longer kept" in str(error)
    assert "no step is planned yet" in str(not_planned(sid, "default", 0))
    assert str(not_planned(sid, "j", 3, lineage_note="lineage older than step 1 unavailable")) \
        .endswith("; lineage older than step 1 unavailable")
