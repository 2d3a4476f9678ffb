"""Start N local processes as gloo ranks (the environment a launcher sets) and collect their output.

The store's port is probed free and released before rank 0 binds it, so another socket can take it in
between (an earlier test's ranks open outgoing connections from the same port range): a run where a
rank reports EADDRINUSE is started again on a new port, up to ``attempts`` times.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ddlsim.real_runs.launcher import free_port, port_taken

REPO = Path(__file__).resolve().parents[2]


def run_gloo_ranks(ranks: int, command: Sequence[str], timeout_s: float, attempts: int = 3,
                   cwd: Path | None = None) -> tuple[list[subprocess.Popen], list[str]]:  # fmt: skip
    """(processes, outputs) of ``command`` run as ``ranks`` gloo ranks on loopback."""
    for attempt in range(attempts):
        processes, outputs = _launch(ranks, command, timeout_s, free_port(), cwd)
        if attempt + 1 == attempts or not any(port_taken(out) for out in outputs):
            break
    return processes, outputs


def _launch(ranks: int, command: Sequence[str], timeout_s: float, port: int,
            cwd: Path | None) -> tuple[list[subprocess.Popen], list[str]]:  # fmt: skip
    processes = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")  # fmt: skip
        processes.append(subprocess.Popen(list(command), env=env, cwd=cwd, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout_s)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    return processes, outputs
