"""Run the MPI test bodies on every rank: ``mpiexec -n N python -m tests.mpi.run_bodies [NAME ...]``.

The same bodies run over torch.distributed's gloo backend with ``--backend gloo`` in N processes
that carry RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (issue 4: the same collectives and
programs on both backends). Exits 0 when every body passed on every rank. A failing rank prints
the failure and aborts the whole job (the other ranks would otherwise wait for it forever).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from tests.mpi.bodies import BODIES


def _transport(backend: str):
    if backend == "gloo":
        from ddlsim.real_runs.gloo_transport import GlooTransport

        return GlooTransport.from_env()
    from ddlsim.real_runs.transport import MpiTransport

    return MpiTransport()


def _abort(transport) -> None:
    comm = getattr(transport, "comm", None)
    if comm is not None:
        comm.Abort(1)
    os._exit(1)


def run_named(transport, bodies: Mapping[str, Callable[[Any], None]], names: list[str]) -> int:
    """Run ``bodies[name]`` for each name (all when none) on this rank, in step with the others."""
    for name in names or list(bodies):
        start = time.perf_counter()
        try:
            bodies[name](transport)
        except BaseException:
            print(f"rank {transport.rank}: body {name} FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            _abort(transport)
        transport.barrier()
        if transport.rank == 0:
            print(f"{name}: ok on {transport.size} ranks ({time.perf_counter() - start:.1f} s)", flush=True)
    return 0


def main(argv: list[str]) -> int:
    backend = "mpi"
    if argv[:1] == ["--backend"]:
        backend, argv = argv[1], argv[2:]
    return run_named(_transport(backend), BODIES, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
