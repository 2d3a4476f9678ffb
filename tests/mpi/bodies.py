"""MPI test bodies, written once: plain functions of a transport, run with one rank by pytest and
with N ranks under ``mpiexec`` (``python -m tests.mpi.run_bodies``).

Every body must be called on every rank of the transport (they communicate); it raises
AssertionError on a wrong result.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.comm import ANY_SOURCE, CommOps
from ddlsim.algorithms.schedule import ScheduleError
from ddlsim.real_runs.comm_executor import MpiComm, run_role_program
from ddlsim.real_runs.schedule_executor import build_schedule, promised, reference_result, run_schedule
from ddlsim.real_runs.trace import TraceWriter, read_trace
from ddlsim.real_runs.transport import Transport
from ddlsim.simulator.records import TRACE_COLUMNS

# Option sets tried beyond each algorithm's defaults (a schedule that rejects the rank count is skipped).
EXTRA_OPTIONS: dict[str, list[dict]] = {
    "ring": [{"channels": 2}, {"channels": 3}],
    "parameter_server": [{"placement": "colocated"}, {"placement": "colocated", "servers": 2}],
    "topk_sparse": [{"density": 0.25}],
}
ELEMENTS = (1, 7, 1000, 4099)
# fp32: sums of P values in [-1, 1] in any order agree to ~P ulp; fp16 (eps 9.8e-4): to ~P ulp of P
TOLERANCE = {np.float32: 1e-5, np.float16: 4e-3}


def _tolerance(dtype, ranks: int) -> float:
    return TOLERANCE[dtype] * max(ranks, 1)


def collective_cases(ranks: int):
    """(algorithm, collective, options, devices_per_node) for every registered algorithm and collective."""
    for name in COLLECTIVE_ALGORITHMS.names():
        algorithm = COLLECTIVE_ALGORITHMS.get(name)
        for collective in algorithm.collectives:
            for options in [{}, *EXTRA_OPTIONS.get(name, [])]:
                for devices_per_node in sorted({1, 2} if ranks % 2 == 0 and ranks > 2 else {1}):
                    yield name, collective, options, devices_per_node


def check_collectives(transport: Transport, elements: tuple[int, ...] = ELEMENTS) -> list[str]:
    """Every registered algorithm and collective equals the library's own on this many ranks,
    float32 and float16. Returns the cases run (``name/collective/options``)."""
    ranks = transport.size
    ran = []
    for name, collective, options, devices_per_node in collective_cases(ranks):
        for dtype in (np.float32, np.float16):
            opts = dict(options)
            if "density" in opts:
                opts["value_bytes"] = np.dtype(dtype).itemsize
            try:
                schedule = build_schedule(name, collective, ranks, devices_per_node=devices_per_node, **opts)
            except ScheduleError:
                continue  # this rank count or placement is not one the algorithm supports
            for count in elements:
                rng = np.random.default_rng([transport.rank, count, ranks])
                data = rng.uniform(-1, 1, count).astype(dtype)
                result = run_schedule(schedule, data.copy(), transport)
                expected = reference_result(schedule, data, transport)
                got = promised(schedule, transport.rank, result)
                if got is None:
                    continue
                want = promised(schedule, transport.rank, expected)
                assert want is not None
                np.testing.assert_allclose(
                    got.astype(np.float64),
                    want.astype(np.float64),
                    rtol=0,
                    atol=_tolerance(dtype, ranks),
                    err_msg=f"{name} {collective} {options} dpn={devices_per_node} {np.dtype(dtype)} "
                    f"{count} elements, rank {transport.rank} of {ranks}",
                )
            ran.append(f"{name}/{collective}/{options}/dpn{devices_per_node}")
    assert any(case.startswith("ring/allreduce") for case in ran), ran
    return ran


def check_point_to_point(transport: Transport) -> None:
    """Arrays of several dtypes go around the ring unchanged (isend/irecv, both directions)."""
    rank, size = transport.rank, transport.size
    for dtype in (np.float32, np.float16, np.int64, np.uint8):
        out = (np.arange(100) * (rank + 1)).astype(dtype)
        back = np.empty_like(out)
        right, left = (rank + 1) % size, (rank - 1) % size
        transport.wait_all([transport.irecv(back, left, 3), transport.isend(out, right, 3)])
        np.testing.assert_array_equal(back, (np.arange(100) * (left + 1)).astype(dtype))


class _Double:
    name = "compute"
    duration_s = 0.0

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def run(self) -> np.ndarray:
        return self.value * 2


def _role(comm):
    """Compute, a ring of sends (with and without ``like``), an any-source gather, two collectives."""
    rank, size = comm.rank, comm.size
    doubled = yield comm.compute(_Double(np.full(3, rank, dtype=np.float32)))
    right, left = (rank + 1) % size, (rank - 1) % size
    got = {}
    if size > 1:
        if rank % 2 == 0:
            yield comm.send(right, doubled, tag=1)
            got["array"] = yield comm.recv(left, tag=1, like=np.empty(3, np.float32))
            yield comm.send(right, {"from": rank}, tag=2)
            got["object"] = yield comm.recv(left, tag=2)
        else:
            got["array"] = yield comm.recv(left, tag=1)
            yield comm.send(right, doubled, tag=1)
            got["object"] = yield comm.recv(left, tag=2)
            yield comm.send(right, {"from": rank}, tag=2)
        if rank == 0:
            senders = set()
            for _ in range(size - 1):
                source, payload = yield comm.recv(ANY_SOURCE, tag=4)
                assert payload[0] == source
                senders.add(source)
            got["senders"] = senders
        else:
            yield comm.send(0, np.array([rank], dtype=np.int64), tag=4)
    total = yield comm.allreduce(np.arange(5, dtype=np.float32) + rank, algorithm="ring")
    group = tuple(range(0, size, 2))
    partial = yield comm.allreduce(np.ones(4, dtype=np.float32), algorithm="ring", group=group)
    return doubled, got, total, partial


def check_comm_executor(transport: Transport) -> None:
    """A role program's sends, receives and collectives do what they say, and each op is traced."""
    rank, size = transport.rank, transport.size
    with tempfile.TemporaryDirectory() as directory:
        tracer = TraceWriter(directory, rank)
        comm = MpiComm(transport, tracer)
        assert isinstance(comm, CommOps)
        doubled, got, total, partial = run_role_program(_role(comm), comm)
        tracer.close()
        ops = [row["op"] for row in read_trace(directory)]
    np.testing.assert_array_equal(doubled, np.full(3, 2 * rank, dtype=np.float32))
    left = (rank - 1) % size
    if size > 1:
        np.testing.assert_array_equal(got["array"], np.full(3, 2 * left, dtype=np.float32))
        assert got["object"] == {"from": left}
        if rank == 0:
            assert got["senders"] == set(range(1, size))
    np.testing.assert_allclose(total, np.arange(5) * size + size * (size - 1) / 2)
    if rank % 2 == 0:
        np.testing.assert_array_equal(partial, np.full(4, len(range(0, size, 2)), dtype=np.float32))
    assert ops.count("allreduce") == 2 and ops.count("compute") == 1, ops


