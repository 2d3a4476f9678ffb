"""Collective schedules: rounds of transfers, the one definition every executor runs.

A collective over ``ranks`` ranks splits its buffer into ``num_chunks`` chunks. A schedule is a
sequence of rounds; a round is a set of transfers, each moving a contiguous range of chunks
``[chunk_lo, chunk_hi)`` from ``src`` to ``dst`` and either reducing them into the destination
(``REDUCE``) or overwriting it (``COPY``).

Execution semantics (shared by the symbolic check, the DES, the closed forms and the real runs):

* A rank takes part in rounds in order. In round k it starts all its sends at once, as soon as it
  has finished round k-1 (all its own sends done and all its receives arrived).
* A receive completes when the transfer arrives; a rank finishes round k when every transfer it
  sends or receives in round k has completed. Ranks that do not appear in a round skip it.
* Within a round, a rank's chunks are read before any of the round's transfers land (a round is
  a simultaneous exchange, as in MPI_Sendrecv).

Rounds are produced lazily (``Schedule.rounds()``) as numpy arrays, so a 4096-rank ring's 33 M
transfers never exist as Python objects at once. numpy is imported where rounds are built, not with
this module: the closed forms (the hop costs below) start without it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

REDUCE = 0
COPY = 1

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


class ScheduleError(ValueError):
    """A schedule cannot be built for the requested ranks or sizes (message says why)."""


class Round:
    """One round of transfers, as parallel arrays (one element per transfer).

    ``Round(src, dst, chunk_lo, chunk_hi, op)`` takes arrays. ``Round.lazy`` lets a generator share
    ``src``, ``dst``, ``op`` and the per-transfer chunk count between rounds and compute the chunk
    offsets only when asked: timing executors never ask, so a ring round costs them no allocation.
    Executors may cache per-round work keyed on the identity of these shared arrays.
    """

    __slots__ = ("_hi", "_lo", "_lo_fn", "chunk_count", "dst", "op", "src")

    def __init__(
        self, src, dst, chunk_lo=None, chunk_hi=None, op=None, *, chunk_count=None, chunk_lo_fn=None
    ):
        self.src = src
        self.dst = dst
        self.op = op
        self._lo = chunk_lo
        self._hi = chunk_hi
        self._lo_fn = chunk_lo_fn
        if chunk_count is None:
            import numpy as np

            chunk_count = np.asarray(chunk_hi) - np.asarray(chunk_lo)
        self.chunk_count = chunk_count

    @staticmethod
    def lazy(src, dst, chunk_count, op, chunk_lo_fn) -> Round:
        """A round whose chunk offsets ``chunk_lo_fn()`` are computed on first use."""
        return Round(src, dst, None, None, op, chunk_count=chunk_count, chunk_lo_fn=chunk_lo_fn)

    @property
    def chunk_lo(self) -> np.ndarray:
        if self._lo is None:
            self._lo = self._lo_fn()
        return self._lo

    @property
    def chunk_hi(self) -> np.ndarray:
        if self._hi is None:
            self._hi = self.chunk_lo + self.chunk_count
        return self._hi

    @staticmethod
    def of(src, dst, chunk_lo, chunk_hi, op) -> Round:
        """Build a round from array-likes or scalars (scalars are broadcast to the transfer count)."""
        import numpy as np

        src_a = np.atleast_1d(np.asarray(src, dtype=np.int64))
        dst_a = np.atleast_1d(np.asarray(dst, dtype=np.int64))
        count = max(src_a.size, dst_a.size)
        arrays = [
            np.broadcast_to(np.asarray(a, dtype=np.int64), (count,))
            for a in (src_a, dst_a, chunk_lo, chunk_hi, op)
        ]
        return Round(*arrays)

    def __len__(self) -> int:
        return int(self.src.size)


@dataclass(frozen=True)
class HopCost:
    """Uncontended cost of one point-to-point transfer: alpha_s + bytes / beta_Bps (seconds)."""

    alpha_s: float
    beta_Bps: float

    def time(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.beta_Bps


class Hop(Protocol):
    """What a closed form charges a round: seconds for a transfer of ``nbytes``."""

    def time(self, nbytes: float) -> float: ...


@dataclass(frozen=True)
class SlowerHop:
    """A round with transfers on two hops (inside nodes and between them, or inside a leaf and
    between leaves): it ends with its slowest transfer, the slower of the two at that size (not
    always the farther one: NVLink's per-message cost can exceed a NIC path's, so small transfers
    inside a node may pace the round)."""

    near: HopCost
    far: HopCost

    def time(self, nbytes: float) -> float:
        return max(self.near.time(nbytes), self.far.time(nbytes))


@dataclass(frozen=True)
class FabricCosts:
    """Uncontended hop costs of a two-level machine (three with a fat tree's leaves), for closed forms.

    Ranks are placed in blocks: rank r lives on node r // devices_per_node. ``intra`` is the cost
    between two devices of one node, ``inter`` between devices of different nodes, through one NIC.
    ``nics_per_node``: the NICs a node's ranks reach, spread evenly (its device d on NIC
    d * nics_per_node // devices_per_node, ``nic``); the closed forms of rounds that cross through a
    node's NICs at once read it (the ring's channels, the doubling and torus rounds that send every
    device of a node across, the parameter server).

    A fat tree puts ``nodes_per_leaf`` nodes under each leaf switch (node n under leaf
    n // nodes_per_leaf; 0: no leaf level, every pair of nodes costs ``inter``). Then ``inter`` is
    the cost between leaves (through the leaves' uplinks), ``leaf`` the cost between two nodes of one
    leaf (their NICs and the leaf switch only), and ``uplink_Bps`` a leaf's uplink rate each way,
    shared by every transfer that leaves or enters the leaf at once (the oversubscribed tree's
    bottleneck: nodes_per_leaf x NICs x port rate / oversubscription).
    """

    intra: HopCost
    inter: HopCost
    devices_per_node: int = 1
    nics_per_node: int = 1
    leaf: HopCost | None = None
    nodes_per_leaf: int = 0
    uplink_Bps: float = math.inf

    @staticmethod
    def uniform(alpha_s: float, beta_Bps: float) -> FabricCosts:
        hop = HopCost(alpha_s, beta_Bps)
        return FabricCosts(hop, hop, 1)

    @property
    def near(self) -> HopCost:
        """The hop between two nodes under one leaf (``inter`` without a leaf level)."""
        return self.leaf or self.inter

    @property
    def ranks_per_leaf(self) -> int:
        """Ranks under one leaf switch (0: no leaf level)."""
        return self.nodes_per_leaf * self.devices_per_node

    def spans_leaves(self, ranks: int) -> bool:
        """Whether ``ranks`` ranks in blocks reach beyond one leaf (any of them, without a leaf level,
        as soon as they reach beyond one node)."""
        return ranks > (self.ranks_per_leaf or self.devices_per_node)

    def between(self, a: int, b: int) -> HopCost:
        d = self.devices_per_node
        if a // d == b // d:
            return self.intra
        per_leaf = self.ranks_per_leaf
        return self.near if per_leaf and a // per_leaf == b // per_leaf else self.inter

    def nic(self, rank: Any) -> Any:
        """The NIC (numbered node by node) rank ``rank`` crosses the network through: its node's NIC
        (d * nics) // devices_per_node for its device d. Works on integers and integer arrays."""
        nics = max(self.nics_per_node, 1)
        return rank // self.devices_per_node * nics + rank % self.devices_per_node * nics // self.devices_per_node

    def _with_intra(self, network: HopCost) -> Hop:
        """A round with transfers inside nodes and on ``network``: the slower of the two at each size
        (``network`` alone with one device a node, where no transfer stays inside one)."""
        return network if self.devices_per_node <= 1 or self.intra == network else SlowerHop(self.intra, network)

    @property
    def mixed(self) -> Hop:
        """A round whose transfers join devices of one node and devices of different nodes: paced by
        the slower of the two hops at each size (the inter hop alone with one device a node)."""
        return self._with_intra(self.inter)

    @property
    def mixed_in_leaf(self) -> Hop:
        """``mixed`` for a round none of whose transfers leaves its leaf: the slower of the intra hop
        and the hop between two nodes of a leaf."""
        return self._with_intra(self.near)

    def worst(self, ranks: int) -> Hop:
        """The slowest hop present among ``ranks`` ranks placed in blocks, one transfer on each: the
        intra hop inside one node; as soon as two nodes take part, the slower of it and the hop
        between them (between leaves once they span leaves, ``mixed``; else ``mixed_in_leaf``)."""
        if ranks <= self.devices_per_node:
            return self.intra
        return self.mixed if self.spans_leaves(ranks) else self.mixed_in_leaf

    def crossing(self, shared: int, leaving: int) -> Hop:
        """A round in which every device of a node sends across the network at once (and receives as
        much): the node's NICs carry ``shared`` transfers each way (ceil(d / nics) when all of them
        send), and ``leaving`` of the transfers from (and into) each leaf go through its uplink.

        Inside a leaf a transfer gets its NIC's share, leaf.beta / shared; one that leaves its leaf
        also its share of the uplink, uplink / leaving. The round ends with the slower kind. Without
        a leaf level every transfer costs inter with its NIC's share."""
        shared = max(shared, 1)
        if not self.ranks_per_leaf:
            return self.inter if shared == 1 else HopCost(self.inter.alpha_s, self.inter.beta_Bps / shared)
        near = self.near
        within = HopCost(near.alpha_s, near.beta_Bps / shared)
        if leaving <= 0:
            return within
        beta = min(self.inter.beta_Bps / shared, self.uplink_Bps / leaving)
        between = HopCost(self.inter.alpha_s, beta)
        return between if leaving >= self.ranks_per_leaf else SlowerHop(within, between)


@dataclass
class Schedule:
    """A collective's schedule for a fixed rank count.

    Subclasses (or factories) provide ``_rounds``. ``chunk_fraction`` gives the share of the
    message each chunk carries (uniform by default); ``payload_factor`` scales bytes on the wire
    (top-k sparsification sends values and indices of a fraction of the elements).
    """

    name: str
    collective: str
    ranks: int
    num_chunks: int
    round_factory: object = field(repr=False)  # callable () -> Iterator[Round]
    root: int = 0
    payload_factor: float = 1.0
    # For reduce_scatter: which chunk range each rank owns at the end; default chunk r on rank r.
    owned_chunks: tuple[tuple[int, int], ...] | None = None
    # Initial ownership for allgather-like schedules: rank r starts with these chunks.
    initial_chunks: tuple[tuple[int, int], ...] | None = None
    # Helper ranks (dedicated parameter servers): when set, ranks 0..worker_ranks-1 are the workers
    # that contribute data and to which the collective's contract applies; ranks worker_ranks..ranks-1
    # start empty and are only relays. None means every rank is a worker.
    worker_ranks: int | None = None
    # The symbolic contract when it differs from ``collective``: top-k sparse allreduce moves every
    # rank's (values, indices) contribution to every rank, so it is checked as an allgather.
    contract: str | None = None

    def rounds(self) -> Iterator[Round]:
        factory = self.round_factory
        assert callable(factory)
        return iter(factory())

    def transfer_bytes(self, rnd: Round, message_bytes: float) -> np.ndarray:
        """Bytes on the wire for each transfer of ``rnd`` when the full buffer is ``message_bytes``."""
        per_chunk = message_bytes * self.payload_factor / self.num_chunks
        return rnd.chunk_count * per_chunk

    @property
    def workers(self) -> int:
        """Ranks that contribute data and receive the result (all ranks unless helpers are present)."""
        return self.ranks if self.worker_ranks is None else self.worker_ranks

    def num_rounds(self) -> int:
        return sum(1 for _ in self.rounds())


def check_ranks(name: str, ranks: int) -> None:
    if not isinstance(ranks, numbers.Integral) or ranks < 1:  # numpy's integers are Integral
        raise ScheduleError(f"{name}: ranks must be a positive integer, got {ranks!r}")


def is_power_of_two(value: int) -> bool:
    return value >= 1 and (value & (value - 1)) == 0
