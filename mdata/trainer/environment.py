"""Where this trainer process is: its rank and world size (torchrun's environment) and the device
batches land on, and what to do when that world is not the one the job's plan was made for. Kept
apart from the Loader so both read the same rules and stay small."""

from __future__ import annotations

import os

from typing import Any

from mdata.errors import MeshError, TrainerError

__all__ = ["default_device", "rank_from_env", "world_size_mismatch"]


def default_device():
    """Where batches land: this process's GPU when CUDA is available (``cuda:LOCAL_RANK``, as
    torchrun sets it), else ``None`` (plain CPU tensors)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def rank_from_env() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError:
        raise TrainerError(
            "cannot tell this trainer's rank: set RANK and WORLD_SIZE (torchrun does) or pass "
            "rank= and world_size= to mdata.trainer.Loader"
        ) from None


def world_size_mismatch(job: str, mesh: Any, world_size: int,
                        local_world_size: int | None = None) -> MeshError:
    """The error of a trainer whose ``WORLD_SIZE`` is not the size of the job's ``mesh`` (a
    ``ClientPlaceTree`` or the mesh a job's info carries), saying both ways out: the torchrun
    flags that start as many ranks as the mesh has, or the mesh that fits this many ranks.

    ``local_world_size``: ranks per host (torchrun's ``LOCAL_WORLD_SIZE``; default: read from
    the environment), so the advice keeps this host's ``--nproc-per-node`` when it can."""
    if local_world_size is None:
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        local_world_size = int(local) if local.isdigit() and int(local) > 0 else None
    needed = mesh.dp * mesh.pp * mesh.cp * mesh.tp
    if local_world_size and needed % local_world_size == 0 and needed > local_world_size:
        start = (f"`torchrun --nnodes {needed // local_world_size} --nproc-per-node "
                 f"{local_world_size}` (this host's {local_world_size} ranks on each of "
                 f"{needed // local_world_size} hosts)")
    else:
        start = (f"`torchrun --nproc-per-node {needed}` on one host, or `--nnodes N "
                 f"--nproc-per-node M` with N*M = {needed}")
    model = mesh.pp * mesh.cp * mesh.tp
    if world_size % model == 0:
        change = (f"change the plan's mesh to dp={world_size // model} (pp={mesh.pp} cp={mesh.cp} "
                  f"tp={mesh.tp} kept) for {world_size} ranks")
    else:
        change = (f"change the plan's mesh so that dp*pp*cp*tp = {world_size} ({world_size} ranks "
                  f"are not a multiple of pp*cp*tp = {model})")
    return MeshError(
        f"job {job!r} plans for mesh dp={mesh.dp} pp={mesh.pp} cp={mesh.cp} tp={mesh.tp} "
        f"(world size {needed}), but this trainer says WORLD_SIZE={world_size}. Start {needed} "
        f"trainer ranks: {start}; or {change}, and register the plan again (a new job name, or "
        "after the job is closed)")
