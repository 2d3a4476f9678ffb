"""A real TCP network of chosen bandwidth on one machine: network namespaces joined in a star.

Each rank runs in its own network namespace with an ``eth0`` that is one end of a veth pair;
the other ends join a bridge in a hub namespace (the switch). Every veth end carries a ``tbf``
shaper, so each node has a full-duplex NIC of the set rate and the switch is non-blocking::

        {prefix}-n0            {prefix}-hub             {prefix}-n1
      +-------------+     +--------------------+     +-------------+
      | eth0 (tbf) ==|=====|= h0 (tbf)  h1 (tbf)=|=====|= eth0 (tbf) |
      | 10.77.0.1   |     |     \\ br0 //        |     | 10.77.0.2   |
      +-------------+     |   10.77.0.254       |     +-------------+
                          +--------------------+

The settings follow the measurements in ``shared/EMULATED_NETWORK.md``: MTU 9000 (at 1500 the
shaper's per-frame timers cost so much CPU that runs fall 20-30 % short), a bucket of
max(2 frames, 250 us of traffic), a queue limit of max(4 MiB, 20 ms of traffic), veth pairs
created directly in their final namespaces so that nothing in the host's namespace is created or
changed, and every object named so that teardown deletes it by name.

Needs root and ``ip``/``tc`` (iproute2). ``check_permitted()`` says why not, for skips.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ddlsim.hardware_models.units import UnitError, parse_bandwidth

MTU_BYTES = 9000
ETHERNET_HEADER_BYTES = 14
# IPv4 (20) + TCP with timestamps (32) per frame; Ethernet header (14) per frame on the wire.
TCP_IP_HEADER_BYTES = 52
TCP_EFFICIENCY_MTU9000 = (MTU_BYTES - TCP_IP_HEADER_BYTES) / (MTU_BYTES + ETHERNET_HEADER_BYTES)
"""Payload share of the set rate for TCP at MTU 9000: 8948 / 9014 = 0.9927."""

BUCKET_TIME_S = 250e-6  # shared/EMULATED_NETWORK.md: bucket of about 250 us of traffic ...
BUCKET_MIN_FRAMES = 2  # ... but at least two full frames
QUEUE_TIME_S = 20e-3  # queue limit: 20 ms of traffic ...
QUEUE_MIN_BYTES = 4 * 2**20  # ... but at least 4 MiB

SUBNET_PREFIX = "10.77.0"  # private, and only ever assigned inside our own namespaces
HUB_HOST = 254
GLOO_PORT = 29500
COMMAND_TIMEOUT_S = 30.0

_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_TC_RATE = re.compile(r"^\s*([0-9.eE+]+)\s*([kKmMgGtT]?)(i?)(bit|bps)\s*$")


class EmulatedNetworkError(RuntimeError):
    """Setting up or using the emulated network failed; the message names the command."""


def parse_rate(text: str | float) -> float:
    """Parse a link rate into bytes/s: "100mbit" -> 12.5e6, "1gbit" -> 125e6, "10 Gbit/s" -> 1.25e9.

    Accepts tc's spelling ("100mbit", "1gbit", "800kbit"; tc's "bps" means bytes/s, as here)
    and everything ``hardware_models.units.parse_bandwidth`` accepts. A bare number is bytes/s.
    """
    if isinstance(text, str):
        match = _TC_RATE.match(text)
        if match:
            number, prefix, binary, unit = match.groups()
            scale = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[prefix.lower()]
            if binary:
                scale = {"": 1.0, "k": 2.0**10, "m": 2.0**20, "g": 2.0**30, "t": 2.0**40}[prefix.lower()]
            text = f"{float(number) * scale}{'bit/s' if unit == 'bit' else 'B/s'}"
    rate = parse_bandwidth(text, "emulated network rate")
    if not rate > 0:
        raise UnitError(f"emulated network rate must be positive, got {text!r}")
    return rate


def bucket_bytes(rate_Bps: float) -> int:
    """tbf bucket: max(2 frames, 250 us of traffic), bytes (100 Mbit/s: max(18028, 3125) = 18028)."""
    return int(max(BUCKET_MIN_FRAMES * (MTU_BYTES + ETHERNET_HEADER_BYTES), rate_Bps * BUCKET_TIME_S))


def queue_limit_bytes(rate_Bps: float) -> int:
    """tbf queue limit: max(4 MiB, 20 ms of traffic), bytes (1 Gbit/s: max(4194304, 2.5e6))."""
    return int(max(QUEUE_MIN_BYTES, rate_Bps * QUEUE_TIME_S))


def _run(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as error:
        raise EmulatedNetworkError(f"timed out after {timeout_s} s: {shlex.join(argv)}") from error
    if check and done.returncode != 0:
        raise EmulatedNetworkError(f"failed ({done.returncode}): {shlex.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def check_permitted() -> str | None:
    """Why an emulated network cannot be built here (for a skip message), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces and tc need root (run as root to emulate a network)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"ddlsim-probe-{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe], timeout_s=10)
    except EmulatedNetworkError as error:
        return f"cannot create a network namespace: {error}"
    try:
        _run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], timeout_s=10)
        _run(f"tc -n {probe} qdisc add dev p0 root tbf rate 1mbit burst 20000 limit 100000".split(), timeout_s=10)
    except EmulatedNetworkError as error:
        return f"veth or tc tbf unavailable: {error}"
    finally:
        _run(["ip", "netns", "delete", probe], timeout_s=10, check=False)
    return None


