"""The Planner pushes built batches' locations to the clients whose ranks will pull them.

Without it every client long-polls once per step and DP group that gets ready (the groups of a
step are built one after the other, so a client's ranks are answered a few at a time), and the
scheduler's time per step goes to handling those messages, not to mdata's work. With it, a
client that long-polled naming itself (``HostLocationRequest.client``) is subscribed for the
lease of each asking rank; when a DP group's batch is built, the group is queued for every
subscribed client with a rank in it, and each client gets one :class:`LocationPush` over its
batched stream once all of its groups of that step are built, or :data:`GATHER_S` after the first
of them was (whichever is first): one message per client and step when its groups are built
together, at most one per group it has ranks in, however many ranks it hosts.

Pushes are hints (:mod:`mdata.wire.location_push`): a rank's lease is checked at each push
(a rank detached or taken over gets none; a client's leases are checked once per change of the
roster, its ``version``, not rank by rank at every push), a batch without holder is not pushed (its ranks
long-poll and wait for the rebuild), and when the job fails, rewinds or closes every subscriber
gets a reset and the subscriptions end (the clients subscribe again with their next long poll).
Counters (``messages``, ``locations``) say what was pushed; the cluster tests read them.

The pusher is given the parts of the job it reads (the roster of leases, the job's
:class:`~scheduler_plugins.built_batches.BuiltBatches`, its failure event, the checkpoint of a
step), not the job's runtime, which creates it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from mdata.errors import MdataError
from mdata.planner.roster import TrainerRoster
from mdata.wire.location_push import PUSH_OP, LocationPush, PushedGroup
from scheduler_plugins.built_batches import BuiltBatches

__all__ = ["GATHER_S", "LocationPusher"]

logger = logging.getLogger("mdata.planner")

#: Longest a built group waits for the client's other groups of its step before it is pushed.
GATHER_S = 0.005


class LocationPusher:
    """The push subscriptions of one job's clients (see the module docstring).

    ``job``: its name; ``scheduler``: whose client streams carry the pushes; ``roster``: the
    job's leases; ``mesh``: the trainers' mesh; ``window``: steps planned ahead; ``batches``:
    what is built; ``failed``: set while the job has failed; ``checkpoint_of(step)``: the
    checkpoint a batch of ``step - 1`` travels with (None when the Planner's view has none).
    """

    def __init__(self, job: str, scheduler: Any, roster: TrainerRoster, mesh: Any, window: int,
                 batches: BuiltBatches, failed: asyncio.Event,
                 checkpoint_of: Callable[[int], Any]) -> None:
        self.job, self.scheduler, self.roster, self.mesh = job, scheduler, roster, mesh
        self.window = max(1, int(window))
        self.batches, self.failed, self.checkpoint_of = batches, failed, checkpoint_of
        self.closed = False  # the job closed: no subscription any more
        # client id -> rank -> (lease token, generation, cp_rank, receives_tokens, receives_labels)
        self.subs: dict[str, dict[int, tuple[str, int, int, bool, bool]]] = {}
        # DP rank -> client id -> its subscribed ranks in that group
        self._groups: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        self._client_groups: dict[str, set[int]] = defaultdict(set)  # client -> its DP groups
        self._pending: dict[str, set[tuple[int, int]]] = defaultdict(set)  # client -> built keys
        # client -> the roster version at which every lease it is subscribed for last held:
        # while the roster is unchanged, a push skips checking them one by one
        self._held_at: dict[str, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.messages = 0  # pushes sent, and the rank locations they carried
        self.locations = 0

    # -- subscriptions ---------------------------------------------------------------------------
    def subscribe(self, client: str, step: int, asks: Iterable[Any]) -> bool:
        """Subscribe ``client`` for the ranks of ``asks`` (LocationAsks whose leases were checked),
        asked for ``step``; groups already built for later steps are queued for it at once.
        False when the client has no stream to push on (then it keeps long-polling)."""
        if client not in self.scheduler.client_comms or self.closed:
            return False
        mine = self.subs.setdefault(client, {})
        mesh = self.mesh
        fresh: set[int] = set()  # DP groups with a rank subscribed anew
        for ask in asks:
            if not ask.token or not _holds(self.roster, ask.rank, ask.token, ask.generation):
                continue
            held = mine.get(ask.rank)
            if held is not None and held[:2] == (ask.token, ask.generation):
                continue
            role, dp = mesh.role(ask.rank), mesh.coordinate(ask.rank).dp
            mine[ask.rank] = (ask.token, ask.generation, int(role.cp_rank),
                              bool(role.receives_tokens), bool(role.receives_labels))
            self._held_at.pop(client, None)  # a lease to check again at the next push
            if held is None:  # kept incrementally: a world subscribes a few ranks at a time
                self._groups[dp][client].append(ask.rank)
                self._client_groups[client].add(dp)
            fresh.add(dp)
        if fresh:  # the later steps' batches already built (within the window)
            for s in range(step + 1, step + 1 + self.window):
                for dp in fresh:
                    if self.batches.built_already((s, dp)):
                        self._pending[client].add((s, dp))
            self._schedule()
        return bool(mine)

    def client_gone(self, client: str) -> None:
        self._held_at.pop(client, None)
        if self.subs.pop(client, None) is not None:
            self._pending.pop(client, None)
            for dp in self._client_groups.pop(client, ()):
                self._groups[dp].pop(client, None)

    def close(self) -> None:
        """The job closed: tell every subscriber, and take no subscription any more."""
        self.closed = True
        self.reset()

    def reset(self) -> None:
        """The job failed, rewound or closed: tell every subscriber and end the subscriptions."""
        push = LocationPush(job=self.job, generation=self.roster.generation, reset=True)
        for client in list(self.subs):
            self._send(client, push)
        self.subs.clear()
        self._held_at.clear()
        self._groups.clear()
        self._client_groups.clear()
        self._pending.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- pushes ----------------------------------------------------------------------------------
    def built(self, key: tuple[int, int]) -> None:
        """The batch of ``key`` (step, DP rank) is built: queue it for its group's subscribers;
        a client whose groups of the step are all built now gets its push at once."""
        clients = self._groups.get(key[1])
        if not clients:
            return
        step = key[0]
        for client in clients:
            pending = self._pending[client]
            pending.add(key)
            if all((step, dp) in pending for dp in self._client_groups.get(client, ())):
                self._flush_client(client)
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None and any(self._pending.values()):
            self._timer = asyncio.get_running_loop().call_later(GATHER_S, self._flush)

    def _flush(self) -> None:
        self._timer = None
        for client in list(self._pending):
            self._flush_client(client)

    def _flush_client(self, client: str) -> None:
        keys = self._pending.pop(client, set())
        ranks = self.subs.get(client)
        if not keys or not ranks:
            return
        if self.failed.is_set() or self.closed:
            return
        roster, batches = self.roster, self.batches
        generation = roster.generation
        # every lease the client is subscribed for held at this roster version: none is checked
        # again until the roster changes (thousands of ranks per step otherwise)
        checked = self._held_at.get(client) == roster.version
        if not checked and all(gen == generation and _holds(roster, rank, token, gen)
                               for rank, (token, gen, *_) in ranks.items()):
            self._held_at[client] = roster.version
            checked = True
        groups: list[PushedGroup] = []
        checkpoints: dict[int, Any] = {}
        for step, dp in sorted(keys):
            fut = batches.futures.get((step, dp))
            if fut is None or (step, dp) in batches.errors:
                continue  # released meanwhile, or failed (its ranks hear it from their poll)
            who_has = batches.who_has(fut.key)
            if not who_has:  # lost with its constructor already: pushed again once rebuilt
                batches.lost((step, dp), fut)
                continue
            checkpoint = checkpoints.get(step) or self.checkpoint_of(step + 1)
            if checkpoint is None:
                continue  # not in the view (never for a batch just built): its ranks ask
            entries = []
            for rank in self._groups.get(dp, {}).get(client, ()):
                token, gen, cp_rank, tokens, labels = ranks[rank]
                if checked or (gen == generation and _holds(roster, rank, token, gen)):
                    entries.append((rank, cp_rank, tokens, labels))
            if entries:
                checkpoints[step] = checkpoint
                groups.append(PushedGroup(step, dp, tuple(fut.key), tuple(who_has), tuple(entries)))
        if groups:
            self.locations += sum(len(g.ranks) for g in groups)
            self._send(client, LocationPush(self.job, generation, tuple(groups), checkpoints))

    def _send(self, client: str, push: LocationPush) -> None:
        comm = self.scheduler.client_comms.get(client)
        if comm is None:  # gone (its remove_client drops the subscription)
            return
        try:
            comm.send({"op": PUSH_OP, "push": push.to_msg()})
            self.messages += 1
        except Exception as exc:  # noqa: BLE001 - a closing stream: its ranks long-poll instead
            logger.debug("mdata job %s: push to %s failed: %r", self.job, client, exc)


def _holds(roster: TrainerRoster, rank: int, token: str, generation: int) -> bool:
    """Whether the lease ``token`` still holds ``rank`` in ``generation``."""
    try:
        roster.check(rank, token, generation)
    except MdataError:
        return False
    return True
