"""The job every control-plane benchmark registers: two text sources, one micro-batch per rank.

Shared by the sweep (:mod:`benchmarks.control_plane`), its per-rank part
(:mod:`benchmarks.control_consume`) and the host agent's figure (:mod:`benchmarks.host_agent`), so
they measure the same plan; kept apart from the sweep so that the parts it runs import it without
importing the sweep.
"""

from __future__ import annotations

__all__ = ["job_plan"]


def job_plan(sources, dp: int, tp: int, broadcast: str | None = None):
    """The plan of ``dp`` DP groups of ``tp`` ranks over the example corpus' text sources."""
    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan

    text = [s for s in sources if s.name in ("chat", "code")]
    return (Plan(text).mix({s.name: 1.0 for s in text})
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=2 * dp)
            .distribute(ClientPlaceTree(dp=dp, tp=tp)).broadcast_at(broadcast).seed(3))
