"""The ``Comm`` seam: role programs talk to the world only through these operations.

A role program (worker, server, master) is a plain generator function. It yields operations and
receives their results::

    def worker(comm, trainer, steps):
        for step in range(steps):
            grads = yield comm.compute(trainer.gradients(step))      # result of the work
            total = yield comm.allreduce(grads, algorithm="ring")     # reduced payload
            yield comm.compute(trainer.apply(total))

Executors interpret the operations:

* the SimPy executor (``simulator``): ``Compute`` waits ``work.duration_s``; ``Send``/``Recv``
  move ``payload.nbytes`` over the modeled fabric; payloads are size-only (``Sized``);
* the MPI executor (``real_runs``): ``Compute`` calls ``work.run()`` (real torch work);
  ``Send``/``Recv`` are real messages carrying numpy arrays; collectives run their schedule.

Work objects come from an executor-specific trainer (simulated: a duration from the cost model;
real: a closure over torch); the role program never looks inside them.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

ANY_SOURCE = -1


class Work(Protocol):
    """Something to compute: simulated executors read ``duration_s``, real ones call ``run()``."""

    name: str

    @property
    def duration_s(self) -> float: ...

    def run(self) -> Any: ...


@dataclass(frozen=True)
class Sized:
    """A size-only payload for simulation: ``nbytes`` bytes of ``what``."""

    nbytes: float
    what: str = "payload"


@dataclass(frozen=True)
class Compute:
    work: Any  # a Work


@dataclass(frozen=True)
class Send:
    dst: int
    payload: Any  # numpy array (real) or Sized (simulated); anything with .nbytes
    tag: int = 0


@dataclass(frozen=True)
class Recv:
    """Receive from ``src``; with ``src == ANY_SOURCE`` the result is ``(source, payload)``."""

    src: int
    tag: int = 0
    like: Any = None  # real executors: an array of the expected shape/dtype to receive into


@dataclass(frozen=True)
class Collective:
    """Run a registered collective algorithm's schedule over ``group`` (all ranks if None)."""

    collective: str
    payload: Any
    algorithm: str = "ring"
    options: dict[str, Any] = field(default_factory=dict)
    group: tuple[int, ...] | None = None


Operation = Compute | Send | Recv | Collective
RoleProgram = Generator[Operation, Any, Any]


class Comm(Protocol):
    """What a role program sees of its executor."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def now(self) -> float: ...


class CommOps:
    """Operation constructors, mixed into every executor's comm object (and usable standalone)."""

    @staticmethod
    def compute(work: Any) -> Compute:
        return Compute(work)

    @staticmethod
    def send(dst: int, payload: Any, tag: int = 0) -> Send:
        return Send(dst, payload, tag)

    @staticmethod
    def recv(src: int = ANY_SOURCE, tag: int = 0, like: Any = None) -> Recv:
        return Recv(src, tag, like)

    @staticmethod
    def allreduce(payload: Any, algorithm: str = "ring", group: tuple[int, ...] | None = None, **options) -> Collective:
        return Collective("allreduce", payload, algorithm, options, group)

    @staticmethod
    def collective(
        collective: str, payload: Any, algorithm: str = "ring", group: tuple[int, ...] | None = None, **options
    ) -> Collective:
        return Collective(collective, payload, algorithm, options, group)


def drive(program: RoleProgram, perform) -> Any:
    """Run a role program synchronously: ``perform(op)`` executes each operation and returns its result.

    This is the whole loop of a blocking executor (the MPI one); the SimPy executor wraps the same
    generator in a SimPy process instead.
    """
    result: Any = None
    try:
        while True:
            op = program.send(result)
            result = perform(op)
    except StopIteration as stop:
        return stop.value
