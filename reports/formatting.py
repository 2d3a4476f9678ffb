"""How numbers are shown to people: one unit and one format per quantity, in the terminal, the plots
and the HTML report alike.

Result files hold SI values under names with unit suffixes (``iteration_s``, ``busbw_Bps``) and
fractions as fractions (``scaling_efficiency`` 0.97, ``median_ape`` 0.405). ``quantity_of(name)``
says what a column is and the fixed unit it is shown in, the same for every table and every run
(as nccl-tests always shows busbw in GB/s), so headers do not change with the data:

- counts (nodes, ranks, steps...) as whole numbers (a fractional count of steps rounds up);
- fractions as percent (x 100, unit ``%``); ratios such as speedup without a unit;
- times in the unit of their suffix (``_s``, ``_ms``, ``_us``), rates in bytes/s as GB/s,
  samples/s as they are;
- one number of decimals for the column: four significant digits on its largest value, more (up
  to three more) so its smallest shows two, scientific notation for the column when even that
  cannot hold both;
- ``-`` where a figure does not apply (empty, None, NaN).

A table header carries the unit: ``header(name, unit)`` gives the terminal's single token in the
project's suffix style (``iteration_s``, ``busbw_GBps``, ``scaling_efficiency_pct``),
``label_with_unit`` the report's and the plots' ``iteration (s)``. ``format_value`` writes one
number with its unit in a sentence or a title (``40.5 %``, ``1.21 ms``: there the SI prefix suits
the number). Nothing here imports more than the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MISSING = "-"


@dataclass(frozen=True)
class Quantity:
    """What a column holds: ``label`` (snake_case), the ``unit`` it is shown in, ``scale`` (shown =
    stored x scale) and ``kind``: ``count``, ``real`` or ``text``."""

    label: str
    unit: str = ""
    scale: float = 1.0
    kind: str = "real"
    round_up: bool = False  # counts that a model gives as fractions (steps to a target): the next whole one


COUNTS = (
    "nodes", "devices", "ranks", "global_batch", "per_device_batch", "updates", "steps", "buckets", "servers",
    "repeats", "devices_per_node", "n_predicted", "n_cannot_model", "bootstrap_samples", "rank", "iteration",
    "count", "workers",
)  # fmt: skip
FRACTIONS = (
    "scaling_efficiency", "comm_share", "server_utilisation", "ci_coverage", "median_ape", "p90_ape", "max_ape",
    "tolerance", "ci_level", "overlap_interference", "mfu",
)  # fmt: skip
SPECIAL = {
    "steps_to_target": Quantity("steps_to_target", kind="count", round_up=True),
    "speedup": Quantity("speedup", "x"),
    "staleness_mean": Quantity("staleness_mean", "steps"),
    "staleness_p99": Quantity("staleness_p99", "steps"),
    "throughput_samples_per_s": Quantity("throughput", "samples/s"),
    "tokens_per_s": Quantity("tokens_per_s"),  # a rate, not seconds (the "_s" suffix)
}
# unit suffix of a stored name -> (unit shown, shown = stored x scale)
SUFFIXES = (
    ("_GBps", "GB/s", 1.0), ("_Bps", "GB/s", 1e-9), ("_bytes", "B", 1.0), ("_ms", "ms", 1.0), ("_us", "µs", 1.0),
    ("_s", "s", 1.0), ("_pct", "%", 1.0),
)  # fmt: skip
# SI prefixes for one number in a sentence (format_value), by base unit
PREFIXES = {
    "s": ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")),
    "B": ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")),
    "B/s": ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")),
}
# a shown unit as a name suffix (the terminal's header token)
SUFFIX_OF_UNIT = {"%": "pct", "B/s": "Bps", "kB/s": "kBps", "MB/s": "MBps", "GB/s": "GBps", "TB/s": "TBps",
                  "µs": "us", "samples/s": "samples_per_s", "B": "bytes", "x": "", "steps": ""}  # fmt: skip


def quantity_of(name: str) -> Quantity:
    """What the stored column ``name`` holds and how it is shown (unknown names: plain numbers)."""
    if name in SPECIAL:
        return SPECIAL[name]
    if name in COUNTS:
        return Quantity(name, kind="count")
    if name in FRACTIONS:
        return Quantity(name, "%", 100.0)
    for suffix, unit, scale in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return Quantity(name[: -len(suffix)], unit, scale)
    return Quantity(name)


def number_or_none(value: Any) -> float | None:
    """A float for a number or numeric text; None for what does not apply (empty, None, NaN, text)."""
    if value is None or isinstance(value, bool) or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


_TO_BASE = {"GB/s": 1e9, "ms": 1e-3, "µs": 1e-6}  # a shown unit in its base unit


def _prefix(base: str, largest: float) -> tuple[float, str]:
    """(factor, unit with prefix) for a number of magnitude ``largest`` in the ``base`` unit."""
    steps = PREFIXES.get(base, ((1.0, ""),))
    for factor, prefix in steps:
        if largest >= factor:
            return factor, prefix + base
    factor, prefix = steps[-1]
    return factor, prefix + base


def _decimals(values: Sequence[float]) -> int | None:
    """Decimals for a column (None: scientific notation); see the module docstring."""
    finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
    if not finite:
        return 0
    largest, smallest = max(finite), min(finite)
    decimals = max(0, 3 - math.floor(math.log10(largest)))
    wanted = max(0, 1 - math.floor(math.log10(smallest)))  # two significant digits on the smallest
    if wanted > decimals + 3 or (decimals == 0 and largest >= 1e7):
        return None
    return max(decimals, wanted)


def _number(value: float, decimals: int | None) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if decimals is None:
        return f"{value:.3e}"
    return f"{value:.{decimals}f}"


def format_column(values: Iterable[Any], quantity: Quantity) -> tuple[str, list[str]]:
    """(the unit shown, one string per value) for a column: one format for every row."""
    raw = list(values)
    numbers = [number_or_none(value) for value in raw]
    if quantity.kind == "text" or (all(n is None for n in numbers) and any(v not in (None, "") for v in raw)):
        return "", [MISSING if value in (None, "") else str(value) for value in raw]
    if quantity.kind == "count":
        whole = [None if n is None else (math.ceil(n - 1e-9) if quantity.round_up else round(n)) for n in numbers]
        return quantity.unit, [MISSING if n is None else (str(n) if math.isfinite(n) else "inf") for n in whole]
    shown = [None if n is None else n * quantity.scale for n in numbers]
    decimals = _decimals([v for v in shown if v is not None])
    return quantity.unit, [MISSING if v is None else _number(v, decimals) for v in shown]


def format_size(size: float) -> str:
    """A message or buffer size: binary prefixes where it is a whole number of them (65536 -> "64 KiB",
    as the user most likely typed it), decimal otherwise (1.6e8 -> "160 MB"); 1 kB = 1000 B."""
    for prefix, scale in (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
        if abs(size) >= scale and (size / scale).is_integer() and abs(size) / scale < 1024:
            return f"{size / scale:.0f} {prefix}B"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.4g} {prefix}B"
    return f"{size:.4g} B"


def header(name: str, unit: str) -> str:
    """The terminal's header token: the label with the unit as a suffix (``iteration_ms``)."""
    label = quantity_of(name).label
    suffix = SUFFIX_OF_UNIT.get(unit, unit.replace("/", "p"))
    return f"{label}_{suffix}" if suffix else label


