"""The second backend: the ``Transport`` protocol over ``torch.distributed`` with gloo.

Point-to-point messages are gloo ``isend``/``irecv`` on CPU tensors that share memory with the
caller's numpy arrays (``torch.from_numpy``), so a receive lands in the caller's buffer without a
copy when the buffer is contiguous. ``reference()`` runs gloo's own collective on the same data,
the result our schedules must equal (as ``MPI.Allreduce`` is for the mpi4py backend).

Rendezvous is torch's TCP store (``init_method="tcp://MASTER_ADDR:MASTER_PORT"``). On an
emulated network (``real_runs.emulated_network``) set ``GLOO_SOCKET_IFNAME=eth0``: the host name
does not resolve inside the namespaces. On loopback, ``MASTER_ADDR=127.0.0.1`` is enough.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import numpy as np

REFERENCE_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
DEFAULT_TIMEOUT_S = 300.0
ANY_SOURCE = -1  # as real_runs.transport.ANY_SOURCE


class GlooRequest:
    """A pending gloo send or receive; ``wait()`` blocks until it is done.

    A receive into a non-contiguous array goes through a contiguous staging tensor, copied back
    into the array on ``wait()``.
    """

    __slots__ = ("_copy_back", "_work")

    def __init__(self, work: Any, copy_back: tuple[np.ndarray, np.ndarray] | None = None):
        self._work = work
        self._copy_back = copy_back

    def wait(self) -> None:
        self._work.wait()
        if self._copy_back is not None:
            target, staged = self._copy_back
            target[...] = staged
            self._copy_back = None

    def test(self) -> bool:
        """True when the transfer has completed (the receive copy-back still happens in ``wait``)."""
        return bool(self._work.is_completed())


def _source(source: int) -> int | None:
    return None if source == ANY_SOURCE else source


def _as_tensor(array: np.ndarray):
    import torch

    if not array.flags.writeable:
        array = np.array(array)  # torch.from_numpy warns on read-only memory; a send may copy
    return torch.from_numpy(array)


class GlooTransport:
    """Transport over an initialised ``torch.distributed`` gloo process group (CPU tensors only)."""

    def __init__(self, rank: int, size: int, group: Any = None):
        self.rank = rank
        self.size = size
        self.group = group  # None: the default (world) group

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S) -> GlooTransport:
        """Join the group named by RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torch's convention)."""
        import torch.distributed as dist

        missing = [key for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if key not in os.environ]
        if missing:
            raise RuntimeError(
                f"gloo backend: environment variables {missing} are not set; the launcher sets RANK, "
                "WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank"
            )
        rank = int(os.environ["RANK"])
        size = int(os.environ["WORLD_SIZE"])
        if not dist.is_initialized():
            dist.init_process_group(
                backend="gloo",
                init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                rank=rank,
                world_size=size,
                timeout=timedelta(seconds=timeout_s),
            )
        return cls(dist.get_rank(), dist.get_world_size())

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # --- point to point ---------------------------------------------------------------------

    def isend(self, array: np.ndarray, dest: int, tag: int = 0) -> GlooRequest:
        import torch.distributed as dist

        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return GlooRequest(dist.isend(_as_tensor(array), dst=dest, group=self.group, tag=tag))

    def irecv(self, array: np.ndarray, source: int, tag: int = 0) -> GlooRequest:
        import torch.distributed as dist

        if array.flags.c_contiguous and array.flags.writeable:
            return GlooRequest(dist.irecv(_as_tensor(array), src=_source(source), group=self.group, tag=tag))
        staged = np.empty(array.shape, dtype=array.dtype)
        return GlooRequest(
            dist.irecv(_as_tensor(staged), src=_source(source), group=self.group, tag=tag), copy_back=(array, staged)
        )

    def wait_all(self, requests: Iterable[GlooRequest]) -> None:
        for request in requests:
            request.wait()

    def recv_any(self, array: np.ndarray, tag: int) -> int:
        """Blocking receive from any source into ``array`` (contiguous); returns the source rank."""
        import torch.distributed as dist

        return int(dist.recv(_as_tensor(array), src=None, group=self.group, tag=tag))

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def dup(self) -> GlooTransport:
        """A transport on a new group of the same ranks: its messages never match this one's."""
        import torch.distributed as dist

        return GlooTransport(self.rank, self.size, dist.new_group(ranks=list(range(self.size))))

    def subset(self, ranks: int) -> GlooTransport | None:
        """A transport over ranks 0..ranks-1 (collective: every rank calls it); None on the others."""
        import torch.distributed as dist

        group = dist.new_group(ranks=list(range(ranks)))
        return GlooTransport(self.rank, ranks, group) if self.rank < ranks else None

    # --- objects ----------------------------------------------------------------------------

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        import torch.distributed as dist

        box = [obj if self.rank == root else None]
        dist.broadcast_object_list(box, src=root, group=self.group)
        return box[0]

    def allgather_object(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    # --- the library's own collectives ------------------------------------------------------

    def reference(self, collective: str, array: np.ndarray, root: int = 0) -> np.ndarray:
        """What gloo's own collective makes of ``array`` on this rank, with plain MPI semantics, the
        contract of ``MpiTransport.reference`` (``real_runs.schedule_executor.reference_result``
        relies on it):

        * ``allreduce``: the element-wise sum of every rank's ``array``;
        * ``reduce``: that sum on ``root`` (zeros elsewhere);
        * ``broadcast``: ``root``'s ``array``;
        * ``reduce_scatter``: this rank's block (``np.array_split`` of the flat array) of the sum;
        * ``allgather``: every rank's ``array`` (any lengths), concatenated in rank order.

        gloo has no reduce-scatter and its all-gather wants equal sizes, so both are all-reduces
        (of the full array; of a zero buffer holding this rank's piece in its place): the same
        numbers, more traffic, which is fine for a correctness reference.
        """
        import torch.distributed as dist

        if collective == "allgather":
            flat = np.ascontiguousarray(array).reshape(-1)
            sizes = self.allgather_object(int(flat.size))
            offset = sum(sizes[: self.rank])
            out = np.zeros(sum(sizes), dtype=flat.dtype)
            out[offset : offset + flat.size] = flat
            dist.all_reduce(_as_tensor(out), group=self.group)
            return out
        out = np.array(array, copy=True, order="C")
        tensor = _as_tensor(out)
        if collective == "reduce_scatter":
            dist.all_reduce(tensor, group=self.group)
            lo, hi = _default_blocks(out.size, self.size)[self.rank]
            return out.reshape(-1)[lo:hi].copy()
        if collective == "allreduce":
            dist.all_reduce(tensor, group=self.group)
        elif collective == "reduce":
            dist.reduce(tensor, dst=root, group=self.group)
            if self.rank != root:
                out[...] = 0
        elif collective == "broadcast":
            dist.broadcast(tensor, src=root, group=self.group)
        else:
            raise ValueError(
                f"no gloo reference for collective {collective!r}; valid: {', '.join(REFERENCE_COLLECTIVES)}"
            )
        return out


def _default_blocks(elements: int, ranks: int) -> list[tuple[int, int]]:
    """Rank r's ``(start, stop)`` in ``np.array_split(range(elements), ranks)``."""
    base, extra = divmod(elements, ranks)
    starts = [r * base + min(r, extra) for r in range(ranks + 1)]
    return [(starts[r], starts[r + 1]) for r in range(ranks)]
