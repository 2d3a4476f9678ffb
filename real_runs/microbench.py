"""Microbenchmarks for calibration: point-to-point, every registered collective, per-layer compute.

Etiquette (mpi4py's and nccl-tests' habits): warm-up calls are excluded; every timed call starts
after a barrier; a call's time is the slowest rank's; results are checked against the library (or
the pattern sent) before timing; each point is repeated and reported as the median with its spread
(min, quartiles, max).

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md``): ``algbw = S / t`` with S the full buffer
(the all-gather's output, the reduce-scatter's input), ``busbw = algbw x factor`` with factor
2(P-1)/P for all-reduce, (P-1)/P for reduce-scatter and all-gather, 1 for broadcast and reduce.

Rows come out twice: as trace rows (``TRACE_COLUMNS``; iteration = repeat) and as rows of the
measurement schema of ``data/README.md`` (``MEASUREMENT_COLUMNS``): kind ``collective`` (and
``point_to_point`` for ping-pong and streaming bandwidth), device ``local_cpu`` and network
``local_shm`` on one machine unless told otherwise, the spread in ``notes``. Per-layer compute
times go to their own table (``LAYER_COLUMNS``).

Row ids are unique per run, ``BENCH-<run id>-00001``, the run id being the UTC start time and a
random tag that rank 0 draws: rows of two runs (one to calibrate on, one to validate against) never
share an id. Rank 0 reports progress per benchmark (``simulator.progress``: lines on stderr, which
the launcher passes through; ``DDLSIM_PROGRESS`` chooses).
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import ScheduleError
from ddlsim.real_runs.schedule_executor import Workspace, build_schedule, promised, reference_result, run_schedule
from ddlsim.real_runs.transport import Transport
from ddlsim.simulator.progress import Progress

MEASUREMENT_COLUMNS = (
    "id", "source", "kind", "workload", "collective", "algorithm", "device", "devices_per_node", "nodes",
    "intra_node_link", "network", "nics_per_node", "message_bytes", "per_device_batch", "precision", "metric",
    "value", "quote", "notes",
)  # fmt: skip
LAYER_COLUMNS = (
    "workload", "layer", "phase", "per_device_batch", "device", "median_s", "min_s", "max_s", "repeats",
    "parameter_bytes",
)  # fmt: skip
P2P_TAG = 9100
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def power_sizes(smallest: int = 1, largest: int = 64 * 2**20, step: int = 4) -> list[int]:
    """Message sizes ``smallest, smallest*step, ...`` up to ``largest`` (bytes)."""
    sizes = []
    size = smallest
    while size <= largest:
        sizes.append(size)
        size *= step
    return sizes


def algorithm_bandwidth_Bps(message_bytes: float, time_s: float) -> float:
    return message_bytes / time_s if time_s > 0 else float("inf")


def bus_bandwidth_Bps(collective: str, message_bytes: float, ranks: int, time_s: float) -> float:
    """nccl-tests' bus bandwidth: algbw x the collective's factor (2(P-1)/P for all-reduce)."""
    return algorithm_bandwidth_Bps(message_bytes, time_s) * BUS_FACTORS[collective](ranks)


@dataclass(frozen=True)
class Stats:
    """Median and spread of repeated timings (seconds)."""

    median_s: float
    min_s: float
    q1_s: float
    q3_s: float
    max_s: float
    repeats: int

    @staticmethod
    def of(times: Sequence[float]) -> Stats:
        values = np.asarray(times, dtype=float)
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        return Stats(float(median), float(values.min()), float(q1), float(q3), float(values.max()), len(values))

    def notes(self) -> str:
        return (
            f"median of {self.repeats}; spread min={self.min_s:.6g} q1={self.q1_s:.6g} "
            f"q3={self.q3_s:.6g} max={self.max_s:.6g} s"
        )


def time_calls(
    transport: Transport, call: Callable[[], Any], repeats: int, warmup: int
) -> list[tuple[int, int, float]]:
    """``(start_ns, end_ns, slowest_rank_s)`` of ``repeats`` calls after ``warmup`` untimed ones,
    each started right after a barrier."""
    out = []
    for index in range(warmup + repeats):
        transport.barrier()
        start = time.perf_counter_ns()
        call()
        end = time.perf_counter_ns()
        slowest = max(transport.allgather_object((end - start) * 1e-9))
        if index >= warmup:
            out.append((start, end, float(slowest)))
    return out


@dataclass
class BenchContext:
    """Where rows go and how they are labelled."""

    transport: Transport
    tracer: Any = None
    device: str = "local_cpu"
    network: str = "local_shm"
    source: str = ""
    repeats: int = 10
    warmup: int = 2
    run_id: str = ""  # default: drawn by rank 0 (``new_run_id``) and shared with every rank

    def __post_init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.layer_rows: list[dict[str, Any]] = []
        hosts = self.transport.allgather_object(socket.gethostname())
        self.hosts = hosts
        self.source = self.source or f"ddlsim bench on {hosts[0]}"
        self.run_id = self.run_id or self.transport.allgather_object(new_run_id())[0]
        self.progress = Progress("bench", unit="points") if self.transport.rank == 0 else None

    def stage(self, label: str, total: int, unit: str) -> None:
        """Rank 0 starts reporting a benchmark of ``total`` ``unit``."""
        if self.progress is not None:
            self.progress.stage(f"bench {label}", total, unit)

    def step(self, count: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(count)

    def next_id(self) -> str:
        return f"BENCH-{self.run_id}-{len(self.rows) + 1:05d}"

    def placement(self, ranks: int) -> tuple[int, int]:
        """(devices_per_node, nodes) of ranks 0..ranks-1 (block placement over the hosts)."""
        nodes = len(set(self.hosts[:ranks]))
        return ranks // nodes, nodes

    def trace(self, op: str, samples: Sequence[tuple[int, int, float]], *, peer: int = -1, nbytes: int = 0) -> None:
        if self.tracer is None:
            return
        for repeat, (start, end, _) in enumerate(samples):
            self.tracer.record(op, start, end, peer=peer, nbytes=nbytes, iteration=repeat)
        self.tracer.flush()

    def add(self, *, kind: str, collective: str, algorithm: str, ranks: int, message_bytes: int, stats: Stats,
            bus_Bps: float | None, precision: str = "fp32", extra: str = "") -> None:  # fmt: skip
        devices_per_node, nodes = self.placement(ranks)
        common = {
            "source": self.source, "kind": kind, "collective": collective, "algorithm": algorithm,
            "device": self.device, "devices_per_node": devices_per_node, "nodes": nodes,
            "network": self.network, "message_bytes": message_bytes, "precision": precision, "quote": "direct",
        }  # fmt: skip
        notes = stats.notes() + (f"; {extra}" if extra else "")
        self.rows.append({**common, "id": self.next_id(), "metric": "time_s",
                          "value": stats.median_s, "notes": notes})  # fmt: skip
        if bus_Bps is not None:
            busbw_notes = f"nccl-tests busbw from the median time; {notes}"
            self.rows.append({**common, "id": self.next_id(), "metric": "bus_bandwidth_Bps",
                              "value": bus_Bps, "notes": busbw_notes})  # fmt: skip


def new_run_id() -> str:
    """``20261123T203204Z-3f9a1c``: when the run started (UTC) and a random tag for runs started together."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


