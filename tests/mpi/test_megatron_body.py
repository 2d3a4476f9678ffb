"""megatron layouts run for real: the MPI test body (launched by ``tests/test_megatron_mpi.py``).

``mpiexec -n N python -m tests.mpi.test_megatron_body`` runs every layout of ``LAYOUTS`` that fits
N ranks through the megatron role program on the real trainer (``real_runs/megatron_trainer.py``)
and prints, from rank 0, one JSON line per layout: the loss of each iteration averaged over the
data-parallel replicas (the global batch's mean) and the ranks' roles. The launcher holds those
losses to one rank's run of the same global batch: any split of the same GPT trains the same network.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ddlsim.algorithms.training_algorithm import make_options

SHAPE = {"layers": 4, "hidden": 32, "heads": 4, "ffn_hidden": 64, "vocabulary": 64, "seq_len": 16}
STEPS = 6
BASE = {"micro_batch": 2, "global_batch": 8, "precision": "fp32"}
# name -> (ranks, layout)
LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {
    "tp2": (2, {"tp": 2}),
    "pp2": (2, {"pp": 2}),
    "dp2_zero1": (2, {"dp": 2, "zero_stage": 1}),
    "tp2_pp2": (4, {"tp": 2, "pp": 2}),
    "tp2_dp2_zero3": (4, {"tp": 2, "dp": 2, "zero_stage": 3}),
    "pp2_dp2_zero1": (4, {"pp": 2, "dp": 2, "zero_stage": 1}),
    "pp2_interleaved_dp2": (4, {"pp": 2, "dp": 2, "virtual_stages": 2}),
    "dp4_zero2": (4, {"dp": 4, "zero_stage": 2}),
}


def settings(layout: dict[str, Any]) -> Any:
    from ddlsim.real_runs.algorithm_runs import RunSettings

    options = make_options("megatron", {"layout": {**BASE, **layout}})
    return RunSettings(algorithm="megatron", options=options, steps=STEPS, learning_rate=3e-3, transformer=SHAPE)


def losses_of(transport: Any, layout: dict[str, Any]) -> list[float]:
    """The global batch's mean loss per iteration (every rank calls this; rank 0's answer counts)."""
    from ddlsim.real_runs.algorithm_runs import run_algorithm

    result = run_algorithm(settings(layout), transport)
    everyone = transport.allgather_object(result.losses)
    replicas = [losses for losses in everyone if losses]  # the last stage's ranks (tp copies of each replica)
    return [sum(losses[step] for losses in replicas) / len(replicas) for step in range(STEPS)]


def main(argv: list[str]) -> int:
    from ddlsim.real_runs.transport import MpiTransport

    transport = MpiTransport()
    names = argv or [name for name, (ranks, _) in LAYOUTS.items() if ranks == transport.size]
    for name in names:
        losses = losses_of(transport, LAYOUTS[name][1])
        if transport.rank == 0:
            print(json.dumps({"layout": name, "ranks": transport.size, "losses": losses}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
