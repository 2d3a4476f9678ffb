"""The hardware catalog: device and link datasheets as TOML data files, validated at load.

Every number in a datasheet is a table ``{ value = ..., source = "..." }`` so its origin stays
beside it. Quantities are human strings ("100 Gbit/s", "16 GB", "1 us"), parsed once here into
SI units. Unknown keys, missing keys and impossible values are rejected with a message naming
the file, the key and what is allowed.

Files: ``hardware_models/devices/<token>.toml`` and ``hardware_models/links/<token>.toml``; the
token is the file name. A calibration profile (later) uses the same keys.

User catalogs: directories holding ``devices/``, ``links/`` (and ``transformers/`` for models)
in the same format, named by ``register_catalog_directory`` (the ``--catalog DIR`` flag) or by
the ``DDLSIM_CATALOG`` environment variable (directories joined by ``os.pathsep``, ":" on
Linux). Their files are validated exactly like the built-ins; they add tokens and may not
redefine one (a duplicate token is an error naming both files).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.units import UnitError, parse_bandwidth, parse_bytes, parse_flops, parse_seconds
from ddlsim.registry import UnknownNameError

HERE = Path(__file__).parent
DEVICE_DIR = HERE / "devices"
LINK_DIR = HERE / "links"
BUILT_IN = {"devices": DEVICE_DIR, "links": LINK_DIR}

PRECISIONS = ("fp32", "fp16", "bf16")  # training precisions of the data-parallel scenarios and measurements
PEAK_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")  # datasheet peaks (dense, no sparsity)
DEVICE_KINDS = ("gpu", "cpu", "manycore", "accelerator")
LINK_KINDS = ("intra_node", "network")
LINK_TOPOLOGIES = ("switch", "full_mesh", "torus_2d", "torus_3d", "point_to_point")
CATALOG_ENVIRONMENT_VARIABLE = "DDLSIM_CATALOG"
CATALOG_KINDS = ("devices", "links", "transformers")


class CatalogError(ValueError):
    """A datasheet is malformed; the message names file, key and the allowed values."""


@dataclass(frozen=True)
class DeviceSystem:
    """The usual server (or rack) of a device: devices per node, its scale-up link, its network and NICs.

    A default for planners and commands that are given only a device; every value can be overridden.
    """

    devices_per_node: int
    intra_node_link: str  # link token, kind intra_node
    network: str  # link token, kind network
    nics_per_node: int
    host_link: str | None = None  # device-to-NIC link token (kind intra_node); None: the generation's default


@dataclass(frozen=True)
class Derivation:
    """Where a catalog value comes from in the development data: ``rows``, any one of which gives
    it, and the values other rows give the same field (``alternatives``: value, rows, source)."""

    rows: tuple[str, ...]
    alternatives: tuple[tuple[float, tuple[str, ...], str], ...] = ()


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
    system: DeviceSystem | None = None
    # per field (``compute_efficiency``, ``layer_efficiency.<type>``): the development rows its value
    # was derived from; a validation that predicts all of them does not use it (calibration/unseen.py)
    derived_from: dict[str, Derivation] = field(default_factory=dict)

    def peak_flops_for(self, precision: str) -> float:
        """Peak FLOP/s of matrix products at ``precision`` (one of PEAK_PRECISIONS).

        Mixed precision (fp16, bf16) runs at the faster of the reduced-precision and fp32 peaks:
        frameworks keep fp32 arithmetic on parts without a fast fp16 path (P40, K80, KNL). fp8
        on a part without fp8 tensor cores (A100) runs at its 16-bit peak; tf32 without a tf32
        path at fp32.
        """
        if precision not in PEAK_PRECISIONS:
            raise CatalogError(f"unknown precision {precision!r}; valid: {', '.join(PEAK_PRECISIONS)}")
        fp32 = self.peak_flops["fp32"]
        fallbacks = ("bf16", "fp16") if precision == "fp8" else ()
        for key in (precision, *fallbacks):
            if key in self.peak_flops:
                return max(fp32, self.peak_flops[key])
        return fp32

    def mixed_precision(self) -> str:
        """The 16-bit format a transformer trains in on this part: bf16 where it has bf16 units at
        least as fast as its fp16 ones (Ampere and later, TPUs), fp16 where only fp16 is fast (Volta's
        tensor cores), else bf16 (neither is faster than fp32 here)."""
        fp32 = self.peak_flops["fp32"]
        bf16, fp16 = self.peak_flops.get("bf16", 0.0), self.peak_flops.get("fp16", 0.0)
        return "fp16" if fp16 > fp32 and fp16 > bf16 else "bf16"

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
    domain_size: int = 0  # devices one scale-up domain joins (a mesh's not all at the port bandwidth; 0: not stated)
    topology: str = ""  # switch | full_mesh | torus_3d | point_to_point ("": not stated)
    # seconds a collective call whose group crosses this link pays once, before its first transfer:
    # a library's fixed cost per call (set-up, buffer registration), not per message. Datasheets
    # have none; a calibration profile fits it (``LinkFit.call_s``).
    call_overhead_s: float = 0.0

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


def _quantity(
    data: dict[str, Any],
    key: str,
    path: Path,
    check,
    sources: dict[str, str],
    derived: dict[str, Derivation] | None = None,
    name: str = "",
) -> Any:
    """The checked value of ``data[key]``, a ``{ value, source }`` table; its source goes to ``sources``.
    With ``derived``, the table may also give ``derived_from`` (row ids) and ``alternatives`` (tables
    ``{ value, rows, source }``), kept as a ``Derivation`` under ``name`` (default ``key``)."""
    where = f"{path}: key {key!r}"
    entry = data[key]
    allowed = {"value", "source", "derived_from", "alternatives"} if derived is not None else {"value", "source"}
    if not isinstance(entry, dict) or not {"value", "source"} <= set(entry) <= allowed:
        extra = ", derived_from = [...], alternatives = [...]" if derived is not None else ""
        raise CatalogError(f'{where}: must be a table {{ value = ..., source = "..."{extra} }}, got {entry!r}')
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        raise CatalogError(f"{where}: source must be a non-empty string")
    if derived is not None and "derived_from" in entry:
        alternatives = []
        for alternative in entry.get("alternatives", []):
            if not isinstance(alternative, dict) or set(alternative) != {"value", "rows", "source"}:
                raise CatalogError(f'{where}: each alternative must be {{ value = ..., rows = [...], source = "..." }}')
            alternatives.append((check(alternative["value"], where), _row_ids(alternative["rows"], where),
                                 str(alternative["source"])))  # fmt: skip
        derived[name or key] = Derivation(_row_ids(entry["derived_from"], where), tuple(alternatives))
    elif "alternatives" in entry:
        raise CatalogError(f"{where}: alternatives need derived_from (the rows the value itself comes from)")
    sources[key] = entry["source"]
    return check(entry["value"], where)


def _row_ids(rows: Any, where: str) -> tuple[str, ...]:
    if not isinstance(rows, list) or not rows or not all(isinstance(row, str) and row.strip() for row in rows):
        raise CatalogError(f"{where}: derived_from and rows must be non-empty lists of row ids, got {rows!r}")
    return tuple(rows)


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
    _check_keys(data, path, required, {"layer_efficiency", "system"})
    sources: dict[str, str] = {}
    derived: dict[str, Derivation] = {}
    values = {
        key: _quantity(data, key, path, check, sources, derived if key == "compute_efficiency" else None)
        for key, check in _DEVICE_QUANTITIES.items()
    }
    peaks_table = data["peak_flops"]
    if not isinstance(peaks_table, dict) or "fp32" not in peaks_table:
        raise CatalogError(f"{path}: key 'peak_flops' must be a table with at least fp32")
    _check_keys(
        peaks_table, path.with_name(f"{path.name} [peak_flops]"), {"fp32"}, set(PEAK_PRECISIONS) - {"fp32"}
    )
    peaks = {
        precision: _quantity(peaks_table, precision, path, _positive(parse_flops), sources)
        for precision in peaks_table
    }
    layer_table = data.get("layer_efficiency", {})
    if not isinstance(layer_table, dict):
        raise CatalogError(f"{path}: key 'layer_efficiency' must be a table of layer type -> efficiency")
    layer_efficiency = {
        layer: _quantity(layer_table, layer, path, _fraction, sources, derived, f"layer_efficiency.{layer}")
        for layer in layer_table
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
        system=_parse_system(data.get("system"), path, sources),
        derived_from=derived,
    )


def _token(kind: str) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise CatalogError(f"{where}: must be a link token (a string), got {value!r}")
        names = link_names(kind)
        if value not in names:
            raise CatalogError(f"{where}: {value!r} is not a {kind} link; valid: {', '.join(names)}")
        return value

    return check


def _parse_system(table: Any, path: Path, sources: dict[str, str]) -> DeviceSystem | None:
    if table is None:
        return None
    where = path.with_name(f"{path.name} [system]")
    if not isinstance(table, dict):
        raise CatalogError(f"{path}: key 'system' must be a table")
    keys = {"devices_per_node", "intra_node_link", "network", "nics_per_node"}
    _check_keys(table, where, keys, {"host_link"})
    found: dict[str, str] = {}
    checks = {"devices_per_node": _count, "nics_per_node": _count,
              "intra_node_link": _token("intra_node"), "network": _token("network"),
              "host_link": _token("intra_node")}  # fmt: skip
    values = {key: _quantity(table, key, where, check, found) for key, check in checks.items() if key in table}
    sources.update({f"system.{key}": source for key, source in found.items()})
    return DeviceSystem(
        devices_per_node=int(values["devices_per_node"]),
        intra_node_link=values["intra_node_link"],
        network=values["network"],
        nics_per_node=int(values["nics_per_node"]),
        host_link=values.get("host_link"),
    )


_LINK_QUANTITIES = {
    "bandwidth": _positive(parse_bandwidth),
    "latency": _positive(parse_seconds, allow_zero=True),
    "per_message_overhead": _positive(parse_seconds, allow_zero=True),
    "efficiency": _fraction,
}


def parse_link(token: str, data: dict[str, Any], path: Path) -> Link:
    """Validate a link datasheet's parsed TOML into a Link."""
    optional = {"links_per_device", "domain_size", "topology"}
    _check_keys(data, path, {"description", "kind", *_LINK_QUANTITIES}, optional)
    sources: dict[str, str] = {}
    values = {key: _quantity(data, key, path, check, sources) for key, check in _LINK_QUANTITIES.items()}
    kind = _text(data, "kind", path, LINK_KINDS)
    links = 1
    if "links_per_device" in data:
        links = int(_quantity(data, "links_per_device", path, _count, sources))
    for key in ("domain_size", "topology"):
        if key in data and kind != "intra_node":
            raise CatalogError(f"{path}: key {key!r} describes a scale-up domain: only for kind 'intra_node' links")
    domain = int(_quantity(data, "domain_size", path, _count, sources)) if "domain_size" in data else 0
    topology = _quantity(data, "topology", path, _choice(LINK_TOPOLOGIES), sources) if "topology" in data else ""
    return Link(
        token=token,
        description=_text(data, "description", path),
        kind=kind,
        bandwidth_Bps=values["bandwidth"],
        latency_s=values["latency"],
        per_message_overhead_s=values["per_message_overhead"],
        efficiency=values["efficiency"],
        links_per_device=links,
        sources=sources,
        domain_size=domain,
        topology=topology,
    )


