"""Result and trace records: one schema for simulated and measured timelines, atomic file writes.

Trace rows (simulated by the DES, measured by ``real_runs``) share ``TRACE_COLUMNS``:

=========== ===============================================================================
rank        global rank (int)
iteration   training iteration or benchmark repetition (int, from 0)
op          what happened: ``forward``, ``backward``, ``update``, ``send``, ``recv``,
            ``allreduce``, ... (snake_case)
peer        the other rank for send/recv, -1 otherwise
bytes       payload bytes moved by the op (0 for compute)
start_s     start time in seconds since the synchronised start of the run
end_s       end time in seconds since the synchronised start of the run
=========== ===============================================================================

So ``validate`` can join a simulated trace and a measured one on (rank, iteration, op).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

TRACE_COLUMNS = ("rank", "iteration", "op", "peer", "bytes", "start_s", "end_s")

SCALING_COLUMNS = (
    "nodes",
    "devices",
    "global_batch",
    "iteration_s",
    "compute_s",
    "exposed_comm_s",
    "throughput_samples_per_s",
    "speedup",
    "scaling_efficiency",
)
# where a transformer layout's iteration goes (``TrainingResult.layout``; they sum to iteration_s)
TRANSFORMER_PARTS = ("compute_s", "tp_s", "cp_s", "ep_s", "zero3_s", "pipeline_wait_s", "dp_wait_s")
# what ``simulate`` prints and the report shows of a transformer layout: its rates and its parts
LAYOUT_COLUMNS = ("nodes", "devices", "global_batch", "iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                  *TRANSFORMER_PARTS)  # fmt: skip


def is_transformer_rows(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether result rows are a transformer layout's (their parts are filled, ``TRANSFORMER_PARTS``)."""
    return all(row.get("tp_s") not in (None, "") for row in rows)


def layout_columns(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """``LAYOUT_COLUMNS`` without the parts that are zero or empty at every point (ep_s without experts)."""

    def filled(value: Any) -> bool:
        return value not in (None, "") and float(value) != 0.0

    return tuple(name for name in LAYOUT_COLUMNS
                 if name not in TRANSFORMER_PARTS or any(filled(row.get(name)) for row in rows))  # fmt: skip


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and put it straight back
    os.umask(mask)
    return mask


def file_mode(path: Path) -> int:
    """The permission bits a plain ``open(path, "w")`` would leave: the existing file's, or 0666 & ~umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[TextIO]:
    """Write to a temporary file beside ``path`` and rename it into place only on success.

    The file ends with the mode a plain write would give it (``file_mode``), not the temporary
    file's private 0600, so results on a shared file system stay readable by the team.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "b" not in mode
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, before the rename)
        mode,
        dir=path.parent,
        prefix=f".{path.name}.",
        suffix=".tmp",
        delete=False,
        encoding="utf-8" if text else None,
        newline="" if text else None,
    )
    try:
        with handle:
            yield handle  # type: ignore[misc]
        os.chmod(handle.name, file_mode(path))
        os.replace(handle.name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle.name)
        raise


@dataclass(frozen=True)
class Rejected:
    """A row of an input file that could not be read, and why (the message names file, row, line and
    column): measurement files and large-model files list them instead of failing the whole file."""

    id: str
    file: str
    line: int
    reason: str


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """Write ``rows`` (dicts) as CSV with exactly ``columns``, atomically. Floats keep full precision."""
    with atomic_open(path) as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), lineterminator="\n", extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _cell(row.get(key, "")) for key in columns})


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        # float() first: a numpy float64 is a float whose repr is 'np.float64(0.5)' under numpy 2
        return repr(float(value))
    return value


def read_csv(path: Path) -> list[dict[str, str]]:
    with Path(path).open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def finite_json(data: Any) -> Any:
    """``data`` with every non-finite float (NaN: does not apply; inf: unbounded) as None (JSON null),
    so that the file is JSON by RFC 8259, which has no NaN or Infinity."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {key: finite_json(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite_json(value) for value in data]
    return data


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as strict JSON (``finite_json``: NaN and infinities become null), atomically."""
    with atomic_open(path) as handle:
        json.dump(finite_json(data), handle, indent=2, sort_keys=True, allow_nan=False)
        handle.write("\n")


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """One strict JSON object per line (as ``write_json``), atomically."""
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(json.dumps(finite_json(row), sort_keys=True, allow_nan=False) + "\n")
