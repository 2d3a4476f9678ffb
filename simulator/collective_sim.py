"""Simulating one collective on a modeled fabric: time, algbw and busbw as nccl-tests defines them.

nccl-tests (doc/PERFORMANCE.md): algbw = S / t, busbw = algbw x factor with factor
2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for broadcast and reduce.
``message_bytes`` S is the full buffer of one rank (for all-gather: the gathered result).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, resolve
from ddlsim.algorithms.schedule import COLLECTIVES
from ddlsim.algorithms.selectors import launch_s
from ddlsim.hardware_models.catalog import Link, load_link
from ddlsim.simulator.engine.collective_engine import ContentionDetected, run_collective
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fabric_spec import FabricSpec, call_overhead_s, topology_of, torus_shape
from ddlsim.simulator.input_errors import ScenarioError, check_sockets

if TYPE_CHECKING:  # a calibration profile is read only where one is named (``--profile``)
    from ddlsim.hardware_models.profile import Profile


def bus_factor(collective: str, ranks: int) -> float:
    if collective == "allreduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("reduce_scatter", "allgather"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True)
class CollectiveSetup:
    """Where a collective runs: ranks placed in blocks of ``devices_per_node`` on the fabric."""

    devices_per_node: int = 1
    intra_node: str | None = None
    host_link: str | None = None
    network: str | None = "ib_edr"
    nics_per_node: int = 1
    sockets: int = 1  # CPU sockets a node's devices are split over (see FabricSpec)
    socket_link: str | None = None
    topology: str = "switch"
    oversubscription: float = 1.0
    nodes_per_leaf: int = 16
    nodes_per_router: int = 4  # dragonfly (see FabricSpec)
    routers_per_group: int = 16
    dragonfly_global_links: int = 1
    torus_dims: tuple[int, ...] | None = None
    loggp: bool = False
    placement: str = "block"
    # a calibration profile (fitted link alpha/beta per message size) and the device it is scoped to
    profile: Profile | None = None
    device: str | None = None
    # ranks sharing one host's cores (None: devices_per_node, one host per node). Ranks of one machine
    # modeled as one-rank nodes on a star (``Measurement.modeled``) still share that machine's CPU.
    host_ranks: int | None = None

    def link(self, token: str, message_bytes: float | None = None, ranks: int = 1) -> Link:
        """The datasheet link, or the profile's alpha/beta for a collective of ``message_bytes``
        (stretched when the host runs more of the ``ranks`` than the fit's cores)."""
        link = load_link(token)
        if not self.profile:
            return link
        return self.profile.link(link, self.device, message_bytes, self._host_ranks(ranks))

    def _host_ranks(self, ranks: int) -> int:
        return min(self.host_ranks, ranks) if self.host_ranks else min(self.devices_per_node, ranks)

    def reduce_Bps(self, tokens: list[str], ranks: int) -> float:
        """The receivers' reduction rate: the slowest fitted one among the links in use (inf if none)."""
        rate = math.inf
        for token in tokens:
            fit = self.profile.link_fit(token, self.device) if self.profile else None
            if fit is not None:
                rate = min(rate, fit.reduce_Bps / fit.stretch(self._host_ranks(ranks)))
        return rate

    def fabric(self, ranks: int, message_bytes: float | None = None) -> Fabric:
        nodes = -(-ranks // self.devices_per_node)
        if nodes > 1 and not self.network:
            raise ScenarioError("more than one node needs --network")
        if self.devices_per_node > 1 and not self.intra_node:
            raise ScenarioError("devices-per-node > 1 needs --intra-node")
        check_sockets(self.devices_per_node, self.sockets, self.socket_link)
        tokens = [
            token
            for token, used in (
                (self.intra_node, self.devices_per_node > 1),
                (self.host_link, nodes > 1),
                (self.network, nodes > 1),
            )
            if token and used
        ]
        return Fabric(
            FabricSpec(
                nodes=nodes,
                devices_per_node=self.devices_per_node,
                peer_link=(
                    self.link(self.intra_node, message_bytes, ranks)
                    if self.intra_node and self.devices_per_node > 1
                    else None
                ),
                host_link=self.link(self.host_link, message_bytes, ranks) if self.host_link else None,
                network=self.link(self.network, message_bytes, ranks) if self.network and nodes > 1 else None,
                socket_link=(
                    self.link(self.socket_link, message_bytes, ranks) if self.socket_link and self.sockets > 1 else None
                ),
                reduce_Bps=self.reduce_Bps(tokens, ranks),
                **topology_of(self),
            )
        )


resolve_algorithm = resolve  # the name predict.py and older callers use


def grid_on_torus(setup: CollectiveSetup, token: str, ranks: int) -> dict[str, Any]:
    """torus_2d's grid on a torus of one rank per node, when the user gives none: rows = the torus's
    first extent, so a row holds the nodes of the other extents in order and both rings stay within
    a hop or two of neighbours (on a 3D torus 131,072 = 64 x 64 x 32: rows of 2048, not the most
    square 512 x 256, whose column ring would cross 8 nodes per step)."""
    if token != "torus_2d" or setup.devices_per_node != 1 or not setup.topology.startswith("torus_"):
        return {}
    shape = torus_shape(ranks, 2 if setup.topology == "torus_2d" else 3, setup.torus_dims)
    return {"rows": shape[0]} if math.prod(shape) == ranks and 1 < shape[0] < ranks else {}

def simulate_collective(
    setup: CollectiveSetup,
    algorithm: str,
    collective: str,
    ranks: int,
    message_bytes: float,
    options: dict[str, Any] | None = None,
    mode: str = "auto",
) -> dict[str, Any]:
    """One row: time_s, algbw_Bps, busbw_Bps (and the closed form on the same fabric) for one size."""
    if collective not in COLLECTIVES:
        raise ScenarioError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if ranks < 1:
        raise ScenarioError(f"ranks must be a positive integer, got {ranks}")
    if not message_bytes > 0:
        raise ScenarioError(f"message size must be > 0 bytes, got {message_bytes!r}")
    nics = setup.nics_per_node if setup.placement == "block" else 1  # scattered ranks: no node blocks
    token, chosen = resolve_algorithm(algorithm, collective, message_bytes, ranks, setup.devices_per_node, nics)
    merged = {**chosen, **grid_on_torus(setup, token, ranks), **(options or {})}
    impl = COLLECTIVE_ALGORITHMS.get(token)
    schedule = impl.schedule(collective, ranks, devices_per_node=setup.devices_per_node, **merged)
    fabric = setup.fabric(schedule.ranks, message_bytes)
    started = time.perf_counter()
    # a library's call enters its schedule this late: its launch, and a calibrated fixed cost per call
    per_node = setup.devices_per_node if setup.placement == "block" else 1
    library, call = launch_s(algorithm, ranks), call_overhead_s(fabric.spec, ranks, per_node)
    launch = library + call
    try:
        finish, path = run_collective(schedule, fabric, message_bytes, launch, mode)
    except ContentionDetected as detected:  # only a forced path declines: auto always has the message path
        raise ScenarioError(
            f"--mode {mode} cannot time {token} over {ranks} ranks exactly ({detected}); "
            "--mode auto takes the fastest path that can"
        ) from detected
    wall = time.perf_counter() - started
    elapsed = float(finish[: schedule.workers].max()) if ranks > 1 else 0.0
    closed = launch + impl.closed_form_s(collective, ranks, message_bytes, fabric.fabric_costs(), **merged)
    algbw = message_bytes / elapsed if elapsed > 0 else float("inf")
    return {
        "algorithm": algorithm,
        "resolved_algorithm": token,
        # what a library chose besides the algorithm (NCCL's ring channels, its tree's pieces)
        "resolved_options": " ".join(f"{key}={value}" for key, value in sorted(chosen.items())),
        "collective": collective,
        "ranks": ranks,
        "message_bytes": message_bytes,
        "time_s": elapsed,
        "algbw_Bps": algbw,
        "busbw_Bps": algbw * bus_factor(collective, ranks),
        "closed_form_s": closed,
        "launch_s": library,
        "call_s": call,  # a calibration profile's fixed cost per call over the links crossed
        "execution_path": path,
        "wall_s": wall,
    }
