"""The real executor of the ``Comm`` seam: role programs run on real ranks, every op timed.

``MpiComm.perform(op)`` executes one ``algorithms.comm`` operation:

* ``Compute``: ``op.work.run()`` (real torch work), traced under ``work.name``;
* ``Send``: a small header (kind, dtype, shape) then the payload's bytes, to ``op.dst``;
* ``Recv``: the header tells shape and dtype; the payload lands in ``like`` when it fits, else in a
  new array; ``ANY_SOURCE`` returns ``(source, payload)``;
* ``Collective``: the registered algorithm's schedule (or a library selector's choice) over
  ``op.group`` (all ranks by default, then ``op.helpers``), run by ``run_schedule`` on a copy of
  the payload; the result has the payload's type (numpy array or torch tensor).
* ``Start``: a collective is queued on the rank's communication stream, a thread of its own over a
  duplicate of the transport (as Horovod's background thread), which runs started collectives one
  after another in order; a send is posted at once (``isend`` of its header and bytes); a receive
  is taken when waited for (its sender's send is posted, so nothing waits on it). The result is a
  handle. ``Wait`` blocks until the handles are done and returns their results (re-raising an error
  of the stream in the caller).

Payloads are numpy arrays, torch tensors (received as numpy arrays) or any picklable object.
The name says MPI, but any ``Transport`` works (``make_transport("gloo")`` too); receiving from
``ANY_SOURCE`` needs a transport with ``recv_any`` (``MpiTransport`` has it).
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, resolve
from ddlsim.algorithms.comm import ANY_SOURCE, Collective, CommOps, Compute, Recv, RoleProgram, Send, Start, Wait, drive
from ddlsim.real_runs.schedule_executor import SCHEDULE_TAG, Workspace, build_schedule, run_schedule
from ddlsim.real_runs.transport import Transport, make_transport

HEADER_SLOTS = 12  # kind, dtype, ndim, up to 9 dimensions
MAX_DIMS = HEADER_SLOTS - 3
ARRAY, PICKLED = 0, 1
# dtypes that travel as arrays; anything else is pickled
DTYPES = tuple(np.dtype(name) for name in (
    "float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
))  # fmt: skip
COLLECTIVE_TAG = SCHEDULE_TAG + 1


class CommExecutorError(RuntimeError):
    """An operation cannot run on this executor; the message says why."""


def _to_numpy(payload: Any) -> tuple[np.ndarray | None, bool]:
    """(array, was_torch): the payload as a contiguous numpy array, or None when it must be pickled."""
    if isinstance(payload, np.ndarray):
        return (np.ascontiguousarray(payload) if payload.dtype in DTYPES else None), False
    module = type(payload).__module__
    if module.startswith("torch") and hasattr(payload, "detach"):
        return np.ascontiguousarray(payload.detach().cpu().numpy()), True
    return None, False


class Handle:
    """A started operation: a collective on the communication stream, or a point-to-point one
    (``requests`` of a posted send; ``receive`` to take when waited for)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.requests: list[Any] = []
        self.receive: Recv | None = None


