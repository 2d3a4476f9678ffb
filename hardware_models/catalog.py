"""The hardware catalog: device and link datasheets as TOML data files, validated at load.

Every number in a datasheet is a table ``{ value = ..., source = "..." }`` so its origin stays
beside it. Quantities are human strings ("100 Gbit/s", "16 GB", "1 us"), parsed once here into
SI units. Unknown keys, missing keys and impossible values are rejected with a message naming
the file, the key and what is allowed.

Files: ``hardware_models/devices/<token>.toml`` and ``hardware_models/links/<token>.toml``; the
token is the file name. A calibration profile (later) uses the same keys.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ddlsim.algorithms.registry import UnknownNameError
from ddlsim.hardware_models.units import UnitError, parse_bandwidth, parse_bytes, parse_flops, parse_seconds

HERE = Path(__file__).parent
DEVICE_DIR = HERE / "devices"
LINK_DIR = HERE / "links"

PRECISIONS = ("fp32", "fp16", "bf16")
DEVICE_KINDS = ("gpu", "cpu", "manycore")
LINK_KINDS = ("intra_node", "network")


class CatalogError(ValueError):
    """A datasheet is malformed; the message names file, key and the allowed values."""


@dataclass(frozen=True)
class Device:
    """A compute device (one GPU, one GK210 die, one CPU socket, one KNL chip), SI units."""

    token: str
    description: str
    kind: str
    peak_flops: dict[str, float]  # precision -> FLOP/s
    memory_bandwidth_Bps: float
    memory_capacity_bytes: float
    on_chip_memory_bytes: float
    compute_efficiency: float  # fraction of peak reached by compute-bound layers
    memory_efficiency: float  # fraction of memory bandwidth reached by memory-bound layers
    layer_efficiency: dict[str, float] = field(default_factory=dict)  # layer type -> compute efficiency
    sources: dict[str, str] = field(default_factory=dict)

    def peak_flops_for(self, precision: str) -> float:
        """Peak FLOP/s for training at ``precision``.

        Mixed precision (fp16, bf16) runs at the faster of the reduced-precision and fp32 peaks:
        frameworks keep fp32 arithmetic on parts without a fast fp16 path (P40, K80, KNL).
        """
        if precision not in PRECISIONS:
            raise CatalogError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
        fp32 = self.peak_flops["fp32"]
        return max(fp32, self.peak_flops.get(precision, fp32))

    def efficiency_for(self, layer_type: str) -> float:
        return self.layer_efficiency.get(layer_type, self.compute_efficiency)


@dataclass(frozen=True)
class Link:
    """A link or network port, per direction, SI units.

    ``bandwidth_Bps`` is the line rate of one link; a device port bundles ``links_per_device``
    links (NVLink); ``efficiency`` is the share of the line rate that carries payload.
    """

    token: str
    description: str
    kind: str
    bandwidth_Bps: float
    latency_s: float
    per_message_overhead_s: float
    efficiency: float
    links_per_device: int = 1
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def port_bandwidth_Bps(self) -> float:
        """Payload bandwidth of one device's (or one NIC's) port, per direction."""
        return self.bandwidth_Bps * self.efficiency * self.links_per_device


def _fraction(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise CatalogError(f"{where}: must be a number in (0, 1], got {value!r}")
    return float(value)


def _positive(parse: Callable[[Any, str], float], allow_zero: bool = False):
    def check(value: Any, where: str) -> float:
        try:
            number = parse(value, where)
        except UnitError as error:
            raise CatalogError(str(error)) from None
        if number < 0 or (number == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise CatalogError(f"{where}: must be {bound}, got {value!r}")
        return number

    return check


def _count(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CatalogError(f"{where}: must be a whole number >= 1, got {value!r}")
    return float(value)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None


def _quantity(data: dict[str, Any], key: str, path: Path, check, sources: dict[str, str]) -> float:
    where = f"{path}: key {key!r}"
    entry = data[key]
    if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
        raise CatalogError(f'{where}: must be a table {{ value = ..., source = "..." }}, got {entry!r}')
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        raise CatalogError(f"{where}: source must be a non-empty string")
    sources[key] = entry["source"]
    return check(entry["value"], where)


def _check_keys(data: dict[str, Any], path: Path, required: set[str], optional: set[str]) -> None:
    unknown = sorted(set(data) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise CatalogError(f"{path}: unknown key {unknown[0]!r}; allowed keys: {allowed}")
    missing = sorted(required - set(data))
    if missing:
        raise CatalogError(f"{path}: missing key {missing[0]!r}")


def _text(data: dict[str, Any], key: str, path: Path, allowed: tuple[str, ...] | None = None) -> str:
    value = data[key]
    if not isinstance(value, str) or (allowed is not None and value not in allowed):
        want = f"one of {', '.join(allowed)}" if allowed else "a string"
        raise CatalogError(f"{path}: key {key!r}: must be {want}, got {value!r}")
    return value


_DEVICE_QUANTITIES = {
    "memory_bandwidth": _positive(parse_bandwidth),
    "memory_capacity": _positive(parse_bytes),
    "on_chip_memory": _positive(parse_bytes),
    "compute_efficiency": _fraction,
    "memory_efficiency": _fraction,
}


def parse_device(token: str, data: dict[str, Any], path: Path) -> Device:
    """Validate a device datasheet's parsed TOML into a Device."""
    required = {"description", "kind", "peak_flops", *_DEVICE_QUANTITIES}
    _check_keys(data, path, required, {"layer_efficiency"})
    sources: dict[str, str] = {}
    values = {key: _quantity(data, key, path, check, sources) for key, check in _DEVICE_QUANTITIES.items()}
    peaks_table = data["peak_flops"]
    if not isinstance(peaks_table, dict) or "fp32" not in peaks_table:
        raise CatalogError(f"{path}: key 'peak_flops' must be a table with at least fp32")
    _check_keys(
        peaks_table, path.with_name(f"{path.name} [peak_flops]"), {"fp32"}, set(PRECISIONS) - {"fp32"}
    )
    peaks = {
        precision: _quantity(peaks_table, precision, path, _positive(parse_flops), sources)
        for precision in peaks_table
    }
    layer_table = data.get("layer_efficiency", {})
    if not isinstance(layer_table, dict):
        raise CatalogError(f"{path}: key 'layer_efficiency' must be a table of layer type -> efficiency")
    layer_efficiency = {
        layer: _quantity(layer_table, layer, path, _fraction, sources) for layer in layer_table
    }
    return Device(
        token=token,
        description=_text(data, "description", path),
        kind=_text(data, "kind", path, DEVICE_KINDS),
        peak_flops=peaks,
        memory_bandwidth_Bps=values["memory_bandwidth"],
        memory_capacity_bytes=values["memory_capacity"],
        on_chip_memory_bytes=values["on_chip_memory"],
        compute_efficiency=values["compute_efficiency"],
        memory_efficiency=values["memory_efficiency"],
        layer_efficiency=layer_efficiency,
        sources=sources,
    )