def namespace_names(prefix: str, ranks: int) -> tuple[str, list[str]]:
    """(hub, [node 0, node 1, ...]) namespace names of a star."""
    return f"{prefix}-hub", [f"{prefix}-n{i}" for i in range(ranks)]


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _kill_namespace_processes(namespace: str, grace_s: float = 3.0) -> None:
    # Only our own uniquely named namespaces are swept, so every pid here is one we started.
    pids = [int(p) for p in _run(["ip", "netns", "pids", namespace], check=False).split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if Path(f"/proc/{pid}").exists()]
            time.sleep(0.05)
        pids = alive
        if not pids:
            return


def delete_namespaces(names: Sequence[str]) -> list[str]:
    """Delete the named namespaces (and the veths, bridge and qdiscs inside them); return failures.

    Processes still inside are ended first, so the namespaces really go away, not just their names.
    """
    existing = set(list_namespaces())
    failures = []
    for name in names:
        if name not in existing:
            continue
        _kill_namespace_processes(name)
        try:
            _run(["ip", "netns", "delete", name], timeout_s=10)
        except EmulatedNetworkError as error:
            failures.append(str(error))
    return failures


def cleanup(prefix: str) -> list[str]:
    """Delete leftovers of a crashed run: every namespace named ``{prefix}-hub`` or ``{prefix}-n<i>``.

    Returns the names deleted.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}-(hub|n\d+)$")
    names = [name for name in list_namespaces() if pattern.match(name)]
    delete_namespaces(names)
    return names


def _shape(namespace: str, device: str, rate_Bps: float) -> list[str]:
    return (
        f"tc -n {namespace} qdisc replace dev {device} root tbf rate {round(rate_Bps * 8)}bit "
        f"burst {bucket_bytes(rate_Bps)} limit {queue_limit_bytes(rate_Bps)}"
    ).split()


_SSH_WRAPPER = """#!/bin/sh
# hydra's ssh launcher calls: WRAPPER [ssh options] HOST COMMAND...; HOST is a namespace name.
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;
        *) break ;;
    esac
