"""Hash every instruction the Planner emits, in order: a check that a faster Planner plans the same.

Why: a speed-up of the Planner's bookkeeping must leave every instruction identical (samples,
assignment, LoadChunk/ReleaseChunk order). Run it from the repository root on two checkouts
(``python benchmarks/planner_identity.py``) and compare the printed hashes; the shapes are 1k
sources, 1k with rows skipped by the loader and lost workers, and 10k with both (~45 s in all).
"""
import dataclasses, hashlib, sys
sys.path.insert(0, ".")
import numpy as np
from benchmarks.planner import _plan
from mdata.mesh import ClientPlaceTree
from mdata.planner import PlannerState, Tick, WorkerLost
from mdata.order import ChunkRef
from tests.unit.planner_driver import Driver, lognormal_metadata


STEP_SAMPLES = ("chunks", "chunk", "index", "micro_batch", "position", "num_tokens", "sample_ids",
                "source_index", "shard", "row", "num_micro_batches")


def feed_instruction(h, ins):
    """An instruction, hashed as its per-DP-group parts: a step's construction and a release of
    many groups hash as one construction or release per group would (the Planner once emitted
    those), so checkouts from before and after that change compare."""
    kind = type(ins).__name__
    if kind == "ConstructStep":
        for dp in ins.dp_ranks:
            samples = ins.samples(dp)
            h.update(b"ConstructBatch")
            for name, value in (("stimulus_id", ins.stimulus_id), ("step", ins.step), ("dp_rank", dp)):
                h.update(name.encode()); feed(h, value)
            h.update(b"samples"); h.update(b"StepSamples")
            for name in STEP_SAMPLES:
                h.update(name.encode()); feed(h, getattr(samples, name))
    elif kind == "ReleaseBatch" and hasattr(ins, "dp_ranks"):
        for dp in ins.dp_ranks:
            h.update(b"ReleaseBatch")
            for name, value in (("stimulus_id", ins.stimulus_id), ("step", ins.step), ("dp_rank", dp)):
                h.update(name.encode()); feed(h, value)
    else:
        feed(h, ins)


def feed(h, x):
    if isinstance(x, np.ndarray):
        h.update(str(x.dtype).encode()); h.update(str(x.shape).encode()); h.update(x.tobytes())
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        h.update(type(x).__name__.encode())
        for f in dataclasses.fields(x):
            h.update(f.name.encode()); feed(h, getattr(x, f.name))
    elif isinstance(x, (list, tuple)):
        h.update(b"[%d" % len(x))
        for y in x: feed(h, y)
    elif isinstance(x, dict):
        h.update(b"{")
        for k, v in x.items(): feed(h, k); feed(h, v)
    elif isinstance(x, ChunkRef):
        h.update(repr(x).encode())
    elif hasattr(x, "to_dict"):
        feed(h, x.to_dict())
    else:
        h.update(repr(x).encode())


def run(sources, steps, bad_every, lose):
    meta = {f"s{i:05d}": lognormal_metadata(f"s{i:05d}", 2, 1500 + 7 * (i % 50), 7.0, i,
                                           bad_every=bad_every) for i in range(sources)}
    names = sorted(meta)
    mesh = ClientPlaceTree(dp=16, cp=1, tp=1)
    plan = _plan(names, mesh, 2048, 0)
    state = PlannerState(plan, meta, job="hash", log_size=1000)
    d = Driver(state, meta, bulk=True)
    h = hashlib.sha256()
    n = 0
    since = 0
    for stop in range(10, steps + 1, 10):
        d.run(stop)
        loads = [ins for ins in d.instructions[since:] if type(ins).__name__ == "LoadChunk"]
        since = len(d.instructions)
        if lose and stop in (20, 40):  # a worker lost: its needed chunks reload, held ones drop
            # the sources of the last 100 loads (counted in loads, which every checkout emits
            # alike, not in instructions, whose grouping may differ)
            victims = sorted({ins.chunk.source for ins in loads[-100:]})[:5]
            for v in victims:
                d.queue.extend(state.handle(WorkerLost(f"w-{v}", (), stimulus_id=f"lost-{v}")))
    for ins in d.instructions + list(d.queue):
        feed_instruction(h, ins); n += 1
    return n, h.hexdigest()[:16]


if __name__ == "__main__":
    for sources, steps, bad, lose in [(1000, 120, 0, False), (1000, 120, 7, True),
                                      (10000, 60, 5, True)]:
        print(sources, steps, bad, lose, *run(sources, steps, bad, lose), flush=True)
