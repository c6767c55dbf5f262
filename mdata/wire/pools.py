"""Messages that change a loader pool worker's role: the Planner promotes a warm standby to
loader when a loader dies, and turns a returning loader into the pool's standby
(:mod:`mdata.pools.standbys` decides; ``scheduler_plugins/standbys.py`` sends these).

* Planner -> pool worker: :class:`SetRoleRequest` (``mdata_set_role``), answered with the
  worker's resources afterwards (:class:`SetRoleReply`).

And the one shape of a pool sizing decision, :class:`PoolDecision`: the Planner decides one per
source (:mod:`mdata.pools.demand`), :func:`mdata.pools.scaling.pool_targets` adds them up per pool,
the autoscaler (:mod:`mdata.driver.autoscale`) applies them and reports what it applied and any
error back to the Planner (:class:`ScalerReportRequest`, ``mdata_scaler_report``), and job status,
dashboard and logs show the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mdata.wire.codec import (
    Handler, Message, Reader, Request, check_float, check_int, check_str,
)
from mdata.wire.jobs import OkReply

__all__ = ["SetRoleRequest", "SetRoleReply", "PoolDecision", "ScalerStatus", "ScalerReportRequest"]


@dataclass(frozen=True)
class SetRoleReply(Message):
    """The worker's resources once the change is applied (what its tasks may now use)."""

    resources: Mapping[str, float]

    def to_msg(self) -> dict[str, Any]:
        return {"resources": dict(self.resources)}

    @classmethod
    def from_msg(cls, msg: Any) -> "SetRoleReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.mapping("resources", check_float))
        r.done()
        return out


@dataclass(frozen=True)
class SetRoleRequest(Request):
    """Become ``role`` (``loader`` or ``standby``): hold ``resources`` and give up ``drop``.

    A worker must hold a resource before a task needing it arrives, so for a promotion the Planner
    sends this before it routes load tasks to the worker; for a demotion, after it stopped routing.
    """

    handler = Handler.SET_ROLE
    reply = SetRoleReply

    role: str
    resources: Mapping[str, float]
    drop: tuple[str, ...] = ()

    def to_msg(self) -> dict[str, Any]:
        return {"role": self.role, "resources": dict(self.resources), "drop": list(self.drop)}

    @classmethod
    def from_msg(cls, msg: Any) -> "SetRoleRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("role"), r.mapping("resources", check_float), r.list("drop", check_str))
        r.done()
        return out


@dataclass(frozen=True)
class PoolDecision(Message):
    """Run ``workers`` workers in ``group`` (a source for the Planner, a pool for a deployment).

    ``demand``: busy worker threads needed, headroom included, before dividing by ``threads``
    per worker and rounding up; ``current``: the workers when decided (-1: not known); ``kind``:
    ``start``, ``up``, ``down`` or ``hold`` (no change); ``time``: wall-clock seconds; ``reason``:
    the sentence that says why, with every number behind it.
    """

    group: str
    workers: int
    reason: str
    demand: float = 0.0
    current: int = -1
    threads: int = 1
    kind: str = "hold"
    time: float = 0.0
    sources: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.kind != "hold"

    def to_msg(self) -> dict[str, Any]:
        return {"group": self.group, "workers": self.workers, "reason": self.reason,
                "demand": self.demand, "current": self.current, "threads": self.threads,
                "kind": self.kind, "time": self.time, "sources": list(self.sources)}

    @classmethod
    def from_msg(cls, msg: Any) -> "PoolDecision":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("group"), r.int("workers"), r.str("reason"), r.float("demand"),
                  r.int("current"), r.int("threads"), r.str("kind"), r.float("time"),
                  r.list("sources", check_str))
        r.done()
        return out

    def __getitem__(self, name: str) -> Any:  # ``status["pool_targets"][src]["workers"]`` reads on
        return getattr(self, name)


def read_decision(value: Any, r: Reader, name: str) -> PoolDecision:
    return PoolDecision.from_msg(value)


@dataclass(frozen=True)
class ScalerStatus(Message):
    """How a pool autoscaler is doing: ``running``, how many ``errors`` it survived and the last
    one (empty when none), when it last ran (wall clock, 0: never), the workers per group it saw
    then, and the decisions it applied most recently (oldest first)."""

    running: bool = False
    errors: int = 0
    last_error: str = ""
    last_run: float = 0.0
    workers: Mapping[str, int] = field(default_factory=dict)
    applied: tuple[PoolDecision, ...] = ()

    def to_msg(self) -> dict[str, Any]:
        return {"running": self.running, "errors": self.errors, "last_error": self.last_error,
                "last_run": self.last_run, "workers": dict(self.workers),
                "applied": [d.to_msg() for d in self.applied]}

    @classmethod
    def from_msg(cls, msg: Any) -> "ScalerStatus":
        r = Reader(cls.__name__, msg)
        out = cls(r.bool("running"), r.int("errors"), r.str("last_error"), r.float("last_run"),
                  r.mapping("workers", check_int), r.list("applied", read_decision))
        r.done()
        return out


def read_scaler(value: Any, r: Reader, name: str) -> ScalerStatus:
    return ScalerStatus.from_msg(value)


@dataclass(frozen=True)
class ScalerReportRequest(Request):
    """Driver -> Planner (``mdata_scaler_report``): an autoscaler's status, so that job status
    and the dashboard say what it applied and whether it hit errors."""

    handler = Handler.SCALER_REPORT
    reply = OkReply

    status: ScalerStatus

    def to_msg(self) -> dict[str, Any]:
        return {"status": self.status.to_msg()}

    @classmethod
    def from_msg(cls, msg: Any) -> "ScalerReportRequest":
        r = Reader(cls.__name__, msg)
        out = cls(ScalerStatus.from_msg(r.raw("status")))
        r.done()
        return out
