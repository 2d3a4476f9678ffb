"""Overhead of our schedules over mpi4py point-to-point against the MPI library's own all-reduce.

    mpiexec -n 4 python benchmarks/overhead_allreduce.py [--message-bytes 16e6] [--repeats 20]

Both run on the same ranks and the same float32 buffer: our ring (``algorithms/ring_collective.py``
executed by ``real_runs.schedule_executor.run_schedule``) and ``MPI_Allreduce``. Etiquette as
nccl-tests: warm-up excluded, a barrier before every timed call, the slowest rank's time per call,
results checked against each other, the median of the repeats. Prints algbw and busbw of both
(busbw = algbw x 2(P-1)/P for all-reduce) and the ratio ours / library (target >= 0.70).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlsim.real_runs.microbench import bus_bandwidth_Bps
from ddlsim.real_runs.schedule_executor import Workspace, build_schedule, run_schedule
from ddlsim.real_runs.transport import MpiTransport


def timed(transport: MpiTransport, call, repeats: int, warmup: int) -> list[float]:
    """Seconds of the slowest rank for each of ``repeats`` calls after ``warmup`` untimed ones."""
    MPI = transport.MPI
    times = []
    for index in range(warmup + repeats):
        transport.barrier()
        start = time.perf_counter()
        call()
        elapsed = transport.comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if index >= warmup:
            times.append(elapsed)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--message-bytes", type=float, default=16e6)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--algorithm", default="ring")
    args = parser.parse_args(argv)
    transport = MpiTransport()
    ranks, rank = transport.size, transport.rank
    elements = int(args.message_bytes) // 4
    data = np.random.default_rng(rank).uniform(-1, 1, elements).astype(np.float32)
    ours = data.copy()
    library = np.empty_like(data)
    schedule = build_schedule(args.algorithm, "allreduce", ranks)
    workspace = Workspace()

    def run_ours() -> None:
        ours[:] = data
        run_schedule(schedule, ours, transport, workspace=workspace)

    def run_library() -> None:
        transport.comm.Allreduce(data, library)

    run_ours()
    run_library()
    np.testing.assert_allclose(ours, library, rtol=0, atol=1e-5 * ranks)  # results checked, not just timed
    ours_s = float(np.median(timed(transport, run_ours, args.repeats, args.warmup)))
    library_s = float(np.median(timed(transport, run_library, args.repeats, args.warmup)))
    if rank == 0:
        nbytes = elements * 4
        ours_bus = bus_bandwidth_Bps("allreduce", nbytes, ranks, ours_s)
        library_bus = bus_bandwidth_Bps("allreduce", nbytes, ranks, library_s)
        print(f"allreduce of {nbytes / 1e6:.1f} MB float32 on {ranks} ranks, median of {args.repeats}")
        print(
            f"  {args.algorithm} over mpi4py point-to-point: {ours_s * 1e3:8.2f} ms  busbw {ours_bus / 1e9:6.2f} GB/s"
        )
        print(f"  MPI_Allreduce ({transport.MPI.Get_library_version().split()[0]}):        "
              f"{library_s * 1e3:8.2f} ms  busbw {library_bus / 1e9:6.2f} GB/s")  # fmt: skip
        print(f"  ratio ours / library busbw: {ours_bus / library_bus:.2f} (target >= 0.70)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