# --- point to point ----------------------------------------------------------------------------


def ping_pong(context: BenchContext, sizes: Iterable[int]) -> None:
    """Ranks 0 and 1 bounce a message; one-way time = round trip / 2 (others wait at the barrier)."""
    transport = context.transport
    if transport.size < 2:
        return
    rank = transport.rank
    sizes = list(sizes)
    context.stage("ping-pong", len(sizes), "sizes")
    for size in sizes:
        send = (np.arange(size) % 251).astype(np.uint8)
        receive = np.zeros(size, dtype=np.uint8)
        inner = 50 if size < 65536 else (10 if size < 2**20 else 2)

        def bounce(send=send, receive=receive, inner=inner) -> None:
            for _ in range(inner):
                if rank == 0:
                    transport.wait_all([transport.isend(send, 1, P2P_TAG)])
                    transport.wait_all([transport.irecv(receive, 1, P2P_TAG)])
                elif rank == 1:
                    transport.wait_all([transport.irecv(receive, 0, P2P_TAG)])
                    transport.wait_all([transport.isend(send, 0, P2P_TAG)])

        samples = time_calls(transport, bounce, context.repeats, context.warmup)
        if rank in (0, 1) and not np.array_equal(receive, send):
            raise AssertionError(f"ping-pong of {size} B delivered wrong bytes")
        one_way = [sample[2] / (2 * inner) for sample in samples]
        context.trace("ping_pong", samples, peer=1 - rank if rank < 2 else -1, nbytes=size)
        stats = Stats.of(one_way)
        context.add(kind="point_to_point", precision="", collective="ping_pong", algorithm="send_recv", ranks=2,
                    message_bytes=size, stats=stats, bus_Bps=algorithm_bandwidth_Bps(size, stats.median_s),
                    extra=f"one-way time = round trip / 2 over {inner} round trips")  # fmt: skip
        context.step()