_LINK_QUANTITIES = {
    "bandwidth": _positive(parse_bandwidth),
    "latency": _positive(parse_seconds, allow_zero=True),
    "per_message_overhead": _positive(parse_seconds, allow_zero=True),
    "efficiency": _fraction,
}


def parse_link(token: str, data: dict[str, Any], path: Path) -> Link:
    """Validate a link datasheet's parsed TOML into a Link."""
    _check_keys(data, path, {"description", "kind", *_LINK_QUANTITIES}, {"links_per_device"})
    sources: dict[str, str] = {}
    values = {key: _quantity(data, key, path, check, sources) for key, check in _LINK_QUANTITIES.items()}
    links = 1
    if "links_per_device" in data:
        links = int(_quantity(data, "links_per_device", path, _count, sources))
    return Link(
        token=token,
        description=_text(data, "description", path),
        kind=_text(data, "kind", path, LINK_KINDS),
        bandwidth_Bps=values["bandwidth"],
        latency_s=values["latency"],
        per_message_overhead_s=values["per_message_overhead"],
        efficiency=values["efficiency"],
        links_per_device=links,
        sources=sources,
    )


def _names(directory: Path) -> list[str]:
    return sorted(path.stem for path in directory.glob("*.toml"))


def device_names() -> list[str]:
    return _names(DEVICE_DIR)


def link_names(kind: str | None = None) -> list[str]:
    names = _names(LINK_DIR)
    if kind is None:
        return names
    return [name for name in names if load_link(name).kind == kind]


@cache
def load_device(token: str) -> Device:
    path = DEVICE_DIR / f"{token}.toml"
    if not path.is_file():
        raise UnknownNameError(f"unknown device {token!r}; valid: {', '.join(device_names())}")
    return parse_device(token, _read(path), path)


@cache
def load_link(token: str) -> Link:
    path = LINK_DIR / f"{token}.toml"
    if not path.is_file():
        raise UnknownNameError(f"unknown link or network {token!r}; valid: {', '.join(link_names())}")
    return parse_link(token, _read(path), path)


def load_device_file(path: Path) -> Device:
    """Load a device datasheet from any path (tests, calibration profiles)."""
    return parse_device(path.stem, _read(path), path)


def load_link_file(path: Path) -> Link:
    return parse_link(path.stem, _read(path), path)
