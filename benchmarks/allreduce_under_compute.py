"""How much an all-reduce on the communication thread slows while the rank computes (issue 6).

    mpiexec -n 2 python benchmarks/allreduce_under_compute.py [--message-bytes 64KiB] [--algorithm ring]

The harness overlaps each gradient bucket's all-reduce with backward by running our schedule
executor (Python) on a second thread of the rank. This times that all-reduce on such a thread
twice: with the main thread idle, and with the main thread running resnet_small's forward and
backward (batch 32, one torch thread) in a loop, as it does during backward. Prints the median of
each (seconds of the calling rank, rank 0) and their ratio. Run it with the launcher's environment
(``OMP_NUM_THREADS=1``, ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` of
``real_runs.environment.ALLOCATOR_ENV``; ``MPIR_CVAR_POLLS_BEFORE_YIELD=1`` beyond one rank per core).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlsim.hardware_models.units import parse_bytes
from ddlsim.real_runs.schedule_executor import Workspace, build_schedule, run_schedule
from ddlsim.real_runs.transport import MpiTransport


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--message-bytes", default="64KiB")
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()

    import torch

    from ddlsim.real_runs.models import build_model

    torch.set_num_threads(1)
    world = MpiTransport()
    comm = world.dup()
    schedule = build_schedule(args.algorithm, "allreduce", world.size)
    elements = max(world.size, int(parse_bytes(args.message_bytes)) // 4)
    workspace = Workspace()

    def allreduces() -> float:
        """Median seconds of ``repeats`` all-reduces run on a thread of their own, after 5 untimed."""
        seconds: list[float] = []

        def body() -> None:
            for _ in range(5 + args.repeats):
                buffer = np.ones(elements, dtype=np.float32)
                start = time.perf_counter()
                run_schedule(schedule, buffer, comm, tag=7, workspace=workspace)
                seconds.append(time.perf_counter() - start)

        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
        return statistics.median(seconds[5:])

    world.barrier()
    idle = allreduces()
    model = build_model("resnet_small", 3, 10)
    images = torch.randn(32, 3, 32, 32)
    stop = threading.Event()

    def compute() -> None:
        while not stop.is_set():
            model(images).sum().backward()

    world.barrier()
    loader = threading.Thread(target=compute)
    loader.start()
    time.sleep(0.3)  # the loop is in its stride
    loaded = allreduces()
    stop.set()
    loader.join()
    if world.rank == 0:
        print(f"{world.size} ranks, {args.algorithm} all-reduce of {elements * 4} B on a communication thread: "
              f"idle {idle * 1e3:.2f} ms, under compute {loaded * 1e3:.2f} ms ({loaded / idle:.0f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
