"""Trainer side: code that runs inside each training process (one per GPU).

``Loader`` attaches to the cluster as a Dask client and yields this rank's batches as torch
tensors; ``tensors`` turns the numpy batches that arrive over the wire into (pinned, on-device)
tensors. Nothing here runs inside the scheduler or a Dask worker.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from mdata.trainer.loader import Loader, default_device

__all__ = ["Loader", "default_device"]
