"""Trainer process body for cluster tests: torch.distributed (gloo) + the mdata Loader.

Lives in its own module so that ``multiprocessing`` spawn can import it in the child.
"""

from __future__ import annotations

import os


def trainer(rank: int, world_size: int, address: str, port: int, job: str, steps: int, out) -> None:
    import torch
    import torch.distributed as dist

    from mdata.trainer import Loader

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        received = []
        with Loader(address, job=job, steps=steps, timeout=90) as loader:
            for batch in loader:
                received.append({
                    "step": batch["step"],
                    "sample_ids": batch["sample_ids"].tolist(),
                    "input_ids": [mb["input_ids"].tolist() for mb in batch["micro_batches"]],
                    "seqlens": [mb["seqlens"].tolist() for mb in batch["micro_batches"]],
                })
                total = torch.tensor([float(len(batch["sample_ids"]))])
                dist.all_reduce(total)  # a synchronous step, as in data-parallel training
            state = loader.state_dict()
        out.put({"rank": rank, "received": received, "state": state})
    except BaseException as exc:  # noqa: BLE001 - reported to the test, never a hang
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        dist.destroy_process_group()
