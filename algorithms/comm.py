"""The ``Comm`` seam: role programs talk to the world only through these operations.

A role program (worker, server, master) is a plain generator function. It yields operations and
receives their results::

    def worker(comm, trainer, steps):
        for step in range(steps):
            grads = yield comm.compute(trainer.gradients(step))      # result of the work
            total = yield comm.allreduce(grads, algorithm="ring")     # reduced payload
            yield comm.compute(trainer.apply(total))

A collective can also be started without waiting (``handle = yield comm.start(comm.allreduce(...))``)
and waited for later (``results = yield comm.wait(handle, ...)``): that is how a backward pass
overlaps the all-reduce of its gradient buckets. Each rank has one communication stream: the
collectives it starts run one after another in the order started, each entering once it was started
and the previous one finished (as Horovod's background thread and PyTorch DDP's NCCL stream do).
A blocking collective is a start followed by a wait. Sends and receives can be started too
(``MPI_Isend``/``MPI_Irecv``): they begin at once, beside the stream, and a pipeline stage that
starts its send before its receive cannot deadlock with its neighbour; waiting for a started
receive gives its payload.

Executors interpret the operations:

* the SimPy executor (``simulator``): ``Compute`` waits ``work.duration_s``; ``Send``/``Recv``
  move ``payload.nbytes`` over the modeled fabric; payloads are size-only (``Sized``);
* the MPI executor (``real_runs``): ``Compute`` calls ``work.run()`` (real torch work);
  ``Send``/``Recv`` are real messages carrying numpy arrays; collectives run their schedule.

Work objects come from an executor-specific trainer (simulated: a duration from the cost model;
real: a closure over torch); the role program never looks inside them.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
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
    """Run a registered collective algorithm's schedule over ``group`` (all ranks if None).

    ``algorithm`` is a collective-algorithm token or a library selector (``nccl``, ``mpich``...),
    resolved per message size as that library does. ``helpers``: ranks that take part in the
    schedule without contributing data (a parameter-server collective's dedicated servers); they
    call the same operation with a buffer of the same size.
    """

    collective: str
    payload: Any
    algorithm: str = "ring"
    options: dict[str, Any] = field(default_factory=dict)
    group: Sequence[int] | None = None
    helpers: Sequence[int] = ()


@dataclass(frozen=True)
class Start:
    """Start ``operation`` and go on; the result is a handle. A collective goes on the rank's
    communication stream; a send or a receive begins at once."""

    operation: Collective | Send | Recv


@dataclass(frozen=True)
class Wait:
    """Wait until every started operation of ``handles`` is done; the result: their results, in order."""

    handles: tuple[Any, ...]


Operation = Compute | Send | Recv | Collective | Start | Wait
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
    def allreduce(
        payload: Any,
        algorithm: str = "ring",
        group: Sequence[int] | None = None,
        helpers: Sequence[int] = (),
        **options,
    ) -> Collective:
        return Collective("allreduce", payload, algorithm, options, group, helpers)

    @staticmethod
    def collective(
        collective: str, payload: Any, algorithm: str = "ring", group: Sequence[int] | None = None, **options
    ) -> Collective:
        return Collective(collective, payload, algorithm, options, group)

    @staticmethod
    def start(operation: Collective | Send | Recv) -> Start:
        return Start(operation)

    @staticmethod
    def wait(*handles: Any) -> Wait:
        return Wait(tuple(handles))


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
