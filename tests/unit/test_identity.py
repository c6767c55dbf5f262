"""The plan's fingerprint is a hash of a canonical description: the same in every process for a
plain-function cost model, sensitive to URLs and listings, and split into what a checkpoint must
match (the data) and what may change (placement)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mdata.cost import AttentionCost
from mdata.identity import DataIdentity, describe, plan_description
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.sources import Source

HERE = Path(__file__).resolve().parent


def linear_cost(num_tokens, num_patches):
    """A cost model that is a plain function (its repr holds a memory address)."""
    return np.asarray(num_tokens, np.float64)


def plan(cost=linear_cost, url="/data/web/*.parquet", dp=4, seed=3) -> Plan:
    sources = [Source("web", url, chunk_rows=128), Source("code", "/data/code")]
    return (Plan(sources).mix({"web": 2, "code": 1}).cost(cost)
            .balance(micro_batches=2, max_tokens=4096, global_batch=32)
            .distribute(ClientPlaceTree(dp=dp)).seed(seed))


def test_a_plain_function_cost_model_is_described_by_its_import_path():
    text = json.dumps(plan_description(plan()))
    assert " at 0x" not in text and "test_identity:linear_cost" in text
    assert describe(functools.partial(linear_cost, 1)) == {
        "partial": "test_identity:linear_cost", "args": [1], "keywords": {}}
    assert describe(AttentionCost(a=2.0)) == {
        "type": "mdata.cost:AttentionCost", "fields": {"a": 2.0, "b": 49152.0}}
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_identity as t; "
            "print(t.plan().fingerprint())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)}).stdout
    assert out.strip() == plan().fingerprint()


def test_urls_and_listings_enter_the_fingerprint():
    assert plan(url="s3://bucket/web/*.parquet").fingerprint() != plan().fingerprint()
    listings = {"web": [["a.parquet", 100], ["b.parquet", 50]], "code": [["c.jsonl", 7]]}
    full = plan().fingerprint(listings)
    assert full != plan().fingerprint() and full == plan().fingerprint(json.loads(json.dumps(listings)))
    changed = {**listings, "web": [["a.parquet", 100], ["b.parquet", 49]]}
    assert plan().fingerprint(changed) != full


def test_the_data_identity_leaves_placement_out():
    listings = {"web": [100, 50], "code": [7]}
    data = DataIdentity.of(plan(), listings)
    assert DataIdentity.of(plan(dp=2, cost=AttentionCost()), listings) == data
    assert DataIdentity.of(plan(seed=4), listings) != data
    assert DataIdentity.of(plan(url="/elsewhere"), listings) != data
    assert data.source("web").rows == 150 and data.source("web").shards == 2
    again = DataIdentity.from_dict(json.loads(json.dumps(data.to_dict())), data.names)
    assert again == data and again.fingerprint() == data.fingerprint()
    assert plan(dp=2).fingerprint() != plan().fingerprint()  # the plan's fingerprint has it all
