"""The collective-algorithm extension point.

A collective algorithm turns (collective, ranks, options) into a ``Schedule`` and gives the
closed-form time of that schedule on an uncontended fabric. Register one per file named
``<variant>_collective.py``; tokens are the file's variant (``ring``, ``halving_doubling``...).
"""

from __future__ import annotations

import numbers
from typing import Any, Protocol

from ddlsim.algorithms.schedule import COLLECTIVES, FabricCosts, Schedule, ScheduleError
from ddlsim.registry import Registry


class CollectiveAlgorithm(Protocol):
    name: str
    collectives: tuple[str, ...]

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        """The rounds of ``collective`` over ``ranks`` ranks (block placement, ``devices_per_node`` per node)."""
        ...

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Seconds the schedule takes on an uncontended fabric with hop costs ``costs``."""
        ...


COLLECTIVE_ALGORITHMS: Registry[CollectiveAlgorithm] = Registry(
    "collective algorithm", package="ddlsim.algorithms", suffix="_collective"
)


def helper_ranks(algorithm: str, ranks: int, **options: Any) -> int:
    """Relay ranks a collective algorithm's schedule adds to ``ranks`` workers (a parameter server's
    dedicated servers), without building the schedule; 0 for library selectors and most algorithms,
    which declare no ``helper_ranks``."""
    from ddlsim.algorithms.selectors import LIBRARIES

    if algorithm in LIBRARIES:  # asked first: a library's token is no file's name, and would load every one
        return 0
    impl = COLLECTIVE_ALGORITHMS.get(algorithm) if algorithm in COLLECTIVE_ALGORITHMS else None
    count = getattr(impl, "helper_ranks", None)
    return int(count(ranks, **options)) if count is not None else 0


def is_collective_token(token: str) -> bool:
    """A registered collective algorithm or a library selector (``nccl``, ``mpich``, ``mlsl``, ``openmpi``)."""
    from ddlsim.algorithms.selectors import LIBRARIES

    return token in LIBRARIES or token in COLLECTIVE_ALGORITHMS


def collective_tokens() -> list[str]:
    from ddlsim.algorithms.selectors import LIBRARIES

    return [*COLLECTIVE_ALGORITHMS.names(), *LIBRARIES.names()]


def resolve(
    algorithm: str,
    collective: str,
    message_bytes: float,
    ranks: int,
    devices_per_node: int = 1,
    nics_per_node: int = 1,
) -> tuple[str, dict[str, Any]]:
    """(algorithm token, options): a collective-algorithm token stays itself; a library selector picks
    as that library does for this size, rank count, members per node and NICs they reach on a node
    (``algorithms.selectors``)."""
    from ddlsim.algorithms.selectors import LIBRARIES, select

    if algorithm in LIBRARIES:
        return select(algorithm, collective, message_bytes, ranks, devices_per_node, nics_per_node)
    if algorithm not in COLLECTIVE_ALGORITHMS:
        raise ScheduleError(
            f"unknown collective algorithm {algorithm!r}; valid: {', '.join(collective_tokens())}"
        )
    return algorithm, {}


def options_key(options: dict[str, Any]) -> tuple:
    """``options`` as a hashable, order-free key for the caches of schedules and times: nested
    option dicts (``hierarchical``'s ``inner_options``) and lists become sorted tuples."""

    def frozen(value: Any) -> Any:
        if isinstance(value, dict):
            return tuple(sorted((key, frozen(item)) for key, item in value.items()))
        if isinstance(value, (list, tuple)):
            return tuple(frozen(item) for item in value)
        return value

    return frozen(options)


def check_collective(algorithm: CollectiveAlgorithm, collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ScheduleError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if collective not in algorithm.collectives:
        raise ScheduleError(
            f"algorithm {algorithm.name!r} does not implement {collective}; it implements: "
            f"{', '.join(algorithm.collectives)}"
        )


def reject_options(algorithm: str, options: dict[str, Any], allowed: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        valid = ", ".join(allowed) if allowed else "none"
        raise ScheduleError(
            f"algorithm {algorithm!r}: unknown option(s) {', '.join(unknown)}; valid: {valid}"
        )


def positive_int_option(algorithm: str, options: dict[str, Any], key: str, default: int = 1) -> int:
    """``options[key]`` (``default`` when absent) as an int; anything but a positive integer (a bool
    included) is refused, naming the algorithm and the option."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:  # numpy's ints included
        raise ScheduleError(f"{algorithm}: {key} must be a positive integer, got {value!r}")
    return int(value)
