"""Messages that change a loader pool worker's role: the Planner promotes a warm standby to
loader when a loader dies, and turns a returning loader into the pool's standby
(:mod:`mdata.standbys` decides; ``scheduler_plugins/standbys.py`` sends these).

* Planner -> pool worker: :class:`SetRoleRequest` (``mdata_set_role``), answered with the
  worker's resources afterwards (:class:`SetRoleReply`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mdata.wire.codec import Handler, Message, Reader, Request, check_float, check_str

__all__ = ["SetRoleRequest", "SetRoleReply"]


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