def exchange_program(comm, nbytes: int):
    """Every rank starts a send of ``nbytes`` to its right neighbour and a receive from its left one
    before waiting for either: with blocking sends of rendezvous-sized messages every rank would wait
    for its neighbour to receive, and none would (a pipeline's forward and backward cross like this)."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    payload = np.full(nbytes // 4, comm.rank, dtype=np.float32)
    sent = yield comm.start(comm.send(right, payload, tag=7))
    receiving = yield comm.start(comm.recv(left, tag=7, like=np.empty_like(payload)))
    _, got = yield comm.wait(sent, receiving)
    return got


def check_started_point_to_point(transport: Transport) -> None:
    if transport.size < 2:
        return
    comm = MpiComm(transport)
    got = run_role_program(exchange_program(comm, 8 << 20), comm)
    np.testing.assert_array_equal(got, np.full((8 << 20) // 4, (transport.rank - 1) % transport.size, np.float32))


def check_trace(transport: Transport) -> None:
    """Rows carry exactly the shared trace schema; a flushed iteration survives an unflushed one."""
    with tempfile.TemporaryDirectory() as directory:
        tracer = TraceWriter(directory, transport.rank, {"scenario": {"test": True}, "ranks": transport.size})
        tracer.start(transport.barrier)
        tracer.iteration = 0
        with tracer.span("forward"):
            pass
        tracer.record("send", tracer.origin_ns, tracer.origin_ns + 1000, peer=1, nbytes=8)
        tracer.flush()
        tracer.iteration = 1
        tracer.record("backward", tracer.origin_ns, tracer.origin_ns + 10)  # never flushed
        rows = [row for row in read_trace(directory) if row["rank"] == transport.rank]
        assert [tuple(row) for row in rows] == [TRACE_COLUMNS] * 2
        assert sorted((row["op"], row["iteration"], row["peer"], row["bytes"]) for row in rows) == [
            ("forward", 0, -1, 0),
            ("send", 0, 1, 8),
        ]
        send = next(row for row in rows if row["op"] == "send")
        assert abs(send["start_s"]) < 1e-12 and abs(send["end_s"] - 1e-6) < 1e-12, send
        transport.barrier()
        if transport.rank == 0:
            assert (Path(directory) / "metadata.json").exists()
        transport.barrier()


def check_training(transport: Transport) -> None:
    """A few steps of bucketed, overlapped sync SGD (the role program the simulator runs) leave every
    rank with the same parameters, with and without overlap."""
    from ddlsim.algorithms.training_algorithm import make_options
    from ddlsim.real_runs.algorithm_runs import RunSettings, run_algorithm

    digests = []
    for overlap in (True, False):
        options = make_options("sync_sgd", {"bucket_bytes": 20_000, "overlap": overlap})
        settings = RunSettings(algorithm="sync_sgd", options=options, model="resnet_small", steps=3, batch=16)
        result = run_algorithm(settings, transport)
        everyone = transport.allgather_object(result.weights_digest)
        assert len(set(everyone)) == 1, everyone
        assert result.buckets > 1
        digests.append(everyone[0])
    assert digests[0] == digests[1]


BODIES: dict[str, Callable[[Transport], object]] = {
    "point_to_point": check_point_to_point,
    "collectives": check_collectives,
    "comm_executor": check_comm_executor,
    "started_point_to_point": check_started_point_to_point,
    "trace": check_trace,
    "training": check_training,
}