def _choice(allowed: tuple[str, ...]) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        if value not in allowed:
            raise CatalogError(f"{where}: must be one of {', '.join(allowed)}, got {value!r}")
        return value

    return check


# --- where the datasheets live: the package, then the user's catalog directories -------------------

_registered_directories: list[Path] = []


def _check_directory(path: Path, named_by: str) -> Path:
    if not path.is_dir():
        raise CatalogError(f"{named_by}: catalog directory {str(path)!r} does not exist or is not a directory")
    if not any((path / kind).is_dir() for kind in CATALOG_KINDS):
        raise CatalogError(
            f"{named_by}: catalog directory {str(path)!r} holds none of {', '.join(k + '/' for k in CATALOG_KINDS)}"
        )
    return path.resolve()


def register_catalog_directory(path: Path | str) -> Path:
    """Add a user catalog directory (``--catalog DIR``), searched after the built-ins; returns it resolved."""
    resolved = _check_directory(Path(path), "--catalog")
    if resolved not in _registered_directories:
        _registered_directories.append(resolved)
    return resolved


def forget_catalog_directories() -> None:
    """Drop the directories given to ``register_catalog_directory`` (the environment variable stays)."""
    _registered_directories.clear()


def catalog_directories() -> tuple[Path, ...]:
    """User catalog directories in search order: registered ones, then ``DDLSIM_CATALOG``'s."""
    from_environment = [
        _check_directory(Path(entry), f"environment variable {CATALOG_ENVIRONMENT_VARIABLE}")
        for entry in os.environ.get(CATALOG_ENVIRONMENT_VARIABLE, "").split(os.pathsep)
        if entry.strip()
    ]
    ordered: list[Path] = []
    for directory in (*_registered_directories, *from_environment):
        if directory not in ordered:
            ordered.append(directory)
    return tuple(ordered)