def label_with_unit(name: str, unit: str) -> str:
    """The report's and plots' heading: ``iteration (ms)``, ``scaling efficiency (%)``."""
    label = quantity_of(name).label.replace("_", " ")
    return f"{label} ({unit})" if unit else label


def format_value(value: Any, name: str) -> str:
    """One number of the stored column ``name`` with its unit: ``40.5 %``, ``1.21 ms``, ``-``."""
    quantity = quantity_of(name)
    number = number_or_none(value)
    if number is None:
        return MISSING if value is None or value == "" or _is_nan(value) else str(value)
    if quantity.kind == "count":
        return str(math.ceil(number - 1e-9) if quantity.round_up else round(number))
    shown, unit = number * quantity.scale, quantity.unit
    base = {"GB/s": "B/s", "ms": "s", "µs": "s"}.get(unit, unit)
    if base in PREFIXES and math.isfinite(shown):  # in a sentence, the prefix that suits the number
        factor, unit = _prefix(base, abs(number * quantity.scale * _TO_BASE.get(unit, 1.0)))
        shown = number * quantity.scale * _TO_BASE.get(quantity.unit, 1.0) / factor
    text = f"{shown:.3g}" if math.isfinite(shown) else ("inf" if shown > 0 else "-inf")
    return f"{text} {unit}" if unit and unit != "x" else (f"{text}x" if unit == "x" else text)


def _is_nan(value: Any) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(units shown, cells) for ``columns`` of ``rows``: each column formatted as one (``format_column``)."""
    units, cells_by_column = [], []
    for column in columns:
        unit, cells = format_column((row.get(column) for row in rows), quantity_of(column))
        units.append(unit)
        cells_by_column.append(cells)
    return units, [list(line) for line in zip(*cells_by_column, strict=True)] if rows else []


def validation_headline(summary: dict[str, Any]) -> str:
    """A validation's summary (``summary.json``, fractions) in one line with units:
    ``median APE 40.5 %, p90 55 %, 90 % CI coverage 50 %, tolerance 10 %: FAIL``."""
    level = format_value(summary.get("ci_level"), "ci_level")
    return (
        f"median APE {format_value(summary.get('median_ape'), 'median_ape')}, "
        f"p90 {format_value(summary.get('p90_ape'), 'p90_ape')}, "
        f"{level} CI coverage {format_value(summary.get('ci_coverage'), 'ci_coverage')}, "
        f"tolerance {format_value(summary.get('tolerance'), 'tolerance')}: "
        + ("PASS" if summary.get("passed") else "FAIL")
    )
