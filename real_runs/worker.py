"""One rank of a real run: ``python -m ddlsim.real_runs.worker train|bench --scenario JSON --out DIR``.

The launcher starts one per rank (under ``mpiexec``, or as gloo processes). Each rank parses the
same scenario, and the ranks first compare digests of it (an allgather): a rank started with a
different scenario stops every rank with a message naming the ranks, exit status 3. Then:

* ``train``: the scenario's training algorithm, its role programs run for real
  (``real_runs.algorithm_runs``); every rank writes its trace, rank 0 ``results.csv`` (per step:
  iteration, the loss averaged over the workers, the first worker's iteration_s) and ``metadata.json``;
* ``bench``: the microbenchmarks the scenario names (``real_runs.microbench``); rank 0 writes
  ``measurements.csv`` (the measurement schema) and ``layers.csv``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ddlsim.real_runs.transport import Transport, make_transport, object_digest

SCENARIO_MISMATCH_EXIT = 3


class ScenarioMismatch(RuntimeError):
    """Ranks were started with different scenarios."""


def check_scenario(transport: Transport, scenario: dict[str, Any]) -> None:
    """Every rank must run the same scenario: compare digests, name the ranks that differ."""
    digests = transport.allgather_object(object_digest(scenario))
    if len(set(digests)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, digest in enumerate(digests):
            groups.setdefault(digest, []).append(rank)
        described = "; ".join(f"ranks {', '.join(map(str, ranks))} have {digest}" for digest, ranks in groups.items())
        raise ScenarioMismatch(f"ranks disagree on the scenario (digests: {described})")


def run_train(transport: Transport, scenario: dict[str, Any], out: Path) -> None:
    from ddlsim.real_runs.algorithm_runs import RunSettings, run_algorithm
    from ddlsim.real_runs.trace import TraceWriter
    from ddlsim.simulator.records import write_csv

    settings = RunSettings.from_dict(scenario["train"])
    metadata = {"mode": "train", "ranks": transport.size, "scenario": scenario}
    with TraceWriter(out, transport.rank, metadata) as tracer:
        result = run_algorithm(settings, transport, tracer)
    everyone = transport.allgather_object((result.role, result.losses, result.step_s, result.buckets))
    if transport.rank == 0:
        workers = [(losses, steps) for role, losses, steps, _ in everyone if role == "worker"]
        steps = len(workers[0][1])
        rows = [
            {
                "iteration": step,
                "loss": sum(losses[step] for losses, _ in workers if step < len(losses))
                / sum(1 for losses, _ in workers if step < len(losses)),
                "iteration_s": workers[0][1][step],
            }
            for step in range(steps)
        ]
        write_csv(out / "results.csv", rows, ("iteration", "loss", "iteration_s"))
        buckets = max(count for *_, count in everyone)
        what = f"{settings.options.collective} all-reduce, {buckets} bucket(s)" if buckets else settings.algorithm
        median = sorted(row["iteration_s"] for row in rows)[len(rows) // 2]
        data = "synthetic token sequences" if settings.algorithm == "megatron" else settings.dataset
        print(
            f"trained {settings.model} on {data} with {settings.algorithm}, {transport.size} ranks, "
            f"{what}: loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}; median iteration {median:.4f} s; "
            f"wrote {out}",
            flush=True,
        )


def run_bench(transport: Transport, scenario: dict[str, Any], out: Path) -> None:
    from ddlsim.real_runs import microbench
    from ddlsim.real_runs.trace import TraceWriter
    from ddlsim.simulator.records import write_csv

    bench = scenario["bench"]
    metadata = {"mode": "bench", "ranks": transport.size, "scenario": scenario}
    with TraceWriter(out, transport.rank, metadata) as tracer:
        tracer.start(transport.barrier)
        context = microbench.BenchContext(
            transport, tracer, device=bench.get("device", "local_cpu"), network=bench.get("network", "local_shm"),
            repeats=bench.get("repeats", 10), warmup=bench.get("warmup", 2),
        )  # fmt: skip
        chosen = bench.get("benchmarks", ["ping_pong", "streaming_bandwidth", "collectives", "layers"])
        if "ping_pong" in chosen:
            microbench.ping_pong(context, bench["p2p_sizes"])
        if "streaming_bandwidth" in chosen:
            microbench.streaming_bandwidth(context, bench["p2p_sizes"])
        if "collectives" in chosen:
            microbench.collectives(context, bench["collective_sizes"], bench.get("algorithms") or None,
                                   bench.get("rank_counts") or None)  # fmt: skip
        if "layers" in chosen:
            microbench.layer_times(context, bench.get("models", ["small_cnn", "resnet_small"]),
                                   bench.get("batch_sizes", [16, 64]))  # fmt: skip
    if transport.rank == 0:
        write_csv(out / "measurements.csv", context.rows, microbench.MEASUREMENT_COLUMNS)
        if context.layer_rows:
            write_csv(out / "layers.csv", context.layer_rows, microbench.LAYER_COLUMNS)
        print(f"{len(context.rows)} measurement rows, {len(context.layer_rows)} layer rows; wrote {out}", flush=True)


MODES = {"train": run_train, "bench": run_bench}


def run(mode: str, scenario: dict[str, Any], out: Path) -> int:
    """Run ``mode`` on this rank (already under mpiexec or with a gloo environment); exit status."""
    transport = make_transport(scenario.get("backend", "mpi"))
    try:
        try:
            check_scenario(transport, scenario)
        except ScenarioMismatch as error:
            print(f"ddlsim: error: rank {transport.rank}: {error}", file=sys.stderr, flush=True)
            return SCENARIO_MISMATCH_EXIT
        out.mkdir(parents=True, exist_ok=True)
        MODES[mode](transport, scenario, out)
        transport.barrier()
        return 0
    finally:
        # gloo's worker threads must be joined before the interpreter exits: a process group left
        # to the exit handlers aborts now and then ("terminate called without an active exception")
        transport.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlsim.real_runs.worker")
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--scenario", required=True, help="the scenario as JSON")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    return run(args.mode, json.loads(args.scenario), args.out)


if __name__ == "__main__":
    sys.exit(main())