done
host="$1"
shift
exec ip netns exec "$host" sh -c "$*"
"""


@dataclass
class StarNetwork:
    """A built star: ``namespaces[i]`` holds rank i's ``eth0`` with ``addresses[i]``."""

    prefix: str
    hub: str
    namespaces: list[str]
    addresses: list[str]
    rate_Bps: float
    hub_address: str
    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def payload_rate_Bps(self) -> float:
        """What TCP can carry at the set rate: rate x 0.9927 (bytes/s)."""
        return self.rate_Bps * TCP_EFFICIENCY_MTU9000

    def wrap_command(self, rank: int, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``ip netns exec <rank's namespace> env K=V ... argv``."""
        assignments = [f"{key}={value}" for key, value in (env or {}).items()]
        return ["ip", "netns", "exec", self.namespaces[rank], "env", *assignments, *argv]

    def gloo_env(self, rank: int, master_port: int = GLOO_PORT) -> dict[str, str]:
        """torch.distributed rendezvous for rank ``rank``; GLOO_SOCKET_IFNAME because the host name
        does not resolve inside the namespaces."""
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(len(self.namespaces)),
            "MASTER_ADDR": self.addresses[0],
            "MASTER_PORT": str(master_port),
            "GLOO_SOCKET_IFNAME": "eth0",
        }

    def launch_gloo(
        self,
        argv_per_rank: Sequence[Sequence[str]],
        env: Mapping[str, str] | None = None,
        *,
        master_port: int = GLOO_PORT,
        realtime: bool = False,
        **popen_kwargs,
    ) -> list[subprocess.Popen]:
        """Start one process per rank in its namespace, with the torch.distributed environment.

        ``realtime`` runs the ranks under ``chrt -f 10``: gloo ranks block in the kernel, and
        real-time priority removes most scheduling noise. Never use it for MPICH ranks, which
        busy-poll and starve the machine.
        """
        if len(argv_per_rank) != len(self.namespaces):
            raise ValueError(f"need one command per rank ({len(self.namespaces)}), got {len(argv_per_rank)}")
        started = []
        for rank, argv in enumerate(argv_per_rank):
            rank_env = {**(env or {}), **self.gloo_env(rank, master_port)}
            command = list(argv)
            if realtime:
                command = ["chrt", "-f", "10", *command]
            process = subprocess.Popen(self.wrap_command(rank, command, rank_env), **popen_kwargs)
            started.append(process)
            self.processes.append(process)
        return started

    def ssh_wrapper(self) -> Path:
        """The script hydra's ssh launcher runs instead of ssh: the proxy runs in namespace HOST."""
        path = self.workdir / "netns_ssh"
        if not path.exists():
            path.write_text(_SSH_WRAPPER)
            path.chmod(0o755)
        return path

    def mpiexec_command(
        self, n: int, argv: Sequence[str], mpiexec: str | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """``(command, env)`` running ``argv`` on ``n`` ranks, one per namespace, over the shaped links.

        mpiexec runs in the hub namespace (it reaches the nodes over br0); hydra's ssh launcher
        starts each proxy through a wrapper that enters the namespace named as the host. The env
        (merge it into the caller's) makes MPICH use TCP over eth0 and no shared memory. Do not
        add real-time priority: MPICH ranks busy-poll.
        """
        if not 1 <= n <= len(self.namespaces):
            raise ValueError(f"n must be in 1..{len(self.namespaces)}, got {n}")
        mpiexec = mpiexec or shutil.which("mpiexec") or "mpiexec"
        hosts = ",".join(self.namespaces[:n])
        launcher = ["-launcher", "ssh", "-launcher-exec", str(self.ssh_wrapper()), "-iface", "br0"]
        placement = ["-hosts", hosts, "-ppn", "1", "-n", str(n)]
        command = ["ip", "netns", "exec", self.hub, mpiexec, *launcher, *placement, *argv]
        env = {
            "MPIR_CVAR_CH4_NETMOD": "ofi",
            "FI_PROVIDER": "tcp",
            "FI_TCP_IFACE": "eth0",
            "MPIR_CVAR_NOLOCAL": "1",
        }
        return command, env

    def byte_counters(self, rank: int) -> tuple[int, int]:
        """(tx_bytes, rx_bytes) of rank's eth0, read from /sys inside its namespace."""
        values = []
        for counter in ("tx_bytes", "rx_bytes"):
            text = _run(
                ["ip", "netns", "exec", self.namespaces[rank], "cat", f"/sys/class/net/eth0/statistics/{counter}"]
            )
            values.append(int(text.strip()))
        return values[0], values[1]

    def stop_processes(self, grace_s: float = 5.0) -> None:
        """End the processes this network launched that are still running (by their own pid)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=grace_s)


def _build(prefix: str, ranks: int, rate_Bps: float, workdir: Path) -> StarNetwork:
    hub, nodes = namespace_names(prefix, ranks)
    addresses = [f"{SUBNET_PREFIX}.{i + 1}" for i in range(ranks)]
    network = StarNetwork(prefix, hub, nodes, addresses, rate_Bps, f"{SUBNET_PREFIX}.{HUB_HOST}", workdir)
    mtu = MTU_BYTES
    lines = [f"ip netns add {name}" for name in (hub, *nodes)]
    lines += [
        f"ip -n {hub} link set lo up",
        f"ip -n {hub} link add br0 mtu {mtu} type bridge",
        f"ip -n {hub} addr add {network.hub_address}/24 dev br0",
    ]
    for i, (node, address) in enumerate(zip(nodes, addresses, strict=True)):
        lines += [
            # Created directly in its final namespaces: nothing touches the host's namespace.
            f"ip -n {hub} link add h{i} mtu {mtu} type veth peer name eth0 netns {node} mtu {mtu}",
            f"ip -n {hub} link set h{i} master br0 up",
            f"ip -n {node} link set lo up",
            f"ip -n {node} addr add {address}/24 dev eth0",
            f"ip -n {node} link set eth0 up",
        ]
    commands = [line.split() for line in lines]
    for i, node in enumerate(nodes):
        commands += [_shape(node, "eth0", rate_Bps), _shape(hub, f"h{i}", rate_Bps)]  # upload, download
    commands.append(f"ip -n {hub} link set br0 up".split())
    for argv in commands:
        _run(argv)
    return network


@contextmanager
def star_network(ranks: int, rate_Bps: float, prefix: str = "ddlsim") -> Iterator[StarNetwork]:
    """Build a star of ``ranks`` namespaces at ``rate_Bps`` bytes/s per direction per node.

    Everything is deleted by name on exit, also after an exception or KeyboardInterrupt in the
    body or half-way through setup. A namespace of that name left by a crashed run is an error
    (call ``cleanup(prefix)``), so we never adopt or delete something we did not create.
    """
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix must be letters, digits, '.', '_' or '-' (at most 40), got {prefix!r}")
    if not 1 <= ranks <= 250:
        raise ValueError(f"ranks must be in 1..250, got {ranks}")
    if not rate_Bps > 0:
        raise ValueError(f"rate_Bps must be positive, got {rate_Bps}")
    reason = check_permitted()
    if reason:
        raise EmulatedNetworkError(f"cannot emulate a network: {reason}")
    hub, nodes = namespace_names(prefix, ranks)
    clash = sorted(set(list_namespaces()) & {hub, *nodes})
    if clash:
        raise EmulatedNetworkError(
            f"namespaces {clash} already exist (a crashed run?); remove them with "
            f"`python -m ddlsim.real_runs.emulated_network cleanup {prefix}`"
        )
    network = None
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as workdir:
        try:
            network = _build(prefix, ranks, rate_Bps, Path(workdir))
            yield network
        finally:
            if network is not None:
                network.stop_processes()
            failures = delete_namespaces([hub, *nodes])
            if failures:
                message = "teardown failed: " + "; ".join(failures)
                if sys.exc_info()[0] is not None:  # do not hide the error that got us here
                    print(message, file=sys.stderr)
                else:
                    raise EmulatedNetworkError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddlsim.real_runs.emulated_network cleanup PREFIX`` | ``check``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check"]:
        reason = check_permitted()
        print(reason or "ok: network namespaces and tc tbf are available")
        return 1 if reason else 0
    if len(args) == 2 and args[0] == "cleanup":
        deleted = cleanup(args[1])
        print("deleted: " + (", ".join(deleted) if deleted else "nothing"))
        return 0
    print("usage: python -m ddlsim.real_runs.emulated_network check | cleanup PREFIX", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
