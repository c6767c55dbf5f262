"""Compatibility alias: the trainer's ``Loader`` lives in :mod:`mdata.trainer`, ``submit_job`` in
:mod:`mdata.driver`. Kept so that ``from mdata.client import Loader`` in existing training scripts
keeps working; new code imports from the homes above."""

from mdata.driver import submit_job
from mdata.trainer import Loader, default_device

__all__ = ["Loader", "submit_job", "default_device"]
