"""Predicting a measurement row with the model, or saying why the model cannot.

* Collective rows run ``simulate_collective`` on the row's fabric: ``devices_per_node`` x
  ``nodes`` ranks, the row's intra-node link and network, ``nics_per_node`` adapters, GPUs
  reaching the NIC over their PCIe host link. Library tokens (nccl, mlsl, ...) pick their
  algorithm per size through ``algorithms.selectors``.
* Training rows build a ``Scenario`` and run the analytic executor (or the DES): data-parallel
  synchronous SGD with the row's algorithm. How framework settings map onto algorithms:

  - ``parameter_server`` on one node: the variables are sharded over every device
    (``placement="colocated"``, one shard per device). TensorFlow's PS on the host CPU moves
    gradients and weights over each GPU's PCIe link, not NVLink, so GPU rows use the host
    link (PCIe) as the intra-node link.
  - ``parameter_server`` on several nodes (TensorFlow ``distributed_replicated``): reduce inside
    each node, then one colocated server per node (``hierarchical`` with an inner
    ``parameter_server``).
  - a library token: the algorithm the library picks for a gradient bucket, given the row's adapters
    per node (NCCL's ring takes one channel per NIC, as for collective rows).
  - the gradient reduction: ``BUCKET_BYTES`` buckets overlapped with the backward, unless the row's
    source configured its own (``STACK_REDUCTIONS``: NVIDIA's MLPerf v0.7 multi-node ResNet-50 runs
    reduce one 64 MiB buffer after the backward); the row's note says so.
  - a catalog transformer (``bert_large``, ``gpt2``, ...; ``ddlsim list workloads``): the
    ``megatron`` training model with data parallelism only (tp = pp = 1, dp = every device, one
    micro-batch of the per-device batch), the gradients reduced by the row's library in
    ``BUCKET_BYTES`` buckets overlapped with the backward pass (as PyTorch DDP and Horovod do), at
    the catalog's sequence length unless the notes state one ("sequence length 128"); compute from
    the transformer model's datasheet efficiencies.

Rows the model cannot express get a reason instead of a number (``Prediction.reason``); a row
with fields its source leaves open gets one here too, and ``intervals.Estimator`` predicts it with
the defaults of ``open_fields``. Compute that no calibration row pins comes from the compute model
(fitted across devices when the profile has one, else the datasheets).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlsim.algorithms.schedule import ScheduleError
from ddlsim.algorithms.training_algorithm import AlgorithmOptions, make_options
from ddlsim.hardware_models.catalog import CatalogError, catalog_directories, device_names, load_device
from ddlsim.hardware_models.profile import Profile
from ddlsim.hardware_models.units import UnitError
from ddlsim.registry import UnknownNameError
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.collective_sim import CollectiveSetup, bus_factor, resolve_algorithm, simulate_collective
from ddlsim.simulator.engine.fabric_spec import FabricError
from ddlsim.simulator.scenario import Scenario, ScenarioError, Stragglers, default_host_link
from ddlsim.simulator.sweep import simulate_point
from ddlsim.simulator.workloads.transformer import TransformerConfigError, transformer_names

# Bus-bandwidth rows quoted as a large-message plateau without a size are predicted at 1 GB
# (nccl-tests' plateau region on every fabric in the catalog starts well below it).
PLATEAU_BYTES = 1e9
BUCKET_BYTES = 25e6  # gradient fusion bucket (Horovod's and PyTorch DDP's default)


@dataclass(frozen=True)
class StackReduction:
    """How a published stack's own configuration reduces gradients, where it is not the default
    (``BUCKET_BYTES`` buckets overlapped with the backward): what the row's source must hold (words,
    lowercased), from how many nodes, and the setting with its source."""

    words: tuple[str, ...]
    min_nodes: int
    overlap: bool
    bucket_bytes: float
    note: str


STACK_REDUCTIONS = (
    # mlcommons/training_results_v0.7, NVIDIA/benchmarks/resnet/implementations/mxnet/config_DGXA100_multi_*.sh
    # and config_DGX2_multi_*.sh (2 to 192 nodes): MXNET_HOROVOD_NUM_GROUPS=1, HOROVOD_FUSION_THRESHOLD=67108864
    # and the backward in one bulk ("Default is no NCCL and BWD overlap"); the one-node configs reduce 20
    # groups while the backward runs, as the default does. (v0.6's multi-node configs overlapped 16 groups.)
    StackReduction(("training_results_v0.7", "nvidia/", "mxnet"), 2, False, 64 * 2**20,
                   "gradients in one 64 MiB buffer after the backward, as NVIDIA's MLPerf v0.7 multi-node configs set "
                   "Horovod (MXNET_HOROVOD_NUM_GROUPS=1, HOROVOD_FUSION_THRESHOLD=67108864)"),
)  # fmt: skip


def stack_reduction(row: Measurement) -> StackReduction | None:
    """The gradient reduction ``row``'s source configured, where it is not the default (``STACK_REDUCTIONS``)."""
    if row.kind != "training" or row.devices == 1:
        return None
    source = row.source.lower()
    return next((rule for rule in STACK_REDUCTIONS
                 if row.nodes >= rule.min_nodes and all(word in source for word in rule.words)), None)  # fmt: skip

