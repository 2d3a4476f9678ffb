"""Run the MPI test bodies on every rank: ``mpiexec -n N python -m tests.mpi.run_bodies [NAME ...]``.

Exits 0 when every body passed on every rank. A failing rank prints the failure and aborts the
whole job (the other ranks would otherwise wait for it forever).
"""

from __future__ import annotations

import sys
import time
import traceback

from tests.mpi.bodies import BODIES


def main(argv: list[str]) -> int:
    from real_runs.transport import MpiTransport

    transport = MpiTransport()
    names = argv or list(BODIES)
    for name in names:
        start = time.perf_counter()
        try:
            BODIES[name](transport)
        except BaseException:
            print(f"rank {transport.rank}: body {name} FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            transport.comm.Abort(1)
        transport.barrier()
        if transport.rank == 0:
            print(f"{name}: ok on {transport.size} ranks ({time.perf_counter() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
