"""The SimPy executor of role programs: ``Comm`` operations on the modeled fabric.

Each rank's role program (``algorithms.training_algorithm``) runs as one SimPy process on the
device ``placement[rank]`` of a ``Fabric``:

* ``Compute``: waits ``work.duration_s``; the result is ``work.run()`` (a size-only payload).
* ``Send``: the sender's per-message overhead, then the bytes stream over the route as a flow on
  the shared ``FlowNetwork`` (max-min fair with every other flow, collectives included), then the
  route's latency; the message lands in the destination's mailbox. The sender is busy until then
  (a blocking, rendezvous-sized send: the payloads here are model-sized).
* ``Recv``: takes the oldest matching message of the mailbox (``ANY_SOURCE`` matches any sender;
  tags must match), or waits for one. Messages between one pair arrive in order, as MPI promises.
* ``Collective``: the registered collective algorithm's schedule over ``group`` (all ranks if None),
  executed message by message by a ``MessageExecutor`` on the same environment and flow network; a
  rank enters when it yields the operation and continues when its part is done. Result: the payload.

The per-transfer arithmetic is ``collective_engine``'s (overhead + flow + latency), so a lone
point-to-point message costs exactly the fabric's hop cost. Every operation is logged per rank
(``OpRecord``) for traces, counts and bytes; no wall clock, no randomness: identical inputs give
identical timelines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.comm import ANY_SOURCE, Collective, CommOps, Compute, Recv, RoleProgram, Send
from ddlsim.simulator.engine.collective_engine import MessageExecutor
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.flow_network import FlowNetwork


@dataclass(frozen=True)
class OpRecord:
    """One executed operation of one rank; times in simulated seconds."""

    rank: int
    iteration: int
    op: str  # compute: the work's name; else send, recv, or the collective's name
    kind: str  # compute, send, recv, collective
    peer: int  # the other rank of a send or recv, -1 otherwise
    nbytes: float
    start_s: float
    end_s: float
    queued_s: float = 0.0  # recv: how long the message waited in the mailbox before being taken


@dataclass
class _Message:
    src: int
    tag: int
    payload: Any
    arrived_s: float


@dataclass
class _Mailbox:
    messages: list[_Message] = field(default_factory=list)
    waiting: list[tuple[int, int, simpy.Event]] = field(default_factory=list)
    peak: int = 0  # largest number of unreceived messages seen


class SimComm(CommOps):
    """What a role program sees of the SimPy executor."""

    def __init__(self, executor: RoleExecutor, rank: int) -> None:
        self._executor = executor
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._executor.ranks

    def now(self) -> float:
        return float(self._executor.env.now)


class _GroupFabric:
    """A fabric seen through a group index -> fabric rank map, so a schedule's ranks are group indices.

    Methods taking (src, dst) map them; everything else is the fabric's own.
    """

    def __init__(self, fabric: Fabric, members: np.ndarray) -> None:
        self._fabric = fabric
        self._members = members

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._fabric, name)
        if name in ("routes", "overheads", "receive_overheads", "path_properties"):
            members = self._members

            def mapped(src, dst):
                return attribute(members[np.asarray(src)], members[np.asarray(dst)])

            return mapped
        return attribute


class RoleExecutor:
    """Run one role program per rank on ``fabric``; rank r is the fabric's rank ``placement[r]``
    (its device under the fabric's own rank placement, block by default)."""

    def __init__(
        self, fabric: Fabric, placement: Sequence[int] | np.ndarray, env: simpy.Environment | None = None
    ) -> None:
        self.fabric = fabric
        self.placement = np.asarray(placement, dtype=np.int64)
        self.ranks = int(self.placement.size)
        if np.unique(self.placement).size != self.ranks:
            raise ValueError("two ranks placed on one device")
        self.env = env or simpy.Environment()
        self.network = FlowNetwork(self.env, fabric.capacity_Bps)
        self.mailboxes = [_Mailbox() for _ in range(self.ranks)]
        self.records: list[OpRecord] = []
        self.returns: dict[int, Any] = {}
        self.finish_s = np.zeros(self.ranks)
        self._routes: dict[tuple[int, int], tuple[np.ndarray, float, float]] = {}
        self._group_executors: dict[tuple[int, ...], MessageExecutor] = {}
        self._collectives: dict[tuple[tuple[int, ...], int], tuple[list[simpy.Event], list[simpy.Event]]] = {}
        self._entered: dict[tuple[tuple[int, ...], int], int] = {}  # (group, rank) -> collectives entered
        self._iteration = [0] * self.ranks

    # --- driver ----------------------------------------------------------------------------------
    def run(self, program_of: Callable[[SimComm], RoleProgram]) -> dict[int, Any]:
        """Start ``program_of(comm)`` on every rank, run to the end, return each rank's return value."""
        for rank in range(self.ranks):
            self.env.process(self._rank_process(rank, program_of(SimComm(self, rank))))
        self.env.run()
        unfinished = [rank for rank in range(self.ranks) if rank not in self.returns]
        if unfinished:
            raise RuntimeError(f"deadlock: ranks {unfinished} never finished their role programs")
        return self.returns

    def _rank_process(self, rank: int, program: RoleProgram):
        env = self.env
        result: Any = None
        while True:
            try:
                op = program.send(result)
            except StopIteration as stop:
                self.returns[rank] = stop.value
                self.finish_s[rank] = env.now
                return
            start = env.now
            if isinstance(op, Compute):
                work = op.work
                self._iteration[rank] = int(getattr(work, "iteration", self._iteration[rank]))
                duration = float(work.duration_s)
                if duration > 0:
                    yield env.timeout(duration)
                result = work.run()
                self._log(rank, work.name, "compute", -1, 0.0, start)
            elif isinstance(op, Send):
                yield from self._send(rank, op)
                result = None
                self._log(rank, "send", "send", op.dst, float(op.payload.nbytes), start)
            elif isinstance(op, Recv):
                message = yield from self._recv(rank, op)
                result = message.payload if op.src != ANY_SOURCE else (message.src, message.payload)
                queued = max(start - message.arrived_s, 0.0)
                self._log(rank, "recv", "recv", message.src, float(message.payload.nbytes), start, queued)
            elif isinstance(op, Collective):
                yield from self._collective(rank, op)
                result = op.payload
                self._log(rank, op.collective, "collective", -1, float(op.payload.nbytes), start)
            else:
                raise TypeError(f"rank {rank} yielded {op!r}, not a Comm operation")

    def _log(self, rank: int, op: str, kind: str, peer: int, nbytes: float, start: float, queued: float = 0.0) -> None:
        self.records.append(
            OpRecord(rank, self._iteration[rank], op, kind, peer, nbytes, float(start), float(self.env.now), queued)
        )

    # --- point to point --------------------------------------------------------------------------
    def _route(self, src: int, dst: int) -> tuple[np.ndarray, float, float]:
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is None:
            a, b = self.placement[[src]], self.placement[[dst]]
            routes, alpha, _bottleneck = self.fabric.path_properties(a, b)
            overhead = float(self.fabric.overheads(a, b)[0])
            cached = (routes[0], overhead, float(alpha[0]) - overhead)
            self._routes[key] = cached
        return cached

    def _send(self, rank: int, op: Send):
        if not 0 <= op.dst < self.ranks or op.dst == rank:
            raise ValueError(f"rank {rank} sends to invalid rank {op.dst}")
        links, overhead, latency = self._route(rank, op.dst)
        env = self.env
        yield env.timeout(overhead)
        yield self.network.transfer(links, float(op.payload.nbytes))
        yield env.timeout(latency)
        self._deliver(op.dst, _Message(rank, op.tag, op.payload, float(env.now)))

    def _deliver(self, dst: int, message: _Message) -> None:
        box = self.mailboxes[dst]
        for index, (src, tag, event) in enumerate(box.waiting):
            if tag == message.tag and src in (ANY_SOURCE, message.src):
                del box.waiting[index]
                event.succeed(message)
                return
        box.messages.append(message)
        box.peak = max(box.peak, len(box.messages))

    def _recv(self, rank: int, op: Recv):
        box = self.mailboxes[rank]
        for index, message in enumerate(box.messages):
            if message.tag == op.tag and op.src in (ANY_SOURCE, message.src):
                del box.messages[index]
                return message
            # MPI keeps per-pair order; any earlier match would have been taken first
        event = self.env.event()
        box.waiting.append((op.src, op.tag, event))
        message = yield event
        return message

    # --- collectives -----------------------------------------------------------------------------
    def _group_executor(self, group: tuple[int, ...]) -> MessageExecutor:
        executor = self._group_executors.get(group)
        if executor is None:
            view = _GroupFabric(self.fabric, self.placement[list(group)])
            executor = MessageExecutor(view, self.env)  # type: ignore[arg-type]
            executor.network = self.network  # one flow network for every transfer of the run
            self._group_executors[group] = executor
        return executor

    def _devices_per_node(self, group: tuple[int, ...]) -> int:
        """Block placement of the group over nodes (for hierarchical schedules), else 1."""
        nodes = self.fabric.node_of(self.fabric.devices_of(self.placement[list(group)]))
        counts = np.bincount(nodes)
        counts = counts[counts > 0]
        per = int(counts[0])
        blocked = bool(np.all(counts == per)) and bool(np.all(np.diff(nodes) >= 0))
        return per if blocked else 1

    def _collective(self, rank: int, op: Collective):
        group = tuple(range(self.ranks)) if op.group is None else tuple(op.group)
        if rank not in group:
            raise ValueError(f"rank {rank} joins a collective over {group} it is not part of")
        position = group.index(rank)
        if len(group) == 1:
            return
        counter = (group, rank)
        sequence = self._entered.get(counter, 0)
        self._entered[counter] = sequence + 1
        key = (group, sequence)
        if key not in self._collectives:
            algorithm = COLLECTIVE_ALGORITHMS.get(op.algorithm)
            schedule = algorithm.schedule(
                op.collective, len(group), devices_per_node=self._devices_per_node(group), **op.options
            )
            ready = [self.env.event() for _ in group]
            done = self._group_executor(group).process(schedule, float(op.payload.nbytes), ready)
            self._collectives[key] = (ready, done)
        ready, done = self._collectives[key]
        ready[position].succeed()
        yield done[position]
