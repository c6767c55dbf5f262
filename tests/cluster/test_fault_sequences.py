"""The chaos tests' comparator on synthetic logs: each check fails on the fault it exists to catch.

Pure and fast (no cluster): the logs are written here in the trainer process's format.
"""

from __future__ import annotations

import json

import pytest

from fault_sequences import (
    Received, assert_exactly_once, assert_same_sequences, exactly_once_problems, merge_incarnations,
    read_log, sequence_problems,
)
from mdata.mesh import ClientPlaceTree

MESH = ClientPlaceTree(dp=2)


def run(ranks: int = 2, steps: int = 6, per_rank: int = 2) -> dict[int, list[Received]]:
    """A plausible uninterrupted run: distinct samples everywhere, tokens derived from ids."""
    out = {}
    for rank in range(ranks):
        seq = []
        for step in range(steps):
            ids = tuple((rank, step, i) for i in range(per_rank))
            seq.append(Received(step, ids, f"h{rank}-{step}"))
        out[rank] = seq
    return out


def write_log(path, start: int, steps, *, checkpoints=(), torn: bool = False, done: bool = False) -> None:
    lines = [json.dumps({"kind": "start", "pid": 1, "rank": 0, "start_step": start})]
    for step in steps:
        lines.append(json.dumps({"kind": "batch", "step": step, "sample_ids": [[0, step, 0]],
                                 "tokens": f"t{step}"}))
        if step + 1 in checkpoints:
            lines.append(json.dumps({"kind": "checkpoint", "next_step": step + 1, "path": "x"}))
    if done:
        lines.append(json.dumps({"kind": "done"}))
    text = "\n".join(lines) + "\n"
    if torn:
        text += '{"kind": "batch", "step": 99, "sam'  # a SIGKILL mid-line
    path.write_text(text)


def test_identical_runs_have_no_problems():
    assert sequence_problems(run(), run()) == []
    assert exactly_once_problems(run(), MESH, global_batch=4) == []


def test_a_lost_step_a_repeated_step_and_a_changed_sample_are_each_reported():
    ref = run()
    lost = run()
    del lost[0][3]
    assert any("missing [3]" in p for p in sequence_problems(ref, lost))
    repeated = run()
    repeated[1].insert(4, repeated[1][3])
    assert any("repeated [3]" in p for p in sequence_problems(ref, repeated))
    changed = run()
    rec = changed[0][2]
    changed[0][2] = Received(rec.step, rec.sample_ids[:1] + ((9, 9, 9),), rec.tokens)
    problems = sequence_problems(ref, changed)
    assert problems and "rank 0 step 2: sample ids differ" in problems[0] and "9/9/9" in problems[0]
    with pytest.raises(AssertionError, match="rank 0 step 2"):
        assert_same_sequences(ref, changed)


def test_same_ids_with_other_tokens_are_reported():
    ref, got = run(), run()
    got[1][5] = Received(5, got[1][5].sample_ids, "other")
    assert sequence_problems(ref, got) == [
        "rank 1 step 5: same sample ids, different tokens (sha1 h1-5 vs other)"]


def test_exactly_once_catches_a_sample_in_two_groups_in_two_steps_and_a_short_batch():
    twice = run()
    twice[1][2] = Received(2, (twice[0][2].sample_ids[0], (1, 2, 1)), "x")
    assert any("delivered twice" in p for p in exactly_once_problems(twice, MESH))
    again = run()
    again[0][4] = Received(4, (again[0][1].sample_ids[0], (0, 4, 1)), "x")
    assert any("already came in step 1" in p for p in exactly_once_problems(again, MESH))
    with pytest.raises(AssertionError, match="3 distinct samples, planned 4"):
        short = run()
        short[0][0] = Received(0, short[0][0].sample_ids[:1], "x")
        assert_exactly_once(short, MESH, global_batch=4)


def test_ranks_of_one_dp_group_must_agree():
    mesh = ClientPlaceTree(dp=1, cp=2)
    seqs = run()
    seqs[1] = [Received(r.step, seqs[0][r.step].sample_ids, r.tokens) for r in seqs[1]]
    assert exactly_once_problems(seqs, mesh, global_batch=2) == []
    seqs[1][3] = Received(3, ((5, 5, 5), (5, 5, 6)), "x")
    assert any("DP group 0 received different samples" in p for p in exactly_once_problems(seqs, mesh))


def test_a_restart_replaces_the_steps_from_its_checkpoint_on(tmp_path):
    """Old process trained 0..6 and checkpointed at 4; the new one resumed at 4: steps 4..6 of
    the old process never count, and the merged sequence is 0..3 (old) + 4.. (new)."""
    write_log(tmp_path / "a", 0, range(7), checkpoints=(4,), torn=True)
    write_log(tmp_path / "b", 4, range(4, 9), done=True)
    old, new = read_log(tmp_path / "a"), read_log(tmp_path / "b")
    assert old.last_step == 6 and old.checkpoints == [4] and not old.done and old.start_step == 0
    assert new.done and new.start_step == 4
    new.batches[0] = Received(4, ((0, 4, 0),), "replayed")  # so we can tell whose step 4 counts
    merged = merge_incarnations([old, new])
    assert [r.step for r in merged] == list(range(9))
    assert merged[4].tokens == "replayed"
    assert merged[3] == old.batches[3]


def test_a_restart_from_a_step_never_reached_leaves_a_hole_the_comparison_reports(tmp_path):
    write_log(tmp_path / "a", 0, range(3))
    write_log(tmp_path / "b", 5, range(5, 7))
    merged = merge_incarnations([read_log(tmp_path / "a"), read_log(tmp_path / "b")])
    ref = {0: [Received(s, ((0, s, 0),), f"t{s}") for s in range(7)]}
    assert "missing [3, 4]" in sequence_problems(ref, {0: merged})[0]
