"""The launcher: a killed rank is named with its signal and its finished iterations stay intact;
ranks started with different scenarios stop with a clear message; a stuck run times out naming
the ranks; missing pieces give an install hint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlsim.real_runs import environment, launcher
from ddlsim.real_runs.launcher import LaunchError

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180


def ddlsim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}  # fmt: skip
    command = [sys.executable, "-m", "ddlsim", *args]
    return subprocess.run(command, cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_under_mpiexec_is_detected_from_the_environment():
    assert launcher.under_mpiexec({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert launcher.under_mpiexec({"OMPI_COMM_WORLD_SIZE": "4"})
    assert not launcher.under_mpiexec({"PATH": "/bin"})


def test_rank_environment_fixes_the_allocator_thresholds_unless_the_caller_set_them(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    env = environment.rank_env(2)
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 2**30  # above any one activation buffer of our models
    assert env["MALLOC_TRIM_THRESHOLD_"] == "65536"
    assert env["OMP_NUM_THREADS"] == "1"


def test_missing_mpi4py_gives_the_install_hint(monkeypatch):
    real = launcher.importlib.util.find_spec
    monkeypatch.setattr(launcher.importlib.util, "find_spec", lambda name: None if name == "mpi4py" else real(name))
    with pytest.raises(LaunchError, match=r"mpi4py.*pip install 'ddlsim\[real\]'"):
        launcher.check_requirements("mpi")


def test_missing_mpiexec_override_is_named():
    with pytest.raises(LaunchError, match="no-such-mpiexec"):
        launcher.find_mpiexec("no-such-mpiexec")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--collective", "nope"], "unknown collective algorithm 'nope'; valid:"),
        (["--algorithm", "nope"], "unknown training algorithm 'nope'; valid:"),
        (["--algorithm", "ring"], "'ring' is a collective algorithm, not a training algorithm: use --collective ring"),
        (["--tau", "3"], "--tau do(es) not apply to --algorithm sync_sgd"),
        (["--algorithm", "async_sgd", "--servers", "2"], "async_sgd: 2 server(s) leave no worker among 2 rank(s)"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, argv, message):
    done = ddlsim("run", "-n", "2", *argv, "--out", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"ddlsim: error: {message}"), done.stderr
    assert done.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


pytest.importorskip("mpi4py")
pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.mpi
def test_a_killed_rank_is_named_and_its_finished_iterations_survive(tmp_path):
    from ddlsim.real_runs.trace import read_trace

    done = ddlsim("run", "-n", "2", "--model", "resnet_small", "--iterations", "6", "--bucket-bytes", "20kB",
                  "--fail-rank", "1", "--fail-at-iteration", "3", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "rank 1 failed" in done.stderr and "SIGKILL" in done.stderr, done.stderr
    assert "its trace holds iterations up to 2" in done.stderr, done.stderr
    rows = [row for row in read_trace(tmp_path) if row["rank"] == 1]
    assert sorted({row["iteration"] for row in rows}) == [0, 1, 2]
    for iteration in range(3):
        ops = [row["op"] for row in rows if row["iteration"] == iteration]
        assert {"forward", "backward", "update"} <= set(ops) and ops.count("allreduce") > 1, ops
    # the finished steps are kept as results (steps 0 and 1: step 2's end is step 3's start, never reached)
    results = (tmp_path / "results.csv").read_text().splitlines()
    assert results[0] == "iteration,loss,iteration_s" and [line.split(",")[0] for line in results[1:]] == ["0", "1"]
    assert all(float(line.split(",")[2]) > 0 for line in results[1:])
    assert "wrote" in done.stderr and "2 step(s) every rank finished" in done.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_a_rerun_into_the_same_directory_removes_the_earlier_runs_files(tmp_path):
    first = ddlsim("run", "-n", "3", "--model", "small_cnn", "--iterations", "2", "--out", str(tmp_path))
    assert first.returncode == 0, first.stderr
    second = ddlsim("run", "-n", "2", "--model", "small_cnn", "--iterations", "2", "--out", str(tmp_path))
    assert second.returncode == 0, second.stderr
    assert "removed" in second.stderr and "of an earlier run" in second.stderr
    traces = sorted(path.name for path in tmp_path.glob("trace.rank*.jsonl"))
    assert traces == ["trace.rank0.jsonl", "trace.rank1.jsonl"]


@pytest.mark.slow
@pytest.mark.mpi
def test_ranks_with_different_scenarios_stop_with_a_clear_message(tmp_path):
    mpiexec = launcher.find_mpiexec()
    env = {**os.environ, "MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    one = [sys.executable, "-m", "ddlsim", "run", "--out", str(tmp_path)]
    command = [mpiexec, "-n", "1", *one, "--iterations", "2", ":", "-n", "1", *one, "--iterations", "3"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0
    assert "ranks disagree on the scenario" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_a_run_past_its_timeout_is_stopped_naming_the_ranks(tmp_path):
    done = ddlsim("run", "-n", "2", "--iterations", "1000000", "--timeout", "12", "--out", str(tmp_path))
    assert done.returncode == 124, done.stderr
    assert "timed out after 12 s; not finished: rank 0 at iteration" in done.stderr, done.stderr


@pytest.mark.slow
def test_training_runs_on_the_gloo_backend_too(tmp_path):
    done = ddlsim("run", "-n", "2", "--backend", "gloo", "--model", "resnet_small", "--iterations", "3",
                  "--bucket-bytes", "20kB", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 ranks, ring" in done.stdout
    # the ranks ran with the environment the launcher gave them, and the run says so
    recorded = json.loads((tmp_path / "metadata.json").read_text())["environment"]
    assert recorded["OMP_NUM_THREADS"] == "1"
    assert {key: recorded.get(key) for key in environment.ALLOCATOR_ENV} == environment.ALLOCATOR_ENV
    assert sorted(path.name for path in tmp_path.glob("trace.rank*.jsonl")) == [
        "trace.rank0.jsonl",
        "trace.rank1.jsonl",
    ]


@pytest.mark.slow
def test_a_gloo_run_whose_port_was_taken_starts_again_on_another(tmp_path, monkeypatch, capsys):
    """The launcher probes a free port and rank 0's store binds it later; here another socket holds
    the first port handed out (as another program may, in between), so rank 0 cannot listen: the
    run starts again on a fresh port and trains."""
    import socket

    from ddlsim.simulator.cli.main import main

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = iter([taken])
        probe = launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda: next(ports, None) or probe())
        code = main(["run", "-n", "2", "--backend", "gloo", "--model", "resnet_small", "--iterations", "2",
                     "--timeout", "150", "--out", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"# port {taken} was taken before rank 0 could listen on it" in err
    statuses = sorted(tmp_path.glob("status.rank*.json"))  # the second start's only: the first's were cleared
    assert [path.name for path in statuses] == ["status.rank0.json", "status.rank1.json"]
    assert all(json.loads(path.read_text())["exit_status"] == 0 for path in statuses)
