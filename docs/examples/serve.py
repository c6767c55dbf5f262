"""Start an embedded mdata cluster for my_job.py's sources (or attach to a running one), submit the
job, and wait for trainers.

    python docs/examples/serve.py --data /tmp/mdata-quickstart --port 8786 --dp 2 --steps 5
    python docs/examples/serve.py --attach tcp://10.0.0.5:8786 --dp 2 --steps 5

It prints the scheduler address trainers attach to, waits until every rank has consumed
``--steps`` steps, prints what happened, then closes the job and the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # before Dask is imported

from my_job import JOB, make_data, my_plan, my_sources

import dask
from distributed import Client

from mdata.driver import start_cluster
from mdata.driver import JobHandle
from mdata.sources import list_shards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/tmp/mdata-quickstart", help="folder or fsspec URL")
    parser.add_argument("--port", type=int, default=8786, help="scheduler port")
    parser.add_argument("--attach", default=None, help="use the cluster at this scheduler address")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel ranks (trainers)")
    parser.add_argument("--steps", type=int, default=5, help="exit after trainers consumed this many")
    args = parser.parse_args()

    sources = my_sources(args.data)
    try:
        list_shards(sources[0])
    except Exception:  # no data yet: write it
        make_data(args.data)
    plan = my_plan(sources, dp=args.dp)
    with contextlib.ExitStack() as stack:
        if args.attach:
            client = stack.enter_context(Client(args.attach, set_as_default=False))
        else:
            # Loaders build mdata's own transforms and those of the modules their operator trusts:
            # trust this job's module (QATemplate) on the embedded workers, which inherit this config.
            stack.enter_context(dask.config.set({"mdata.workers.trusted-modules": ["my_job"]}))
            cluster = stack.enter_context(start_cluster(sources, scheduler_port=args.port))
            client = stack.enter_context(cluster.client(set_as_default=False))
        job = JobHandle.submit(client, plan, job=JOB)
        print(f"scheduler {client.scheduler.address} dashboard {client.dashboard_link}", flush=True)
        while job.consumed_step() < args.steps:
            failure = job.status()["failure"]
            if failure:
                print(f"job failed: {failure}")
                return 1
            time.sleep(0.5)
        for s in job.step_summaries()[: args.steps]:
            print(f"step {s['step']}: {s['counts']} max/lower bound {s['max_over_lower_bound']:.3f}")
        print(f"checkpoint: {job.checkpoint()}")
        job.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
