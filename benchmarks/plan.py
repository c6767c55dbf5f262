"""Plans as data: the demo's plan of the example corpus survives every form it travels in.

The plan goes Plan -> ``to_spec()`` -> JSON -> msgpack (as Dask's comms carry a handler's
arguments, into ``RegisterJobRequest``) -> YAML plan file -> ``Plan.from_file``, and must come back
the same plan: the same spec, the same fingerprint, equal Source values (transforms included), and
the same simulation of the Planner on the corpus's real per-row token counts. The figure is 1 when
all of that holds, 0 otherwise (a round trip that loses anything is a bug, not a slowdown);
``plan.spec_bytes`` is the size of the spec as JSON, what crosses to the scheduler per registration.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import msgpack

from benchmarks.workload import corpus_dir, corpus_profile
from mdata.data.example import example_sources
from mdata.driver.demo import demo_plan
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.wire.messages import RegisterJobRequest

__all__ = ["run"]


def _travel(plan: Plan, folder: Path) -> Plan:
    spec = json.loads(json.dumps(plan.to_spec()))
    wire = msgpack.unpackb(msgpack.packb(RegisterJobRequest(job="bench", plan=spec).to_msg(),
                                         use_bin_type=True), raw=False, use_list=False)
    received = Plan.from_spec(RegisterJobRequest.from_msg(wire).plan)
    return Plan.from_file(received.to_file(folder / "plan.yaml"))


def run(quick: bool) -> dict[str, float]:
    steps = 4 if quick else 16
    plan = demo_plan(example_sources(corpus_dir()))
    metadata = corpus_profile().metadata()
    with tempfile.TemporaryDirectory() as folder:
        back = _travel(plan, Path(folder))
    same = (back.to_spec() == plan.to_spec() and back.fingerprint() == plan.fingerprint()
            and back.sources == plan.sources
            and simulate(back, steps, metadata, keep_samples=True).samples
            == simulate(plan, steps, metadata, keep_samples=True).samples)
    return {
        "plan.spec_roundtrip_ok": 1 if same else 0,
        "plan.spec_bytes": len(json.dumps(plan.to_spec()).encode()),
    }


if __name__ == "__main__":  # pragma: no cover
    import sys

    for name, value in run(quick="--quick" in sys.argv).items():
        print(f"{name:40s} {value}")
