"""The SimPy executor of role programs: ``Comm`` operations on the modeled fabric.

Each rank's role program (``algorithms.training_algorithm``) runs as one SimPy process on fabric
rank ``placement[rank]``:

* ``Compute``: waits ``work.duration_s``; the result is ``work.run()`` (a size-only payload).
* ``Send``: the sender's per-message overhead, then the bytes stream over the route, then the
  route's latency; the message lands in the destination's mailbox. The sender is busy until then
  (a blocking, rendezvous-sized send: the payloads here are model-sized).
* ``Recv``: takes the oldest matching message of the mailbox (``ANY_SOURCE`` matches any sender;
  tags must match), or waits for one. Messages between one pair arrive in order, as MPI promises.
* ``Start`` of a collective: the collective goes on the rank's communication stream; it enters once
  the previous collective of the stream is done (now if none). Collectives over one group are
  matched in the order each member starts them, as MPI matches them on a communicator. ``Wait``
  waits for started collectives; a blocking ``Collective`` is a start and a wait.

Two execution modes, with the same semantics:

* ``vectorised``: when the last member of a collective has entered, the collective engine's
  round-at-a-time executor (``VectorisedExecutor``) computes every member's finish time at once,
  proving that no flow shares a link with another at the same time; point-to-point messages are
  proved the same way in the same link state (``VectorisedExecutor.transfer``). A message sent by
  a rank whose started collective is not done yet, a collective in which a rank would finish before
  the last one entered, or any possible contention raises ``ContentionDetected``. Where a
  collective met the one timed just before it while that one was still in flight, the error is a
  ``ConcurrentCollectives`` and the caller runs the point again with ``concurrent=True``: each
  collective's exits stay revisable until its first member leaves, and such a pair is timed
  together where both move in lockstep (``VectorisedExecutor.run_concurrently``). Where the round
  path cannot prove a collective otherwise (its own flows contend, as a pipelined tree's chunks
  do, or may meet earlier ones), its members' times come from the fluid path instead
  (``FluidExecutor``: the message path's max-min fair model over all its flows, with numpy), after
  the round path's attempt is undone from a checkpoint; exact where none of its flows met a flow
  known before on a link (``VectorisedExecutor.place_apart`` checks, then records its flows for
  later operations to be checked against). A checkpoint per collective costs a copy of the link
  state, so a run first goes without: such a collective raises ``FluidMayApply`` and the caller
  runs the point again with ``fluid=True``. The fluid path does not model LogGP overheads: there
  such a collective stays a ``ContentionDetected``. Otherwise the caller runs the whole point again
  in
* ``message`` mode: every transfer of every collective and every message is a flow on one shared
  ``FlowNetwork`` (max-min fair), exact under any contention.

The per-transfer arithmetic is the collective engine's (overhead + flow + latency), so a lone message
costs exactly the fabric's hop cost. Per rank it accumulates compute, blocked and communication
seconds and mailbox statistics; with ``record=True`` it also keeps every operation (``OpRecord``).
No wall clock, no randomness: identical inputs give identical timelines.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import simpy

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, options_key, resolve
from ddlsim.algorithms.comm import (
    ANY_SOURCE,
    Collective,
    CommOps,
    Compute,
    Recv,
    RoleProgram,
    Send,
    Start,
    Wait,
)
from ddlsim.algorithms.schedule import Schedule
from ddlsim.algorithms.selectors import launch_s
from ddlsim.simulator.engine.collective_engine import (
    Checkpoint,
    ContentionDetected,
    MessageExecutor,
    TransferLog,
    VectorisedExecutor,
)
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fabric_spec import call_overhead_s
from ddlsim.simulator.engine.flow_network import FlowNetwork, Route
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.message_executor import MemberLog

MODES = ("vectorised", "message")
_CAUSALITY_SLACK_S = 1e-12


@dataclass(frozen=True, slots=True)  # slots: a traced run at scale holds 10^5-10^6 of them
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
class RankStats:
    """Per-rank accumulators (seconds), kept whether or not operations are recorded."""

    compute_s: np.ndarray
    blocked_s: np.ndarray  # in send, recv, a blocking collective or a wait
    comm_s: np.ndarray  # durations of messages and collectives (overlapped or not)
    recv_wait_s: np.ndarray
    queued_s: np.ndarray  # summed mailbox waits of the messages a rank received
    received: np.ndarray  # messages received
    wait_s: np.ndarray  # blocked in waits for started operations
    parts: dict[str, np.ndarray] = field(default_factory=dict)  # compute items' seconds by cause, if they say

    @staticmethod
    def zeros(ranks: int) -> RankStats:
        return RankStats(
            compute_s=np.zeros(ranks),
            blocked_s=np.zeros(ranks),
            comm_s=np.zeros(ranks),
            recv_wait_s=np.zeros(ranks),
            queued_s=np.zeros(ranks),
            received=np.zeros(ranks, dtype=np.int64),
            wait_s=np.zeros(ranks),
        )

    def add_parts(self, rank: int, parts: dict[str, float]) -> None:
        for name, seconds in parts.items():
            if name not in self.parts:
                self.parts[name] = np.zeros(self.compute_s.size)
            self.parts[name][rank] += seconds


@dataclass
class _Message:
    src: int
    tag: int
    payload: Any
    arrived_s: float


@dataclass
class _Mailbox:
    """A rank's unreceived messages and its receives waiting for one.

    Each message is in two queues, both in the order it was queued: its (source, tag) pair's (MPI
    keeps each pair's order; a pipeline stage holds a dozen messages of two tags from two
    neighbours, and looking a receive up by its pair, not by scanning them all, saved a tenth of a
    16,384-rank Llama 3 405B run) and its tag's, for receives from any source (a parameter server's
    4096 workers are 4096 pairs). A message taken through one queue is marked and dropped from the
    other when it reaches that one's head. Messages reach a mailbox in arrival order, except on the
    round path, where a receive from any source is not used (``RoleExecutor._recv``).
    """

    pairs: dict[tuple[int, int], deque[list[Any]]] = field(default_factory=dict)  # entries [message, taken]
    tags: dict[int, deque[list[Any]]] = field(default_factory=dict)
    count: int = 0  # unreceived messages
    waiting: list[tuple[int, int, simpy.Event]] = field(default_factory=list)
    peak: int = 0  # largest number of unreceived messages seen

    def put(self, message: _Message) -> None:
        entry = [message, False]
        _queue(self.pairs, (message.src, message.tag)).append(entry)
        _queue(self.tags, message.tag).append(entry)
        self.count += 1
        self.peak = max(self.peak, self.count)

    def take(self, src: int, tag: int) -> _Message | None:
        """The oldest message of ``tag`` from ``src`` (from any source with ANY_SOURCE), or None."""
        if src == ANY_SOURCE:
            entry = _pop_untaken(self.tags, tag)
            if entry is None:
                return None
            entry[1] = True
            _drop_taken(self.pairs, (entry[0].src, tag))
        else:
            entry = _pop_untaken(self.pairs, (src, tag))
            if entry is None:
                return None
            entry[1] = True
            _drop_taken(self.tags, tag)
        self.count -= 1
        return entry[0]


_Key = TypeVar("_Key")


def _queue(queues: dict[_Key, deque[list[Any]]], key: _Key) -> deque[list[Any]]:
    queue = queues.get(key)
    if queue is None:
        queue = queues[key] = deque()
    return queue


def _drop_taken(queues: dict[_Key, deque[list[Any]]], key: _Key) -> None:
    """Drop the entries taken through the other queue from the head of ``key``'s (it goes when empty)."""
    queue = queues.get(key)
    if queue is None:
        return
    while queue and queue[0][1]:
        queue.popleft()
    if not queue:
        del queues[key]


