"""Start the ranks of a real run and say clearly how they ended.

``launch(...)`` runs ``python -m ddlsim.real_runs.worker MODE`` on N ranks:

* already under ``mpiexec`` (``PMI_RANK``/``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE`` or ``PMIX_RANK``
  in the environment): in this process, as one rank;
* backend ``mpi``: ``mpiexec -n N [-hostfile FILE]``, the ``mpiexec`` beside the Python that runs
  us (the ``mpich`` wheel installs it there), else the PATH's, else ``--mpiexec``;
* backend ``gloo``: N local processes with the torch.distributed environment (RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT);
* ``--emulate-network RATE``: the ranks run in network namespaces joined through rate-limited
  links (``real_runs.emulated_network``, imported only then).

Each rank runs under a small wrapper (``python -m ddlsim.real_runs.launcher wrap``) that starts the worker
as its child, passes its stderr through while keeping the last lines, and writes
``status.rank{r}.json`` (exit status, signal, last stderr lines) before exiting with the child's
status. So when a rank crashes, even by SIGKILL, the launcher names it and says why. A run past
``timeout_s`` is stopped and the ranks that had not finished are named with the last iteration
their trace holds.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlsim.real_runs.environment import rank_env

MPI_ENV_KEYS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")
RANK_ENV_KEYS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK")
INSTALL_HINT = "pip install 'ddlsim[real]'"
STDERR_TAIL_LINES = 12
STATUS_GLOB = "status.rank*.json"
# what a run or a bench writes into its directory (and a rerun there removes first)
GLOO_PORT_ATTEMPTS = 3  # runs started on a fresh port when the probed one was taken before rank 0 bound it
RUN_FILES = (STATUS_GLOB, "trace.rank*.jsonl", "metadata.json", "results.csv", "measurements.csv", "layers.csv")


class LaunchError(RuntimeError):
    """The run could not be started (missing MPI, torch, mpiexec, emulated network...)."""


def under_mpiexec(env: Mapping[str, str] | None = None) -> bool:
    """True when this process is already one rank of an MPI job."""
    env = os.environ if env is None else env
    return any(key in env for key in MPI_ENV_KEYS)


def find_mpiexec(override: str | None = None) -> str:
    """``override``, else the mpiexec beside this Python (the mpich wheel's), else the PATH's."""
    import shutil

    if override:
        found = shutil.which(override)
        if not found:
            raise LaunchError(f"--mpiexec {override!r} is not an executable")
        return found
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise LaunchError(f"no mpiexec found beside {sys.executable} or on the PATH; install one with {INSTALL_HINT}")
    return found


def check_requirements(backend: str) -> None:
    """Fail early, with the install hint, when torch or mpi4py is missing."""
    needed = ["torch"] + (["mpi4py"] if backend == "mpi" else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise LaunchError(
            f"real runs need {' and '.join(missing)}, which is not installed; install with {INSTALL_HINT}"
        )


def status_path(out: Path, rank: int) -> Path:
    return Path(out) / f"status.rank{rank}.json"


# --- the per-rank wrapper ------------------------------------------------------------------------


def _rank_from_env() -> int:
    for key in RANK_ENV_KEYS:
        if key in os.environ:
            return int(os.environ[key])
    return 0


def _die_with_parent() -> None:
    """In the child: receive SIGKILL when the wrapper dies (mpiexec kills wrappers, not their children)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def wrap(status_dir: Path, command: Sequence[str]) -> int:
    """Run ``command`` as this rank's child; record how it ended in ``status.rank{r}.json``."""
    rank = _rank_from_env()
    started = time.time()
    child = subprocess.Popen(
        list(command),
        stderr=subprocess.PIPE,
        close_fds=False,
        preexec_fn=_die_with_parent,
    )  # close_fds=False: the MPI process manager hands the rank its connection as an inherited fd
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    assert child.stderr is not None
    for raw in child.stderr:
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
        tail.append(raw.decode(errors="replace").rstrip("\n"))
    code = child.wait()
    status = {
        "rank": rank,
        "exit_status": code,
        "signal": signal.Signals(-code).name if code < 0 else None,
        "stderr_tail": list(tail),
        "started_unix_s": started,
        "ended_unix_s": time.time(),
    }
    from ddlsim.simulator.records import write_json

    write_json(status_path(status_dir, rank), status)
    return 128 - code if code < 0 else code


# --- launching -----------------------------------------------------------------------------------


def worker_command(mode: str, scenario: Mapping[str, Any], out: Path) -> list[str]:
    return [sys.executable, "-m", "ddlsim.real_runs.worker", mode, "--scenario", json.dumps(scenario, sort_keys=True),
            "--out", str(out)]  # fmt: skip


def wrapped(command: Sequence[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "ddlsim.real_runs.launcher", "wrap", "--status-dir", str(out), "--", *command]


def free_port() -> int:
    """A loopback port free now (another program may take it before it is bound: ``port_taken``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    """End the process groups this launcher started (each was started in its own session)."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_all(processes: Sequence[subprocess.Popen], timeout_s: float | None) -> bool:
    """Wait for every process; once one fails, give the others a grace period, then stop them.
    Returns False on timeout."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failed_at = None
    while any(process.poll() is None for process in processes):
        now = time.monotonic()
        if deadline is not None and now > deadline:
            return False
        if failed_at is None and any((process.poll() or 0) != 0 for process in processes):
            failed_at = now
        if failed_at is not None and now - failed_at > 10:
            _stop(processes)
            break
        time.sleep(0.05)
    return True


def launch(
    mode: str,
    scenario: Mapping[str, Any],
    out: Path,
    ranks: int,
    *,
    backend: str = "mpi",
    mpiexec: str | None = None,
    hostfile: str | None = None,
    timeout_s: float | None = None,
    emulate_network: str | None = None,
) -> int:
    """Run the worker on ``ranks`` ranks; print what went wrong and return non-zero if anything did."""
    out = Path(out)
    if under_mpiexec():
        from ddlsim.real_runs.worker import run

        return run(mode, dict(scenario), out)
    check_requirements(backend)
    out.mkdir(parents=True, exist_ok=True)
    stale = _clear_run_files(out)  # an earlier run's files would mix with this run's (more ranks then, say)
    if stale:
        print(f"# removed {stale} file(s) of an earlier run in {out}", file=sys.stderr)
    command = wrapped(worker_command(mode, scenario, out), out)
    env = rank_env(ranks)
    if emulate_network:
        return _launch_emulated(command, out, ranks, backend, mpiexec, timeout_s, emulate_network, env)
    if backend == "mpi":
        argv = [find_mpiexec(mpiexec), "-n", str(ranks)]
        if hostfile:
            argv += ["-hostfile", hostfile]
        processes = [subprocess.Popen(argv + command, env=env, start_new_session=True)]
    else:
        return _launch_gloo(command, env, out, ranks, timeout_s)
    return _finish(processes, out, ranks, timeout_s)


def _launch_gloo(command: list[str], env: dict[str, str], out: Path, ranks: int, timeout_s: float | None) -> int:
    """The ranks on this machine over gloo, rank 0's store on a free port. The port is probed free and
    then bound by rank 0, so another program can take it in between: a run whose ranks failed because
    of that (``EADDRINUSE``) is started again on a new port, up to ``GLOO_PORT_ATTEMPTS`` times."""
    for attempt in range(1, GLOO_PORT_ATTEMPTS + 1):
        port = str(free_port())
        processes = []
        for rank in range(ranks):
            gloo = {"RANK": str(rank), "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                    "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo")}  # fmt: skip
            processes.append(subprocess.Popen(command, env={**env, **gloo}, start_new_session=True))
        finished = _wait(processes, timeout_s)
        if attempt == GLOO_PORT_ATTEMPTS or not (finished and _port_was_taken(processes, out)):
            return _report(processes, finished, out, ranks, timeout_s)
        _clear_run_files(out)
        print(f"# port {port} was taken before rank 0 could listen on it; starting the ranks again on another "
              f"(attempt {attempt + 1} of {GLOO_PORT_ATTEMPTS})", file=sys.stderr)  # fmt: skip
    raise AssertionError("unreachable")


def _clear_run_files(out: Path) -> int:
    """Remove what a run or bench writes into ``out`` (``RUN_FILES``); how many files went."""
    files = [path for pattern in RUN_FILES for path in sorted(out.glob(pattern))]
    for path in files:
        path.unlink()
    return len(files)


def port_taken(output: str) -> bool:
    """Whether a rank's output says its store could not listen because the port was in use."""
    lowered = output.lower()
    return "eaddrinuse" in lowered or "address already in use" in lowered


def _port_was_taken(processes: Sequence[subprocess.Popen], out: Path) -> bool:
    """Whether the finished ranks failed because the store's port was in use."""
    if not any(process.returncode for process in processes):
        return False
    return any(port_taken(line) for status in read_statuses(out).values() for line in status["stderr_tail"])


def _launch_emulated(command: list[str], out: Path, ranks: int, backend: str, mpiexec: str | None,
                     timeout_s: float | None, rate: str, env: dict[str, str]) -> int:  # fmt: skip
    try:
        emulated = importlib.import_module("ddlsim.real_runs.emulated_network")
    except ModuleNotFoundError as error:
        raise LaunchError(f"--emulate-network needs real_runs.emulated_network, which is missing ({error})") from None
    problem = emulated.check_permitted() if hasattr(emulated, "check_permitted") else None
    if problem:
        raise LaunchError(f"--emulate-network cannot run here: {problem}")
    rate_Bps = emulated.parse_rate(rate)
    with emulated.star_network(ranks, rate_Bps) as network:
        if backend == "mpi":
            argv, extra = network.mpiexec_command(ranks, command, find_mpiexec(mpiexec))
            processes = [subprocess.Popen(argv, env={**env, **extra}, start_new_session=True)]
        else:
            processes = network.launch_gloo([command] * ranks, env, start_new_session=True)
        return _finish(processes, out, ranks, timeout_s)


def _wait(processes: Sequence[subprocess.Popen], timeout_s: float | None) -> bool:
    """``_wait_all``, stopping the processes on Ctrl-C."""
    try:
        return _wait_all(processes, timeout_s)
    except KeyboardInterrupt:
        _stop(processes)
        raise


def _finish(processes: Sequence[subprocess.Popen], out: Path, ranks: int, timeout_s: float | None) -> int:
    return _report(processes, _wait(processes, timeout_s), out, ranks, timeout_s)


def _report(
    processes: Sequence[subprocess.Popen], finished: bool, out: Path, ranks: int, timeout_s: float | None
) -> int:
    """Print what went wrong (a timeout, failed ranks) and return the run's exit status."""
    if not finished:
        _stop(processes)
        print(f"ddlsim: error: {timeout_report(out, ranks, timeout_s)}", file=sys.stderr)
        return 124
    codes = [process.returncode for process in processes]
    report = failure_report(out, ranks)
    if report:
        print(f"ddlsim: error: {report}", file=sys.stderr)
        kept = write_finished_steps(out)
        if kept:
            print(f"# wrote {out / 'results.csv'}: the {kept} step(s) every rank finished, from the traces "
                  "(iteration_s only: the losses were lost with the ranks)", file=sys.stderr)  # fmt: skip
        return 1
    if any(codes):
        print(f"ddlsim: error: the launcher's processes exited with status {codes}", file=sys.stderr)
        return 1
    return 0


def read_statuses(out: Path) -> dict[int, dict[str, Any]]:
    statuses = {}
    for path in Path(out).glob(STATUS_GLOB):
        with contextlib.suppress(ValueError, OSError):
            status = json.loads(path.read_text())
            statuses[int(status["rank"])] = status
    return statuses


def _last_iterations(out: Path) -> dict[int, int]:
    """The last iteration each rank's trace holds (-1: none)."""
    from ddlsim.real_runs.trace import read_trace

    last: dict[int, int] = {}
    with contextlib.suppress(ValueError, OSError):
        for row in read_trace(out):
            last[row["rank"]] = max(last.get(row["rank"], -1), row["iteration"])
    return last


def failure_report(out: Path, ranks: int) -> str:
    """Which ranks failed and why (first failure first), or '' when every rank exited 0."""
    statuses = read_statuses(out)
    failed = sorted((s for s in statuses.values() if s["exit_status"] != 0), key=lambda s: s["ended_unix_s"])
    missing = [rank for rank in range(ranks) if rank not in statuses]
    if not failed and not missing:
        return ""
    if not failed:
        return f"rank(s) {', '.join(map(str, missing))} ended without reporting a status (killed with their wrapper?)"
    last = _last_iterations(out)
    lines = []
    for index, status in enumerate(failed):
        why = f"killed by signal {status['signal']}" if status["signal"] else f"exit status {status['exit_status']}"
        cause = " (first to fail)" if index == 0 and len(failed) > 1 else ""
        lines.append(f"rank {status['rank']} failed{cause}: {why}; its trace holds iterations up to "
                     f"{last.get(status['rank'], -1)}")  # fmt: skip
        if status["stderr_tail"]:
            lines.append(f"  last stderr lines of rank {status['rank']}:")
            lines += [f"    {line}" for line in status["stderr_tail"]]
    if missing:
        lines.append(f"rank(s) {', '.join(map(str, missing))} were stopped before reporting")
    return "\n".join(lines)


def write_finished_steps(out: Path) -> int:
    """After a failed training run: ``results.csv`` (iteration, loss empty, iteration_s) of the steps
    every rank's trace shows finished, timed as the first rank that trains (the lowest rank with a
    ``forward`` or ``gradient``). A step counts once the rank's next step began. Returns the steps
    written (0: none, nothing written; not a training run)."""
    from ddlsim.real_runs.trace import read_trace
    from ddlsim.simulator.records import write_csv

    with contextlib.suppress(ValueError, OSError):
        rows = read_trace(out)
        starts: dict[int, dict[int, float]] = {}
        for row in rows:
            if row["op"] in ("forward", "gradient"):
                mine = starts.setdefault(row["rank"], {})
                mine[row["iteration"]] = min(mine.get(row["iteration"], row["start_s"]), row["start_s"])
        if not starts:
            return 0
        first = starts[min(starts)]
        done = min(max(steps) for steps in starts.values())  # each rank's last step may be unfinished
        table = [
            {"iteration": step, "loss": "", "iteration_s": first[step + 1] - first[step]}
            for step in range(done)
            if step in first and step + 1 in first
        ]
        if table:
            write_csv(out / "results.csv", table, ("iteration", "loss", "iteration_s"))
        return len(table)
    return 0


def timeout_report(out: Path, ranks: int, timeout_s: float | None) -> str:
    statuses = read_statuses(out)
    last = _last_iterations(out)
    pending = [rank for rank in range(ranks) if rank not in statuses]
    where = ", ".join(f"rank {rank} at iteration {last.get(rank, -1)}" for rank in pending)
    return f"timed out after {timeout_s:g} s; not finished: {where or 'none reported (all ranks stuck at start?)'}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddlsim.real_runs.launcher wrap --status-dir DIR -- COMMAND...`` (the per-rank wrapper)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "wrap" or args[1] != "--status-dir" or args[3] != "--":
        print("usage: python -m ddlsim.real_runs.launcher wrap --status-dir DIR -- COMMAND...", file=sys.stderr)
        return 2
    return wrap(Path(args[2]), args[4:])


if __name__ == "__main__":
    sys.exit(main())
