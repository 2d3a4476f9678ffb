"""All-reduce on a network whose bandwidth we set: measured bus bandwidth against rate x TCP efficiency.

Builds a star of network namespaces (``real_runs.emulated_network``) at ``--rate`` per node and
direction, starts one rank per namespace, and times an all-reduce of ``--message-bytes``:

* ``library``: the library's own all-reduce (``dist.all_reduce`` for gloo, ``MPI_Allreduce``);
* ``ring``: our ring schedule (``algorithms/ring_collective.py``) run by
  ``real_runs.schedule_executor.run_schedule`` over the same transport (when that module exists).

Benchmark etiquette as nccl-tests: one warm-up excluded, a barrier before every timed iteration,
the slowest rank's time per iteration, the median over iterations, the result checked
(every element equals P(P+1)/2). ``busbw = algbw x 2(P-1)/P`` with ``algbw = S / t``; on a star
whose node links carry ``rate`` each way, a bandwidth-bound ring all-reduce reaches busbw = the
payload rate TCP gets from the link, ``rate x 0.9927`` at MTU 9000. The last column is the ratio.

    python benchmarks/emulated_allreduce.py                       # 100mbit, 2 ranks, 32 MB, gloo
    python benchmarks/emulated_allreduce.py --ranks 2,4 --rate 1gbit --message-bytes 64MB
    python benchmarks/emulated_allreduce.py --library mpi         # MPICH through hydra's ssh launcher
    python benchmarks/emulated_allreduce.py --json                # one JSON record per line

Needs root (network namespaces and tc). Example, 2 ranks at 100 Mbit/s, 32 MB, on a 2-core VM:
busbw ~ 12.2 MB/s against 12.41 MB/s = 12.5 MB/s x 0.9927 (ratio ~ 0.98).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from ddlsim.hardware_models.units import parse_bytes  # noqa: E402
from ddlsim.real_runs.emulated_network import (  # noqa: E402
    TCP_EFFICIENCY_MTU9000,
    StarNetwork,
    check_permitted,
    parse_rate,
    star_network,
)

IMPLEMENTATIONS = ("library", "ring")
RUN_TIMEOUT_S = 600.0


# --- what each rank runs -----------------------------------------------------------------------


def _library_allreduce(library: str, transport: Any, buffer: np.ndarray) -> None:
    if library == "gloo":
        import torch
        import torch.distributed as dist

        dist.all_reduce(torch.from_numpy(buffer))
    else:
        transport.comm.Allreduce(transport.MPI.IN_PLACE, buffer, op=transport.MPI.SUM)


def _ring_available() -> bool:
    try:
        import ddlsim.real_runs.schedule_executor  # noqa: F401
    except ImportError:
        return False
    return True


def worker(library: str, message_bytes: int, iterations: int, implementations: list[str]) -> None:
    """One rank: time each implementation; rank 0 prints one JSON record per implementation."""
    transport: Any
    if library == "gloo":
        from ddlsim.real_runs.gloo_transport import GlooTransport

        transport = GlooTransport.from_env()
    else:
        from ddlsim.real_runs.transport import MpiTransport

        transport = MpiTransport()
    rank, size = transport.rank, transport.size
    buffer = np.empty(message_bytes // 4, dtype=np.float32)
    expected = size * (size + 1) / 2
    for implementation in implementations:
        run: Callable[[], Any]
        if implementation == "ring":
            from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
            from ddlsim.real_runs.schedule_executor import run_schedule

            schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", size)
            run = functools.partial(run_schedule, schedule, buffer, transport)
        else:
            run = functools.partial(_library_allreduce, library, transport, buffer)
        times_s = []
        for iteration in range(iterations + 1):  # iteration 0 is the warm-up
            buffer.fill(rank + 1)
            transport.barrier()
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            if not np.all(buffer == expected):
                raise SystemExit(f"rank {rank}: {implementation} all-reduce gave a wrong result")
            slowest = max(transport.allgather_object(elapsed))
            if iteration > 0:
                times_s.append(slowest)
        if rank == 0:
            record = {"implementation": implementation, "times_s": times_s}
            print("RESULT " + json.dumps(record), flush=True)
    transport.barrier()
    if library == "gloo":
        transport.close()


# --- the driver ----------------------------------------------------------------------------------


def _worker_argv(library: str, message_bytes: int, iterations: int, implementations: list[str]) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "worker",
        "--library",
        library,
        "--message-bytes",
        str(message_bytes),
        "--iterations",
        str(iterations),
        "--implementations",
        ",".join(implementations),
    ]


def _collect(processes: list[subprocess.Popen], timeout_s: float) -> list[str]:
    outputs = []
    deadline = time.monotonic() + timeout_s
    for rank, process in enumerate(processes):
        try:
            out, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise SystemExit(f"rank {rank} did not finish within {timeout_s:.0f} s") from None
        if process.returncode != 0:
            raise SystemExit(f"rank {rank} failed with exit code {process.returncode}:\n{out}")
        outputs.append(out)
    return outputs


def measure(
    network: StarNetwork,
    library: str,
    message_bytes: int,
    iterations: int,
    implementations: list[str],
    realtime: bool = False,
    timeout_s: float = RUN_TIMEOUT_S,
) -> list[dict]:
    """Run the all-reduces on ``network`` and return one record per implementation."""
    ranks = len(network.namespaces)
    argv = _worker_argv(library, message_bytes, iterations, implementations)
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    before = [network.byte_counters(rank) for rank in range(ranks)]
    if library == "gloo":
        processes = network.launch_gloo(
            [argv] * ranks, env, realtime=realtime, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        outputs = _collect(processes, timeout_s)
    else:
        command, mpi_env = network.mpiexec_command(ranks, argv)  # never real-time: MPICH busy-polls
        process = subprocess.Popen(
            command, env={**os.environ, **env, **mpi_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        network.processes.append(process)
        outputs = _collect([process], timeout_s)
    after = [network.byte_counters(rank) for rank in range(ranks)]
    tx_bytes = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    records = []
    lines = [line for out in outputs for line in out.splitlines() if line.startswith("RESULT ")]
    payload_Bps = network.rate_Bps * TCP_EFFICIENCY_MTU9000
    for line in lines:
        result = json.loads(line.removeprefix("RESULT "))
        time_s = statistics.median(result["times_s"])
        algbw = message_bytes / time_s
        busbw = algbw * 2 * (ranks - 1) / ranks
        records.append(
            {
                "library": library,
                "implementation": result["implementation"],
                "ranks": ranks,
                "message_bytes": message_bytes,
                "iterations": iterations,
                "time_s": time_s,
                "time_spread_s": max(result["times_s"]) - min(result["times_s"]),
                "algbw_Bps": algbw,
                "busbw_Bps": busbw,
                "rate_Bps": network.rate_Bps,
                "payload_rate_Bps": payload_Bps,
                "ratio": busbw / payload_Bps,
                # the whole run, warm-ups and barriers included: proof the traffic crossed eth0
                "eth0_tx_bytes": tx_bytes,
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    run_worker = sub.add_parser("worker", help="(internal) one rank")
    run_worker.add_argument("--library", choices=("gloo", "mpi"), required=True)
    run_worker.add_argument("--message-bytes", type=int, required=True)
    run_worker.add_argument("--iterations", type=int, required=True)
    run_worker.add_argument("--implementations", required=True)
    parser.add_argument("--rate", default="100mbit", help="per node and direction: 100mbit, 1gbit, 12.5MB/s")
    parser.add_argument("--ranks", default="2", help="comma-separated rank counts, e.g. 2,4")
    parser.add_argument("--message-bytes", default="32MB", help="all-reduce size, e.g. 16MB, 64MiB")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations (after one warm-up)")
    parser.add_argument("--library", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--implementations", default="library,ring", help="library, ring (ring if available)")
    parser.add_argument("--realtime", action="store_true", help="gloo ranks under chrt -f 10 (never for MPI)")
    parser.add_argument("--prefix", default=f"ddlsim-bench-{os.getpid()}", help="namespace name prefix")
    parser.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker(args.library, args.message_bytes, args.iterations, args.implementations.split(","))
        return 0
    reason = check_permitted()
    if reason:
        print(f"cannot emulate a network here: {reason}", file=sys.stderr)
        return 2
    if args.realtime and args.library == "mpi":
        parser.error("--realtime is for gloo only: real-time MPICH ranks busy-poll and starve the machine")
    implementations = [name for name in args.implementations.split(",") if name]
    unknown = sorted(set(implementations) - set(IMPLEMENTATIONS))
    if unknown:
        parser.error(f"unknown implementations {unknown}; valid: {', '.join(IMPLEMENTATIONS)}")
    if "ring" in implementations and not _ring_available():
        print("note: real_runs.schedule_executor not available; skipping our ring", file=sys.stderr)
        implementations.remove("ring")
    rate_Bps = parse_rate(args.rate)
    message_bytes = int(parse_bytes(args.message_bytes)) // 4 * 4
    if not args.json:
        print(
            f"rate {args.rate} = {rate_Bps / 1e6:.3f} MB/s per node and direction; TCP payload at MTU 9000: "
            f"x {TCP_EFFICIENCY_MTU9000:.4f} = {rate_Bps * TCP_EFFICIENCY_MTU9000 / 1e6:.3f} MB/s"
        )
        print(
            f"{'library':8} {'impl':8} {'ranks':>5} {'bytes':>10} {'time_s':>8} {'spread_s':>8} "
            f"{'algbw_MBps':>10} {'busbw_MBps':>10} {'ratio':>6}  eth0_tx_bytes"
        )
    for ranks in (int(text) for text in args.ranks.split(",")):
        with star_network(ranks, rate_Bps, prefix=args.prefix) as network:
            records = measure(network, args.library, message_bytes, args.iterations, implementations, args.realtime)
        for record in records:
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                print(
                    f"{record['library']:8} {record['implementation']:8} {ranks:5d} {message_bytes:10d} "
                    f"{record['time_s']:8.3f} {record['time_spread_s']:8.3f} {record['algbw_Bps'] / 1e6:10.3f} "
                    f"{record['busbw_Bps'] / 1e6:10.3f} {record['ratio']:6.3f}  {record['eth0_tx_bytes']}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
