"""Measured traces: one JSON-lines file per rank in the simulator's trace schema, plus run metadata.

Every row has exactly ``simulator.records.TRACE_COLUMNS`` (rank, iteration, op, peer, bytes,
start_s, end_s). Times are ``time.perf_counter_ns`` relative to a start every rank takes right
after a barrier (``TraceWriter.start``). Rows are buffered in memory and appended to
``trace.rank{r}.jsonl`` by ``flush()``, which the harness calls after every iteration: a rank
killed mid-run loses only its unfinished iteration, never a line already flushed.
``metadata.json`` (written by rank 0) records host, ranks, library versions and the scenario.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddlsim.real_runs.environment import TIMING_ENV
from ddlsim.simulator.records import TRACE_COLUMNS, write_json

TRACE_GLOB = "trace.rank*.jsonl"


def trace_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"trace.rank{rank}.jsonl"


def timing_environment() -> dict[str, str]:
    """The variables of this process's environment that change its timings (``environment.TIMING_ENV``)
    and are set; a run whose ranks were started outside ``ddlsim run`` shows here what it lacked."""
    return {key: os.environ[key] for key in TIMING_ENV if key in os.environ}


def library_versions() -> dict[str, str]:
    """Versions of the libraries a measurement depends on (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in ("numpy", "torch", "mpi4py"):
        with contextlib.suppress(ImportError):
            versions[name] = str(__import__(name).__version__)
    with contextlib.suppress(Exception):
        from mpi4py import MPI

        if MPI.Is_initialized():
            versions["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
    return versions


class TraceWriter:
    """Collects one rank's timed ops; thread-safe (a communication thread records too).

    ``directory`` receives ``trace.rank{rank}.jsonl`` (truncated on creation) and, from rank 0,
    ``metadata.json``. Set ``iteration`` before each iteration; call ``flush()`` after it.
    """

    def __init__(self, path: Path | str, rank: int, metadata: dict[str, Any] | None = None) -> None:
        self.directory = Path(path)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.iteration = 0
        self.origin_ns = time.perf_counter_ns()
        self._rows: list[str] = []
        self._lock = threading.Lock()
        self._file = trace_path(self.directory, rank).open("w", encoding="utf-8")
        if rank == 0 and metadata is not None:
            write_json(self.directory / "metadata.json", self.metadata(metadata))

    @staticmethod
    def metadata(extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "libraries": library_versions(),
            "trace_columns": list(TRACE_COLUMNS),
            "clock": "time.perf_counter_ns relative to a barrier-synchronised start, seconds",
            "environment": timing_environment(),
            **extra,
        }

    def start(self, barrier: Any = None) -> None:
        """Set time zero: call right after a barrier (``barrier`` is called first when given)."""
        if barrier is not None:
            barrier()
        self.origin_ns = time.perf_counter_ns()

    def now_s(self) -> float:
        return (time.perf_counter_ns() - self.origin_ns) * 1e-9

    def record(self, op: str, start_ns: int, end_ns: int, *, peer: int = -1, nbytes: int = 0,
               iteration: int | None = None) -> None:  # fmt: skip
        """One row: ``op`` ran from ``start_ns`` to ``end_ns`` (``time.perf_counter_ns`` values)."""
        row = {
            "rank": self.rank,
            "iteration": self.iteration if iteration is None else iteration,
            "op": op,
            "peer": int(peer),
            "bytes": int(nbytes),
            "start_s": (start_ns - self.origin_ns) * 1e-9,
            "end_s": (end_ns - self.origin_ns) * 1e-9,
        }
        line = json.dumps(row, allow_nan=False)  # strict JSON: rows hold whole numbers and finite times
        with self._lock:
            self._rows.append(line)

    @contextlib.contextmanager
    def span(self, op: str, *, peer: int = -1, nbytes: int = 0) -> Iterator[None]:
        """Time the body as one row."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self.record(op, start, time.perf_counter_ns(), peer=peer, nbytes=nbytes)

    def flush(self) -> None:
        """Append the buffered rows to the rank's file and hand them to the kernel (one write)."""
        with self._lock:
            rows, self._rows = self._rows, []
            if rows and not self._file.closed:
                self._file.write("\n".join(rows) + "\n")
                self._file.flush()  # in the kernel now: survives the process being killed

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trace(directory: Path | str) -> list[dict[str, Any]]:
    """All rows of every rank's trace in ``directory``, sorted by (rank, start_s).

    A last line cut short by a killed rank is ignored; any other malformed line is an error.
    """
    rows: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob(TRACE_GLOB)):
        lines = path.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines) - 1:  # the unterminated tail of a killed writer
                    continue
                raise ValueError(f"{path}:{number + 1}: not a JSON trace row") from None
            if tuple(row) != TRACE_COLUMNS:
                raise ValueError(f"{path}:{number + 1}: columns {list(row)} != {list(TRACE_COLUMNS)}")
            rows.append(row)
    rows.sort(key=lambda row: (row["rank"], row["start_s"]))
    return rows
