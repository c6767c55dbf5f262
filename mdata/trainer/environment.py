"""Where this trainer process is: its rank and world size (torchrun's environment) and the device
batches land on. Kept apart from the Loader so both read the same rules and stay small."""

from __future__ import annotations

import os

from mdata.errors import TrainerError

__all__ = ["default_device", "rank_from_env"]


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
