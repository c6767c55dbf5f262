"""One trainer rank. Start one per GPU with torchrun, which sets RANK and WORLD_SIZE:

    torchrun --nproc-per-node 2 docs/examples/train.py --scheduler tcp://127.0.0.1:8786 --steps 5
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from mdata.trainer import Loader


def main() -> None:
    parser = argparse.ArgumentParser(description="an mdata trainer rank")
    parser.add_argument("--scheduler", required=True, help="the mdata scheduler's address")
    parser.add_argument("--job", default="quickstart")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() else None
    with Loader(args.scheduler, job=args.job, steps=args.steps, device=device) as loader:
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
