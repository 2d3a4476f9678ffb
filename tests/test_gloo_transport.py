"""GlooTransport on loopback: point-to-point and gloo's own collectives equal numpy on 2 and 3 ranks.

Each test starts N local processes running this file as a script (``RANK``/``WORLD_SIZE``/
``MASTER_ADDR=127.0.0.1``/``MASTER_PORT`` in their environment, as a launcher would set them).
Every rank's data is ``arange(n) * (rank + 1)``, so the sum over P ranks is
``arange(n) * P(P+1)/2`` (P=3: 6 x arange(n)), checkable by hand.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tests.mpi.gloo_ranks import free_port, run_gloo_ranks

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TIMEOUT_S = 120


def _run_ranks(ranks: int, scenario: str) -> list[str]:
    processes, outputs = run_gloo_ranks(ranks, [sys.executable, __file__, scenario], TIMEOUT_S)
    for rank, (process, out) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} failed:\n{out}"
        assert "ok" in out.splitlines()[-1], out
    return outputs


# --- what each rank runs --------------------------------------------------------------------


def _point_to_point(transport) -> None:
    """Ring shift: every rank sends its data right and receives from the left, both non-blocking,
    on float32 and float16, into a contiguous buffer and into a strided view."""
    rank, size = transport.rank, transport.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for dtype in (np.float32, np.float16):
        data = (np.arange(1000) * (rank + 1)).astype(dtype)
        received = np.zeros(1000, dtype=dtype)
        requests = [transport.irecv(received, left, tag=7), transport.isend(data, right, tag=7)]
        transport.wait_all(requests)
        np.testing.assert_array_equal(received, (np.arange(1000) * (left + 1)).astype(dtype))
    strided = np.zeros(200, dtype=np.float32)
    transport.wait_all(
        [
            transport.irecv(strided[::2], left, tag=3),
            transport.isend(np.full(100, rank, dtype=np.float32), right, tag=3),
        ]
    )
    np.testing.assert_array_equal(strided[::2], np.full(100, left))
    np.testing.assert_array_equal(strided[1::2], 0)
    # Two messages on different tags, received in the opposite order to the one they were sent in.
    if rank == 0:
        transport.wait_all([transport.isend(np.ones(4), 1, tag=1), transport.isend(np.full(4, 2.0), 1, tag=2)])
    elif rank == 1:
        second, first = np.zeros(4), np.zeros(4)
        transport.wait_all([transport.irecv(second, 0, tag=2), transport.irecv(first, 0, tag=1)])
        assert first.tolist() == [1.0] * 4 and second.tolist() == [2.0] * 4
    transport.barrier()


def _reference(transport) -> None:
    """The same contract as MpiTransport.reference: plain MPI semantics, blocks as np.array_split."""
    rank, size = transport.rank, transport.size
    total = size * (size + 1) // 2
    n = 10 * size + 1  # not a multiple of size: blocks of 11, 10(, 10)
    data = (np.arange(n) * (rank + 1)).astype(np.float32)
    kept = data.copy()
    summed = np.arange(n, dtype=np.float32) * total
    np.testing.assert_array_equal(transport.reference("allreduce", data), summed)
    np.testing.assert_array_equal(data, kept)  # the input is not modified
    half = transport.reference("allreduce", data.astype(np.float16))
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, summed.astype(np.float16))
    default_blocks = [(0, 11), (11, 21), (21, 31)][:size] if size == 3 else [(0, 11), (11, 21)]
    lo, hi = default_blocks[rank]
    # reduce_scatter: this rank's block of the sum, as MPI_Reduce_scatter returns it
    np.testing.assert_array_equal(transport.reference("reduce_scatter", data), summed[lo:hi])
    # allgather: rank r contributes r + 1 values r; every rank gets them concatenated in rank order
    gathered = np.concatenate([np.full(r + 1, r, dtype=np.float32) for r in range(size)])
    np.testing.assert_array_equal(transport.reference("allgather", np.full(rank + 1, rank, np.float32)), gathered)
    np.testing.assert_array_equal(transport.reference("broadcast", data, root=size - 1), np.arange(n) * size)
    reduced = transport.reference("reduce", data, root=1)
    np.testing.assert_array_equal(reduced, summed if rank == 1 else np.zeros(n))
    assert transport.bcast_object({"scenario": rank}, root=0) == {"scenario": 0}
    assert transport.allgather_object(rank * 10) == [r * 10 for r in range(size)]
    try:
        transport.reference("alltoall", data)
    except ValueError as error:
        assert "allreduce" in str(error)
    else:
        raise AssertionError("unknown collective accepted")


def _groups(transport) -> None:
    """dup() keeps messages apart from the parent's; subset(2) spans ranks 0 and 1 only; recv_any."""
    rank, size = transport.rank, transport.size
    twin = transport.dup()
    assert (twin.rank, twin.size) == (rank, size)
    if rank == 0:
        transport.wait_all([transport.isend(np.full(2, 1.0), 1, 5), twin.isend(np.full(2, 2.0), 1, 5)])
    elif rank == 1:
        on_twin, on_parent = np.zeros(2), np.zeros(2)
        twin.wait_all([twin.irecv(on_twin, 0, 5)])  # posted first, yet gets the twin's message
        transport.wait_all([transport.irecv(on_parent, 0, 5)])
        assert on_twin.tolist() == [2.0, 2.0] and on_parent.tolist() == [1.0, 1.0]
    pair = transport.subset(2)
    if rank < 2:
        assert pair is not None and pair.size == 2
        np.testing.assert_array_equal(pair.reference("allreduce", np.ones(3)), np.full(3, 2.0))
    else:
        assert pair is None
    if rank == 0:
        senders = sorted(transport.recv_any(np.zeros(1), tag=9) for _ in range(size - 1))
        assert senders == list(range(1, size))
    else:
        transport.wait_all([transport.isend(np.full(1, float(rank)), 0, 9)])
    transport.barrier()