def streaming_bandwidth(context: BenchContext, sizes: Iterable[int], window: int = 16) -> None:
    """Rank 0 posts ``window`` messages back to back to rank 1, which acknowledges (osu_bw style)."""
    transport = context.transport
    if transport.size < 2:
        return
    rank = transport.rank
    ack = np.zeros(1, dtype=np.uint8)
    sizes = list(sizes)
    context.stage("streaming bandwidth", len(sizes), "sizes")
    for size in sizes:
        send = (np.arange(size) % 251).astype(np.uint8)
        receive = [np.zeros(size, dtype=np.uint8) for _ in range(window)] if rank == 1 else []

        def stream(send=send, receive=receive) -> None:
            if rank == 0:
                transport.wait_all([transport.isend(send, 1, P2P_TAG) for _ in range(window)])
                transport.wait_all([transport.irecv(ack, 1, P2P_TAG + 1)])
            elif rank == 1:
                transport.wait_all([transport.irecv(buffer, 0, P2P_TAG) for buffer in receive])
                transport.wait_all([transport.isend(ack, 0, P2P_TAG + 1)])

        samples = time_calls(transport, stream, context.repeats, context.warmup)
        if rank == 1 and not all(np.array_equal(buffer, send) for buffer in receive):
            raise AssertionError(f"streaming {size} B delivered wrong bytes")
        stats = Stats.of([sample[2] for sample in samples])
        context.trace("streaming_bandwidth", samples, peer=1 - rank if rank < 2 else -1, nbytes=size * window)
        context.add(kind="point_to_point", precision="", collective="streaming_bandwidth", algorithm="send_recv",
                    ranks=2,
                    message_bytes=size, stats=stats, bus_Bps=algorithm_bandwidth_Bps(size * window, stats.median_s),
                    extra=f"time of a window of {window} messages and a 1-byte acknowledgement")  # fmt: skip
        context.step()


# --- collectives ---------------------------------------------------------------------------------


def library_name(transport: Transport) -> str:
    """The token of the library's own collectives: ``mpich``, ``openmpi``, ``gloo``..."""
    mpi = getattr(transport, "MPI", None)
    if mpi is None:
        return type(transport).__name__.removesuffix("Transport").lower() or "library"
    version = mpi.Get_library_version().lower()
    for name in ("mpich", "open mpi", "intel", "mvapich"):
        if name in version:
            return name.replace(" ", "")
    return "mpi"


