"""Units: SI inside, human strings parsed once at load time.

Type aliases carry the unit in their name, as astra-network-analytical does. Every human
string ("100 Gbit/s", "16 GB", "1.5 us", "10.6 TFLOP/s") is turned into SI numbers here and
nowhere else. Decimal prefixes are powers of ten (GB = 1e9 B); binary prefixes must be written
as such (GiB = 2**30 B).

Every parser refuses what cannot be physical: non-finite numbers, magnitudes past ``LIMITS`` (an
exabyte, 8 Pbit/s, a year, a zettaFLOP/s) and non-zero values below the smallest meaningful one
(1 bit/s, a femtosecond, 1 FLOP/s); sizes are whole bytes. Signs and zeros are left to the caller,
which knows whether a zero latency or a negative offset means something.
"""

from __future__ import annotations

import math
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


# (smallest non-zero magnitude, largest magnitude, how to say them) per quantity, in SI units
LIMITS: dict[str, tuple[float, float, str]] = {
    "bytes": (1.0, 1e18, "1 B to 1 EB (1e18 B)"),
    "bandwidth": (0.125, 1e15, "1 bit/s to 8 Pbit/s (1e15 B/s)"),
    "seconds": (1e-15, 3.2e7, "1 fs to a year (3.2e7 s)"),
    "flops": (1.0, 1e21, "1 FLOP/s to 1e21 FLOP/s"),
}


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"{what}: expected a number with a unit, got {text!r}")
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        match = _QUANTITY.match(str(text))
        if not match:
            raise UnitError(f"{what}: cannot parse {text!r} as a number with a unit")
        value, unit = float(match.group("number")), match.group("unit")
    if not math.isfinite(value):
        raise UnitError(f"{what}: {text!r} is not a finite number")
    return value, unit


def within_limits(value: float, quantity: str, text: object, what: str) -> float:
    """``value`` (SI) if its magnitude is zero or within ``LIMITS[quantity]``; UnitError otherwise."""
    low, high, said = LIMITS[quantity]
    magnitude = abs(value)
    if not math.isfinite(value) or magnitude > high or 0 < magnitude < low:
        raise UnitError(f"{what}: {text!r} is outside what is physically meaningful; allowed: {said}")
    return value


def _prefix(prefix: str, text: str, what: str, allowed: str) -> float:
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    raise UnitError(f"{what}: unknown unit prefix {prefix!r} in {text!r}; allowed: {allowed}")


SIZE_UNITS = "B, kB, MB, GB, TB (decimal: 1 kB = 1000 B), KiB, MiB, GiB, TiB (binary: 1 KiB = 1024 B)"


def parse_bytes(text: str | float | int, what: str = "size") -> Bytes:
    """Parse a size: "16 GB" -> 16e9, "64KiB" -> 65536, "1e6" -> 1e6 (bytes).

    Units: B with decimal (k, M, G, T) or binary (Ki, Mi, Gi, Ti) prefixes. A bare number is bytes.
    The result is a whole number of bytes within ``LIMITS["bytes"]`` (UnitError otherwise).
    """
    value, unit = _split(text, what)
    if unit not in ("", "B"):
        if not unit.endswith("B"):
            raise UnitError(f"{what}: unknown size unit in {text!r}; allowed: {SIZE_UNITS}")
        value *= _prefix(unit[:-1], str(text), what, SIZE_UNITS)
    if abs(value) <= LIMITS["bytes"][1]:
        whole = round(value)
        # a whole number of bytes, allowing the last bits of a decimal product (1.1 kB = 1100.0000000000002)
        if abs(value - whole) > 1e-9 * max(1.0, abs(value)):
            raise UnitError(f"{what}: {text!r} is {value:g} bytes, not a whole number of bytes")
        value = float(whole)
    return within_limits(value, "bytes", text, what)


def parse_bandwidth(text: str | float | int, what: str = "bandwidth") -> BytesPerSecond:
    """Parse a bandwidth into bytes/s: "100 Gbit/s" -> 12.5e9, "12.5 GB/s" -> 12.5e9.

    Network datasheets quote bits per second ("bit/s", "b/s", "bps"); memories and buses quote
    bytes per second ("B/s"). A bare number is bytes/s.
    """
    value, unit = _split(text, what)
    allowed = "bit/s, Gbit/s, Gb/s, Gbps, B/s, GB/s, GiB/s, ... (a bare number is bytes/s)"
    if unit == "":
        return within_limits(value, "bandwidth", text, what)
    for suffix, scale in (("bit/s", 0.125), ("b/s", 0.125), ("bps", 0.125), ("B/s", 1.0)):
        if unit.endswith(suffix):
            rate = value * scale * _prefix(unit[: -len(suffix)], str(text), what, allowed)
            return within_limits(rate, "bandwidth", text, what)
    raise UnitError(f"{what}: unknown bandwidth unit in {text!r}; allowed: {allowed}")