def _worker(scenario: str) -> None:
    from ddlsim.real_runs.gloo_transport import GlooTransport

    transport = GlooTransport.from_env(timeout_s=60)
    try:
        assert (transport.rank, transport.size) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        {"point_to_point": _point_to_point, "reference": _reference, "groups": _groups}[scenario](transport)
    finally:
        transport.close()
    print(f"rank {transport.rank} ok", flush=True)


# --- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [2, 3])
def test_point_to_point_delivers_neighbours_data(ranks):
    _run_ranks(ranks, "point_to_point")


@pytest.mark.parametrize("ranks", [2, 3])
def test_reference_collectives_equal_numpy(ranks):
    _run_ranks(ranks, "reference")


@pytest.mark.parametrize("ranks", [2, 3])
def test_dup_subset_and_recv_any(ranks):
    _run_ranks(ranks, "groups")


def test_from_env_names_missing_variables(monkeypatch):
    from ddlsim.real_runs.gloo_transport import GlooTransport

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        GlooTransport.from_env()


@pytest.mark.parametrize("mode", ["finishes", "fails"])
def test_a_worker_leaves_the_process_group_however_it_ends(monkeypatch, tmp_path, mode):
    """A group left to the interpreter's exit handlers can abort the rank after its work is done."""
    import torch.distributed as dist

    from ddlsim.real_runs import worker

    environment = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    if mode == "finishes":
        assert worker.run("bench", {"backend": "gloo", "bench": {"benchmarks": []}}, tmp_path) == 0
        assert (tmp_path / "measurements.csv").exists()
    else:
        with pytest.raises(KeyError, match="train"):
            worker.run("train", {"backend": "gloo"}, tmp_path)
    assert not dist.is_initialized()


if __name__ == "__main__":
    _worker(sys.argv[1])
