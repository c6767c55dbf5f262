"""Elastic resume, checked by simulation: does a checkpoint continue correctly on another shape?

The Planner's own state machine (``mdata.planner.simulate``) runs a DP 4 job uninterrupted,
keeps the checkpoint of step ``k``, and resumes it under other plans:

* the same global batch on DP 2, DP 8, DP 2 x CP 2, DP 2 x TP 2 x PP 2, DP 8 with broadcast at
  TP, more micro-batches: every resumed step must hold exactly the uninterrupted run's samples;
* another global batch (32 and 96), and another mixture (allowed explicitly): every source's
  samples after the resume must be exactly its order from the checkpoint's cursor on, minus the
  rows loaders skip (none repeated, none skipped), and the new mixture's counts exact from the
  first step.

``resume.elastic_ok`` is 1 when all of them hold, else 0. The sources are generated token-length
metadata (a large source, a middle one, and a small one with bad rows whose epochs wrap every few
steps), since only lengths and skips matter to the Planner. Also reported: the size of the
checkpoint that travels with every batch, and of the stored one with every shard's listing.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from benchmarks.harness import figure
from mdata.checkpoint import Checkpoint
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.mixing import ExactApportioner
from mdata.order import SourceOrder
from mdata.plan import Plan
from mdata.planner import ResumeOptions, simulate

__all__ = ["run"]

WEIGHTS = {"web": 3.0, "code": 2.0, "chat": 1.0}
NEW_WEIGHTS = {"web": 1.0, "code": 1.0, "chat": 2.0}


def _metadata() -> dict[str, SourceMetadata]:
    rng = np.random.default_rng(17)

    def source(name: str, shards: int, rows: int, mu: float, bad_every: int = 0) -> SourceMetadata:
        tokens = [np.clip(rng.lognormal(mu, 1.0, rows), 1, 32_000).astype(np.int32)
                  for _ in range(shards)]
        skipped = None
        if bad_every:
            skipped = [np.arange(rows) % bad_every == k % bad_every for k in range(shards)]
        return SourceMetadata.from_arrays(name, tokens, skipped=skipped)

    return {"web": source("web", 8, 2000, 6.0, bad_every=41), "code": source("code", 4, 1500, 7.0),
            "chat": source("chat", 2, 60, 4.5, bad_every=13)}


def _plan(dp: int = 4, global_batch: int = 48, micro_batches: int = 2, weights=None, **mesh) -> Plan:
    return (Plan(list(WEIGHTS)).mix(weights or WEIGHTS)
            .balance(micro_batches=micro_batches, max_tokens=8192, global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=dp, **mesh)).seed(5).window(3).shuffle(2))


def _unions(result) -> dict[int, list]:
    return {s: sorted(i for rank in ranks for i in rank) for s, ranks in result.samples.items()}


def _continues(plan: Plan, meta, start: dict, result, end: int) -> bool:
    """Each source's samples in ``result`` are exactly its order from ``start``'s cursors to the
    cursors of the checkpoint of ``end``, minus skipped rows."""
    final = result.checkpoints[end]["cursors"]
    got: dict[str, Counter] = {n: Counter() for n in plan.source_names}
    for ranks in result.samples.values():
        for rank in ranks:
            for source, shard, row in rank:
                got[source][(shard, row)] += 1
    for name in plan.source_names:
        order = SourceOrder(meta[name].shard_rows, plan.chunk_rows(name), plan.seed_value, name,
                            plan.shuffle_chunks)
        taken = order.take(start["cursors"][name], final[name] - start["cursors"][name])
        bad = meta[name].skipped
        want = Counter((s, r) for s, r in zip(taken.shards.tolist(), taken.rows.tolist())
                       if bad is None or not bad[s][r])
        if got[name] != want:
            return False
    return True


def _exact_counts(plan: Plan, result) -> bool:
    names, fresh = plan.source_names, ExactApportioner(len(plan.source_names),
                                                        plan.balance_spec.global_batch)
    for k, step in enumerate(result.steps.tolist()):
        expected = fresh.counts(plan.mixture.weights_vector(step, names))
        if result.counts[k].tolist() != expected.tolist():
            return False
    return True


def run(quick: bool = False) -> dict[str, object]:
    meta = _metadata()
    steps = 24 if quick else 96
    k = steps // 3
    reference = simulate(_plan(), steps, meta, keep_samples=True, checkpoints=[k])
    ckpt = reference.checkpoints[k]
    want = {s: v for s, v in _unions(reference).items() if s >= k}

    same_batch = [_plan(dp=2), _plan(dp=8), _plan(dp=2, cp=2), _plan(dp=2, tp=2, pp=2),
                  _plan(dp=8, tp=2).broadcast_at("tp"), _plan(micro_batches=5)]
    checks: dict[str, bool] = {}
    for plan in same_batch:
        again = simulate(plan, steps - k, meta, keep_samples=True, checkpoint=ckpt)
        checks[f"same batch on {plan.mesh.describe()}"] = _unions(again) == want
    for batch, dp in ((32, 4), (96, 8)):
        plan = _plan(dp=dp, global_batch=batch)
        again = simulate(plan, steps - k, meta, keep_samples=True, checkpoint=ckpt, checkpoints=[steps])
        checks[f"global batch {batch} on DP {dp}"] = _continues(plan, meta, ckpt, again, steps)
    plan = _plan(dp=2, weights=NEW_WEIGHTS)
    again = simulate(plan, steps - k, meta, keep_samples=True, checkpoint=ckpt, checkpoints=[steps],
                     resume_options=ResumeOptions(allow_mixture_change=True))
    checks["mixture change on DP 2"] = (_continues(plan, meta, ckpt, again, steps)
                                        and _exact_counts(plan, again))
    failed = [name for name, ok in checks.items() if not ok]
    light = Checkpoint.from_dict(ckpt).light()
    return {
        "resume.elastic_ok": figure(
            float(not failed), goal="1 (resumed steps identical on another mesh; orders continue)",
            note=(f"{len(checks)} resumes of a DP 4 checkpoint at step {k} of {steps}: "
                  + ("all hold" if not failed else "failed: " + "; ".join(failed)))),
        "resume.variants": len(checks),
        "resume.checkpoint_bytes": light.nbytes(),
        "resume.checkpoint_bytes_with_listings": Checkpoint.from_dict(ckpt).nbytes(),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=2, default=str))
