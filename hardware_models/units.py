"""Units: SI inside, human strings parsed once at load time.

Type aliases carry the unit in their name, as astra-network-analytical does. Every human
string ("100 Gbit/s", "16 GB", "1.5 us", "10.6 TFLOP/s") is turned into SI numbers here and
nowhere else. Decimal prefixes are powers of ten (GB = 1e9 B); binary prefixes must be written
as such (GiB = 2**30 B).
"""

from __future__ import annotations

import re

Seconds = float
Bytes = float
BytesPerSecond = float
FlopsPerSecond = float
Flops = float


class UnitError(ValueError):
    """A quantity string could not be parsed; the message says what is allowed."""


_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "ps": 1e-12, "min": 60.0, "h": 3600.0}

_NUMBER = r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>.*?)\s*$")


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"{what}: expected a number with a unit, got {text!r}")
    if isinstance(text, int | float):
        return float(text), ""
    match = _QUANTITY.match(str(text))
    if not match:
        raise UnitError(f"{what}: cannot parse {text!r} as a number with a unit")
    return float(match.group("number")), match.group("unit")


def _prefix(prefix: str, text: str, what: str, allowed: str) -> float:
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    raise UnitError(f"{what}: unknown unit prefix {prefix!r} in {text!r}; allowed: {allowed}")


def parse_bytes(text: str | float | int, what: str = "size") -> Bytes:
    """Parse a size: "16 GB" -> 16e9, "64KiB" -> 65536, "1e6" -> 1e6 (bytes).

    Units: B with decimal (k, M, G, T) or binary (Ki, Mi, Gi, Ti) prefixes. A bare number is bytes.
    """
    value, unit = _split(text, what)
    allowed = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB (decimal prefixes are powers of 10)"
    if unit in ("", "B"):
        return value
    if not unit.endswith("B"):
        raise UnitError(f"{what}: unknown size unit in {text!r}; allowed: {allowed}")
    return value * _prefix(unit[:-1], str(text), what, allowed)


def parse_bandwidth(text: str | float | int, what: str = "bandwidth") -> BytesPerSecond:
    """Parse a bandwidth into bytes/s: "100 Gbit/s" -> 12.5e9, "12.5 GB/s" -> 12.5e9.

    Network datasheets quote bits per second ("bit/s", "b/s", "bps"); memories and buses quote
    bytes per second ("B/s"). A bare number is bytes/s.
    """
    value, unit = _split(text, what)
    allowed = "bit/s, Gbit/s, Gb/s, Gbps, B/s, GB/s, GiB/s, ... (a bare number is bytes/s)"
    if unit == "":
        return value
    for suffix, scale in (("bit/s", 0.125), ("b/s", 0.125), ("bps", 0.125), ("B/s", 1.0)):
        if unit.endswith(suffix):
            return value * scale * _prefix(unit[: -len(suffix)], str(text), what, allowed)
    raise UnitError(f"{what}: unknown bandwidth unit in {text!r}; allowed: {allowed}")


def parse_seconds(text: str | float | int, what: str = "time") -> Seconds:
    """Parse a duration: "1.5 us" -> 1.5e-6, "2ms" -> 2e-3 (seconds). A bare number is seconds."""
    value, unit = _split(text, what)
    if unit == "":
        return value
    if unit in _TIME:
        return value * _TIME[unit]
    raise UnitError(f"{what}: unknown time unit in {text!r}; allowed: {', '.join(_TIME)}")


def parse_flops(text: str | float | int, what: str = "compute rate") -> FlopsPerSecond:
    """Parse a compute rate: "10.6 TFLOP/s" -> 10.6e12 FLOP/s. A bare number is FLOP/s."""
    value, unit = _split(text, what)
    allowed = "FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s (also FLOPS)"
    if unit == "":
        return value
    for suffix in ("FLOP/s", "FLOPS", "flop/s"):
        if unit.endswith(suffix):
            return value * _prefix(unit[: -len(suffix)], str(text), what, allowed)
    raise UnitError(f"{what}: unknown compute-rate unit in {text!r}; allowed: {allowed}")


def format_bytes(size: Bytes) -> str:
    """Human form with decimal prefixes: 1.6e8 -> "160 MB"."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.4g} {prefix}B"
    return f"{size:.4g} B"