def collectives(context: BenchContext, sizes: Iterable[int], algorithms: Sequence[str] | None = None,
                rank_counts: Sequence[int] | None = None, library: bool = True) -> None:  # fmt: skip
    """Every registered algorithm's collectives (and the library's own) at each size and rank count.

    Smaller rank counts run on a sub-communicator of ranks 0..k-1 when the transport can make one
    (``subset``); otherwise only the full size is measured.
    """
    world = context.transport
    names = list(algorithms) if algorithms else COLLECTIVE_ALGORITHMS.names()
    counts = sorted(set(rank_counts or [world.size]))
    subset = getattr(world, "subset", None)
    sizes = list(sizes)
    measured = [count for count in counts if 2 <= count <= world.size and (count == world.size or subset)]
    per_count = sum(len(COLLECTIVE_ALGORITHMS.get(name).collectives) for name in names) + (
        len(BUS_FACTORS) if library else 0
    )
    context.stage("collectives", len(measured) * per_count * len(sizes), "points")
    for count in counts:
        if count > world.size or count < 2:
            continue
        transport = world if count == world.size else (subset(count) if subset else None)
        if count != world.size and subset is None:
            continue
        if transport is not None:
            _collectives_on(context, transport, sizes, names, library)
        world.barrier()


def _collectives_on(context: BenchContext, transport: Transport, sizes: Iterable[int], names: Sequence[str],
                    library: bool) -> None:  # fmt: skip
    ranks = transport.size
    saved = context.transport
    context.transport = transport  # time_calls synchronises the ranks taking part
    workspace = Workspace()
    try:
        for name in names:
            for collective in COLLECTIVE_ALGORITHMS.get(name).collectives:
                try:
                    schedule = build_schedule(name, collective, ranks)
                except ScheduleError:
                    context.step(len(list(sizes)))  # not defined at this rank count: nothing to measure
                    continue
                for size in sizes:
                    elements = max(1, size // 4)
                    data = np.random.default_rng([transport.rank, size]).uniform(-1, 1, elements).astype(np.float32)
                    buffer = data.copy()
                    run_schedule(schedule, buffer, transport, workspace=workspace)
                    expected = reference_result(schedule, data, transport)
                    got, want = promised(schedule, transport.rank, buffer), promised(schedule, transport.rank, expected)
                    if got is not None and want is not None:
                        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * ranks,
                                                   err_msg=f"{name} {collective} {size} B")  # fmt: skip

                    def call(schedule=schedule, buffer=buffer, data=data) -> None:
                        buffer[:] = data
                        run_schedule(schedule, buffer, transport, workspace=workspace)

                    samples = time_calls(transport, call, context.repeats, context.warmup)
                    _add_collective(context, collective, name, ranks, elements * 4, samples)
                    context.step()
        if library:
            _library_collectives(context, transport, sizes)
    finally:
        context.transport = saved


def _add_collective(context: BenchContext, collective: str, algorithm: str, ranks: int, nbytes: int,
                    samples: Sequence[tuple[int, int, float]]) -> None:  # fmt: skip
    stats = Stats.of([sample[2] for sample in samples])
    context.trace(collective, samples, nbytes=nbytes)
    context.add(kind="collective", collective=collective, algorithm=algorithm, ranks=ranks, message_bytes=nbytes,
                stats=stats, bus_Bps=bus_bandwidth_Bps(collective, nbytes, ranks, stats.median_s),
                extra="message_bytes = the full buffer (nccl-tests size)")  # fmt: skip


