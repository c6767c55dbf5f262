"""mdata: a Dask-based data orchestrator for multi-source training of large foundation models.

The pure core (sources, plan primitives, balancing, lineage, mesh, checkpoints) lives here and never
imports the Dask-side packages ``scheduler_plugins`` and ``workers``.
"""

from mdata.errors import *  # noqa: F401,F403
from mdata.lineage.ids import SampleId

__version__ = "0.1.0"
__all__ = ["SampleId", "__version__"]
