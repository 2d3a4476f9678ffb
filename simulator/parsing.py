"""Parsing what users type that has no unit: counts ("1,2,4,...,256", "2:4096:x2") and bounded numbers.

The command line's shared helper (sizes with units are ``hardware_models.units.parse_sizes``). It
lives beside the command line rather than in it so that library code may name it too (``sweep``
keeps ``parse_counts`` importable), and it imports nothing heavy, so that ``ddlsim --help`` and
the argument checks stay instant.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
from collections.abc import Callable

MAX_COUNT = 2**24  # 16,777,216: ranks or nodes past any machine built (the largest have about 10^5 nodes)
MAX_SWEEP_POINTS = 10_000


class InputError(ValueError):
    """Bad command-line input detected by a command itself (one line, exit status 2)."""


ALLOWED_COUNTS = "a list (1,2,4), a continued list (1,2,4,...,256) or a range (1:256:x2, 2:16:+2, 1:8)"


def parse_counts(text: str, what: str = "nodes", maximum: int = MAX_COUNT) -> tuple[int, ...]:
    """Parse counts: "1,2,4", "1,2,4,...,256" (continue the pattern), "1:256:x2", "2:16:+2", "1:8".

    Example: "1,2,4,...,32" -> (1, 2, 4, 8, 16, 32); "1:9:+4" -> (1, 5, 9). A range always ends at
    its END ("1:100:x2" -> 1, 2, ..., 64, 100); a continued list must land on its last item. Counts
    are whole numbers from 1 to ``maximum``; InputError names what was wrong.
    """
    text = text.strip()
    if ":" in text:
        counts = _range(text, what)
    else:
        items = [item.strip() for item in text.split(",")]
        numbers = [_integer(item, text, what) for item in items if item != "..."]
        if "..." in items:
            at = items.index("...")
            if at < 2 or at != len(items) - 2 or items.count("...") > 1:
                raise InputError(f"{what}: '...' must follow two or more counts and precede the last one, "
                                 f"e.g. 1,2,4,...,256; got {text!r}")  # fmt: skip
            counts = _continue(numbers[:-1], numbers[-1], text, what)
        else:
            counts = tuple(numbers)
    bad = [count for count in counts if count < 1]
    if bad:
        raise InputError(f"{what}: counts must be positive, got {bad[0]}")
    if max(counts) > maximum:
        raise InputError(f"{what}: {max(counts):,} is past the largest count allowed, {maximum:,}")
    return counts


def _integer(item: str, text: str, what: str) -> int:
    try:
        return int(item)
    except ValueError:
        raise InputError(f"{what}: cannot parse {text!r}; allowed: {ALLOWED_COUNTS}") from None


def _range(text: str, what: str) -> tuple[int, ...]:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise InputError(f"{what}: cannot parse {text!r}; allowed: {ALLOWED_COUNTS}")
    start, end = _integer(parts[0], text, what), _integer(parts[1], text, what)
    step = parts[2].strip() if len(parts) == 3 else "+1"
    match = re.fullmatch(r"([x*+])(\d+)", step)
    if not match or int(match.group(2)) < (2 if match.group(1) in "x*" else 1):
        raise InputError(f"{what}: the step of {text!r} must be xF with F >= 2 or +S with S >= 1")
    if start < 1:
        raise InputError(f"{what}: counts must be positive, got {start}")
    if end < start:
        raise InputError(f"{what}: the range {text!r} runs backwards (END {end} < START {start}); "
                         "write START:END with START <= END")  # fmt: skip
    factor, geometric = int(match.group(2)), match.group(1) in "x*"
    values: list[int] = []
    current = start
    while current < end and len(values) <= MAX_SWEEP_POINTS:
        values.append(current)
        current = current * factor if geometric else current + factor
    if len(values) > MAX_SWEEP_POINTS:
        raise InputError(f"{what}: {text!r} gives more than {MAX_SWEEP_POINTS} points; use a coarser step")
    return (*values, end)  # a range ends at END whether or not a step lands on it


def _continue(head: list[int], last: int, text: str, what: str) -> tuple[int, ...]:
    """Extend ``head`` by its ratio (or else its difference) up to ``last``, which it must land on."""
    a, b = head[-2], head[-1]
    candidates: list[Callable[[int], int]] = []
    if a > 0 and b % a == 0 and b // a >= 2:
        candidates.append(lambda v: v * (b // a))
    if b > a:
        candidates.append(lambda v: v + (b - a))
    for step in candidates:
        if any(step(x) != y for x, y in itertools.pairwise(head)):
            continue
        values = list(head)
        while values[-1] < last and len(values) <= MAX_SWEEP_POINTS:
            values.append(step(values[-1]))
        if values[-1] == last:
            return tuple(values)
    shown = ",".join(map(str, head))
    hint = f"x{b // a}" if a > 0 and b % a == 0 and b // a >= 2 else f"+{max(b - a, 1)}"
    raise InputError(
        f"{what}: the pattern {shown},... does not reach {last} (of {text!r}); give a last count the "
        f"pattern lands on, or a range, which always ends at its END: {head[0]}:{last}:{hint}"
    )


def bounded(kind: type, low: float, high: float, what: str) -> Callable[[str], float]:
    """An argparse ``type`` for an int or float in [low, high]; anything else is a one-line error."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} takes {'a whole number' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None  # fmt: skip
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be in [{low:g}, {high:g}], got {text!r}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert
