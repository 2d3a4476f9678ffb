"""Executing a collective schedule message by message, in SimPy over a ``FlowNetwork``: the reference.

Implements the round semantics of ``algorithms.schedule`` exactly, under any contention: a rank
enters round k+1 once every transfer it sends or receives in round k has arrived; a transfer costs
the sender's per-message overhead, then its bytes stream over the route as a flow (sharing links
max-min fairly with every other flow in flight), then the route's latency; the receiver of a
REDUCE transfer then spends bytes / reduce_Bps adding it in (``FabricSpec.reduce_Bps``).
``collective_engine.VectorisedExecutor`` computes the same times a round at a time and is held to
this executor by the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ddlsim.algorithms.schedule import Schedule
from ddlsim.simulator.engine.fabric import Fabric

if TYPE_CHECKING:
    import simpy


@dataclass
class TransferLog:
    """Optional per-transfer record (for traces): arrays over the transfers executed whose sender
    (fabric rank) is below ``max_sender``, and counts over all of them.

    A trace draws the transfers of a few ranks (no viewer shows 10^9 of them), so only those are
    kept: the log's memory grows with the traced ranks' transfers, not with ranks squared.
    ``total`` counts every transfer executed; ``extrapolated`` those of rounds the steady-state
    shortcut advanced without executing them (no times exist for those)."""

    src: list[np.ndarray] = field(default_factory=list)
    dst: list[np.ndarray] = field(default_factory=list)
    nbytes: list[np.ndarray] = field(default_factory=list)
    start_s: list[np.ndarray] = field(default_factory=list)
    end_s: list[np.ndarray] = field(default_factory=list)
    max_sender: int = 2**62
    total: int = 0
    extrapolated: int = 0

    def add(self, src: np.ndarray, dst: np.ndarray, nbytes: Any, start_s: Any, end_s: Any) -> None:
        """Record transfers (arrays of one length; ``nbytes``, ``start_s``, ``end_s`` may be scalars)."""
        src = np.asarray(src)
        self.total += int(src.size)
        keep = src < self.max_sender
        if not keep.any():
            return
        columns = [np.broadcast_to(np.asarray(column, dtype=float), src.shape) for column in (nbytes, start_s, end_s)]
        if not keep.all():
            src, dst, columns = src[keep], np.asarray(dst)[keep], [column[keep] for column in columns]
        self.src.append(np.array(src))
        self.dst.append(np.array(dst))
        self.nbytes.append(np.array(columns[0]))
        self.start_s.append(np.array(columns[1]))
        self.end_s.append(np.array(columns[2]))


class MemberLog:
    """A group's view of a ``TransferLog``: transfers given in the group's member indices (a
    collective over some ranks of a run, executed over their view of the fabric) are recorded as the
    fabric ranks ``ranks`` maps them to, as the round path records them."""

    def __init__(self, log: TransferLog, ranks: np.ndarray) -> None:
        self.log, self.ranks = log, ranks

    def add(self, src: np.ndarray, dst: np.ndarray, nbytes: Any, start_s: Any, end_s: Any) -> None:
        self.log.add(self.ranks[np.asarray(src)], self.ranks[np.asarray(dst)], nbytes, start_s, end_s)


@dataclass
class _Plan:
    """One round as the message path needs it (schedule ranks; Python lists for scalar access)."""

    src: np.ndarray
    dst: np.ndarray
    routes: np.ndarray
    latency_s: list[float]
    overhead_s: list[float]
    nbytes: np.ndarray
    reduce_s: list[float] | None
    sends: dict[int, list[int]]
    receives: dict[int, list[int]]


class MessageExecutor:
    """Message-by-message execution in SimPy over a shared ``FlowNetwork`` (exact under contention).

    A transfer is a chain of callbacks (overhead timeout, flow, latency timeout, arrival), not a
    process of its own, and a rank moves to its next round when a counter of its transfers in the
    current round reaches zero: a few events per transfer. Under LogGP a rank's CPU serialises its
    overheads, which needs SimPy resources and processes (``_process_loggp``).
    """

    def __init__(self, fabric: Fabric, env: simpy.Environment | None = None) -> None:
        # SimPy is loaded here, where the message path runs, not by every command that imports the
        # engine (the round and fluid paths need only this module's transfer logs): about 45 ms a start
        import simpy

        from ddlsim.simulator.engine.flow_network import FlowNetwork

        self.fabric = fabric
        self.env = env or simpy.Environment()
        self.network = FlowNetwork(self.env, fabric.capacity_Bps, getattr(fabric, "redundant", None))
        self.transfers = 0
        # LogGP: each rank's CPU handles one message overhead at a time
        self._cpus: dict[int, simpy.Resource] = {}

    def _cpu(self, rank: int) -> simpy.Resource:
        import simpy  # (loaded by __init__)

        if rank not in self._cpus:
            self._cpus[rank] = simpy.Resource(self.env, capacity=1)
        return self._cpus[rank]

    def _plans(self, schedule: Schedule, message_bytes: float) -> list[_Plan]:
        plans = []
        for rnd in schedule.rounds():
            if not len(rnd):
                continue
            src = np.asarray(rnd.src, dtype=np.int64)
            dst = np.asarray(rnd.dst, dtype=np.int64)
            routes = self.fabric.routes(src, dst)
            nbytes = schedule.transfer_bytes(rnd, message_bytes)
            reduce_s = self.fabric.reduce_times(nbytes, rnd.op)
            sends: dict[int, list[int]] = {}
            receives: dict[int, list[int]] = {}
            for index, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
                sends.setdefault(s, []).append(index)
                receives.setdefault(d, []).append(index)
            plans.append(
                _Plan(
                    src,
                    dst,
                    routes,
                    self.fabric.latencies(routes).tolist(),
                    self.fabric.overheads(src, dst).tolist(),
                    np.broadcast_to(nbytes, src.shape),
                    None if reduce_s is None else reduce_s.tolist(),
                    sends,
                    receives,
                )
            )
        return plans

    def process(
        self,
        schedule: Schedule,
        message_bytes: float,
        ready: Sequence[simpy.Event] | None = None,
        log: TransferLog | MemberLog | None = None,
    ) -> list[simpy.Event]:
        """Start the collective inside ``self.env``; rank r enters when ``ready[r]`` fires (now if None).

        Returns one event per rank that fires when that rank has finished the collective.
        """
        plans = self._plans(schedule, message_bytes)
        if self.fabric.spec.loggp:
            return self._process_loggp(schedule.ranks, plans, ready, log)
        env, network = self.env, self.network
        ranks = schedule.ranks
        finished = [env.event() for _ in range(ranks)]
        at = [0] * ranks  # the round each rank is in (an index into plans)
        entered = [False] * ranks  # whether it has started that round's sends
        # transfers each rank still waits for, per round (receives may arrive before it enters)
        left = [
            {r: len(p.sends.get(r, ())) + len(p.receives.get(r, ())) for r in (*p.sends, *p.receives)} for p in plans
        ]

        def enter(r: int) -> None:
            while at[r] < len(plans):
                k = at[r]
                if r in left[k]:
                    entered[r] = True
                    for index in plans[k].sends.get(r, ()):
                        send(k, index)
                    if left[k][r]:
                        return
                at[r] += 1
                entered[r] = False
            finished[r].succeed()

        def complete(k: int, r: int) -> None:
            left[k][r] -= 1
            if not left[k][r] and at[r] == k and entered[r]:
                at[r] += 1
                entered[r] = False
                enter(r)

        def send(k: int, index: int) -> None:
            begin = env.now
            overhead = plans[k].overhead_s[index]
            if overhead > 0:
                env.timeout(overhead).callbacks.append(lambda _e: stream(k, index, begin))
            else:
                stream(k, index, begin)

        def stream(k: int, index: int, begin: float) -> None:
            plan = plans[k]
            flow = network.transfer(plan.routes[index], float(plan.nbytes[index]))
            flow.callbacks.append(lambda _e: travel(k, index, begin))

        def travel(k: int, index: int, begin: float) -> None:
            latency = plans[k].latency_s[index]
            if latency > 0:
                env.timeout(latency).callbacks.append(lambda _e: arrive(k, index, begin))
            else:
                arrive(k, index, begin)

        def arrive(k: int, index: int, begin: float) -> None:
            plan = plans[k]
            self.transfers += 1
            if log is not None:
                one = slice(index, index + 1)
                log.add(plan.src[one], plan.dst[one], plan.nbytes[one], begin, env.now)
            receiver = int(plan.dst[index])
            complete(k, int(plan.src[index]))
            seconds = plan.reduce_s[index] if plan.reduce_s is not None else 0.0
            if seconds:  # the receiver adds a REDUCE transfer into its buffer once it has arrived
                env.timeout(seconds).callbacks.append(lambda _e: complete(k, receiver))
            else:
                complete(k, receiver)

        for r in range(ranks):
            gate = None if ready is None else ready[r]
            if gate is None or gate.callbacks is None:  # no gate, or one already processed
                enter(r)
            else:
                gate.callbacks.append(partial(lambda r, _event: enter(r), r))
        return finished

    def _process_loggp(
        self,
        ranks: int,
        plans: list[_Plan],
        ready: Sequence[simpy.Event] | None,
        log: TransferLog | MemberLog | None,
    ) -> list[simpy.Event]:
        """The same rounds with LogGP overheads: o on the sender's CPU before the message and on the
        receiver's after it, one message at a time per CPU (processes and resources)."""
        env = self.env

        def transfer(plan: _Plan, index: int, arrival: simpy.Event):
            begin = env.now
            o = plan.overhead_s[index]
            with self._cpu(int(plan.src[index])).request() as cpu:
                yield cpu
                yield env.timeout(o)
            yield self.network.transfer(plan.routes[index], float(plan.nbytes[index]))
            yield env.timeout(plan.latency_s[index])
            with self._cpu(int(plan.dst[index])).request() as cpu:
                yield cpu
                yield env.timeout(o)
            self.transfers += 1
            if log is not None:
                one = slice(index, index + 1)
                log.add(plan.src[one], plan.dst[one], plan.nbytes[one], begin, env.now)
            arrival.succeed()

        def reduce_in(arrival: simpy.Event, seconds: float):
            yield arrival
            if seconds:
                yield env.timeout(seconds)

        arrivals = [[env.event() for _ in range(plan.src.size)] for plan in plans]

        def rank(r: int):
            if ready is not None:
                yield ready[r]
            for plan, events in zip(plans, arrivals, strict=True):
                mine: list[simpy.Event] = [env.process(transfer(plan, i, events[i])) for i in plan.sends.get(r, ())]
                for i in plan.receives.get(r, ()):
                    seconds = plan.reduce_s[i] if plan.reduce_s is not None else 0.0
                    mine.append(env.process(reduce_in(events[i], seconds)) if seconds else events[i])
                if mine:
                    yield env.all_of(mine)

        return [env.process(rank(r)) for r in range(ranks)]

    def run(self, schedule: Schedule, message_bytes: float, start_s: np.ndarray | float) -> np.ndarray:
        """Per-rank finish times, running a fresh simulation from ``start_s``."""
        starts = np.broadcast_to(np.asarray(start_s, dtype=np.float64), (schedule.ranks,))
        env = self.env
        base = env.now
        ready = [env.timeout(float(s) - base) for s in starts]
        done = self.process(schedule, message_bytes, ready)
        finish = np.zeros(schedule.ranks)

        def record(r: int) -> Callable[[simpy.Event], None]:
            def callback(_event: simpy.Event) -> None:
                finish[r] = env.now

            return callback

        for r, event in enumerate(done):
            event.callbacks.append(record(r))
        env.run()
        return finish
