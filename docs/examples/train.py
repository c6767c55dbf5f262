"""One trainer rank. Start one per GPU with torchrun, which sets RANK and WORLD_SIZE:

    torchrun --nproc-per-node 2 docs/examples/train.py --scheduler tcp://127.0.0.1:8786 --steps 5

With ``--plan PLAN.yaml`` the first rank to arrive registers the job from the plan file (the
others find it registered); without it the job must be registered already (serve.py, or
``mdata cluster up --plan PLAN.yaml``). The job name defaults to ``default``, as for ``cluster up``,
``serve.py`` and the ``Loader``. An mdata error (a wrong address, job name or WORLD_SIZE) ends the
rank with one line saying what to do, not a traceback.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from mdata.errors import MdataError
from mdata.plan import Plan
from mdata.trainer import Loader


def main() -> None:
    parser = argparse.ArgumentParser(description="an mdata trainer rank")
    parser.add_argument("--scheduler", required=True, help="the mdata scheduler's address")
    parser.add_argument("--job", default="default", help="the job's name (default: default)")
    parser.add_argument("--steps", type=int, default=5, help="steps to train")
    parser.add_argument("--plan", default=None, help="a plan file (YAML) to register the job from")
    args = parser.parse_args()
    plan = None if args.plan is None else Plan.from_file(args.plan)

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() else None
    try:
        train(args, plan, rank, device)
    except MdataError as exc:  # one line per rank: what went wrong and what to do
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.destroy_process_group()


def train(args: argparse.Namespace, plan, rank: int, device) -> None:
    with Loader(args.scheduler, job=args.job, plan=plan, steps=args.steps, device=device) as loader:
        for batch in loader:
            tokens = torch.zeros(1)
            for mb in batch["micro_batches"]:
                # model(mb["input_ids"], position_ids=mb["position_ids"], cu_seqlens=mb["cu_seqlens"])
                # loss against mb["labels"]; backward ...
                tokens += int(mb["seqlens"].sum())
            dist.all_reduce(tokens)  # every rank waits for the slowest, as in real training
            print(f"rank {rank} step {batch['step']}: {len(batch['micro_batches'])} micro-batches, "
                  f"{int(tokens.item())} tokens over all ranks", flush=True)
        state = loader.state_dict()  # save it with the model; resume with Loader(..., checkpoint=state)
    print(f"rank {rank} resumes at step {state['next_step']}", flush=True)


if __name__ == "__main__":
    main()