MODEL_ERRORS = (
    ScenarioError, UnknownNameError, ScheduleError, FabricError, CatalogError, UnitError, TransformerConfigError,
)  # fmt: skip


@dataclass(frozen=True)
class Prediction:
    """The predicted value in the row's metric unit, or None and the reason."""

    value: float | None
    reason: str = ""
    detail: str = ""  # what was modeled (resolved algorithm, executor)

    @property
    def ok(self) -> bool:
        return self.value is not None


def cannot(reason: str) -> Prediction:
    return Prediction(None, reason)


def needs_input_pipeline(row: Measurement) -> bool:
    """Real-data training rows include disk and JPEG decoding, which the model does not simulate
    (it assumes the input pipeline keeps up; the row's note says so)."""
    text = f"{row.notes} {row.source}".lower()
    if "synthetic" in text:
        return False
    return "real imagenet" in text or "input pipeline" in text or "real-data" in text


def _catalog_devices() -> frozenset[str]:
    return _names(catalog_directories())[0]


def _catalog_transformers() -> frozenset[str]:
    return _names(catalog_directories())[1]


@functools.cache
def _names(directories: tuple) -> tuple[frozenset[str], frozenset[str]]:
    """The catalog's device and transformer tokens, once per set of user catalog directories."""
    return frozenset(device_names()), frozenset(transformer_names())


def is_transformer_row(row: Measurement) -> bool:
    """A training row of a catalog transformer (not a layer table): the megatron model predicts it."""
    return row.kind == "training" and row.workload in _catalog_transformers()


def static_reason(row: Measurement) -> str | None:
    """Why the model cannot express ``row`` as it stands, before any calibration; None if it can.

    Open fields (device, intra-node link, network, algorithm, batch, precision) are reasons here;
    ``intervals.Estimator`` fills them with their defaults first.
    """
    if not row.device:
        return "device not stated"
    if row.device not in _catalog_devices():
        return f"device {row.device!r} has no datasheet in the hardware catalog (no compute model for it)"
    if row.devices_per_node > 1 and not row.intra_node_link:
        return "intra-node link not stated for a row with several devices per node"
    if row.nodes > 1 and not row.network:
        return "network not stated for a multi-node row"
    if row.devices > 1 and not row.algorithm:
        return "algorithm/library not stated: which all-reduce ran is unknown"
    if row.kind != "training":
        if row.message_bytes is None and row.metric == "time_s":
            return "message size not stated for a collective time"
        return None
    if row.per_device_batch is None:
        return "per-device batch not stated"
    if not row.precision:
        return "precision not stated (it changes the compute/communication balance)"
    return None


def collective_setup(row: Measurement, profile: Profile | None, host_ranks: int | None = None) -> CollectiveSetup:
    """The row's fabric; ``host_ranks``: ranks sharing one host's cores (default the row's devices per node)."""
    device = load_device(row.device)
    return CollectiveSetup(
        devices_per_node=row.devices_per_node,
        intra_node=row.intra_node_link or None,
        host_link=default_host_link(device) if row.nodes > 1 else None,
        network=row.network or None,
        nics_per_node=row.nics_per_node or 1,
        sockets=row.sockets or 1,
        socket_link=row.socket_link or None,
        profile=profile,
        # fits may be scoped to the software that ran and its code path (a library's collectives differ)
        device=f"{row.device}@{row.algorithm}@{row.collective}",
        host_ranks=host_ranks,
    )


def collective_bytes(row: Measurement) -> float:
    return row.message_bytes if row.message_bytes is not None else PLATEAU_BYTES


def predict_collective(
    row: Measurement, profile: Profile | None, mode: str = "auto", host_ranks: int | None = None
) -> Prediction:
    setup = collective_setup(row, profile, host_ranks)
    nbytes = collective_bytes(row)
    result = simulate_collective(setup, row.algorithm, row.collective, row.devices, nbytes, mode=mode)
    time_s = float(result["time_s"])
    detail = str(result["resolved_algorithm"])
    if result["call_s"]:  # named where it applies, as the rank jitter is
        detail += f", fixed cost per call {1e3 * float(result['call_s']):.3g} ms"
    if row.metric == "time_s":
        return Prediction(time_s, detail=detail)
    if row.metric == "bus_bandwidth_Bps":
        return Prediction(nbytes / time_s * bus_factor(row.collective, row.devices), detail=detail)
    return cannot(f"metric {row.metric!r} is not produced for collective rows")