def _pop_untaken(queues: dict[_Key, deque[list[Any]]], key: _Key) -> list[Any] | None:
    """The first entry of ``key``'s queue not taken through the other queue, popped, or None."""
    _drop_taken(queues, key)
    queue = queues.get(key)
    if queue is None:
        return None
    entry = queue.popleft()
    if not queue:
        del queues[key]
    return entry


@dataclass
class _Handle:
    """A started operation: ``done`` fires when this rank's part is over (a receive's payload is set
    then); a send on the round path has no event: its part is over at ``ready_s``, known when it starts."""

    done: simpy.Event | None
    payload: Any
    ready_s: float = 0.0


@dataclass(frozen=True)
class _Group:
    """The ranks of a collective (then its helpers), numbered in order of first use."""

    index: int
    members: tuple[int, ...]
    ranks: int  # members that contribute data (the rest are helpers)
    position: dict[int, int]  # rank -> index in members


@dataclass(eq=False)
class _Ran:
    """A collective timed on the round path, as long as its exits may still be revised: a later
    collective that meets its flows is timed together with it from ``checkpoint`` on."""

    instance: _Instance
    start_s: np.ndarray
    checkpoint: Checkpoint | None  # the link state before it (``concurrent`` only)
    operations: int  # the round executor's operations once it ran
    finish_s: np.ndarray
    version: int = 0  # bumped when its exits are revised: a wake-up of an older version is stale


