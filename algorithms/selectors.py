"""Which collective algorithm a communication library would pick, as (token, options).

``select(library, collective, message_bytes, ranks, devices_per_node, nics_per_node)`` mimics the library's default
choice (no tuning files, no environment overrides). ``message_bytes`` is the whole buffer: for
allreduce, reduce and broadcast the buffer each rank passes; for allgather and reduce_scatter the
gathered / input buffer of P pieces (the rules below quote the thresholds in those terms). Where a
library's algorithm is not in our library, the closest one is named in the rule.

mpich (MPICH 3.x/4.x ``*_intra_auto`` and the CVARs' defaults; Thakur, Rabenseifner & Gropp 2005):
    allreduce       recursive_doubling if S <= 2048 B (MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE) or the
                    element count (4-byte elements assumed) is below pof2(P); else halving_doubling
                    (Rabenseifner). Non-commutative ops also get recursive doubling; we only model sums.
    allgather       recursive_doubling if S < 512 KiB (MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE) and P is a
                    power of two; Bruck if S < 80 KiB (MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE), which we
                    replace by recursive_doubling (same log2 latency); else ring.
    reduce_scatter  halving_doubling if S < 512 KiB (MPIR_CVAR_REDSCAT_COMMUTATIVE_LONG_MSG_SIZE);
                    else pairwise exchange, replaced by ring (same bytes, P-1 steps).
    broadcast       binomial_tree if S < 12 KiB (MPIR_CVAR_BCAST_SHORT_MSG_SIZE) or P < 8
                    (MPIR_CVAR_BCAST_MIN_PROCS); else scatter + allgather (van de Geijn), replaced by
                    chain with P pieces (the same ~2 S/beta and P-proportional latency).
    reduce          binomial_tree if S <= 2048 B (MPIR_CVAR_REDUCE_SHORT_MSG_SIZE); else
                    reduce-scatter + gather, replaced by chain with P pieces.
Every call of a library also pays its launch latency (``LAUNCH_S``) before its first transfer: the
executors enter the chosen schedule that much later. An explicit algorithm token pays none (it is
the algorithm alone, the ideal).

nccl (NCCL >= 2.4; approximate: NCCL picks per call from a latency/bandwidth model of the hardware):
    allreduce       ring on one node; with N > 1 nodes double_binary_tree when S <= 256 KiB x N
                    (trees win while latency dominates, and their log2(N) latency gains more with N),
                    ring otherwise. NCCL's multi-node ring is hierarchy-aware; token ``ring`` stands
                    for it, with ``channels`` = the NICs the group's devices on one node attach to
                    (``nics_per_node``) when the group spans several whole nodes with more than one
                    device each: NCCL runs one ring channel per NIC (src/graph/search.cc), each
                    leaving the node through its own NIC; a group of one device per node (a
                    data-parallel group of a tensor-parallel layout) or of one node keeps one ring.
                    Pipelining: 512 KiB pieces (NCCL's 4 MiB buffer in 8 steps); a tree's
                    pieces shrink to 256, 128, 64 and 32 KiB until each tree has 8, 4 and 1 x its
                    depth of them (``nccl_tree_pieces``, NCCL's enqueue.cc chunk rule).
    allgather, reduce_scatter: ring, with channels as for allreduce.
    broadcast, reduce: chain (NCCL's pipelined ring), 512 KiB pieces.
mlsl (Intel MLSL hands its allreduce to Intel MPI; a plausible rule, not taken from Intel's source):
    allreduce       recursive_doubling if S <= 2 KiB, halving_doubling if S <= 1 MiB, ring above.
    others          as mpich (Intel MPI derives from MPICH).
openmpi (Open MPI ``coll/tuned`` fixed decision rules, v1.x-4.x; approximate):
    allreduce       recursive_doubling if S < 10 000 B, else ring (segmented ring above P x 1 MiB).
    allgather       recursive_doubling if S < 50 000 B and P is a power of two (Bruck otherwise,
                    replaced by recursive_doubling), ring above.
    reduce_scatter  halving_doubling if S < 64 KiB, ring above.
    broadcast       binomial_tree if S < 2048 B, else chain in 128 KiB pieces (segmented pipeline).
    reduce          binomial_tree if S < 2048 B, else chain in 128 KiB pieces.
gloo (facebookincubator/gloo, the collectives under PyTorch's gloo backend):
    allreduce       ring at every size (gloo/allreduce.cc: an unspecified algorithm runs ``ring``;
                    ``bcube`` only when asked for).
    allgather       ring (gloo/allgather.cc: each rank receives from rank - 1, sends to rank + 1).
    broadcast       binomial_tree (gloo/broadcast.cc: log2 rounds from the root).
    reduce_scatter, reduce: as mpich (not taken from gloo's source).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ddlsim.algorithms.schedule import COLLECTIVES, ScheduleError
from ddlsim.registry import Registry

KiB = 1024
MiB = 1024 * KiB

# Seconds from a library's collective call to its first transfer (kernel launch, the first step's
# set-up), per library; 0 for the others (not sourced yet).
LAUNCH_S = {
    # NVIDIA/nccl src/graph/tuning.cc (NCCL 2.5-2.8): baseLat of Ring/Simple, 8.4 us, the latency
    # NCCL's own cost model adds once to every ring collective before its per-step hwLat
    "nccl": 8.4e-6,
}

Choice = tuple[str, dict[str, Any]]
Selector = Callable[[str, float, int, int, int], Choice]
LIBRARIES: Registry[Selector] = Registry("collective library")


def _pieces(message_bytes: float, piece_bytes: float) -> int:
    return max(1, math.ceil(message_bytes / piece_bytes))


def _is_power_of_two(ranks: int) -> bool:
    return ranks & (ranks - 1) == 0


@LIBRARIES.register("mpich")
def _mpich(collective: str, message_bytes: float, ranks: int, devices_per_node: int, nics_per_node: int) -> Choice:
    pof2 = 1 << (ranks.bit_length() - 1)
    if collective == "allreduce":
        short = message_bytes <= 2048 or message_bytes / 4 < pof2
        return ("recursive_doubling" if short else "halving_doubling"), {}
    if collective == "allgather":
        if (message_bytes < 512 * KiB and _is_power_of_two(ranks)) or message_bytes < 80 * KiB:
            return "recursive_doubling", {}
        return "ring", {}
    if collective == "reduce_scatter":
        return ("halving_doubling" if message_bytes < 512 * KiB else "ring"), {}
    if collective == "broadcast":
        if message_bytes < 12 * KiB or ranks < 8:
            return "binomial_tree", {}
        return "chain", {"chunks": ranks}
    if message_bytes <= 2048:  # reduce
        return "binomial_tree", {}
    return "chain", {"chunks": ranks}


# NCCL's tree chunk rule (src/enqueue.cc, NCCL 2.4-2.19, Simple protocol): start from the step size
# (4 MiB buffer / 8 steps) and halve while a channel has fewer than depth x factor chunks and the chunk
# is still above the floor, so small messages still pipeline through a deep tree
NCCL_TREE_SHRINK = ((8, 128 * KiB), (4, 64 * KiB), (1, 32 * KiB))


def nccl_tree_pieces(message_bytes: float, ranks: int, nodes: int) -> int:
    """Pieces per tree of NCCL's double binary tree allreduce: each tree (a channel) carries half the
    buffer, cut into chunks by NCCL's rule against its tree depth, ranks per node - 1 + log2(nodes)
    (init.cc: the chain inside the node plus the tree across nodes). Two channels, one per tree: a
    machine where NCCL opens more gets smaller chunks still."""
    depth = ranks // nodes - 1 + int(math.log2(nodes))
    per_tree = message_bytes / 2
    chunk = 512 * KiB
    for factor, floor_bytes in NCCL_TREE_SHRINK:
        while per_tree // chunk < depth * factor and chunk > floor_bytes:
            chunk //= 2
    return _pieces(per_tree, chunk)


@LIBRARIES.register("nccl")
def _nccl(collective: str, message_bytes: float, ranks: int, devices_per_node: int, nics_per_node: int) -> Choice:
    nodes = math.ceil(ranks / max(1, devices_per_node))
    chunks = _pieces(message_bytes, 512 * KiB)
    whole_nodes = ranks % min(devices_per_node, ranks) == 0
    if collective == "allreduce" and nodes > 1 and message_bytes <= 256 * KiB * nodes and whole_nodes:
        return "double_binary_tree", {"chunks": nccl_tree_pieces(message_bytes, ranks, nodes)}
    if collective in ("allreduce", "allgather", "reduce_scatter"):
        return "ring", nccl_ring_options(nodes, devices_per_node, nics_per_node, whole_nodes)
    return "chain", {"chunks": chunks}


def nccl_ring_options(nodes: int, devices_per_node: int, nics_per_node: int, whole_nodes: bool) -> dict[str, Any]:
    """NCCL's ring: one channel per NIC the group's devices on a node reach (search.cc starts each
    ring channel from the next NIC), when the group spans whole nodes of several devices; no option
    (one ring) otherwise, e.g. a group of one device per node or a group within one node."""
    channels = min(nics_per_node, devices_per_node)
    if nodes > 1 and whole_nodes and channels > 1:
        return {"channels": channels}
    return {}


@LIBRARIES.register("mlsl")
def _mlsl(collective: str, message_bytes: float, ranks: int, devices_per_node: int, nics_per_node: int) -> Choice:
    if collective == "allreduce":
        if message_bytes <= 2 * KiB:
            return "recursive_doubling", {}
        return ("halving_doubling" if message_bytes <= MiB else "ring"), {}
    return _mpich(collective, message_bytes, ranks, devices_per_node, nics_per_node)


@LIBRARIES.register("openmpi")
def _openmpi(collective: str, message_bytes: float, ranks: int, devices_per_node: int, nics_per_node: int) -> Choice:
    if collective == "allreduce":
        return ("recursive_doubling" if message_bytes < 10_000 else "ring"), {}
    if collective == "allgather":
        return ("recursive_doubling" if message_bytes < 50_000 else "ring"), {}
    if collective == "reduce_scatter":
        return ("halving_doubling" if message_bytes < 64 * KiB else "ring"), {}
    if message_bytes < 2048:  # broadcast, reduce
        return "binomial_tree", {}
    return "chain", {"chunks": _pieces(message_bytes, 128 * KiB)}


@LIBRARIES.register("gloo")
def _gloo(collective: str, message_bytes: float, ranks: int, devices_per_node: int, nics_per_node: int) -> Choice:
    if collective in ("allreduce", "allgather"):
        return "ring", {}
    if collective == "broadcast":
        return "binomial_tree", {}
    return _mpich(collective, message_bytes, ranks, devices_per_node, nics_per_node)


def launch_s(algorithm: str, ranks: int) -> float:
    """The launch latency of a call through ``algorithm`` over ``ranks`` ranks: the library's
    (``LAUNCH_S``); 0 for an algorithm token, and for one rank (no call reaches the library)."""
    return LAUNCH_S.get(algorithm, 0.0) if ranks > 1 else 0.0


def select(
    library: str,
    collective: str,
    message_bytes: float,
    ranks: int,
    devices_per_node: int = 1,
    nics_per_node: int = 1,
) -> tuple[str, dict[str, Any]]:
    """(algorithm token, options) that ``library`` would use; see the module docstring for the rules.

    ``devices_per_node``: the group's members on each node (block placement); ``nics_per_node``: the
    distinct NICs those members on one node attach to (NCCL opens one ring channel per NIC)."""
    chooser = LIBRARIES.get(library)
    if collective not in COLLECTIVES:
        raise ScheduleError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ScheduleError(f"select: ranks must be a positive integer, got {ranks!r}")
    if isinstance(devices_per_node, bool) or not isinstance(devices_per_node, int) or devices_per_node < 1:
        raise ScheduleError(f"select: devices_per_node must be a positive integer, got {devices_per_node!r}")
    if isinstance(nics_per_node, bool) or not isinstance(nics_per_node, int) or nics_per_node < 1:
        raise ScheduleError(f"select: nics_per_node must be a positive integer, got {nics_per_node!r}")
    if not message_bytes >= 0:
        raise ScheduleError(f"select: message_bytes must be >= 0, got {message_bytes!r}")
    token, options = chooser(collective, float(message_bytes), ranks, devices_per_node, nics_per_node)
    return token, dict(options)