def _library_collectives(context: BenchContext, transport: Transport, sizes: Iterable[int]) -> None:
    """The library's own collectives on the same sizes (algorithm token: the library's name)."""
    ranks = transport.size
    token = library_name(transport)
    for collective in BUS_FACTORS:
        for size in sizes:
            elements = max(ranks, size // 4)
            if collective == "allgather":  # each rank contributes 1/P of the full buffer
                elements = max(1, elements // ranks)
            data = np.ones(elements, dtype=np.float32)
            result = transport.reference(collective, data)
            expected = {"allreduce": ranks, "reduce_scatter": ranks, "allgather": 1, "broadcast": 1,
                        "reduce": ranks if transport.rank == 0 else 1}[collective]  # fmt: skip
            if not np.all(result == expected):
                raise AssertionError(f"library {collective} of {size} B gave a wrong result")
            samples = time_calls(transport, partial(transport.reference, collective, data), context.repeats,
                                 context.warmup)  # fmt: skip
            nbytes = elements * 4 * (ranks if collective == "allgather" else 1)
            _add_collective(context, collective, token, ranks, nbytes, samples)
            context.step()


# --- per-layer compute ---------------------------------------------------------------------------


def layer_times(context: BenchContext, models: Sequence[str], batch_sizes: Sequence[int], image_size: int = 32,
                channels: int = 3, classes: int = 10) -> None:  # fmt: skip
    """Forward and backward time of each top-level layer of the real_runs models, and of the whole model.

    Every rank runs the same passes at the same time (a barrier starts each repeat), so the times
    are those of a layer while this many ranks share the host, as in a run of that many ranks; run
    the bench with one rank for a device alone. Layer by layer, with detached inputs, each layer's
    backward is timed alone (rank 0's times: what a layer's share of the step is); layer ``total``
    is the harness's own training step without communication (``_training_step_times``, the
    slowest rank's), whose forward and backward carry what a real step costs beyond its layers.
    """
    transport = context.transport
    import torch

    from ddlsim.real_runs.models import build_model

    context.stage("per-layer compute", len(models) * len(batch_sizes), "model batches")
    for model_name in models:
        model = build_model(model_name, channels, classes)
        # fp32 gradient bytes of each top-level layer: what its backward hands to the all-reduce
        gradient_bytes = {
            f"{index}_{type(layer).__name__.lower()}": 4 * sum(p.numel() for p in layer.parameters())
            for index, layer in enumerate(model.children())
        }
        gradient_bytes["total"] = sum(gradient_bytes.values())
        for batch in batch_sizes:
            images = torch.randn(batch, channels, image_size, image_size)
            labels = torch.randint(0, classes, (batch,))
            forward: dict[str, list[float]] = {}
            backward: dict[str, list[float]] = {}
            for repeat in range(context.warmup + context.repeats):
                keep = repeat >= context.warmup
                transport.barrier()
                spans = _one_pass(model, images, labels, forward if keep else {}, backward if keep else {})
                transport.barrier()
                if keep and context.tracer is not None and transport.rank == 0:
                    for op, start, end in spans:
                        context.tracer.record(op, start, end, iteration=repeat - context.warmup)
            step = _training_step_times(transport, model_name, batch, context.warmup + context.repeats)
            if step is not None:
                forward["total"], backward["total"] = step[0][context.warmup :], step[1][context.warmup :]
            context.step()
            if transport.rank != 0:
                continue
            for phase, table in (("forward", forward), ("backward", backward)):
                for layer, times in table.items():
                    stats = Stats.of(times)
                    context.layer_rows.append({
                        "workload": model_name, "layer": layer, "phase": phase, "per_device_batch": batch,
                        "device": context.device, "median_s": stats.median_s, "min_s": stats.min_s,
                        "max_s": stats.max_s, "repeats": stats.repeats,
                        "parameter_bytes": gradient_bytes[layer],
                    })  # fmt: skip
    if context.tracer is not None and transport.rank == 0:
        context.tracer.flush()
    transport.barrier()


class _StepTimes:
    """The part of a TraceWriter that ``run_algorithm`` uses, keeping each step's forward and backward
    seconds (a backward in several gradient buckets is summed over them).

    ``flush`` (called as each step begins, and at the end) waits at a barrier of ``world``, so ranks
    training over one-rank communicators still start each step together, as in a synchronous run.
    """

    def __init__(self, world: Any) -> None:
        self.iteration = 0
        self.world = world
        self._by_step: dict[str, dict[int, float]] = {"forward": {}, "backward": {}}

    @property
    def seconds(self) -> dict[str, list[float]]:
        return {op: [steps[key] for key in sorted(steps)] for op, steps in self._by_step.items()}

    def start(self, barrier: Any = None) -> None:
        self.world.barrier()

    def record(self, op: str, start_ns: int, end_ns: int, **_: Any) -> None:
        if op in self._by_step:
            steps = self._by_step[op]
            steps[self.iteration] = steps.get(self.iteration, 0.0) + (end_ns - start_ns) * 1e-9

    def flush(self) -> None:
        self.world.barrier()


def _training_step_times(
    transport: Any, model: str, batch: int, steps: int
) -> tuple[list[float], list[float]] | None:
    """Forward and backward seconds of the harness's own training step, without communication.

    Every rank runs sync SGD (``real_runs.algorithm_runs.run_algorithm``) at once, each over a
    one-rank communicator, so the step runs as in a real run (fresh batches, gradient hooks, the
    update) and shares the host as a run of this many ranks does. Steps start together (a barrier after each), and each
    step's times are those of its slowest rank (largest forward + backward), which is what a
    synchronous iteration waits for: with more ranks than cores the ranks sharing a core are slower
    than one alone, and rank 0 need not be among them. None where the transport is not MPI.
    """
    comm = getattr(transport, "comm", None)
    if comm is None:
        return None
    from ddlsim.real_runs.algorithm_runs import RunSettings, run_algorithm
    from ddlsim.real_runs.transport import MpiTransport

    alone = MpiTransport(comm.Split(transport.rank, 0))
    times = _StepTimes(transport)
    settings = RunSettings(algorithm="sync_sgd", model=model, dataset="synthetic", batch=batch, steps=steps)
    run_algorithm(settings, alone, times)  # its last flush() waits for every rank
    return slowest_steps(transport.allgather_object((times.seconds["forward"], times.seconds["backward"])))


def slowest_steps(ranks: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[list[float], list[float]]:
    """Per step, the forward and backward seconds of the rank whose forward + backward was longest.

    ``ranks[r]`` is rank r's ``(forward seconds, backward seconds)``, one entry per step.
    """
    steps = zip(*(zip(forward, backward, strict=True) for forward, backward in ranks), strict=True)
    slowest = [max(step, key=sum) for step in steps]
    return [forward for forward, _ in slowest], [backward for _, backward in slowest]


def _one_pass(model: Any, images: Any, labels: Any, forward: dict[str, list[float]],
              backward: dict[str, list[float]]) -> list[tuple[str, int, int]]:  # fmt: skip
    """One forward and backward pass; appends each layer's seconds, returns ``(op, start_ns, end_ns)``."""
    import torch

    spans = []
    inputs, outputs, names = [], [], []
    x = images
    for index, layer in enumerate(model.children()):
        name = f"{index}_{type(layer).__name__.lower()}"
        x = x.detach().requires_grad_(index > 0)
        start = time.perf_counter_ns()
        y = layer(x)
        end = time.perf_counter_ns()
        forward.setdefault(name, []).append((end - start) * 1e-9)
        spans.append((f"forward_{name}", start, end))
        inputs.append(x)
        outputs.append(y)
        names.append(name)
        x = y
    grad = torch.autograd.grad(torch.nn.functional.cross_entropy(x, labels), x)[0]
    for index in reversed(range(len(outputs))):
        start = time.perf_counter_ns()
        outputs[index].backward(grad)
        end = time.perf_counter_ns()
        backward.setdefault(names[index], []).append((end - start) * 1e-9)
        spans.append((f"backward_{names[index]}", start, end))
        grad = inputs[index].grad
        if grad is None:
            break
    return spans
