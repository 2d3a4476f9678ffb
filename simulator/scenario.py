"""A scenario: workload x cluster x strategy x run settings, validated and frozen.

The strategy is a training algorithm (``algorithm``: sync_sgd, async_sgd, sync_easgd, ...) with its
options (``options``: the collective and its options, gradient buckets and overlap, tau, alpha,
servers...). The CLI builds one from its options; every executor reads only this. ``resolved()``
expands the tokens into the datasheet numbers actually used, and is written beside the results;
``Scenario.from_dict`` reads that file's ``scenario`` back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ddlsim.algorithms.training_algorithm import (
    OPTION_FIELDS,
    TRAINING_ALGORITHMS,
    AlgorithmOptions,
    TrainingAlgorithm,
)
from ddlsim.hardware_models.catalog import PEAK_PRECISIONS, PRECISIONS, Device, Link, load_device, load_link
from ddlsim.hardware_models.compute import BYTES_PER_ELEMENT
from ddlsim.registry import UnknownNameError
from ddlsim.simulator.engine.fabric_spec import TOPOLOGIES, FabricSpec, topology_of
from ddlsim.simulator.input_errors import ScenarioError, check_sockets
from ddlsim.simulator.workloads import Layer, Workload, load_workload, saved_for_backward_bytes, workload_names
from ddlsim.simulator.workloads.transformer import TransformerConfig, load_transformer, transformer_names

if TYPE_CHECKING:  # neither is needed to run a scenario without noise or a profile (the closed form's start-up)
    import numpy as np

    from ddlsim.hardware_models.profile import Profile

EXECUTORS = ("des", "analytic")
# what a published run may change: its sequence length and padded vocabulary, and, for a model that is not
# in the catalog, the shape it gives (or its size implies) on a catalog model of the same kind
TRANSFORMER_CHANGES = ("seq_len", "vocabulary", "max_positions", "layers", "hidden", "heads", "kv_heads", "head_dim",
                       "ffn_hidden")  # fmt: skip
STRAGGLER_FORMS = (
    "none, lognormal:SIGMA (per step), lognormal:SIGMA:device (per device, fixed) or lognormal:SIGMA:expected "
    "(every rank at the expected slowest of N's pace: the closed form's view, deterministic)"
)


@dataclass(frozen=True)
class Stragglers:
    """Compute-time noise: multiplier exp(sigma z - sigma^2 / 2), z ~ N(0, 1), mean 1."""

    sigma: float = 0.0
    per_device: bool = False
    expected: bool = False  # every rank runs at E[max of N multipliers]: no draws

    @staticmethod
    def parse(text: str | None) -> Stragglers:
        if text in (None, "", "none"):
            return Stragglers()
        match = re.fullmatch(r"lognormal:([0-9.eE+-]+)(:device|:step|:expected)?", str(text))
        if not match:
            raise ScenarioError(f"--stragglers: cannot parse {text!r}; allowed: {STRAGGLER_FORMS}")
        sigma = float(match.group(1))
        if not (math.isfinite(sigma) and 0 <= sigma <= 5):
            raise ScenarioError(f"--stragglers: sigma must lie in [0, 5], got {sigma!r}")
        return Stragglers(sigma, match.group(2) == ":device", match.group(2) == ":expected")

    def expected_slowest(self, ranks: int) -> float:
        """E[max of ``ranks`` multipliers]: the factor by which a step that waits for every rank's
        compute is slower than one rank's mean, exp(sigma z - sigma^2/2) over the distribution of the
        largest of ``ranks`` standard normals (integrated on a grid; 1 without noise or for one rank)."""
        if self.sigma == 0 or ranks <= 1:
            return 1.0
        return _expected_slowest(float(self.sigma), int(ranks))

    def sampler(self, rng: np.random.Generator, ranks: int = 1):
        """A function () -> next multiplier for one of ``ranks`` ranks."""
        import numpy as np

        if self.sigma == 0:
            return lambda: 1.0
        if self.expected:
            slowest = self.expected_slowest(ranks)
            return lambda: slowest
        sigma = self.sigma
        if self.per_device:
            fixed = float(np.exp(sigma * rng.standard_normal() - sigma * sigma / 2))
            return lambda: fixed
        return lambda: float(np.exp(sigma * rng.standard_normal() - sigma * sigma / 2))


@functools.lru_cache(maxsize=4096)
def _expected_slowest(sigma: float, ranks: int) -> float:
    """``Stragglers.expected_slowest`` on its 40,001-point grid, kept per (sigma, ranks): calibration asks
    for the same few thousand times."""
    import numpy as np
    from scipy.special import log_ndtr

    z = np.linspace(-12.0, 14.0, 40001)
    log_density = np.log(ranks) - z * z / 2 - 0.5 * np.log(2 * np.pi) + (ranks - 1) * log_ndtr(z)
    weights = np.exp(log_density)
    values = np.exp(sigma * z - sigma * sigma / 2)
    return float(np.trapezoid(weights * values, z) / np.trapezoid(weights, z))


def default_host_link(device: Device) -> str | None:
    """The link between a device and its NIC: the one its datasheet's system names (Hopper and later:
    PCIe 5.0), else PCIe 4.0 for Ampere and PCIe 3.0 for older GPUs; CPUs and KNL are the host
    themselves."""
    if device.kind != "gpu":
        return None
    if device.system is not None and device.system.host_link is not None:
        return device.system.host_link
    if device.token.startswith(("h100", "h200", "b200", "gb200", "gb300")):
        return "pcie5_x16"
    return "pcie4_x16" if device.token.startswith("a100") else "pcie3_x16"


def link_scope(device: str, software: str) -> str:
    """Where a training run's links look for their fits (``Profile.link_fit``): the device under the
    software of its collectives, as ``ddlsim calibrate`` keys the fits of collective rows
    (``token@device@software``, or ``...@allreduce`` where ranks share a host's cores)."""
    return f"{device}@{software}@allreduce"


@dataclass(frozen=True)
class Scenario:
    workload: str = "resnet50"
    device: str = "p100_sxm2"
    devices_per_node: int = 8
    intra_node: str | None = "nvlink1"
    host_link: str | None = "auto"
    network: str | None = "ib_edr"
    nics_per_node: int = 1
    sockets: int = 1  # CPU sockets a node's devices are split over (see FabricSpec)
    socket_link: str | None = None  # the link between two sockets, as device traffic sees it
    topology: str = "switch"
    oversubscription: float = 1.0
    nodes_per_leaf: int = 16
    nodes_per_router: int = 4  # dragonfly (see FabricSpec)
    routers_per_group: int = 16
    dragonfly_global_links: int = 1
    torus_dims: tuple[int, ...] | None = None  # torus extents in nodes; None: near-cubic per point
    placement: str = "block"  # block or scatter (see simulator.fabric.FabricSpec)
    loggp: bool = False  # LogGP-style per-message CPU overhead at sender and receiver
    algorithm: str = "sync_sgd"  # training algorithm (ddlsim list training-algorithms)
    options: AlgorithmOptions = field(default_factory=AlgorithmOptions)
    nodes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    per_device_batch: int = 32
    precision: str = "fp32"
    updates: int | None = None  # gradient steps per worker; None: the algorithm's default
    stragglers: str = "none"  # compute noise: none, lognormal:SIGMA[:device]
    executor: str = "des"
    seed: int = 0
    # a calibration profile: fitted efficiencies and link alpha/beta override the datasheets
    profile: Profile | None = None
    # False when predicting a run that was measured: it did fit, whatever the activation estimate says
    enforce_memory: bool = True
    # a catalog transformer as a published run had it: (field, value) pairs among TRANSFORMER_CHANGES
    transformer_changes: tuple[tuple[str, int], ...] = ()
    # the software whose fitted links apply (``token@device@software``); empty: the collective option.
    # A measured row names its library (nccl) where the scenario holds the algorithm it resolves to.
    link_software: str = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def positive_int(name: str, value: Any) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"{name} must be a positive integer, got {value!r}")

        for name in ("devices_per_node", "nics_per_node", "nodes_per_leaf", "per_device_batch", "sockets",
                     "nodes_per_router", "routers_per_group", "dragonfly_global_links"):  # fmt: skip
            positive_int(name.replace("_", "-"), getattr(self, name))
        check_sockets(self.devices_per_node, self.sockets, self.socket_link)
        for change, value in self.transformer_changes:
            if change not in TRANSFORMER_CHANGES:
                raise ScenarioError(
                    f"transformer_changes: {change!r} cannot be changed; valid: {', '.join(TRANSFORMER_CHANGES)}"
                )
            positive_int(f"transformer_changes {change}", value)
        if self.updates is not None:
            positive_int("updates", self.updates)
        if not self.nodes:
            raise ScenarioError("nodes: give at least one node count")
        for count in self.nodes:
            positive_int("nodes", count)
        precisions = PEAK_PRECISIONS if self.is_transformer else PRECISIONS  # fp8: transformer layouts only
        if self.precision not in precisions or self.precision == "tf32":
            valid = ", ".join(p for p in precisions if p != "tf32")
            raise ScenarioError(f"unknown precision {self.precision!r}; valid: {valid}")
        if self.executor not in EXECUTORS:
            raise ScenarioError(f"unknown executor {self.executor!r}; valid: {', '.join(EXECUTORS)}")
        if self.topology not in TOPOLOGIES:
            raise ScenarioError(f"unknown topology {self.topology!r}; valid: {', '.join(TOPOLOGIES)}")
        if not self.oversubscription >= 1:
            raise ScenarioError(f"oversubscription must be >= 1 (1 = full bisection), got {self.oversubscription!r}")
        if self.nics_per_node > self.devices_per_node:
            raise ScenarioError("nics-per-node must not exceed devices-per-node")
        # names: each lookup raises UnknownNameError listing the valid tokens
        if self.is_transformer:
            load_transformer(self.workload)
        elif self.workload not in workload_names():
            raise UnknownNameError(
                f"unknown workload {self.workload!r}; valid: layer tables {', '.join(workload_names())}; "
                f"transformers (--algorithm megatron) {', '.join(transformer_names())}"
            )
        else:
            load_workload(self.workload)
        device = load_device(self.device)
        self._check_options(self.training_algorithm)
        if self.devices_per_node > 1 and not self.intra_node:
            raise ScenarioError("devices-per-node > 1 needs --intra-node (e.g. pcie3_x16, nvlink2)")
        if max(self.nodes) > 1 and not self.network:
            raise ScenarioError("more than one node needs --network (e.g. ib_edr, eth_10g)")
        for token in (self.intra_node, self.network, self.resolved_host_link(device)):
            if token:
                load_link(token)
        if self.intra_node and load_link(self.intra_node).kind != "intra_node":
            raise ScenarioError(f"--intra-node {self.intra_node!r} is a network, not an intra-node link")
        if self.network and load_link(self.network).kind != "network":
            raise ScenarioError(f"--network {self.network!r} is an intra-node link, not a network")
        Stragglers.parse(self.stragglers)
        algorithm = self.training_algorithm
        if self.is_transformer != (algorithm.name == "megatron"):
            raise ScenarioError(
                f"workload {self.workload!r} is a transformer: train it with --algorithm megatron"
                if self.is_transformer
                else f"--algorithm megatron trains a transformer (ddlsim list workloads); {self.workload!r} is not one"
            )
        if self.enforce_memory and not self.is_transformer:  # a transformer layout is checked per point
            self.check_memory()

    def _check_options(self, algorithm: TrainingAlgorithm) -> None:
        """The options are valid, and every option set away from its default is one the algorithm reads."""
        self.options.validate()
        default = AlgorithmOptions()
        unused = [
            name
            for name in OPTION_FIELDS
            if name not in algorithm.options and getattr(self.options, name) != getattr(default, name)
        ]
        if unused:
            valid = ", ".join(algorithm.options) or "none"
            raise ScenarioError(
                f"option(s) {', '.join(unused)} do not apply to algorithm {algorithm.name!r}; it reads: {valid}"
            )

    @functools.cached_property
    def is_transformer(self) -> bool:
        """A transformer from the catalog (trained by ``megatron``) rather than a DNN layer table.
        Looked up once per scenario: the lookup lists the catalog directories' files."""
        return self.workload in transformer_names()

    @property
    def transformer_spec(self) -> TransformerConfig:
        """The catalog transformer, with ``transformer_changes`` applied (a run's sequence length,
        padded vocabulary)."""
        config = load_transformer(self.workload)
        changes: dict[str, Any] = dict(self.transformer_changes)
        return dataclasses.replace(config, **changes) if changes else config

    @property
    def training_algorithm(self) -> TrainingAlgorithm:
        return TRAINING_ALGORITHMS.get(self.algorithm)

    @property
    def steps(self) -> int:
        """Gradient steps per worker: ``updates``, or the algorithm's default."""
        return self.updates if self.updates is not None else self.training_algorithm.default_updates

    @property
    def collective(self) -> str:
        return self.options.collective

    @property
    def bucket_bytes(self) -> float:
        return self.options.bucket_bytes

    def resolved_host_link(self, device: Device | None = None) -> str | None:
        if self.host_link == "auto":
            return default_host_link(device or load_device(self.device))
        return self.host_link or None

    # --- resolved objects --------------------------------------------------------------------
    @property
    def device_spec(self) -> Device:
        device = load_device(self.device)
        return self.profile.device(device) if self.profile else device

    @property
    def compute_scale(self) -> float:
        """Measured / modeled compute time pinned by the profile for this run shape (1 without one)."""
        if self.profile is None:
            return 1.0
        return self.profile.compute_scale(self.device, self.workload, self.precision, self.per_device_batch)

    @property
    def overlap_interference(self) -> float:
        return self.profile.overlap_interference if self.profile else 0.0

    @property
    def workload_spec(self) -> Workload:
        return load_workload(self.workload)

    @property
    def bytes_per_element(self) -> float:
        return BYTES_PER_ELEMENT[self.precision]

    def link(self, token: str | None) -> Link | None:
        """The link's datasheet, or its calibrated alpha/beta for gradient buckets of ``bucket_bytes``:
        the fit for this device under the scenario's collective software (``token@device@software``,
        as ``ddlsim calibrate`` keys the fits of collective rows: a library such as nccl, or an
        algorithm token), else a broader one (``Profile.link_fit``)."""
        if not token:
            return None
        link = load_link(token)
        if self.profile is None:
            return link
        return self.profile.link(link, self.link_scope, self.bucket_bytes)

    @property
    def link_scope(self) -> str:
        """The scope the profile's link fits are looked up in (``Profile.link_fit``)."""
        return link_scope(self.device, self.link_software or self.collective)

    def nodes_for(self, ranks: int) -> int:
        """Nodes the fabric needs for ``ranks`` collective ranks placed in blocks (helper ranks such
        as dedicated parameter servers get nodes of their own)."""
        return -(-ranks // self.devices_per_node)

    def fabric_spec(self, nodes: int) -> FabricSpec:
        return FabricSpec(
            nodes=nodes,
            devices_per_node=self.devices_per_node,
            peer_link=self.link(self.intra_node) if self.devices_per_node > 1 else None,
            host_link=self.link(self.resolved_host_link()),
            network=self.link(self.network) if nodes > 1 else None,
            socket_link=self.link(self.socket_link) if self.sockets > 1 else None,
            **topology_of(self),
        )

    def memory_needed_bytes(self) -> float:
        """Device memory for training (bytes): fp32 weights, gradients and momentum, the fp16 working
        copies under mixed precision, and the batch's activations that the layers' backward reads
        (``workloads.saved_for_backward_bytes``). A
        ``hybrid_parallel`` device holds one pipeline stage: the largest stage's need, counting the
        activation it received from the stage before (kept for its first layer's backward)."""
        stages = self.hybrid_stages()
        if stages is None:
            return self._memory_of(self.workload_spec.layers)
        return max(
            self._memory_of(stage, stages[index - 1][-1].output_bytes if index else 0.0)
            for index, stage in enumerate(stages)
        )

    def _memory_of(self, layers: tuple[Layer, ...], received_bytes: float = 0.0) -> float:
        parameters = sum(layer.parameters for layer in layers)
        state = parameters * (4.0 * 3 + (4.0 if self.precision != "fp32" else 0.0))
        # the activations the layers' backward keeps (workloads.saved_for_backward_bytes), and the
        # activation a pipeline stage received, kept for its first layer's backward
        received = received_bytes * self.bytes_per_element / 4.0
        return state + self.per_device_batch * (saved_for_backward_bytes(layers, self.bytes_per_element) + received)

    def hybrid_stages(self) -> list[tuple[Layer, ...]] | None:
        """The layers each device of a node holds under ``hybrid_parallel`` (the given split, else the
        balanced one), or None: another algorithm, one device per node, or a split that does not
        match the node or the model (the algorithm's plan reports that)."""
        if self.algorithm != "hybrid_parallel" or self.devices_per_node == 1:
            return None
        from ddlsim.simulator.training.trainers import balanced_split, layer_times, stage_layers

        layers = self.workload_spec.layers
        split = self.options.split
        if split is None:
            if self.devices_per_node > len(layers):
                return None
            split = balanced_split(layer_times(self), self.devices_per_node)
        if len(split) != self.devices_per_node or sum(split) != len(layers):
            return None
        return stage_layers(layers, split)

    def check_memory(self) -> None:
        device = self.device_spec
        needed = self.memory_needed_bytes()
        if needed > device.memory_capacity_bytes:
            where = "per-device batch"
            if self.hybrid_stages() is not None:
                where = "the largest hybrid_parallel stage of its split, pipeline batch"
            raise ScenarioError(
                f"does not fit: {self.workload} at {where} {self.per_device_batch} ({self.precision}) "
                f"needs {needed / 1e9:.1f} GB, {self.device} has {device.memory_capacity_bytes / 1e9:.1f} GB "
                "(assumed: fp32 weights, gradients and momentum, fp16 copies under mixed precision, the "
                "activations each layer's backward reads, no recomputation); lower --per-device-batch, or "
                "--no-memory-check if the run did fit"
            )

    def with_nodes(self, nodes: tuple[int, ...]) -> Scenario:
        return dataclasses.replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(dataclasses.replace(self, profile=None))
        data["nodes"] = list(self.nodes)
        data["torus_dims"] = list(self.torus_dims) if self.torus_dims else None
        data["options"] = self.options.to_dict()
        data["profile"] = self.profile.summary() if self.profile else None
        if not self.link_software:  # the default says nothing a scenario file needs
            del data["link_software"]
        return data

    @staticmethod
    def from_dict(data: dict[str, Any], **overrides: Any) -> Scenario:
        """The scenario ``to_dict`` wrote (``scenario.json``'s ``scenario``); a profile is not restored."""
        values = {key: value for key, value in data.items() if key != "profile"}
        known = {item.name for item in dataclasses.fields(Scenario)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ScenarioError(f"unknown scenario key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        values["options"] = AlgorithmOptions.from_dict(dict(values.get("options") or {}))
        for key in ("nodes", "torus_dims"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        if values.get("transformer_changes"):
            values["transformer_changes"] = tuple((str(k), int(v)) for k, v in values["transformer_changes"])
        return Scenario(**(values | overrides))

    def resolved(self) -> dict[str, Any]:
        """The scenario with every token expanded into the numbers used (SI units, with sources)."""
        device = self.device_spec
        links = {
            role: dataclasses.asdict(self.link(token))  # type: ignore[arg-type]
            for role, token in (
                ("intra_node", self.intra_node),
                ("host_link", self.resolved_host_link()),
                ("network", self.network),
                ("socket_link", self.socket_link if self.sockets > 1 else None),
            )
            if token
        }
        resolved = {"scenario": self.to_dict(), "device": dataclasses.asdict(device), "links": links}
        if self.is_transformer:
            return resolved | {"workload": dataclasses.asdict(self.transformer_spec)}
        workload = self.workload_spec
        return resolved | {
            "workload": {
                "name": workload.name,
                "description": workload.description,
                "parameters": workload.parameter_count,
                "forward_flops_per_sample": workload.forward_flops,
                "backward_flops_per_sample": workload.backward_flops,
                "layers": len(workload.layers),
            },
            "memory_needed_bytes": self.memory_needed_bytes(),
        }
