"""Measurements: one tidy CSV schema for every measured number, from our harness or from a paper.

The schema (``MEASUREMENT_COLUMNS``) is described in ``simulator/data/published_sources.md`` and
the project's data README: one row per measured number, empty cell = not applicable or unknown.

Files are read row by row (``read_measurements``): a row with an unknown token, a NaN, a negative
or physically impossible value, or cells beyond the header is set aside with a reason naming the
file, the row (its id and line) and the column, and the other rows are kept; ids that collide
(between files or within one) are renamed ``ID#2``, ``ID#3`` and reported. Files saved by
spreadsheets read as they are: a UTF-8 byte-order mark is skipped, Windows-1252 (Latin-1) text is
decoded with a notice, empty trailing cells and blank lines are ignored. Only what stops a whole
file (no such file, a missing or unknown column, no rows) raises ``MeasurementError``.
``load_measurements`` is the strict form: the first bad row or duplicate id raises.

``from_trace`` turns a harness trace directory (``trace.rank*.jsonl`` + ``metadata.json``, the
shared trace schema of ``simulator.records``) into measurement rows: one row per (op, bytes) of
the timed collectives, or one training row of iteration time.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import COLLECTIVES
from ddlsim.hardware_models.catalog import PRECISIONS, device_names, link_names, load_device
from ddlsim.simulator.records import Rejected
from ddlsim.simulator.workloads import workload_names
from ddlsim.simulator.workloads.transformer import transformer_names

MEASUREMENT_COLUMNS = (
    "id",
    "source",
    "kind",
    "workload",
    "collective",
    "algorithm",
    "device",
    "devices_per_node",
    "nodes",
    "intra_node_link",
    "network",
    "nics_per_node",
    "sockets",
    "socket_link",
    "message_bytes",
    "per_device_batch",
    "precision",
    "metric",
    "value",
    "quote",
    "notes",
)

KINDS = ("collective", "training", "point_to_point")
METRICS = {
    "collective": ("time_s", "bus_bandwidth_Bps"),
    # the harness's ping-pong (one-way time) and streaming rows; bandwidth = message / time
    "point_to_point": ("time_s", "bus_bandwidth_Bps"),
    "training": ("time_s", "throughput_samples_per_s", "scaling_efficiency"),
}
QUOTES = ("direct", "derived", "secondary")
LIBRARY_TOKENS = ("nccl", "mpich", "mlsl", "openmpi", "gloo")
# Device tokens of the measurement schema that the catalog has no datasheet for: accepted in a
# file, reported as cannot_model by validate (tpu_v3 was one until it got its datasheet).
SCHEMA_ONLY_DEVICES: tuple[str, ...] = ()
POINT_TO_POINT_PATTERNS = ("ping_pong", "streaming_bandwidth")
POINT_TO_POINT_ALGORITHMS = ("send_recv",)
# Frameworks a source names instead of the library under them: the library each uses, per device kind
# (Horovod's GPU builds reduce with NCCL, HOROVOD_GPU_ALLREDUCE=NCCL, as Sergeev & Del Balso 2018
# describe; its CPU builds with MPI). A row without a device keeps the library open (open_fields.py),
# whose default is the same choice.
# PyTorch DistributedDataParallel (``ddp``) and DeepSpeed reduce with NCCL on GPUs (their documented
# GPU backend); DDP on CPUs with Gloo (PyTorch's distributed documentation: "use the Gloo backend for
# distributed CPU training"). Library builds named for the library ddlsim models: RCCL is ROCm's port
# of NCCL (the same ring and tree algorithms); Intel MPI and MVAPICH2 derive from MPICH.
_NCCL_ON_GPUS = {"gpu": "nccl", "cpu": "mpich", "manycore": "mpich"}
_MPI_EVERYWHERE = {"gpu": "mpich", "cpu": "mpich", "manycore": "mpich"}
LIBRARY_BUILDS = ("rccl", "intel_mpi", "mvapich2")
FRAMEWORK_LIBRARIES = {
    "horovod": _NCCL_ON_GPUS,
    "ddp": {"gpu": "nccl", "cpu": "gloo", "manycore": "gloo"},
    "deepspeed": {"gpu": "nccl"},
    "rccl": {"gpu": "nccl"},
    "intel_mpi": _MPI_EVERYWHERE,
    "mvapich2": _MPI_EVERYWHERE,
}


class MeasurementError(ValueError):
    """A measurement file is malformed; the message names the file, row (id and line) and column."""


# Physically meaningful ranges (SI units): beyond them a number is a typo or a unit slip, not a
# measurement. Times up to a year, rates up to 1e9 samples/s, bus bandwidth up to 1e13 B/s (ten
# times the fastest link in the catalog), messages up to 1e13 bytes, a million nodes.
VALUE_RANGES = {
    "time_s": (1e-9, 3.2e7),
    "throughput_samples_per_s": (1e-6, 1e9),
    "scaling_efficiency": (1e-4, 2.0),
    "bus_bandwidth_Bps": (1.0, 1e13),
}
# columns a file may leave out (added after files in the schema were written): empty for every row
OPTIONAL_COLUMNS = ("sockets", "socket_link")
COUNT_LIMITS = {
    "devices_per_node": 4096,
    "nodes": 1_000_000,
    "nics_per_node": 64,
    "sockets": 8,
    "per_device_batch": 10_000_000,
}
MESSAGE_BYTES_LIMIT = 1e13


@dataclass
class MeasurementSet:
    """The rows read from measurement files, the rows set aside, and notices about the files."""

    rows: list[Measurement]
    rejected: list[Rejected]
    notices: list[str]


@dataclass(frozen=True)
class Measurement:
    """One measured number (SI units) and where it came from."""

    id: str
    kind: str
    metric: str
    value: float
    device: str
    devices_per_node: int
    nodes: int
    workload: str = ""
    collective: str = ""
    algorithm: str = ""
    intra_node_link: str = ""
    network: str = ""
    nics_per_node: int | None = None
    sockets: int | None = None  # CPU sockets the node's devices are split over (empty: 1)
    socket_link: str = ""  # the link between two sockets (required with sockets > 1)
    message_bytes: float | None = None
    per_device_batch: int | None = None
    precision: str = ""
    quote: str = ""
    source: str = ""
    notes: str = ""
    file: str = ""
    line: int = 0

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes

    def modeled(self) -> Measurement:
        """The row as the model sees it: ranks of one machine that talk only through a ``network``
        (no intra-node link, e.g. the harness's ``local_shm``) are one-rank nodes on that network;
        accelerator chips on several hosts of one scale-up domain (a TPU slice: hosts of 4 chips
        joined by the ICI torus, no network named) are one node on the domain's link."""
        if self.nodes == 1 and self.devices_per_node > 1 and not self.intra_node_link and self.network:
            return dataclasses.replace(self, devices_per_node=1, nodes=self.devices)
        domain = scale_up_domain(self.device)
        if domain and self.nodes > 1 and not self.network and self.devices <= domain[0]:
            link = self.intra_node_link or domain[1]
            return dataclasses.replace(self, devices_per_node=self.devices, nodes=1, intra_node_link=link)
        return self

    @property
    def where(self) -> str:
        return f"{self.file}: row {self.id!r} (line {self.line})"

    def to_row(self) -> dict[str, Any]:
        """The row in the CSV schema (empty cells for unknowns)."""
        row: dict[str, Any] = {}
        for column in MEASUREMENT_COLUMNS:
            value = getattr(self, column)
            if value is None:
                value = ""
            elif isinstance(value, float) and value.is_integer() and column != "value":
                value = int(value)
            row[column] = value
        return row


@functools.cache
def scale_up_domain(device: str) -> tuple[int, str] | None:
    """(chips, link) of an accelerator's scale-up domain from its datasheet (a TPU pod and its ICI),
    None for other devices: GPUs' NVLink domains end at the node, which rows state."""
    if device not in device_names():
        return None
    spec = load_device(device)
    if spec.kind != "accelerator" or spec.system is None or not spec.system.intra_node_link:
        return None
    return spec.system.devices_per_node, spec.system.intra_node_link


def _valid_tokens() -> dict[str, tuple[str, ...]]:
    try:
        from ddlsim.algorithms.selectors import LIBRARIES

        libraries = tuple(LIBRARIES.names())
    except ImportError:  # pragma: no cover - the selectors land with the collective-library issue
        libraries = LIBRARY_TOKENS
    return {
        "kind": KINDS,
        "workload": tuple(workload_names()) + tuple(transformer_names()),
        "collective": COLLECTIVES + POINT_TO_POINT_PATTERNS,
        "algorithm": tuple(COLLECTIVE_ALGORITHMS.names())
        + libraries
        + POINT_TO_POINT_ALGORITHMS
        + tuple(FRAMEWORK_LIBRARIES),
        "intra_node_link": tuple(link_names("intra_node")),
        "socket_link": tuple(link_names("intra_node")),
        "network": tuple(link_names("network")),
        "precision": PRECISIONS,
        "quote": QUOTES,
    }


def _fail(path: Path, row_id: str, line: int, column: str, message: str) -> MeasurementError:
    return MeasurementError(f"{path}: row {row_id!r} (line {line}), column {column!r}: {message}")


def _number(
    raw: str, path: Path, row_id: str, line: int, column: str, whole: bool, bounds: tuple[float, float] | None = None
) -> float:
    try:
        number = float(raw)
    except ValueError:
        raise _fail(path, row_id, line, column, f"not a number: {raw!r}") from None
    if not math.isfinite(number):
        raise _fail(path, row_id, line, column, f"must be a finite number, got {raw!r}")
    if number <= 0:
        raise _fail(path, row_id, line, column, f"must be > 0, got {raw!r}")
    if whole and not number.is_integer():
        raise _fail(path, row_id, line, column, f"must be a whole number, got {raw!r}")
    if bounds and not bounds[0] <= number <= bounds[1]:
        raise _fail(path, row_id, line, column, f"must be in [{bounds[0]:g}, {bounds[1]:g}], got {raw!r}")
    return number


def parse_row(raw: dict[str, str], path: Path, line: int, tokens: dict[str, tuple[str, ...]]) -> Measurement:
    """Validate one CSV row (strings) into a Measurement."""
    cell = {column: (raw.get(column) or "").strip() for column in MEASUREMENT_COLUMNS}
    row_id = cell["id"]
    if not row_id:
        raise _fail(path, "", line, "id", "every row needs an id")

    def fail(column: str, message: str) -> MeasurementError:
        return _fail(path, row_id, line, column, message)

    for column, allowed in tokens.items():
        token = cell[column]
        if token and token not in allowed:
            raise fail(column, f"unknown token {token!r}; valid: {', '.join(allowed)}")
    for column in ("kind", "metric", "devices_per_node", "nodes", "value"):
        if not cell[column]:
            raise fail(column, "must not be empty")
    kind = cell["kind"]
    if cell["metric"] not in METRICS[kind]:
        raise fail("metric", f"unknown metric {cell['metric']!r} for a {kind} row; valid: {', '.join(METRICS[kind])}")
    device = cell["device"]  # empty: the source names no part (see open_fields.py)
    if device and device not in device_names() and device not in SCHEMA_ONLY_DEVICES:
        raise fail(
            "device",
            f"device {device!r} is not in the hardware catalog (hardware_models/devices); valid: "
            f"{', '.join(device_names())}",
        )
    if kind != "training" and not cell["collective"]:
        raise fail("collective", f"a {kind} row must name its collective (or point-to-point pattern)")
    if (kind == "point_to_point") != (cell["collective"] in POINT_TO_POINT_PATTERNS):
        raise fail("collective", f"{cell['collective']!r} does not go with kind {kind!r}")
    if kind == "training" and not cell["workload"]:
        raise fail("workload", "a training row must name its workload")

    def number(column: str, whole: bool, bounds: tuple[float, float] | None = None) -> float | None:
        return _number(cell[column], path, row_id, line, column, whole, bounds) if cell[column] else None

    value = number("value", whole=False, bounds=VALUE_RANGES[cell["metric"]])
    assert value is not None
    devices_per_node = number("devices_per_node", whole=True, bounds=(1, COUNT_LIMITS["devices_per_node"]))
    nodes = number("nodes", whole=True, bounds=(1, COUNT_LIMITS["nodes"]))
    nics = number("nics_per_node", whole=True, bounds=(1, COUNT_LIMITS["nics_per_node"]))
    sockets = number("sockets", whole=True, bounds=(1, COUNT_LIMITS["sockets"]))
    if sockets is not None and devices_per_node and devices_per_node % sockets:
        raise fail("sockets", f"{sockets:g} sockets do not split {devices_per_node:g} devices per node evenly")
    if sockets is not None and sockets > 1 and not cell["socket_link"]:
        raise fail("socket_link", "a row with sockets > 1 must name the link between the sockets (e.g. qpi)")
    batch = number("per_device_batch", whole=True, bounds=(1, COUNT_LIMITS["per_device_batch"]))
    message_bytes = number("message_bytes", whole=True, bounds=(1, MESSAGE_BYTES_LIMIT))
    algorithm, notes = cell["algorithm"], cell["notes"]
    if algorithm in FRAMEWORK_LIBRARIES:
        kind_of_device = load_device(device).kind if device in device_names() else ""
        library = FRAMEWORK_LIBRARIES[algorithm].get(kind_of_device, "")
        verb = "modelled as" if algorithm in LIBRARY_BUILDS else "reduces with"
        said = (
            f"{algorithm} {verb} {library} on {kind_of_device} devices"
            if library
            else f"{algorithm}: library left open"
        )
        algorithm, notes = library, f"{notes}; {said}" if notes else said
    return Measurement(
        id=row_id,
        kind=kind,
        metric=cell["metric"],
        value=value,
        device=device,
        devices_per_node=int(devices_per_node or 1),
        nodes=int(nodes or 1),
        workload=cell["workload"],
        collective=cell["collective"],
        algorithm=algorithm,
        intra_node_link=cell["intra_node_link"],
        network=cell["network"],
        nics_per_node=int(nics) if nics is not None else None,
        sockets=int(sockets) if sockets is not None else None,
        socket_link=cell["socket_link"],
        message_bytes=message_bytes,
        per_device_batch=int(batch) if batch is not None else None,
        precision=cell["precision"],
        quote=cell["quote"],
        source=cell["source"],
        notes=notes,
        file=str(path),
        line=line,
    )


def _decode(path: Path, notices: list[str]) -> str:
    """The file's text: UTF-8 (a byte-order mark skipped), else Windows-1252 with a notice."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        notices.append(
            f"{path}: not UTF-8 (byte {data[error.start]:#04x} at offset {error.start}); read as Windows-1252 "
            "(Latin-1) text, as spreadsheets save it: save the file as UTF-8 to silence this"
        )
        return data.decode("cp1252", errors="replace")


def _read_file(path: Path) -> tuple[list[Measurement], list[Rejected], list[str]]:
    """(rows, rejected rows, notices) of one measurement CSV; raises only for what stops the whole file."""
    path = Path(path)
    if not path.is_file():
        raise MeasurementError(f"{path}: no such measurement file")
    notices: list[str] = []
    reader = csv.DictReader(io.StringIO(_decode(path, notices), newline=""))
    header = [column.strip() for column in reader.fieldnames or []]
    while header and not header[-1]:  # empty trailing header cells of a spreadsheet export
        header.pop()
    reader.fieldnames = header
    missing = [column for column in MEASUREMENT_COLUMNS if column not in header and column not in OPTIONAL_COLUMNS]
    if missing:
        raise MeasurementError(
            f"{path}: row 'header' (line 1), column {missing[0]!r}: missing column; the schema needs "
            f"{', '.join(c for c in MEASUREMENT_COLUMNS if c not in OPTIONAL_COLUMNS)} "
            f"(and may have {', '.join(OPTIONAL_COLUMNS)})"
        )
    unknown = [column for column in header if column not in MEASUREMENT_COLUMNS]
    if unknown:
        raise MeasurementError(
            f"{path}: row 'header' (line 1), column {unknown[0]!r}: unknown column; the schema has "
            f"{', '.join(MEASUREMENT_COLUMNS)}"
        )
    tokens = _valid_tokens()
    rows: list[Measurement] = []
    rejected: list[Rejected] = []
    for raw in reader:
        line = reader.line_num
        extra = [cell for cell in raw.pop(None, None) or [] if cell.strip()]
        if not any((value or "").strip() for value in raw.values()) and not extra:
            continue  # a blank line
        row_id = (raw.get("id") or "").strip()
        if extra:
            rejected.append(
                Rejected(
                    row_id,
                    str(path),
                    line,
                    f"{path}: row {row_id!r} (line {line}): {len(extra)} cell(s) beyond the header's "
                    f"{len(header)} columns ({', '.join(map(repr, extra[:3]))}): an unquoted comma or a shifted row",
                )
            )
            continue
        try:
            rows.append(parse_row(raw, path, line, tokens))
        except MeasurementError as error:
            rejected.append(Rejected(row_id, str(path), line, str(error)))
    if not rows and not rejected:
        raise MeasurementError(f"{path}: no measurement rows")
    return rows, rejected, notices


def read_measurement_file(path: Path) -> list[Measurement]:
    """Every row of one measurement CSV, validated; raises MeasurementError at the first bad row."""
    rows, rejected, _ = _read_file(path)
    if rejected:
        raise MeasurementError(rejected[0].reason)
    return rows


def read_measurements(paths: Iterable[Path | str]) -> MeasurementSet:
    """Every readable row of every file, the rows set aside with their reasons, and notices.

    Ids must name one row: a later row with an id already used (in any of the files) is renamed
    ``ID#2`` (``#3``, ...) and a notice says so. Files without a single readable row raise.
    """
    rows: list[Measurement] = []
    rejected: list[Rejected] = []
    notices: list[str] = []
    seen: dict[str, Measurement] = {}
    collisions: list[str] = []
    for path in paths:
        file_rows, file_rejected, file_notices = _read_file(Path(path))
        rejected.extend(file_rejected)
        notices.extend(file_notices)
        for row in file_rows:
            if row.id in seen:
                count = 2
                while f"{row.id}#{count}" in seen:
                    count += 1
                collisions.append(f"{row.id!r} ({seen[row.id].where}, again at line {row.line} of {row.file})")
                row = dataclasses.replace(row, id=f"{row.id}#{count}")
            seen[row.id] = row
            rows.append(row)
    if collisions:
        notices.append(
            f"{len(collisions)} row id(s) used more than once, e.g. {collisions[0]}; the later rows are renamed "
            "ID#2, ID#3, ...: give each run its own ids"
        )
    if not rows and not rejected:
        raise MeasurementError("no measurement files given")
    if not rows:
        more = f" (and {len(rejected) - 1} more bad rows)" if len(rejected) > 1 else ""
        raise MeasurementError(f"no readable rows: {rejected[0].reason}{more}")
    return MeasurementSet(rows, rejected, notices)


def check_rows(rows: Sequence[dict[str, Any]], label: Path | str) -> list[Measurement]:
    """Validate schema dicts (e.g. converted from a trace) as if they had been read from ``label``."""
    tokens = _valid_tokens()
    return [
        parse_row(
            {key: "" if value is None else str(value) for key, value in row.items()}, Path(label), index + 2, tokens
        )
        for index, row in enumerate(rows)
    ]


def load_measurements(paths: Iterable[Path | str]) -> list[Measurement]:
    """All rows of all files, validated strictly: the first bad row or duplicate id raises."""
    rows: list[Measurement] = []
    seen: dict[str, Measurement] = {}
    for path in paths:
        for row in read_measurement_file(Path(path)):
            if row.id in seen:
                first = seen[row.id]
                raise MeasurementError(f"{row.where}, column 'id': duplicate id, first used at {first.where}")
            seen[row.id] = row
            rows.append(row)
    if not rows:
        raise MeasurementError("no measurement files given")
    return rows


def data_sha256(paths: Sequence[Path | str]) -> str:
    """SHA-256 over the bytes of the measurement files, in the order given."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def rows_sha256(rows: Sequence[Measurement]) -> str:
    """SHA-256 of the rows' content in the schema (independent of the files they came from)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row.to_row(), sort_keys=True).encode())
    return digest.hexdigest()


def packaged_published_dev() -> Path:
    """The published development set shipped with the package (see its published_sources.md)."""
    return Path(__file__).parent / "data" / "published_dev.csv"


# --- harness traces ---------------------------------------------------------------------------

COLLECTIVE_OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")
COMPUTE_OPS = ("forward", "backward", "update")


def _trace_rows(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    files = sorted(directory.glob("trace.rank*.jsonl"))
    if not files:
        raise MeasurementError(f"{directory}: no trace.rank*.jsonl files (is this a harness trace directory?)")
    for path in files:
        with path.open(encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                    row["start_s"] = float(row["start_s"])
                    row["end_s"] = float(row["end_s"])
                    row["iteration"] = int(row["iteration"])
                    row["bytes"] = float(row.get("bytes", 0) or 0)
                except (ValueError, KeyError, TypeError) as error:
                    raise MeasurementError(f"{path}: line {number}: not a trace row ({error})") from None
                rows.append(row)
    return rows


def failed_ranks(directory: Path) -> str:
    """How a harness run in ``directory`` failed ('' if every rank's ``status.rank*.json``, written by
    the launcher, says exit status 0, or there are none): e.g. ``rank 1 (signal SIGKILL)``."""
    failures = []
    for path in sorted(Path(directory).glob("status.rank*.json")):
        try:
            status = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            failures.append(f"{path.name} (unreadable)")
            continue
        if status.get("exit_status", 0) != 0:
            how = f"signal {status['signal']}" if status.get("signal") else f"exit status {status.get('exit_status')}"
            failures.append(f"rank {status.get('rank', '?')} ({how})")
    return ", ".join(failures)


def from_trace(directory: Path, overrides: dict[str, Any] | None = None, warmup: int = 1) -> list[dict[str, Any]]:
    """Measurement rows (schema dicts) from one harness trace directory.

    A collective op's time in one repetition is max(end) - min(start) over the ranks (the barrier
    before it synchronises the starts); the row's value is the median over repetitions after the
    first ``warmup`` ones. A training trace (forward/backward/update ops) gives one ``time_s`` row:
    the median over iterations of the span of all ranks' ops. Row fields that the trace cannot know
    (device, network, ...) come from ``metadata.json`` keys of the same name (top level or under
    ``measurement``/``scenario``) and from ``overrides``.

    A failed run (``failed_ranks``) gives only the repetitions every rank finished (each rank's
    last traced one may be cut short), and its rows' notes say so.
    """
    directory = Path(directory)
    metadata: dict[str, Any] = {}
    meta_path = directory / "metadata.json"
    if meta_path.is_file():
        metadata = json.loads(meta_path.read_text(encoding="utf-8"))
    fields: dict[str, Any] = {}
    for scope in (metadata.get("scenario") or {}, metadata.get("measurement") or {}, metadata):
        if isinstance(scope, dict):
            fields.update({k: v for k, v in scope.items() if k in MEASUREMENT_COLUMNS and v not in (None, "")})
    fields.update({k: v for k, v in (overrides or {}).items() if v not in (None, "")})
    rows = _trace_rows(directory)
    ranks = len({int(row["rank"]) for row in rows})
    failure = failed_ranks(directory)
    if failure:
        last: dict[int, int] = {}
        for row in rows:
            last[int(row["rank"])] = max(last.get(int(row["rank"]), -1), row["iteration"])
        finished = min(last.values())  # every rank reached it; the failed rank's last one is cut short
        rows = [row for row in rows if row["iteration"] < finished]
    fields.setdefault("nodes", ranks // int(fields.get("devices_per_node", 1) or 1))
    fields.setdefault("devices_per_node", 1)
    fields.setdefault("source", f"ddlsim harness trace {directory.name}")
    fields.setdefault("quote", "direct")
    prefix = str(fields.pop("id", "") or directory.name)
    spans: dict[tuple[str, float, int], list[float]] = {}
    for row in rows:
        op = str(row["op"])
        key = (
            op if op in COLLECTIVE_OPS else "iteration",
            row["bytes"] if op in COLLECTIVE_OPS else 0.0,
            row["iteration"],
        )
        span = spans.setdefault(key, [math.inf, -math.inf])
        span[0] = min(span[0], row["start_s"])
        span[1] = max(span[1], row["end_s"])
    training = any(str(row["op"]) in COMPUTE_OPS for row in rows)
    grouped: dict[tuple[str, float], list[float]] = {}
    for (op, nbytes, iteration), (start, end) in sorted(spans.items()):
        if iteration < warmup:
            continue
        if training and op != "iteration":
            continue
        if not training and op == "iteration":
            continue
        grouped.setdefault((op, nbytes), []).append(end - start)
    out = []
    for (op, nbytes), times in sorted(grouped.items()):
        row = {column: "" for column in MEASUREMENT_COLUMNS}
        row.update({k: v for k, v in fields.items() if k in MEASUREMENT_COLUMNS})
        row["metric"] = "time_s"
        row["value"] = statistics.median(times)
        if training:
            row["kind"] = "training"
            row["id"] = prefix
        else:
            row["kind"] = "collective"
            row["collective"] = op
            row["message_bytes"] = int(nbytes) if float(nbytes).is_integer() else nbytes
            row["id"] = f"{prefix}-{op}-{int(nbytes)}"
        row["notes"] = (
            f"{row.get('notes') or ''} median of {len(times)} repetitions after {warmup} warm-up; "
            f"{ranks} ranks; converted by ddlsim measurements from-trace"
            + (f"; FAILED RUN ({failure}): repetitions every rank finished only" if failure else "")
        ).strip()
        out.append(row)
    if not out:
        failed = f" that every rank finished (failed run: {failure})" if failure else ""
        raise MeasurementError(f"{directory}: no timed repetitions{failed} after {warmup} warm-up")
    return out


# --- the small-scale / large-scale split -----------------------------------------------------------


def is_calibration_row(row: Measurement, rows: Sequence[Measurement]) -> bool:
    """The documented split (docs/calibration.md): small scale calibrates, larger scale is held out.

    * training: single-device rows pin compute; every multi-device row is predicted.
    * collective with a message size, one node: rows with fewer devices than the largest one-node
      run of the same (device, intra-node link) calibrate the intra-node link.
    * collective with a message size, several nodes: rows with fewer nodes than the largest run of
      the same (device, devices per node, network) calibrate the network.
    * plateau figures without a message size (bus bandwidth quotes) are always predicted.
    """
    if row.kind == "training":
        return row.devices == 1
    if row.message_bytes is None:
        return False
    if row.nodes == 1:
        family = [
            other.devices_per_node
            for other in rows
            if other.kind == "collective"
            and other.nodes == 1
            and other.device == row.device
            and other.intra_node_link == row.intra_node_link
        ]
        return row.devices_per_node < max(family)
    family = [
        other.nodes
        for other in rows
        if other.kind == "collective"
        and other.nodes > 1
        and other.device == row.device
        and other.devices_per_node == row.devices_per_node
        and other.network == row.network
    ]
    return row.nodes < max(family)


def split_by_scale(rows: Sequence[Measurement]) -> tuple[list[Measurement], list[Measurement]]:
    """(calibration rows, held-out rows) by ``is_calibration_row``."""
    calibration = [row for row in rows if is_calibration_row(row, rows)]
    held_out = [row for row in rows if not is_calibration_row(row, rows)]
    return calibration, held_out
