"""A load failure's reason ends with advice that fits what is at fault: the data or the storage."""

from __future__ import annotations

import pytest

from mdata.errors import (
    CorruptShardError, MdataError, SkipBudgetExceededError, StorageEndpointError, StorageUnavailableError,
)
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.planner import ChunkFailed, JobFailed, PlannerState, Tick


class Src:
    def __init__(self, name, chunk_rows):
        self.name, self.chunk_rows = name, chunk_rows


def failed_reason(error) -> str:
    plan = (Plan([Src("a", 3)]).mix({"a": 1}).balance(micro_batches=1, max_tokens=100, global_batch=2)
            .distribute(ClientPlaceTree(dp=2)).window(1).shuffle(1))
    state = PlannerState(plan, {"a": [6]}, job="j")
    (load,) = state.handle(Tick(stimulus_id="t0"))
    (failed,) = state.handle(ChunkFailed(load.chunk, error, stimulus_id="f"))
    assert isinstance(failed, JobFailed)
    assert failed.error is (error if isinstance(error, MdataError) else None)
    return failed.reason


@pytest.mark.parametrize("error", [
    StorageUnavailableError("unreachable for 300s over 12 attempts", source="a", shard="a-0.parquet"),
    StorageEndpointError("never answered", source="a", endpoint="http://127.0.0.1:1"),
])
def test_a_storage_failure_points_at_the_storage_not_the_shard(error):
    reason = failed_reason(error)
    assert "remove the shard" not in reason and "skip_tolerance" not in reason
    assert "data is not at fault" in reason
    if isinstance(error, StorageEndpointError):
        assert "endpoint_url" in reason
    else:
        assert "mdata.storage.retry-deadline" in reason


@pytest.mark.parametrize("error", [
    CorruptShardError("bad footer", source="a", shard="a-0.parquet"),
    SkipBudgetExceededError("2 of 2 rows failed", source="a", shard="a-0.parquet"),
    OSError("connection reset"),
])
def test_a_data_failure_still_says_fix_the_shard_or_raise_skip_tolerance(error):
    reason = failed_reason(error)
    assert reason.endswith("Fix or remove the shard, or raise the source's skip_tolerance "
                           "if single samples are bad")