def parse_seconds(text: str | float | int, what: str = "time") -> Seconds:
    """Parse a duration: "1.5 us" -> 1.5e-6, "2ms" -> 2e-3 (seconds). A bare number is seconds."""
    value, unit = _split(text, what)
    if unit not in ("", *_TIME):
        raise UnitError(f"{what}: unknown time unit in {text!r}; allowed: {', '.join(_TIME)}")
    return within_limits(value * _TIME.get(unit, 1.0), "seconds", text, what)


def parse_flops(text: str | float | int, what: str = "compute rate") -> FlopsPerSecond:
    """Parse a compute rate: "10.6 TFLOP/s" -> 10.6e12 FLOP/s. A bare number is FLOP/s."""
    value, unit = _split(text, what)
    allowed = "FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s (also FLOPS)"
    if unit == "":
        return within_limits(value, "flops", text, what)
    for suffix in ("FLOP/s", "FLOPS", "flop/s"):
        if unit.endswith(suffix):
            return within_limits(value * _prefix(unit[: -len(suffix)], str(text), what, allowed), "flops", text, what)
    raise UnitError(f"{what}: unknown compute-rate unit in {text!r}; allowed: {allowed}")


MAX_SWEEP_POINTS = 10_000


def parse_sizes(text: str, what: str = "--message-bytes") -> tuple[Bytes, ...]:
    """Parse message sizes (bytes): "100MB", "1KiB,4KiB", or a range "START:END:xF" / "START:END:+STEP".

    A range steps from START by the factor F (or adds STEP) and always ends at END: where the steps
    land on END it is the last of them ("1KiB:1GiB:x2": 1 KiB, 2 KiB, ..., 1 GiB, 21 sizes, as
    nccl-tests' -b 1K -e 1G -f 2), otherwise END follows the last step below it ("1KB:1GB:x2": 1 kB,
    2.048 kB, ..., 524.288 MB, 1 GB). Sizes are whole bytes > 0 (units as ``parse_bytes``); a range
    whose END is below its START is refused.
    """
    text = text.strip()
    if ":" not in text:
        sizes = [parse_bytes(item, what) for item in text.split(",")]
    else:
        parts = text.split(":")
        step = re.fullmatch(r"\s*([x*+])\s*(.+?)\s*", parts[2]) if len(parts) == 3 else None
        if step is None:
            raise UnitError(
                f"{what}: cannot parse {text!r}; write START:END:xFACTOR or START:END:+STEP, e.g. 1KiB:1GiB:x2"
            )
        start, end = parse_bytes(parts[0], what), parse_bytes(parts[1], what)
        if start > 0 and end < start:
            raise UnitError(f"{what}: the range {text!r} runs backwards (END {end:g} B < START {start:g} B); "
                            "write START:END with START <= END")  # fmt: skip
        geometric = step.group(1) in "x*"
        if geometric:
            try:
                factor = float(step.group(2))
            except ValueError:
                factor = math.nan
            if not factor >= 1.5 or not math.isfinite(factor):
                raise UnitError(f"{what}: the factor in {text!r} must be a number >= 1.5, e.g. x2")
        else:
            increment = parse_bytes(step.group(2), what)
            if not increment > 0:
                raise UnitError(f"{what}: the step in {text!r} must be > 0 bytes")
        sizes, current = [], start
        while start > 0 and current < end and not math.isclose(current, end, rel_tol=1e-9):
            sizes.append(float(round(current)))
            current = current * factor if geometric else current + increment
            if len(sizes) > MAX_SWEEP_POINTS:
                break
        sizes.append(end)  # the range ends at END whether or not a step lands on it
    if len(sizes) > MAX_SWEEP_POINTS:
        raise UnitError(f"{what}: {text!r} gives more than {MAX_SWEEP_POINTS} sizes; use a coarser step")
    for size in sizes:
        if not size > 0:
            raise UnitError(f"{what}: sizes must be > 0 bytes, got {text!r}")
    return tuple(sizes)


def format_bytes(size: Bytes) -> str:
    """Human form with decimal prefixes: 1.6e8 -> "160 MB"."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.4g} {prefix}B"
    return f"{size:.4g} B"