def predict_point_to_point(row: Measurement, profile: Profile | None, host_ranks: int | None = None) -> Prediction:
    """Ping-pong: the one-way time of one message between ranks 0 and 1, alpha + S / beta of their path."""
    if row.collective != "ping_pong":
        return cannot(f"point-to-point pattern {row.collective!r} (a pipelined window of messages) is not modeled")
    nbytes = collective_bytes(row)
    fabric = collective_setup(row, profile, host_ranks).fabric(2, nbytes)
    time_s = fabric.hop_cost(0, 1).time(nbytes)
    if row.metric == "time_s":
        return Prediction(time_s, detail="alpha-beta hop")
    return Prediction(nbytes / time_s, detail="alpha-beta hop")


def training_algorithm(row: Measurement, bucket_bytes: float = BUCKET_BYTES) -> tuple[str, dict[str, Any]]:
    """(algorithm token, options) for a training row, a library's choice made for a gradient bucket of
    ``bucket_bytes``; see the module docstring."""
    if row.devices == 1:
        return "ring", {}
    if row.algorithm == "parameter_server":
        if row.nodes == 1:
            return "parameter_server", {"placement": "colocated", "servers": row.devices}
        return "hierarchical", {
            "inner": "parameter_server",
            "inner_options": {"placement": "colocated", "servers": row.nodes},
        }
    token, options = resolve_algorithm(row.algorithm, "allreduce", bucket_bytes, row.devices, row.devices_per_node,
                                       row.nics_per_node or 1)  # fmt: skip
    return token, options


def _measured_run(row: Measurement, profile: Profile | None, executor: str, intra: str | None) -> dict[str, Any]:
    """The ``Scenario`` fields every training row sets the same way (its machine, scale, precision,
    the profile and its rank jitter), with ``intra`` as the link inside a node of several devices."""
    jitter = profile.rank_jitter_sigma if profile else 0.0
    return {
        "workload": row.workload,
        "device": row.device,
        "devices_per_node": row.devices_per_node,
        "intra_node": intra if row.devices_per_node > 1 else None,
        "network": row.network or None if row.nodes > 1 else None,
        "nics_per_node": row.nics_per_node or 1,
        "sockets": row.sockets or 1,
        "socket_link": row.socket_link or None,
        "nodes": (row.nodes,),
        "precision": row.precision,
        "executor": executor,
        "profile": profile,
        "enforce_memory": False,  # the run was measured, so it fit in memory
        # the slowest of N ranks at every step, with the profile's fitted per-rank jitter, at its
        # expectation: the fit priced it so (the closed form), and one step's draws in the event
        # simulation would be one sample of the slowest rank, the same sample for every N-rank row
        "stragglers": f"lognormal:{jitter!r}:expected" if jitter > 0 else "none",
        # the links fitted for its device under the software it names (a library before it resolves)
        "link_software": row.algorithm,
    }


def training_scenario(row: Measurement, profile: Profile | None, executor: str = "analytic") -> Scenario:
    device = load_device(row.device)
    reduction = stack_reduction(row)
    bucket_bytes = reduction.bucket_bytes if reduction else BUCKET_BYTES
    algorithm, options = training_algorithm(row, bucket_bytes)
    intra = row.intra_node_link or None
    host = default_host_link(device)
    if row.algorithm == "parameter_server" and host and row.devices_per_node > 1:
        intra = host  # the PS traffic crosses each GPU's PCIe link to the host
    assert row.per_device_batch is not None
    return Scenario(
        options=AlgorithmOptions(
            collective=algorithm,
            collective_options=options,
            bucket_bytes=bucket_bytes,
            overlap=reduction.overlap if reduction else True,
        ),
        per_device_batch=row.per_device_batch,
        **_measured_run(row, profile, executor, intra),
    )


def transformer_scenario(row: Measurement, profile: Profile | None, executor: str = "analytic") -> Scenario:
    """The data-parallel ``megatron`` scenario of a catalog transformer's training row (module docstring)."""
    if row.algorithm == "parameter_server":
        raise ScenarioError(
            f"{row.workload} is a catalog transformer: its data-parallel training is modelled with an "
            "all-reduce library (nccl, mpich, ring, ...), not a parameter server"
        )
    assert row.per_device_batch is not None
    layout = {
        "tp": 1,
        "pp": 1,
        "dp": row.devices,
        "micro_batch": row.per_device_batch,
        "global_batch": row.per_device_batch * row.devices,
        "precision": row.precision,
    }
    options: dict[str, Any] = {"layout": layout, "overlap_grad_reduce": True, "bucket_bytes": BUCKET_BYTES}
    sequence = stated_sequence_length(row)
    if row.devices > 1:
        options["collective"] = row.algorithm
    return Scenario(
        algorithm="megatron",
        options=make_options("megatron", options),
        transformer_changes=(("seq_len", sequence),) if sequence else (),
        **_measured_run(row, profile, executor, row.intra_node_link or None),
    )