@cache
def _catalog_files(kind: str, directories: tuple[Path, ...], suffixes: tuple[str, ...] = (".toml",)) -> dict[str, Path]:
    built_in = BUILT_IN.get(kind)
    files = {path.stem: path for path in sorted(built_in.glob("*.toml"))} if built_in else {}
    for directory in directories:
        for path in sorted((directory / kind).glob("*")):
            if path.suffix not in suffixes or not path.is_file():
                continue
            if path.stem in files:
                raise CatalogError(
                    f"{path}: token {path.stem!r} is already defined by {files[path.stem]}; "
                    "a user catalog may add tokens, not redefine them"
                )
            files[path.stem] = path
    return files


def catalog_files(kind: str, suffixes: tuple[str, ...] = (".toml",)) -> dict[str, Path]:
    """Token -> file of one catalog kind (``devices``, ``links``; ``transformers`` has only user files here)."""
    return _catalog_files(kind, catalog_directories(), suffixes)


def device_names() -> list[str]:
    return sorted(catalog_files("devices"))


def link_names(kind: str | None = None) -> list[str]:
    names = sorted(catalog_files("links"))
    if kind is None:
        return names
    return [name for name in names if load_link(name).kind == kind]


def load_device(token: str) -> Device:
    """The device ``token`` (built-in or from a user catalog); unknown tokens list the valid ones."""
    path = catalog_files("devices").get(token)
    if path is None:
        raise UnknownNameError(f"unknown device {token!r}; valid: {', '.join(device_names())}")
    return _load_device(token, path)


def load_link(token: str) -> Link:
    """The link or network ``token`` (built-in or from a user catalog); unknown tokens list the valid ones."""
    path = catalog_files("links").get(token)
    if path is None:
        raise UnknownNameError(f"unknown link or network {token!r}; valid: {', '.join(link_names())}")
    return _load_link(token, path)


@cache
def _load_device(token: str, path: Path) -> Device:
    return parse_device(token, _read(path), path)


@cache
def _load_link(token: str, path: Path) -> Link:
    return parse_link(token, _read(path), path)


def load_device_file(path: Path) -> Device:
    """Load a device datasheet from any path (tests, calibration profiles)."""
    return parse_device(path.stem, _read(path), path)


def load_link_file(path: Path) -> Link:
    return parse_link(path.stem, _read(path), path)