@dataclass
class _LogMark:
    """A transfer log's length and counts, to drop what was logged after (a round path's attempt)."""

    log: TransferLog
    entries: int
    total: int
    extrapolated: int

    @staticmethod
    def of(log: TransferLog | None) -> _LogMark | None:
        return None if log is None else _LogMark(log, len(log.src), log.total, log.extrapolated)

    def undo(self) -> None:
        log = self.log
        for column in (log.src, log.dst, log.nbytes, log.start_s, log.end_s):
            del column[self.entries :]
        log.total, log.extrapolated = self.total, self.extrapolated


class FluidMayApply(ContentionDetected):
    """A collective the round path could not prove, on a run without checkpoints: with ``fluid`` the
    fluid path could time it."""


class ConcurrentCollectives(ContentionDetected):
    """A collective met one still in flight whose exits are already scheduled: with ``concurrent``
    the two could be timed together."""


@dataclass
class _Instance:
    """One collective call over ``members`` (the group, then its helpers)."""

    op: Collective
    members: tuple[int, ...]
    schedule: Schedule
    member_ranks: np.ndarray  # fabric rank of each member
    done: list[simpy.Event]
    entered_s: np.ndarray
    started: int = 0
    entered: int = 0
    ready: list[simpy.Event] | None = None  # message mode: each member's entry
    launch_s: float = 0.0  # a library call's launch: the schedule starts this long after a member enters


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
    """A fabric seen through a member index -> fabric rank map, so a schedule's ranks are member indices."""

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
    """Run one role program per rank on ``fabric``; rank r is the fabric's rank ``placement[r]``."""

    def __init__(
        self,
        fabric: Fabric,
        placement: Sequence[int] | np.ndarray,
        mode: str = "message",
        *,
        record: bool = False,
        transfer_log: TransferLog | None = None,
        concurrent: bool = False,
        fluid: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown execution mode {mode!r}; valid: {', '.join(MODES)}")
        self.fabric = fabric
        self.placement = np.asarray(placement, dtype=np.int64)
        self.ranks = int(self.placement.size)
        if np.unique(self.placement).size != self.ranks:
            raise ValueError("two ranks placed on one device")
        self.mode = mode
        self.env = simpy.Environment()
        self.vectorised = VectorisedExecutor(fabric) if mode == "vectorised" else None
        # round path: keep each collective's exits revisable until its first member leaves (at the
        # cost of a copy of the link state per collective), to time two in flight together
        self.concurrent = concurrent
        # round path: keep the link state before each collective (a copy each), to time one the round
        # path cannot prove by the fluid path instead (``_run_fluid``), which does not model LogGP
        # overheads
        self.fluid_applies = not fabric.spec.loggp
        self.fluid = fluid and self.fluid_applies
        self._last: _Ran | None = None  # the last collective the round path timed
        self.network = FlowNetwork(self.env, fabric.capacity_Bps, fabric.redundant) if mode == "message" else None
        self.transfer_log = transfer_log
        self.mailboxes = [_Mailbox() for _ in range(self.ranks)]
        self.records: list[OpRecord] | None = [] if record else None
        self.stats = RankStats.zeros(self.ranks)
        self.returns: dict[int, Any] = {}
        self.finish_s = np.zeros(self.ranks)
        self.transfers = 0
        self._routes: dict[tuple[int, int], tuple[Route, float, float]] = {}
        self._group_executors: dict[tuple[int, ...], MessageExecutor] = {}
        self._fluid_executors: dict[tuple[int, ...], FluidExecutor] = {}  # round path: per group
        self.fluid_collectives = 0  # collectives the round path left to the fluid path
        self._member_ranks: dict[tuple[int, ...], np.ndarray] = {}
        self._schedules: dict[tuple[Any, ...], Schedule] = {}
        self._groups: dict[tuple[int, ...], _Group] = {}
        self._groups_by_id: dict[tuple[int, int], tuple[Any, Any, _Group]] = {}
        self._instances: dict[tuple[int, int], _Instance] = {}  # (group index, sequence) -> call
        self._sequence: dict[tuple[int, int], int] = {}  # (group index, rank) -> collectives started
        self._tail: list[simpy.Event | None] = [None] * self.ranks  # last collective on each stream
        self._in_flight = np.zeros(self.ranks, dtype=np.int64)  # started collectives not done
        self._send_until = [0.0] * self.ranks  # round path: when each rank's started sends have arrived
        self._ahead = False  # a message was delivered at its send, ahead of its arrival (round path)
        self._iteration = [0] * self.ranks

    # --- driver ----------------------------------------------------------------------------------
    def run(self, program_of: Callable[[SimComm], RoleProgram]) -> dict[int, Any]:
        """Start ``program_of(comm)`` on every rank, run to the end, return each rank's return value."""
        for rank in range(self.ranks):
            self.env.process(self._rank_process(rank, program_of(SimComm(self, rank))))
        _run_interruptibly(self.env)
        unfinished = [rank for rank in range(self.ranks) if rank not in self.returns]
        if unfinished:
            raise RuntimeError(f"deadlock: ranks {unfinished} never finished their role programs")
        if self.vectorised is not None:
            self.transfers += self.vectorised.transfers
        self.transfers += sum(executor.transfers for executor in self._group_executors.values())
        return self.returns

    def _rank_process(self, rank: int, program: RoleProgram):
        env, stats = self.env, self.stats
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
                stats.compute_s[rank] += env.now - start
                parts = getattr(work, "parts", None)
                if parts:
                    stats.add_parts(rank, parts)
                self._log(rank, work.name, "compute", -1, 0.0, start)
                continue
            if isinstance(op, Send):
                yield from self._send(rank, op)
                result = None
                nbytes = float(op.payload.nbytes)
                self._log(rank, "send", "send", op.dst, nbytes, start)
            elif isinstance(op, Recv):
                message = yield from self._recv(rank, op)
                result = message.payload if op.src != ANY_SOURCE else (message.src, message.payload)
                queued = max(start - message.arrived_s, 0.0)
                stats.recv_wait_s[rank] += env.now - start
                stats.queued_s[rank] += queued
                stats.received[rank] += 1
                self._log(rank, "recv", "recv", message.src, float(message.payload.nbytes), start, queued)
            elif isinstance(op, Collective):
                handle = self._start(rank, op)
                assert handle.done is not None
                yield handle.done
                result = handle.payload
            elif isinstance(op, Start):
                operation = op.operation
                if isinstance(operation, Collective):
                    result = self._start(rank, operation)
                else:
                    result = self._start_p2p(rank, operation)
                continue
            elif isinstance(op, Wait):
                events = [handle.done for handle in op.handles if handle.done is not None]
                pending = [event for event in events if not event.processed]
                if pending:
                    yield env.all_of(pending)
                ready = max((handle.ready_s for handle in op.handles if handle.done is None), default=0.0)
                if ready > env.now:
                    yield env.timeout(ready - env.now)
                result = [handle.payload for handle in op.handles]
                stats.wait_s[rank] += env.now - start
            else:
                raise TypeError(f"rank {rank} yielded {op!r}, not a Comm operation")
            stats.blocked_s[rank] += env.now - start

    def _log(self, rank: int, op: str, kind: str, peer: int, nbytes: float, start: float, queued: float = 0.0,
             end: float | None = None) -> None:  # fmt: skip
        end = self.env.now if end is None else end
        if kind in ("send", "recv"):
            self.stats.comm_s[rank] += end - start
        if self.records is not None:
            self.records.append(
                OpRecord(rank, self._iteration[rank], op, kind, peer, nbytes, float(start), float(end), queued)
            )

    # --- point to point --------------------------------------------------------------------------
    def _route(self, src: int, dst: int) -> tuple[Route, float, float]:
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is None:
            assert self.network is not None
            a, b = self.placement[[src]], self.placement[[dst]]
            routes, alpha, _bottleneck = self.fabric.path_properties(a, b)
            overhead = float(self.fabric.overheads(a, b)[0])
            cached = (self.network.route(routes[0]), overhead, float(alpha[0]) - overhead)
            self._routes[key] = cached
        return cached

    def _send(self, rank: int, op: Send):
        if not 0 <= op.dst < self.ranks or op.dst == rank:
            raise ValueError(f"rank {rank} sends to invalid rank {op.dst}")
        env = self.env
        nbytes = float(op.payload.nbytes)
        if self.vectorised is not None:
            if self._in_flight[rank]:
                raise ContentionDetected("a rank sends a message while its started collective runs")
            arrival = self.vectorised.transfer(int(self.placement[rank]), int(self.placement[op.dst]), nbytes, env.now)
            yield env.timeout(arrival - env.now)
        else:
            assert self.network is not None
            links, overhead, latency = self._route(rank, op.dst)
            yield env.timeout(overhead)
            yield self.network.transfer(links, nbytes)
            yield env.timeout(latency)
            self.transfers += 1
        self._deliver(op.dst, _Message(rank, op.tag, op.payload, float(env.now)))

    def route_peers(self, pairs: list[tuple[int, int]]) -> None:
        """Route the (sender, receiver) rank pairs a program will send over, in one batch (round path)."""
        if self.vectorised is None or not pairs:
            return
        ranks = np.array(pairs, dtype=np.int64)
        self.vectorised.route_pairs(self.placement[ranks[:, 0]], self.placement[ranks[:, 1]])

    def _start_p2p(self, rank: int, op: Send | Recv) -> _Handle:
        """A started send or receive: a process of its own; the handle's payload is the received one.
        On the round path a started send is no process and no event (``_start_send_on_rounds``)."""
        if self.vectorised is not None and isinstance(op, Send):
            return self._start_send_on_rounds(rank, op)
        handle = _Handle(self.env.event(), None)
        handle.done = self.env.process(self._p2p(rank, op, handle))
        return handle

    def _start_send_on_rounds(self, rank: int, op: Send) -> _Handle:
        """The send's arrival is known when it starts: the message goes into the receiver's mailbox
        at once, stamped with it (a receive that takes it earlier waits until then), and the handle
        is done then: no event of its own (a pipeline sends one per micro-batch and stage: a third
        of a 16,384-rank Llama 3 405B run's events)."""
        env, vectorised = self.env, self.vectorised
        assert vectorised is not None
        if not 0 <= op.dst < self.ranks or op.dst == rank:
            raise ValueError(f"rank {rank} sends to invalid rank {op.dst}")
        if self._in_flight[rank]:
            raise ContentionDetected("a rank sends a message while its started collective runs")
        start, nbytes = float(env.now), float(op.payload.nbytes)
        arrival = vectorised.transfer(int(self.placement[rank]), int(self.placement[op.dst]), nbytes, start)
        if arrival > self._send_until[rank]:
            self._send_until[rank] = arrival
        self._ahead = True
        self._deliver(op.dst, _Message(rank, op.tag, op.payload, arrival))
        self._log(rank, "send", "send", op.dst, nbytes, start, end=arrival)
        return _Handle(None, None, arrival)

    def _p2p(self, rank: int, op: Send | Recv, handle: _Handle):
        start = self.env.now
        if isinstance(op, Send):  # the message path's (the round path's are _start_send_on_rounds)
            yield from self._send(rank, op)
            self._log(rank, "send", "send", op.dst, float(op.payload.nbytes), start)
            return
        message = yield from self._recv(rank, op)
        handle.payload = message.payload if op.src != ANY_SOURCE else (message.src, message.payload)
        self._log(rank, "recv", "recv", message.src, float(message.payload.nbytes), start)

    def _deliver(self, dst: int, message: _Message) -> None:
        """Hand ``message`` to a receive waiting for it (when it arrives: a message of the round path
        is delivered at its send, ahead of its arrival) or queue it in ``dst``'s mailbox."""
        box = self.mailboxes[dst]
        for index, (src, tag, event) in enumerate(box.waiting):
            if tag == message.tag and src in (ANY_SOURCE, message.src):
                if src == ANY_SOURCE and message.arrived_s > self.env.now:
                    # a message sent later could arrive first: not decided here
                    raise ContentionDetected("a receive from any source meets a message ahead of its arrival")
                del box.waiting[index]
                _succeed_after(self.env, event, max(message.arrived_s - self.env.now, 0.0), message)
                return
        box.put(message)

    def _recv(self, rank: int, op: Recv):
        box = self.mailboxes[rank]
        if op.src == ANY_SOURCE and self._ahead:
            raise ContentionDetected("a receive from any source while messages are delivered ahead of their arrival")
        queued = box.take(op.src, op.tag)
        if queued is not None:
            if queued.arrived_s > self.env.now:  # delivered at its send: still on the wire
                yield self.env.timeout(queued.arrived_s - self.env.now)
            return queued
        event = self.env.event()
        box.waiting.append((op.src, op.tag, event))
        message = yield event
        return message

    # --- collectives -----------------------------------------------------------------------------
    def _group(self, op: Collective) -> _Group:
        """The group of ``op`` (its ranks, then its helpers), looked up by the identity of the tuples
        the role program passes (the same objects call after call): hashing a 4096-rank tuple per
        operation would cost more than the operation."""
        key = (id(op.group), id(op.helpers))
        cached = self._groups_by_id.get(key)
        if cached is not None and cached[0] is op.group and cached[1] is op.helpers:
            return cached[2]
        ranks = tuple(range(self.ranks)) if op.group is None else tuple(op.group)
        members = ranks + tuple(op.helpers)
        group = self._groups.get(members)
        if group is None:
            group = _Group(len(self._groups), members, len(ranks), {rank: i for i, rank in enumerate(members)})
            self._groups[members] = group
        self._groups_by_id[key] = (op.group, op.helpers, group)
        return group

    def _start(self, rank: int, op: Collective) -> _Handle:
        group = self._group(op)
        position = group.position.get(rank)
        if position is None:
            raise ValueError(f"rank {rank} joins a collective over {group.members} it is not part of")
        if group.ranks == 1:
            return _Handle(self.env.event().succeed(), op.payload)
        members = group.members
        counter = (group.index, rank)
        sequence = self._sequence.get(counter, 0)
        self._sequence[counter] = sequence + 1
        key = (group.index, sequence)
        instance = self._instances.get(key)
        if instance is None:
            instance = self._instance(op, group.ranks, members)
            self._instances[key] = instance
        instance.started += 1
        if instance.started == len(members):  # every member holds it now: forget it
            del self._instances[key]
        done = instance.done[position]
        iteration, nbytes = self._iteration[rank], float(op.payload.nbytes)
        self._in_flight[rank] += 1

        def finished(_event: simpy.Event) -> None:
            self._in_flight[rank] -= 1
            entered = float(instance.entered_s[position])
            self.stats.comm_s[rank] += self.env.now - entered
            if self.records is not None:
                self.records.append(
                    OpRecord(rank, iteration, op.collective, "collective", -1, nbytes, entered, float(self.env.now))
                )

        done.callbacks.append(finished)
        tail = self._tail[rank]
        self._tail[rank] = done
        if tail is None or tail.processed:
            self._enter(instance, position)
        else:
            tail.callbacks.append(lambda _event: self._enter(instance, position))
        return _Handle(done, op.payload)

    def _instance(self, op: Collective, ranks: int, members: tuple[int, ...]) -> _Instance:
        member_ranks = self._member_ranks.get(members)
        if member_ranks is None:
            member_ranks = self.placement[list(members)]
            self._member_ranks[members] = member_ranks
        per_node, nics = self._devices_per_node(member_ranks[:ranks])
        schedule = self._schedule(op, ranks, per_node, nics)
        if schedule.ranks != len(members):
            raise ValueError(
                f"{op.algorithm} {op.collective} over {ranks} ranks needs {schedule.ranks - ranks} "
                f"helper rank(s); the operation names {len(members) - ranks}"
            )
        count = len(members)
        env = self.env
        launch = launch_s(op.algorithm, ranks) + call_overhead_s(self.fabric.spec, ranks, per_node)
        if self.vectorised is not None:
            done = [env.event() for _ in range(count)]
            return _Instance(op, members, schedule, member_ranks, done, np.zeros(count), launch_s=launch)
        ready = [env.event() for _ in range(count)]
        # the group's executor numbers its ranks 0..count-1: the log takes fabric ranks, as the round path's
        log = None if self.transfer_log is None else MemberLog(self.transfer_log, member_ranks)
        done = self._group_executor(members, member_ranks).process(schedule, float(op.payload.nbytes), ready, log)
        return _Instance(op, members, schedule, member_ranks, done, np.zeros(count), ready=ready, launch_s=launch)

    def _schedule(self, op: Collective, ranks: int, per_node: int, nics: int) -> Schedule:
        token, chosen = resolve(op.algorithm, op.collective, float(op.payload.nbytes), ranks, per_node, nics)
        options = {**chosen, **op.options}
        key = (token, op.collective, ranks, per_node, options_key(options))
        schedule = self._schedules.get(key)
        if schedule is None:
            impl = COLLECTIVE_ALGORITHMS.get(token)
            schedule = impl.schedule(op.collective, ranks, devices_per_node=per_node, **options)
            self._schedules[key] = schedule
        return schedule

    def _devices_per_node(self, fabric_ranks: np.ndarray) -> tuple[int, int]:
        """(devices per node, distinct NICs they attach to on the first node) of a group placed in
        equal consecutive blocks over nodes (for hierarchical schedules and NCCL's ring channels),
        else (1, 1)."""
        devices = self.fabric.devices_of(fabric_ranks)
        nodes = self.fabric.node_of(devices)
        counts = np.bincount(nodes)
        counts = counts[counts > 0]
        per = int(counts[0])
        blocked = bool(np.all(counts == per)) and bool(np.all(np.diff(nodes) >= 0))
        if not blocked or per == 1:
            return 1, 1
        first = devices[nodes == nodes[0]]
        return per, int(np.unique(self.fabric.nic_of(first)).size)

    def _group_executor(self, members: tuple[int, ...], member_ranks: np.ndarray) -> MessageExecutor:
        executor = self._group_executors.get(members)
        if executor is None:
            view = _GroupFabric(self.fabric, member_ranks)
            executor = MessageExecutor(view, self.env)  # type: ignore[arg-type]
            assert self.network is not None
            executor.network = self.network  # one flow network for every transfer of the run
            self._group_executors[members] = executor
        return executor

    def _enter(self, instance: _Instance, position: int) -> None:
        env = self.env
        member = instance.members[position]
        if self.vectorised is not None and self._send_until[member] > env.now:
            # its message's flow and the collective's could share the rank's port: not provable
            raise ContentionDetected("a rank enters a collective while its started send is in flight")
        instance.entered_s[position] = env.now
        instance.entered += 1
        if instance.ready is not None:
            _succeed_after(env, instance.ready[position], instance.launch_s)
            return
        if instance.entered < len(instance.members):
            return
        vectorised = self.vectorised
        assert vectorised is not None
        nbytes = float(instance.op.payload.nbytes)
        start = instance.entered_s + instance.launch_s if instance.launch_s else instance.entered_s
        # the state before it: to time it together with a later one (``concurrent``), or to undo the
        # round path's attempt before the fluid path times it (``fluid``)
        checkpoint = vectorised.checkpoint() if self.concurrent or self.fluid else None
        logged = _LogMark.of(self.transfer_log) if self.fluid else None
        apart = False  # timed on its own by the fluid path
        try:
            finish = vectorised.run(instance.schedule, nbytes, start, self.transfer_log, members=instance.member_ranks)
        except ContentionDetected as detected:
            try:
                finish = self._run_with_previous(instance, start, detected)
            except ConcurrentCollectives:
                raise
            except ContentionDetected as still:
                if still is not detected:  # the pair's attempt changed the state: not undone here
                    raise
                if not self.fluid:
                    if not self.fluid_applies:
                        raise
                    raise FluidMayApply(f"the fluid path may time a collective ({detected})") from detected
                assert checkpoint is not None
                if logged is not None:
                    logged.undo()  # what the round path's attempt logged
                finish = self._run_fluid(instance, start, checkpoint, detected)
                apart = True
            checkpoint = None  # a third collective meeting these two is not timed with them
        if float(finish.min()) < env.now - _CAUSALITY_SLACK_S:
            raise ContentionDetected("a rank would finish its collective before the last rank entered it")
        ran = _Ran(instance, start, checkpoint if self.concurrent else None, vectorised.operations, finish)
        self._last = None if apart or (self.concurrent and checkpoint is None) else ran
        self._schedule_exits(ran)

    def _run_fluid(
        self, instance: _Instance, start: np.ndarray, checkpoint: Checkpoint, detected: ContentionDetected
    ) -> np.ndarray:
        """Finish times of a collective the round path could not prove (``detected``), from the fluid
        path (``FluidExecutor``: the message path's max-min fair model over every flow of the
        collective), after undoing the round path's attempt. Exact where none of its flows met a flow
        known before on a link, which ``VectorisedExecutor.place_apart`` checks before it records its
        flows for later ones to be checked against; else ``detected`` stands."""
        vectorised = self.vectorised
        assert vectorised is not None
        vectorised.restore(checkpoint, calls=1)
        members = instance.members
        fluid = self._fluid_executors.get(members)
        try:
            if fluid is None:
                view = _GroupFabric(self.fabric, instance.member_ranks)
                fluid = self._fluid_executors[members] = FluidExecutor(view)  # type: ignore[arg-type]
            before = fluid.transfers
            # the fluid path numbers the group's members 0..n-1; a decline abandons the run and its log
            log = None if self.transfer_log is None else MemberLog(self.transfer_log, instance.member_ranks)
            nbytes = float(instance.op.payload.nbytes)
            finish = fluid.run(instance.schedule, nbytes, start, link_use=True, log=log)
            assert fluid.link_use is not None
            vectorised.place_apart(fluid.link_use, instance.member_ranks, finish, fluid.transfers - before)
        except ContentionDetected as declined:
            raise detected from declined
        self.fluid_collectives += 1
        return finish

    def _run_with_previous(self, instance: _Instance, start: np.ndarray, detected: ContentionDetected) -> np.ndarray:
        """Finish times of a collective that met flows on the round path (``detected``), timed
        together with the collective before it if no member of that one has left yet and nothing
        ran in between (its exits are then revised); else ``detected`` stands."""
        vectorised, previous = self.vectorised, self._last
        assert vectorised is not None
        if (
            previous is None
            or float(previous.finish_s.min()) <= self.env.now  # a member left: it may have gone on
            or vectorised.operations != previous.operations + 1  # only this collective's attempt since
        ):
            raise detected
        if not self.concurrent:
            raise ConcurrentCollectives(f"a collective meets another still in flight ({detected})") from detected
        if previous.checkpoint is None:
            raise detected
        vectorised.restore(previous.checkpoint, calls=2)
        first = previous.instance
        calls = [
            (call.schedule, float(call.op.payload.nbytes), call_start, call.member_ranks)
            for call, call_start in ((first, previous.start_s), (instance, start))
        ]
        revised, finish = vectorised.run_concurrently(calls, self.transfer_log)
        if float(revised.min()) < self.env.now - _CAUSALITY_SLACK_S:
            raise ContentionDetected("a collective in flight would have ended before the one that met it entered")
        previous.finish_s = revised
        previous.version += 1
        self._schedule_exits(previous)
        return finish

    def _schedule_exits(self, ran: _Ran) -> None:
        """Wake each member when its collective is done. With ``concurrent``, one wake-up at the first
        exit schedules them all, unless the exits were revised since (``_run_with_previous``)."""
        env = self.env
        if not self.concurrent:
            self._exits_due(ran, ran.version)
            return
        wake = env.event()
        version = ran.version
        wake.callbacks.append(lambda _event: self._exits_due(ran, version))
        _succeed_after(env, wake, max(float(ran.finish_s.min()) - env.now, 0.0))

    def _exits_due(self, ran: _Ran, version: int) -> None:
        if version != ran.version:  # revised: a later wake-up holds the new times
            return
        now = self.env.now
        for event, end in zip(ran.instance.done, ran.finish_s.tolist(), strict=True):
            _succeed_after(self.env, event, max(end - now, 0.0))


def _run_interruptibly(env: simpy.Environment) -> None:
    """``env.run()``, stopping at the next event once SIGINT arrives.

    A KeyboardInterrupt raised inside a process's generator becomes that process's failure, which
    SimPy raises only when the failed event comes up (seconds to minutes later in a large run).
    Here the signal only sets a flag, checked between events, so Ctrl-C stops the run at once.
    """
    if threading.current_thread() is not threading.main_thread():
        env.run()
        return
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, _frame: interrupted.append(number))
    try:
        step = env.step
        while not interrupted:
            try:
                step()
            except simpy.core.EmptySchedule:
                return
        raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def _succeed_after(env: simpy.Environment, event: simpy.Event, delay: float, value: Any = None) -> None:
    """Trigger ``event`` ``delay`` seconds from now with ``value``: what ``Timeout`` does, for an
    event that already exists (a rank may be waiting on it). One heap entry instead of a timeout and
    a callback."""
    event._ok = True
    event._value = value
    env.schedule(event, delay=delay)