SEQUENCE_NOTE = re.compile(r"\b(?:seq(?:uence)?[ _-]?len(?:gth)?|max_seq_length)\s*(?:[:=]|of)?\s*(\d+)", re.IGNORECASE)


def stated_sequence_length(row: Measurement) -> int | None:
    """The tokens per sample a transformer row's notes state ('sequence length 128', 'seq_len=512',
    'max_seq_length 128'), else None: the catalog's."""
    match = SEQUENCE_NOTE.search(row.notes)
    return (int(match.group(1)) or None) if match else None


def _one_device_rate(row: Measurement, profile: Profile | None, executor: str) -> float:
    """Samples per second of one device of a catalog transformer's row, at its per-device batch."""
    single = dataclasses.replace(row, devices_per_node=1, nodes=1, algorithm="", intra_node_link="", network="")
    return float(simulate_point(transformer_scenario(single, profile, executor), 1)["throughput_samples_per_s"])


def predict_training(
    row: Measurement, profile: Profile | None, executor: str = "analytic", require_pinned: bool = False
) -> Prediction:
    transformer = is_transformer_row(row)  # the megatron model's compute: nothing for a profile to pin
    if (
        require_pinned
        and not transformer
        and row.metric != "scaling_efficiency"
        and (profile is None or not profile.pins(row.device, row.workload, row.precision, row.per_device_batch or 0))
    ):
        return cannot(
            f"compute not pinned: no single-device calibration row of {row.workload} on {row.device} "
            f"({row.precision}, batch {row.per_device_batch})"
        )
    if transformer:
        scenario = transformer_scenario(row, profile, executor)
        detail = f"megatron data-parallel ({row.algorithm or 'one device'}) {executor}"
    else:
        scenario = training_scenario(row, profile, executor)
        detail = f"{scenario.collective} {executor}"
    point = simulate_point(scenario, row.nodes)
    if profile is not None and profile.rank_jitter_sigma > 0 and row.devices > 1:
        slowest = Stragglers(profile.rank_jitter_sigma).expected_slowest(row.devices)
        detail += f", rank jitter {profile.rank_jitter_sigma:.4g}: slowest of {row.devices} ranks x{slowest:.3f}"
    if row.metric == "throughput_samples_per_s":
        return Prediction(float(point["throughput_samples_per_s"]), detail=detail)
    if row.metric == "time_s":
        return Prediction(float(point["iteration_s"]), detail=detail)
    if row.metric == "scaling_efficiency":  # against one device of the same per-device batch
        if transformer:  # a megatron point carries no single-device baseline
            rate = float(point["throughput_samples_per_s"]) / row.devices
            return Prediction(rate / _one_device_rate(row, profile, executor), detail=detail)
        return Prediction(float(point["scaling_efficiency"]), detail=detail)
    return cannot(f"metric {row.metric!r} is not produced for training rows")


def predict(
    row: Measurement,
    profile: Profile | None = None,
    executor: str = "analytic",
    require_pinned: bool = False,
) -> Prediction:
    """The model's value for ``row`` in the row's metric, or a reason it cannot give one.

    ``require_pinned``: decline training rows whose compute no calibration row pins (the behaviour
    before compute was fitted across devices).

    Ranks of one machine modeled as one-rank nodes (``Measurement.modeled``) still share its cores:
    the host's rank count is the unmodeled row's devices per node.
    """
    host_ranks = row.devices_per_node
    row = row.modeled()
    reason = static_reason(row)
    if reason:
        return cannot(reason)
    try:
        if row.kind == "point_to_point":
            return predict_point_to_point(row, profile, host_ranks)
        if row.kind == "collective":
            return predict_collective(row, profile, host_ranks=host_ranks)
        return predict_training(row, profile, executor, require_pinned)
    except MODEL_ERRORS as error:
        return cannot(f"the model cannot build this run: {error}")


def ape_summary(apes: Sequence[float]) -> tuple[float, float, float]:
    """Median, 90th percentile (linear interpolation) and largest of absolute percentage errors
    (as fractions); NaN for each when there are none."""
    if not apes:
        return math.nan, math.nan, math.nan
    return statistics.median(apes), float(np.percentile(np.asarray(apes), 90)), max(apes)
