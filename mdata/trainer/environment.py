"""Where this trainer process is: its rank and world size (torchrun's environment) and the device
batches land on, and what to do when that world is not the one the job's plan was made for. Kept
apart from the Loader so both read the same rules and stay small."""

from __future__ import annotations

import os

from typing import Any

from mdata.errors import MeshError, TrainerError

__all__ = ["default_device", "rank_from_env", "world_size_mismatch", "wants_host_agent", "AUTO_AGENT_WORLD"]

#: With ``mdata.trainer.host-agent: auto``, the world size from which a host's trainer processes
#: share one client: below it the scheduler has time to spare for one client per process, and
#: the agent would only add its local hop to each request.
AUTO_AGENT_WORLD = 1024


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


def wants_host_agent(setting: Any, environ: Any = None) -> bool:
    """Whether this trainer process goes through its host's agent (``mdata.trainer.host-agent``):
    ``true``/``false`` as set; ``auto`` when torchrun says this process has local peers
    (``LOCAL_WORLD_SIZE`` > 1) in a world of :data:`AUTO_AGENT_WORLD` ranks or more, where
    one client per process is what the scheduler can no longer afford."""
    if isinstance(setting, str) and setting.strip().lower() == "auto":
        env = os.environ if environ is None else environ
        try:
            return int(env.get("LOCAL_WORLD_SIZE", "1")) > 1 and \
                int(env.get("WORLD_SIZE", "1")) >= AUTO_AGENT_WORLD
        except ValueError:
            return False
    if isinstance(setting, str):
        value = setting.strip().lower()
        if value in ("true", "yes", "on", "1"):
            return True
        if value in ("false", "no", "off", "0", ""):
            return False
        raise TrainerError(f"mdata.trainer.host-agent must be true, false or auto, got {setting!r}")
    return bool(setting)