class CommStream:
    """The rank's communication stream: a thread that runs started collectives one after another."""

    def __init__(self, run) -> None:
        self._run = run  # Collective -> result, on the stream's transport
        self._queue: queue.Queue[tuple[Handle, Collective] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="comm-stream", daemon=True)
        self._thread.start()

    def start(self, op: Collective) -> Handle:
        handle = Handle()
        self._queue.put((handle, op))
        return handle

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            handle, op = item
            try:
                handle.result = self._run(op)
            except BaseException as error:  # handed to the waiting thread
                handle.error = error
            finally:
                handle.done.set()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class MpiComm(CommOps):
    """Executes ``algorithms.comm`` operations for real on ``transport`` (default: MPI COMM_WORLD).

    ``tracer`` (a ``real_runs.trace.TraceWriter``) receives one row per op; ``now()`` is seconds
    since the tracer's synchronised start (or since this object was made, without a tracer).
    """

    def __init__(self, transport: Transport | None = None, tracer: Any = None, *, trace_transfers: bool = False):
        self.transport = transport if transport is not None else make_transport("mpi")
        self.tracer = tracer
        self.trace_transfers = trace_transfers  # also record the sends/receives inside collectives
        self._origin_ns = time.perf_counter_ns()
        self._workspace = Workspace()
        self._stream: CommStream | None = None

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    def now(self) -> float:
        if self.tracer is not None:
            return float(self.tracer.now_s())
        return (time.perf_counter_ns() - self._origin_ns) * 1e-9

    def _record(self, op: str, start_ns: int, *, peer: int = -1, nbytes: int = 0) -> None:
        if self.tracer is not None:
            self.tracer.record(op, start_ns, time.perf_counter_ns(), peer=peer, nbytes=nbytes)

    def perform(self, op: Any) -> Any:
        start = time.perf_counter_ns()
        if isinstance(op, Compute):
            result = op.work.run()
            self._record(str(getattr(op.work, "name", "compute")), start)
            return result
        if isinstance(op, Send):
            nbytes = self._send(op)
            self._record("send", start, peer=op.dst, nbytes=nbytes)
            return None
        if isinstance(op, Recv):
            source, payload = self._recv(op)
            nbytes = payload.nbytes if isinstance(payload, np.ndarray) else 0
            self._record("recv", start, peer=source, nbytes=nbytes)
            return (source, payload) if op.src == ANY_SOURCE else payload
        if isinstance(op, Collective):
            result, nbytes = self._collective(op, self.transport, self._workspace)
            self._record(op.collective, start, nbytes=nbytes)
            return result
        if isinstance(op, Start):
            operation = op.operation
            if isinstance(operation, Collective):
                return self._communication_stream().start(operation)
            handle = Handle()
            if isinstance(operation, Send):
                handle.requests, nbytes = self._post_send(operation)
                self._record("send", start, peer=operation.dst, nbytes=nbytes)
            else:
                handle.receive = operation
            handle.done.set()
            return handle
        if isinstance(op, Wait):
            # receives first: a neighbour's posted send of a large message completes only once this
            # rank receives it, and that neighbour may be waiting for its own send just the same
            for handle in op.handles:
                if handle.receive is not None:
                    handle.result = self.perform(handle.receive)
                    handle.receive = None
            results = []
            for handle in op.handles:
                handle.done.wait()
                if handle.error is not None:
                    raise handle.error
                if handle.requests:
                    self.transport.wait_all(handle.requests)
                    handle.requests = []
                results.append(handle.result)
            return results
        raise CommExecutorError(f"unknown operation {op!r}; valid: Compute, Send, Recv, Collective, Start, Wait")

    def _communication_stream(self) -> CommStream:
        if self._stream is None:
            dup = getattr(self.transport, "dup", None)
            transport = dup() if dup is not None else self.transport
            workspace = Workspace()

            def run(op: Collective) -> Any:
                iteration = getattr(self.tracer, "iteration", None)
                start = time.perf_counter_ns()
                result, nbytes = self._collective(op, transport, workspace)
                if self.tracer is not None:
                    self.tracer.record(op.collective, start, time.perf_counter_ns(), nbytes=nbytes, iteration=iteration)
                return result

            self._stream = CommStream(run)
        return self._stream

    def close(self) -> None:
        """End the communication stream (after the role program: nothing is left on it)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # --- point to point ----------------------------------------------------------------------

    def _send(self, op: Send) -> int:
        requests, nbytes = self._post_send(op)
        self.transport.wait_all(requests)
        return nbytes

    def _post_send(self, op: Send) -> tuple[list[Any], int]:
        """Post a message (its header, then its bytes); the requests and the payload's bytes."""
        array, _ = _to_numpy(op.payload)
        header = np.zeros(HEADER_SLOTS, dtype=np.int64)
        if array is None or array.ndim > MAX_DIMS:
            array = np.frombuffer(pickle.dumps(op.payload), dtype=np.uint8)
            header[0] = PICKLED
        header[1] = DTYPES.index(array.dtype)
        header[2] = array.ndim
        header[3 : 3 + array.ndim] = array.shape
        requests = [self.transport.isend(header, op.dst, op.tag), self.transport.isend(array, op.dst, op.tag)]
        return requests, int(array.nbytes)

    def _recv(self, op: Recv) -> tuple[int, Any]:
        header = np.zeros(HEADER_SLOTS, dtype=np.int64)
        source = op.src
        if source == ANY_SOURCE:
            recv_any = getattr(self.transport, "recv_any", None)
            if recv_any is None:
                raise CommExecutorError(
                    f"{type(self.transport).__name__} cannot receive from any source; name the source rank"
                )
            source = int(recv_any(header, op.tag))
        else:
            self.transport.wait_all([self.transport.irecv(header, source, op.tag)])
        kind, dtype, shape = int(header[0]), DTYPES[int(header[1])], tuple(int(d) for d in header[3 : 3 + header[2]])
        like = op.like
        if (
            kind == ARRAY and isinstance(like, np.ndarray) and like.shape == shape and like.dtype == dtype
            and like.flags.c_contiguous
        ):  # fmt: skip
            target = like
        else:
            target = np.empty(shape, dtype=dtype)
        self.transport.wait_all([self.transport.irecv(target, source, op.tag)])
        return source, (pickle.loads(target.tobytes()) if kind == PICKLED else target)

    # --- collectives ------------------------------------------------------------------------

    def _collective(self, op: Collective, transport: Transport, workspace: Workspace) -> tuple[Any, int]:
        array, was_torch = _to_numpy(op.payload)
        if array is None:
            raise CommExecutorError(f"collective payloads must be numeric arrays, got {type(op.payload).__name__}")
        group = tuple(op.group) if op.group is not None else tuple(range(self.size))
        token, chosen = resolve(op.algorithm, op.collective, float(array.nbytes), len(group))
        options = {**chosen, **op.options}
        if "value_bytes" in getattr(COLLECTIVE_ALGORITHMS.get(token), "options", ()):
            options.setdefault("value_bytes", array.itemsize)  # sparse values travel in the buffer's precision
        schedule = build_schedule(token, op.collective, len(group), **options)
        buffer = array.copy()
        tracer = self.tracer if self.trace_transfers else None
        run_schedule(schedule, buffer, transport, tracer, group=(*group, *op.helpers), tag=COLLECTIVE_TAG,
                     workspace=workspace)  # fmt: skip
        if was_torch:
            import torch

            return torch.from_numpy(buffer), int(array.nbytes)
        return buffer, int(array.nbytes)


def run_role_program(program: RoleProgram, comm: MpiComm) -> Any:
    """Run one rank's role program to completion on ``comm``; returns the program's return value."""
    try:
        return drive(program, comm.perform)
    finally:
        comm.close()
