"""Calibration profiles: fitted model parameters that override the catalog's datasheet values.

A profile is a TOML file in the catalog's format (every number a ``{ value, source }`` table, SI
units) written by ``ddlsim calibrate``::

    schema_version = 1
    data_sha256 = "..."                       # hash of the measurement rows it was fitted to
    overlap_interference = { value = 0.0, source = "..." }
    rank_jitter_sigma = { value = 0.04, source = "..." }  # per-rank step-time noise: the slowest of N
    noise_sigma = { value = 0.05, source = "..." }   # lognormal sigma of measured / predicted

    [devices.k80]                              # any of the device datasheet's efficiencies
    compute_efficiency = { value = 0.41, source = "fitted ..." }
    memory_efficiency = { value = 0.62, source = "fitted ..." }
    [devices.k80.layer_efficiency]
    conv = { value = 0.45, source = "fitted ..." }
    [devices.k80.workload_scale]              # measured / modeled compute time, pinned per run shape
    "resnet50/fp32/64" = { value = 1.03, source = "pinned by TFBENCH-041, ..." }

    [links."pcie3_x16@titanx_pascal@nccl"]     # link token [@device or kind [@library or algorithm]]
    breakpoints_bytes = { value = [1e6], source = "protocol switch between 0.4 and 12 MB" }
    alpha_s = { value = [2e-5, 5e-6], source = "fitted ..." }      # one per message-size segment
    beta_Bps = { value = [9e9, 1.2e10], source = "fitted ..." }
    call_s = { value = [0.0, 1.8e-2], source = "fitted ..." }  # optional: fixed seconds per call
    step_alpha_s = { value = [0.0, 1.1e-3], source = "..." }  # optional: the per-step reading's alpha
    reduce_Bps = { value = 3e9, source = "fitted ..." }  # optional: receiver's reduction rate (gamma)
    cores = { value = 2.0, source = "fitted ..." }       # optional: cores driving a CPU transport

    [[bootstrap]]                              # parameter samples for confidence intervals
    "devices.k80.compute_efficiency" = 0.40
    "links.pcie3_x16@titanx_pascal.alpha_s.0" = 2.1e-5

    [compute]                                  # the cross-device compute model (compute_fit.py)
    "factor.precision.gpu_fp32" = { value = 1.2, source = "fitted ..." }  # multipliers of the datasheet's
    "factor.architecture.volta" = { value = 1.3, source = "fitted ..." }  # compute efficiency
    "launch_s.gpu" = { value = 2e-5, source = "fitted ..." }         # fixed seconds per kernel

    [noise]                                    # lognormal sigma per kind of prediction, from the
    "training: compute from datasheet" = { value = 0.09, source = "..." }  # leave-one-source-out residuals

    [calibrated_scale]                         # largest device count calibrated, per row kind,
    "training/k80/parameter_server" = { value = 16, source = "..." }  # device and algorithm

The segment of a message of S bytes is the number of breakpoints <= S. A fitted link replaces the
datasheet's (latency + per-message overhead, line rate x efficiency x links) by (alpha, beta):
alpha is all the per-message time the path's other (uncalibrated) parts do not already carry;
``call_s`` (optional, 0 without it) is a cost each collective call crossing the link pays once,
whatever the number of ranks: a library's fixed cost per call, told apart from alpha (paid per
step, so growing with the ranks) by rows at two or more scales. Where one scale could not tell
them apart, ``step_alpha_s`` keeps the per-step reading's alpha (0 where the rows decided), and
``per_step_reading()`` gives the profile that reading makes: predictions span both.

A fit scoped to a device kind (``ib_fdr@gpu@ring``) is pooled over that kind's devices: a device
without a fit of its own for the link and software takes it (``link_fit_key``). Calibration pools
only where the path does not depend on the device (``simulator.calibration.link_fit.link_group``).

Nothing here is global: a profile is a frozen value passed to ``Scenario(profile=...)`` and
``CollectiveSetup(profile=...)``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.catalog import DEVICE_KINDS, CatalogError, Device, Link, load_device
from ddlsim.hardware_models.compute import LAYER_TYPES, ComputeModel, architecture, layer_kind, precision_class

SCHEMA_VERSION = 1

DEVICE_KEYS = ("compute_efficiency", "memory_efficiency", "layer_efficiency", "workload_scale")
LINK_KEYS = ("breakpoints_bytes", "alpha_s", "beta_Bps", "call_s", "step_alpha_s", "reduce_Bps", "cores")
LINK_REQUIRED = ("breakpoints_bytes", "alpha_s", "beta_Bps")
TOP_KEYS = (
    "schema_version",
    "data_sha256",
    "description",
    "overlap_interference",
    "rank_jitter_sigma",
    "transformer_slowdown",
    "transformer_band",
    "noise_sigma",
    "devices",
    "links",
    "bootstrap",
    "compute",
    "noise",
    "calibrated_scale",
)


class ProfileError(CatalogError):
    """A profile file is malformed; the message names the file, the key and what is allowed."""


@dataclass(frozen=True)
class LinkFit:
    """Fitted alpha (s) and beta (bytes/s) per message-size segment; breakpoints in bytes."""

    breakpoints_bytes: tuple[float, ...] = ()
    alpha_s: tuple[float, ...] = (0.0,)
    beta_Bps: tuple[float, ...] = (1e9,)
    source: str = "fitted"
    # gamma = 1 / reduce_Bps: seconds per byte the receiver of a REDUCE transfer spends adding it in
    reduce_Bps: float = math.inf
    # cores of the host that drive this transport (CPU-driven: shared memory, TCP); a host running
    # more ranks than this stretches alpha, 1/beta and gamma by ranks / cores. inf = never stretched.
    cores: float = math.inf
    # fixed seconds per collective call, per segment (empty: none); see the module docstring
    call_s: tuple[float, ...] = ()
    # the per-step reading's alpha per segment where one scale could not tell it from the per-call
    # reading the fit kept (0: the rows decided; empty: none)
    step_alpha_s: tuple[float, ...] = ()

    def segment(self, message_bytes: float | None) -> int:
        if message_bytes is None:
            return len(self.alpha_s) - 1
        return bisect.bisect_right(self.breakpoints_bytes, message_bytes)

    def stretch(self, host_ranks: int) -> float:
        """Factor by which ``host_ranks`` ranks sharing ``cores`` cores slow each rank: max(1, ranks / cores)."""
        return max(1.0, host_ranks / self.cores)

    def apply(self, link: Link, message_bytes: float | None, host_ranks: int = 1) -> Link:
        index = self.segment(message_bytes)
        stretch = self.stretch(host_ranks)
        return dataclasses.replace(
            link,
            bandwidth_Bps=self.beta_Bps[index] / stretch,
            efficiency=1.0,
            links_per_device=1,
            latency_s=0.0,
            per_message_overhead_s=self.alpha_s[index] * stretch,
            call_overhead_s=self.call_s[index] if self.call_s else 0.0,
            sources={**link.sources, "profile": self.source},
        )


@dataclass(frozen=True)
class DeviceFit:
    """Fitted efficiencies (None = keep the datasheet's) and pinned compute-time scales."""

    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    layer_efficiency: dict[str, float] = field(default_factory=dict)
    workload_scale: dict[str, float] = field(default_factory=dict)  # "workload/precision/batch" -> factor
    sources: dict[str, str] = field(default_factory=dict)

    def apply(self, device: Device) -> Device:
        return dataclasses.replace(
            device,
            compute_efficiency=self.compute_efficiency or device.compute_efficiency,
            memory_efficiency=self.memory_efficiency or device.memory_efficiency,
            layer_efficiency={**device.layer_efficiency, **self.layer_efficiency},
            sources={**device.sources, **{f"profile.{k}": v for k, v in self.sources.items()}},
        )


# Names of the compute model's parameters (``ComputeFit.values``); ``factor.*`` multiply the
# datasheet's compute efficiency. The product may exceed 1: it is the efficiency against the FLOP
# the layer table counts (direct convolution), and Winograd or FFT convolutions do fewer.
COMPUTE_PREFIXES = (
    "factor.precision.",
    "factor.architecture.",
    "factor.device.",
    "factor.layer.",
    "factor.workload.",
    "memory_factor.",
    "half_batch.",
    "launch_s.",
)


@dataclass(frozen=True)
class ComputeFit:
    """The cross-device compute model: the datasheet's efficiencies times factors per
    precision class, architecture generation, device, layer kind and workload (the mix of kernels a network's layers
    get: Winograd 3x3 convolutions, asymmetric ones), effective memory bandwidth per precision class
    (``memory_factor`` x the datasheet's memory efficiency; above 1 / efficiency when a framework fuses
    element-wise layers and moves fewer bytes than the layer table counts), batch dependence and
    fixed cost per device kind.

    A name missing from ``values`` takes its neutral value (factor 1, no batch dependence, no fixed
    cost; the datasheet's memory efficiency), so a device, generation, kind or workload the
    calibration data did not contain is predicted from what was fitted across the others.
    """

    values: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def efficiency(self, device: Device, precision: str, layer_type: str, workload: str = "") -> float:
        """Large-batch compute efficiency of ``layer_type`` layers of ``workload`` on ``device`` at ``precision``."""
        efficiency = device.efficiency_for(layer_type)
        for name in self.factor_names(device, precision, workload, layer_type):
            if name.startswith("factor."):
                efficiency *= self.values.get(name, 1.0)
        return efficiency

    @staticmethod
    def factor_names(device: Device, precision: str, workload: str, layer_type: str = "conv") -> tuple[str, ...]:
        """The names of the parameters that set ``device``'s compute at ``precision`` for ``workload``
        (the efficiency factors, then the memory factor)."""
        pclass = precision_class(device, precision)
        return (
            f"factor.precision.{pclass}",
            f"factor.architecture.{architecture(device)}",
            f"factor.device.{device.token}",
            f"factor.layer.{layer_kind(layer_type)}",
            f"factor.workload.{workload}",
            f"memory_factor.{pclass}",
        )

    def model(self, device: Device, precision: str, workload: str = "") -> ComputeModel:
        """The ``ComputeModel`` of ``device`` at ``precision`` running ``workload``."""
        by_type = {layer_type: self.efficiency(device, precision, layer_type, workload) for layer_type in LAYER_TYPES}
        memory = device.memory_efficiency * self.values.get(f"memory_factor.{precision_class(device, precision)}", 1.0)
        return ComputeModel(
            default_efficiency=self.efficiency(device, precision, "", workload),
            memory_efficiency=memory,
            efficiency=by_type,
            half_batch=self.values.get(f"half_batch.{device.kind}", 0.0),
            launch_s=self.values.get(f"launch_s.{device.kind}", 0.0),
        )


def workload_key(workload: str, precision: str, per_device_batch: int) -> str:
    return f"{workload}/{precision}/{per_device_batch}"


@dataclass(frozen=True)
class Profile:
    """Everything a calibration fitted; apply it with ``device``, ``link`` and ``compute_scale``."""

    devices: dict[str, DeviceFit] = field(default_factory=dict)
    links: dict[str, LinkFit] = field(default_factory=dict)
    overlap_interference: float = 0.0
    # lognormal sigma of each rank's compute per step: a synchronous step waits for the slowest of N
    rank_jitter_sigma: float = 0.0
    # large-model rows: measured / closed-form iteration time (simulator.calibration.llm_validation);
    # a transformer layout's simulated iteration is scaled by it (training.trainers.transformer_result)
    transformer_slowdown: float = 1.0
    transformer_band: tuple[float, float] = (1.0, 1.0)  # the rows' spread around it (low, high factors)
    noise_sigma: float = 0.0
    data_sha256: str = ""
    description: str = ""
    bootstrap: tuple[dict[str, float], ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    compute: ComputeFit | None = None  # the cross-device compute model (None: datasheets)
    # lognormal sigma per kind of prediction (``noise_sigma`` for kinds not listed)
    noise: dict[str, float] = field(default_factory=dict)
    # the largest device count among the calibration rows of each "kind/device/algorithm": a
    # prediction beyond it extrapolates, and its interval says so (simulator.calibration.intervals)
    calibrated_scale: dict[str, float] = field(default_factory=dict)

    # --- applying ------------------------------------------------------------------------------
    def device(self, device: Device) -> Device:
        fit = self.devices.get(device.token)
        return fit.apply(device) if fit else device

    def compute_model(self, device: Device, precision: str, workload: str = "") -> ComputeModel | None:
        """The fitted compute model of ``device`` at ``precision`` for ``workload``; None without a compute fit."""
        return self.compute.model(device, precision, workload) if self.compute else None

    def sigma(self, kind: str) -> float:
        """The lognormal sigma of a prediction of ``kind``: fitted for the kind, else its nearest
        parent's (``"training, 1 node: pinned compute"`` -> ``"training, 1 node"`` -> ``"training"``);
        when only the root (``"training"``, ``"collective"``) was fitted, the larger of the root's and
        ``noise_sigma``: nothing of that scale was checked on held-out rows."""
        parent = kind
        while parent:
            if parent in self.noise:
                root = not any(mark in parent for mark in ":,")
                return max(self.noise[parent], self.noise_sigma) if root and parent != kind else self.noise[parent]
            cut = max(parent.rfind(":"), parent.rfind(","))
            parent = parent[:cut] if cut > 0 else ""
        return self.noise_sigma

    def link_fit(self, token: str, device: str | None = None) -> LinkFit | None:
        """The most specific fit: ``token@device@software``, then ``token@device``, then ``token``.

        ``device`` is a device token, optionally followed by ``@software`` (the library or
        algorithm that ran: software overheads differ between stacks on the same hardware).
        """
        key = self.link_fit_key(token, device)
        return self.links[key] if key else None

    def link_fit_key(self, token: str, device: str | None = None) -> str | None:
        """The key of the fit ``link_fit`` uses, or None: the device's own scopes first, then a fit
        pooled over the devices of its kind for the same software (``token@gpu@software...``)."""
        for scope in (device, _kind_scope(device) if device and self._pools(token) else None):
            while scope:
                if f"{token}@{scope}" in self.links:
                    return f"{token}@{scope}"
                scope = scope.rpartition("@")[0]
                if scope in DEVICE_KINDS:  # a kind alone scopes nothing: its fits name their software
                    break
        return token if token in self.links else None

    def _pools(self, token: str) -> bool:
        return any(key.startswith(f"{token}@{kind}@") for key in self.links for kind in DEVICE_KINDS)

    def link(
        self, link: Link, device: str | None = None, message_bytes: float | None = None, host_ranks: int = 1
    ) -> Link:
        """``link`` with its fit applied (alpha/beta of the size's segment, stretched for ``host_ranks``)."""
        fit = self.link_fit(link.token, device)
        return fit.apply(link, message_bytes, host_ranks) if fit else link

    def compute_scale(self, device: str, workload: str, precision: str, per_device_batch: int) -> float:
        fit = self.devices.get(device)
        if fit is None:
            return 1.0
        return fit.workload_scale.get(workload_key(workload, precision, per_device_batch), 1.0)

    def pins(self, device: str, workload: str, precision: str, per_device_batch: int) -> bool:
        fit = self.devices.get(device)
        return fit is not None and workload_key(workload, precision, per_device_batch) in fit.workload_scale

    # --- flat parameter vectors (bootstrap samples) ------------------------------------------------
    def flat(self) -> dict[str, float]:
        """Every fitted number under a dotted name, e.g. ``links.ib_fdr.beta_Bps.0``."""
        out: dict[str, float] = {"overlap_interference": self.overlap_interference}
        for token, fit in self.devices.items():
            for key in ("compute_efficiency", "memory_efficiency"):
                value = getattr(fit, key)
                if value is not None:
                    out[f"devices.{token}.{key}"] = value
            for layer, value in fit.layer_efficiency.items():
                out[f"devices.{token}.layer_efficiency.{layer}"] = value
            for key, value in fit.workload_scale.items():
                out[f"devices.{token}.workload_scale.{key}"] = value
        if self.compute:
            for name, value in self.compute.values.items():
                out[f"compute.{name}"] = value
        for key, link in self.links.items():
            for index, value in enumerate(link.alpha_s):
                out[f"links.{key}.alpha_s.{index}"] = value
            for index, value in enumerate(link.beta_Bps):
                out[f"links.{key}.beta_Bps.{index}"] = value
            for index, value in enumerate(link.call_s):
                out[f"links.{key}.call_s.{index}"] = value
        return out

    def with_flat(self, values: dict[str, float]) -> Profile:
        """This profile with the named numbers replaced (names as ``flat`` gives them)."""
        devices = {
            token: dataclasses.replace(
                fit, layer_efficiency=dict(fit.layer_efficiency), workload_scale=dict(fit.workload_scale)
            )
            for token, fit in self.devices.items()
        }
        links = {key: fit for key, fit in self.links.items()}
        interference = self.overlap_interference
        compute = dict(self.compute.values) if self.compute else None
        for name, value in values.items():
            parts = name.split(".")
            if parts[0] == "overlap_interference":
                interference = value
            elif parts[0] == "compute" and compute is not None:
                compute[name.partition(".")[2]] = value
            elif parts[0] == "devices" and parts[1] in devices:
                fit = devices[parts[1]]
                if parts[2] == "compute_efficiency":
                    devices[parts[1]] = dataclasses.replace(fit, compute_efficiency=value)
                elif parts[2] == "memory_efficiency":
                    devices[parts[1]] = dataclasses.replace(fit, memory_efficiency=value)
                elif parts[2] == "layer_efficiency":
                    fit.layer_efficiency[parts[3]] = value
                elif parts[2] == "workload_scale":
                    fit.workload_scale[".".join(parts[3:])] = value
            elif parts[0] == "links":
                # link keys hold no dots; the last two parts are the field and the segment index
                key, what, index = ".".join(parts[1:-2]), parts[-2], int(parts[-1])
                if key in links:
                    link = links[key]
                    segments = list(getattr(link, what, ()))
                    if what in ("alpha_s", "beta_Bps", "call_s") and index < len(segments):
                        segments[index] = value
                        links[key] = dataclasses.replace(link, **{what: tuple(segments)})  # type: ignore[arg-type]
        fitted = dataclasses.replace(self.compute, values=compute) if self.compute and compute is not None else None
        return dataclasses.replace(
            self, devices=devices, links=links, overlap_interference=interference, compute=fitted
        )

    def per_step_reading(self) -> Profile | None:
        """This profile with every undecided link segment read per step (its ``step_alpha_s``, no
        per-call cost), or None when the rows decided every segment."""
        links = dict(self.links)
        changed = False
        for key, fit in self.links.items():
            if not any(fit.step_alpha_s):
                continue
            alphas, calls = list(fit.alpha_s), list(fit.call_s or (0.0,) * len(fit.alpha_s))
            for index, step in enumerate(fit.step_alpha_s):
                if step:
                    alphas[index], calls[index] = step, 0.0
            links[key] = dataclasses.replace(fit, alpha_s=tuple(alphas), call_s=tuple(calls), step_alpha_s=())
            changed = True
        return dataclasses.replace(self, links=links, bootstrap=()) if changed else None

    def undecided_devices(self) -> set[str]:
        """The devices whose link fits hold a segment ``per_step_reading`` reads otherwise (keys are
        ``token[@device[@software...]]``: "" for a fit scoped to no device, which applies to all; a
        device kind for a fit pooled over that kind)."""
        return {key.split("@")[1] if "@" in key else "" for key, fit in self.links.items() if any(fit.step_alpha_s)}

    def ideal(self) -> Profile:
        """This profile with the fitted step-level cost terms switched off (``--ideal``): no rank
        jitter (the slowest of N ranks), no overlap interference and no fixed cost per collective
        call; compute and the links' alpha and beta stay fitted."""
        sources = {**self.sources, "rank_jitter_sigma": "switched off (--ideal)",
                   "overlap_interference": "switched off (--ideal)"}  # fmt: skip
        links = {key: dataclasses.replace(fit, call_s=()) for key, fit in self.links.items()}
        return dataclasses.replace(
            self, rank_jitter_sigma=0.0, overlap_interference=0.0, links=links, sources=sources
        )

    def samples(self) -> list[Profile]:
        """One profile per bootstrap sample (empty when the profile carries none)."""
        return [self.with_flat(sample) for sample in self.bootstrap]

    def summary(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "data_sha256": self.data_sha256,
            "devices": sorted(self.devices),
            "links": sorted(self.links),
            "overlap_interference": self.overlap_interference,
            "rank_jitter_sigma": self.rank_jitter_sigma,
            "transformer_slowdown": self.transformer_slowdown,
            "noise_sigma": self.noise_sigma,
            "noise": dict(self.noise),
            "calibrated_scale": dict(self.calibrated_scale),
            "compute": dict(self.compute.values) if self.compute else None,
            "bootstrap_samples": len(self.bootstrap),
        }


# --- TOML ---------------------------------------------------------------------------------------


def _kind_scope(device: str) -> str | None:
    """``gpu@ring@allreduce`` for ``titanx_pascal@ring@allreduce``: the scope of fits pooled over a kind."""
    name, _, software = device.partition("@")
    try:
        kind = load_device(name).kind
    except (CatalogError, KeyError):  # not a catalog device (a test's own): no pooled scope
        return None
    return f"{kind}@{software}" if software else None


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return _toml_string(str(value))


def _entry(value: Any, source: str) -> str:
    return f"{{ value = {_toml_value(value)}, source = {_toml_string(source)} }}"


def profile_to_toml(profile: Profile) -> str:
    """The profile as TOML text (deterministic: keys sorted)."""
    lines = [
        "# ddlsim calibration profile: fitted values override the hardware catalog's datasheets.",
        f"schema_version = {profile.schema_version}",
        f"data_sha256 = {_toml_string(profile.data_sha256)}",
        f"description = {_toml_string(profile.description)}",
        "overlap_interference = "
        + _entry(profile.overlap_interference, profile.sources.get("overlap_interference", "fitted")),
        "rank_jitter_sigma = " + _entry(profile.rank_jitter_sigma, profile.sources.get("rank_jitter_sigma", "fitted")),
        "transformer_slowdown = "
        + _entry(profile.transformer_slowdown, profile.sources.get("transformer_slowdown", "default: none")),
        "transformer_band = "
        + _entry(list(profile.transformer_band), profile.sources.get("transformer_band", "default: none")),
        "noise_sigma = " + _entry(profile.noise_sigma, profile.sources.get("noise_sigma", "fitted")),
    ]
    for token in sorted(profile.devices):
        fit = profile.devices[token]
        lines += ["", f"[devices.{_toml_string(token)}]"]
        for key in ("compute_efficiency", "memory_efficiency"):
            value = getattr(fit, key)
            if value is not None:
                lines.append(f"{key} = {_entry(value, fit.sources.get(key, 'fitted'))}")
        for table in ("layer_efficiency", "workload_scale"):
            values = getattr(fit, table)
            if values:
                lines += ["", f"[devices.{_toml_string(token)}.{table}]"]
                for key in sorted(values):
                    source = fit.sources.get(f"{table}.{key}", "fitted")
                    lines.append(f"{_toml_string(key)} = {_entry(values[key], source)}")
    for key in sorted(profile.links):
        link = profile.links[key]
        lines += ["", f"[links.{_toml_string(key)}]"]
        lines.append(f"breakpoints_bytes = {_entry(list(link.breakpoints_bytes), link.source)}")
        lines.append(f"alpha_s = {_entry(list(link.alpha_s), link.source)}")
        lines.append(f"beta_Bps = {_entry(list(link.beta_Bps), link.source)}")
        if any(link.call_s):  # absent = no fixed cost per call
            lines.append(f"call_s = {_entry(list(link.call_s), link.source)}")
        if any(link.step_alpha_s):  # absent = every segment decided by the rows
            reading = "the per-step reading's alpha, where one scale could not tell it from the per-call reading"
            lines.append(f"step_alpha_s = {_entry(list(link.step_alpha_s), reading)}")
        for name in ("reduce_Bps", "cores"):
            value = getattr(link, name)
            if math.isfinite(value):  # absent = inf: free reduction, never stretched
                lines.append(f"{name} = {_entry(value, link.source)}")
    lines += _extension_toml(profile)
    for sample in profile.bootstrap:
        lines += ["", "[[bootstrap]]"]
        lines += [f"{_toml_string(name)} = {_toml_value(float(sample[name]))}" for name in sorted(sample)]
    return "\n".join(lines) + "\n"


def _extension_toml(profile: Profile) -> list[str]:
    """The ``[compute]``, ``[noise]`` and ``[calibrated_scale]`` tables (written only when fitted)."""
    lines: list[str] = []
    compute = profile.compute or ComputeFit()
    tables = (
        ("compute", compute.values, compute.sources),
        ("noise", profile.noise, profile.sources),
        ("calibrated_scale", profile.calibrated_scale, profile.sources),
    )
    for table, values, sources in tables:
        if values:
            lines += ["", f"[{table}]"]
            for key in sorted(values):
                source = sources.get(key if table == "compute" else f"{table}.{key}", "fitted")
                lines.append(f"{_toml_string(key)} = {_entry(values[key], source)}")
    return lines


# Allowed ranges of the compute model's parameters (what a physically meaningful fit can give).
COMPUTE_BOUNDS = {
    "factor.": (1e-2, 1e2),
    "memory_factor.": (0.05, 20.0),
    "half_batch.": (0.0, 1e4),
    "launch_s.": (0.0, 1.0),
}
NOISE_BOUNDS = (0.0, 5.0)
SCALE_BOUNDS = (1.0, 1e9)  # devices


def parse_extensions(
    data: dict[str, Any], where: str
) -> tuple[ComputeFit | None, dict[str, float], dict[str, float], dict[str, str]]:
    """The ``[compute]``, ``[noise]`` and ``[calibrated_scale]`` tables: (compute fit or None, noise
    per kind, calibrated scale per key, the sources of the last two)."""
    compute = None
    table = data.get("compute")
    if table is not None:
        if not isinstance(table, dict):
            raise ProfileError(f"{where}: key 'compute' must be a table of parameter = {{ value, source }}")
        values: dict[str, float] = {}
        sources: dict[str, str] = {}
        for name in table:
            bounds = next((b for prefix, b in COMPUTE_BOUNDS.items() if name.startswith(prefix)), None)
            if bounds is None or not name.startswith(COMPUTE_PREFIXES):
                raise ProfileError(
                    f"{where} [compute]: unknown key {name!r}; allowed: names starting {', '.join(COMPUTE_PREFIXES)}"
                )
            value, sources[name] = _number_entry(table, name, f"{where} [compute]", *bounds)
            values[name] = float(value)
        compute = ComputeFit(values, sources)
    tables: dict[str, dict[str, float]] = {"noise": {}, "calibrated_scale": {}}
    extension_sources: dict[str, str] = {}
    kinds = (("noise", NOISE_BOUNDS, "prediction kind"), ("calibrated_scale", SCALE_BOUNDS, "kind/device/algorithm"))
    for name, bounds, what in kinds:
        table = data.get(name)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise ProfileError(f"{where}: key {name!r} must be a table of {what} = {{ value, source }}")
        for key in table:
            value, extension_sources[f"{name}.{key}"] = _number_entry(table, key, f"{where} [{name}]", *bounds)
            tables[name][key] = float(value)
    return compute, tables["noise"], tables["calibrated_scale"], extension_sources


def _number_entry(
    table: dict[str, Any], key: str, where: str, low: float, high: float, array: bool = False
) -> tuple[Any, str]:
    """``table[key]`` as ``{ value = NUMBER, source = "..." }`` (``array``: ``value = [NUMBER, ...]``)."""
    entry = table[key]
    shape = "[numbers]" if array else "a number"
    if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
        raise ProfileError(f'{where}: key {key!r} must be a table {{ value = {shape}, source = "..." }}, got {entry!r}')
    if not isinstance(entry["source"], str):
        raise ProfileError(f"{where}: key {key!r}: source must be a string, got {entry['source']!r}")
    if isinstance(entry["value"], list) != array:
        raise ProfileError(f"{where}: key {key!r}: value must be {shape}, got {entry['value']!r}")
    values = entry["value"] if array else [entry["value"]]
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ProfileError(f"{where}: key {key!r}: must be a number, got {value!r}")
        if not low <= value <= high:
            raise ProfileError(f"{where}: key {key!r}: must be in [{low:g}, {high:g}], got {value!r}")
    return entry["value"], str(entry["source"])


def _table(value: Any, where: str, what: str) -> dict[str, Any]:
    """``value`` if it is a TOML table; a ProfileError naming the key and what it holds otherwise."""
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: key {what!r} must be a table, got {value!r}")
    return value


def _unknown(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ProfileError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(allowed)}")


def parse_profile(data: dict[str, Any], path: Path) -> Profile:
    """A Profile from parsed TOML; every key's type and range checked (ProfileError names file and key)."""
    where = str(path)
    _unknown(data, TOP_KEYS, where)
    for key in ("data_sha256", "description"):
        if key in data and not isinstance(data[key], str):
            raise ProfileError(f"{where}: key {key!r} must be a string, got {data[key]!r}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProfileError(
            f"{where}: key 'schema_version': this ddlsim reads version {SCHEMA_VERSION}, got {version!r}"
        )
    sources: dict[str, str] = {}
    interference, sources["overlap_interference"] = _number_entry(data, "overlap_interference", where, 0.0, 1.0)
    jitter, slowdown = 0.0, 1.0
    if "rank_jitter_sigma" in data:  # profiles written before the term have none: no jitter
        jitter, sources["rank_jitter_sigma"] = _number_entry(data, "rank_jitter_sigma", where, 0.0, 1.0)
    band: tuple[float, float] = (1.0, 1.0)
    if "transformer_slowdown" in data:
        slowdown, sources["transformer_slowdown"] = _number_entry(data, "transformer_slowdown", where, 0.1, 10.0)
    if "transformer_band" in data:
        values, sources["transformer_band"] = _number_entry(data, "transformer_band", where, 0.1, 10.0, array=True)
        if len(values) != 2 or values[0] > values[1]:
            raise ProfileError(f"{where}: key 'transformer_band': value must be [low, high], got {values!r}")
        band = (float(values[0]), float(values[1]))
    sigma, sources["noise_sigma"] = _number_entry(data, "noise_sigma", where, *NOISE_BOUNDS)
    devices: dict[str, DeviceFit] = {}
    for token, table in _table(data.get("devices", {}), where, "devices").items():
        at = f"{where} [devices.{token}]"
        _unknown(_table(table, where, f"devices.{token}"), DEVICE_KEYS, at)
        fit_sources: dict[str, str] = {}
        efficiencies: dict[str, float | None] = {"compute_efficiency": None, "memory_efficiency": None}
        for key in efficiencies:
            if key in table:
                efficiencies[key], fit_sources[key] = _number_entry(table, key, at, 1e-6, 1.0)
        maps: dict[str, dict[str, float]] = {"layer_efficiency": {}, "workload_scale": {}}
        for name, high in (("layer_efficiency", 1.0), ("workload_scale", 1e6)):
            for key in _table(table.get(name, {}), at, name):
                maps[name][key], fit_sources[f"{name}.{key}"] = _number_entry(
                    table[name], key, f"{at}.{name}", 1e-6, high
                )
        devices[token] = DeviceFit(
            efficiencies["compute_efficiency"],
            efficiencies["memory_efficiency"],
            maps["layer_efficiency"],
            maps["workload_scale"],
            fit_sources,
        )
    links: dict[str, LinkFit] = {}
    for key, table in _table(data.get("links", {}), where, "links").items():
        at = f"{where} [links.{key}]"
        _unknown(_table(table, where, f"links.{key}"), LINK_KEYS, at)
        for name in LINK_REQUIRED:
            if name not in table:
                raise ProfileError(f"{at}: missing key {name!r}")
        breakpoints, source = _number_entry(table, "breakpoints_bytes", at, 0.0, 1e18, array=True)
        alpha, _ = _number_entry(table, "alpha_s", at, 0.0, 1e3, array=True)
        beta, _ = _number_entry(table, "beta_Bps", at, 1.0, 1e15, array=True)
        if len(alpha) != len(breakpoints) + 1 or len(beta) != len(alpha):
            raise ProfileError(f"{at}: alpha_s and beta_Bps need one value per segment (breakpoints + 1)")
        if list(breakpoints) != sorted(breakpoints):
            raise ProfileError(f"{at}: key 'breakpoints_bytes' must be increasing")
        optional: dict[str, float] = {}
        for name, low, high in (("reduce_Bps", 1.0, 1e15), ("cores", 1.0, 1e6)):
            if name in table:
                optional[name] = float(_number_entry(table, name, at, low, high)[0])
        per_segment: dict[str, tuple[float, ...]] = {}
        for name in ("call_s", "step_alpha_s"):
            if name in table:
                values = tuple(float(c) for c in _number_entry(table, name, at, 0.0, 1e3, array=True)[0])
                if len(values) != len(alpha):
                    raise ProfileError(f"{at}: {name} needs one value per segment (breakpoints + 1), like alpha_s")
                per_segment[name] = values
        links[key] = LinkFit(
            tuple(float(b) for b in breakpoints),
            tuple(float(a) for a in alpha),
            tuple(float(b) for b in beta),
            source,
            reduce_Bps=optional.get("reduce_Bps", math.inf),
            cores=optional.get("cores", math.inf),
            call_s=per_segment.get("call_s", ()),
            step_alpha_s=per_segment.get("step_alpha_s", ()),
        )
    samples = data.get("bootstrap", [])
    if not isinstance(samples, list) or not all(isinstance(sample, dict) for sample in samples):
        raise ProfileError(f"{where}: key 'bootstrap' must be an array of tables [[bootstrap]], got {samples!r}")
    for index, sample in enumerate(samples):
        for name, value in sample.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ProfileError(f"{where}: [[bootstrap]] {index + 1}, key {name!r}: must be a number, got {value!r}")
    compute, noise, scale, extension_sources = parse_extensions(data, where)
    sources.update(extension_sources)
    return Profile(
        compute=compute,
        noise=noise,
        calibrated_scale=scale,
        devices=devices,
        links=links,
        overlap_interference=float(interference),
        rank_jitter_sigma=float(jitter),
        transformer_slowdown=float(slowdown),
        transformer_band=band,
        noise_sigma=float(sigma),
        data_sha256=str(data.get("data_sha256", "")),
        description=str(data.get("description", "")),
        bootstrap=tuple({str(k): float(v) for k, v in sample.items()} for sample in samples),
        sources=sources,
    )


def load_profile(path: Path | str) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file")
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"{path}: not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ProfileError(f"{path}: not UTF-8 text (TOML files are UTF-8): byte {error.start}") from None
    return parse_profile(data, path)
