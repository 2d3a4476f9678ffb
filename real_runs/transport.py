"""Transports: the point-to-point layer under the real executors (MPI via mpi4py; gloo elsewhere).

A transport moves numpy arrays between ranks with non-blocking sends and receives, and offers the
communication library's own collectives (``reference``) so every schedule we run can be checked
against the library on the same data. ``make_transport("mpi")`` gives ``MpiTransport(COMM_WORLD)``;
``make_transport("gloo")`` gives ``real_runs.gloo_transport.GlooTransport.from_env()``.

Arrays travel as raw bytes (``MPI.BYTE``), so any dtype (float16 included) moves unchanged; the
caller provides a receive array of the right shape and dtype.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ddlsim.algorithms.schedule import COLLECTIVES

INSTALL_HINT = "pip install 'ddlsim[real]'"
ANY_SOURCE = -1


class TransportError(RuntimeError):
    """The transport cannot do what was asked (missing library, bad backend); the message says why."""


class Transport(Protocol):
    """What the schedule and Comm executors need from a communication library."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def isend(self, array: np.ndarray, dest: int, tag: int) -> Any: ...

    def irecv(self, array: np.ndarray, source: int, tag: int) -> Any: ...

    def wait_all(self, requests: Sequence[Any]) -> None: ...

    def barrier(self) -> None: ...

    def close(self) -> None:
        """Release the library's resources; this rank sends nothing after it (idempotent)."""
        ...

    def reference(self, collective: str, array: np.ndarray, root: int = 0) -> np.ndarray:
        """The library's own collective on ``array``, with plain MPI semantics: allreduce, reduce
        (result on ``root``), broadcast (from ``root``) return full arrays; reduce_scatter returns
        this rank's ``np.array_split`` block of the sum; allgather concatenates every rank's
        ``array`` in rank order. Every transport must keep exactly this contract."""
        ...

    def bcast_object(self, obj: Any, root: int = 0) -> Any: ...

    def allgather_object(self, obj: Any) -> list[Any]: ...


def import_mpi():
    """``mpi4py.MPI``, initialised with thread level MULTIPLE (a communication thread overlaps backward)."""
    try:
        import mpi4py
    except ImportError as error:
        raise TransportError(f"mpi4py is not installed; install it with {INSTALL_HINT}") from error
    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    return MPI


def element_blocks(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` element ranges of the given sizes."""
    bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(len(sizes))]


def default_blocks(elements: int, ranks: int) -> list[tuple[int, int]]:
    """Rank r's block of ``np.array_split(range(elements), ranks)``."""
    return element_blocks([len(piece) for piece in np.array_split(np.arange(elements), ranks)])


class MpiTransport:
    """A transport over an mpi4py communicator (``COMM_WORLD`` unless given).

    ``reference`` runs the MPI library's own collective, with plain MPI semantics (as the gloo
    transport): ``allreduce`` the sum (MPI_Allreduce); ``reduce`` the sum on ``root``, a copy of
    the input elsewhere (MPI_Reduce); ``broadcast`` root's array (MPI_Bcast); ``reduce_scatter``
    block ``rank`` of the sum, blocks as ``np.array_split`` into ``size`` (MPI_Reduce_scatter);
    ``allgather`` every rank's flat array concatenated in rank order (MPI_Allgatherv).
    """

    def __init__(self, comm: Any = None) -> None:
        self.MPI = import_mpi()
        self.comm = self.MPI.COMM_WORLD if comm is None else comm

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    def _bytes(self, array: np.ndarray) -> list[Any]:
        if not array.flags.c_contiguous:
            raise TransportError("MpiTransport moves contiguous arrays only")
        return [array, array.nbytes, self.MPI.BYTE]

    def isend(self, array: np.ndarray, dest: int, tag: int) -> Any:
        return self.comm.Isend(self._bytes(array), dest=dest, tag=tag)

    def irecv(self, array: np.ndarray, source: int, tag: int) -> Any:
        source = self.MPI.ANY_SOURCE if source == ANY_SOURCE else source
        return self.comm.Irecv(self._bytes(array), source=source, tag=tag)

    def wait_all(self, requests: Sequence[Any]) -> None:
        if requests:
            self.MPI.Request.Waitall(list(requests))

    def recv_any(self, array: np.ndarray, tag: int) -> int:
        """Blocking receive from any source; returns the source rank."""
        status = self.MPI.Status()
        self.comm.Recv(self._bytes(array), source=self.MPI.ANY_SOURCE, tag=tag, status=status)
        return int(status.Get_source())

    def send_object(self, obj: Any, dest: int, tag: int) -> None:
        self.comm.send(obj, dest=dest, tag=tag)

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        """Nothing to release: mpi4py finalizes MPI when the interpreter exits."""

    def dup(self) -> MpiTransport:
        """A transport on a duplicated communicator: its messages never match this one's."""
        return MpiTransport(self.comm.Dup())

    def subset(self, ranks: int) -> MpiTransport | None:
        """A transport over ranks 0..ranks-1 (collective over this communicator); None on the others."""
        color = 0 if self.rank < ranks else self.MPI.UNDEFINED
        comm = self.comm.Split(color, self.rank)
        return None if comm == self.MPI.COMM_NULL else MpiTransport(comm)

    def reference(self, collective: str, array: np.ndarray, root: int = 0) -> np.ndarray:
        MPI = self.MPI
        array = np.ascontiguousarray(array)
        if collective == "allreduce":
            out = np.empty_like(array)
            self.comm.Allreduce(array, out, op=MPI.SUM)
        elif collective == "reduce":
            out = array.copy()
            self.comm.Reduce(array, out if self.rank == root else None, op=MPI.SUM, root=root)
        elif collective == "broadcast":
            out = array.copy()
            self.comm.Bcast(out, root=root)
        elif collective == "reduce_scatter":
            flat = array.reshape(-1)
            counts = [hi - lo for lo, hi in default_blocks(flat.size, self.size)]
            out = np.empty(counts[self.rank], dtype=array.dtype)
            self.comm.Reduce_scatter(flat, out, counts, op=MPI.SUM)
        elif collective == "allgather":
            flat = array.reshape(-1)
            counts = self.comm.allgather(flat.size)
            out = np.empty(sum(counts), dtype=array.dtype)
            displacements = [lo for lo, _ in element_blocks(counts)]
            self.comm.Allgatherv(flat, [out, (counts, displacements)])
        else:
            raise TransportError(f"no library reference for collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
        return out

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self.comm.allgather(obj))


def make_transport(backend: str) -> Transport:
    """The transport of ``backend``: ``"mpi"`` (mpi4py, COMM_WORLD) or ``"gloo"`` (torch.distributed)."""
    if backend == "mpi":
        return MpiTransport()
    if backend == "gloo":
        try:
            module = importlib.import_module("ddlsim.real_runs.gloo_transport")
        except ModuleNotFoundError as error:
            if error.name in ("ddlsim.real_runs.gloo_transport", "torch"):
                raise TransportError(
                    f"the gloo backend needs torch and real_runs.gloo_transport ({error.name} is missing); "
                    f"install with {INSTALL_HINT}"
                ) from error
            raise
        return module.GlooTransport.from_env()
    raise TransportError(f"unknown backend {backend!r}; valid: gloo, mpi")


def object_digest(obj: Any) -> str:
    """A short stable digest of a picklable, JSON-like object (ranks compare scenarios by it)."""
    import hashlib
    import json

    try:
        text = json.dumps(obj, sort_keys=True, default=repr).encode()
    except TypeError:
        text = pickle.dumps(obj)
    return hashlib.sha256(text).hexdigest()[:16]
