"""Everyday use (issue 15): progress, numbers with units, tables, sizes, files, start-up, bad input."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ddlsim.simulator.cli.main import main
from ddlsim.simulator.progress import Progress, format_duration


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# --- 1. progress -------------------------------------------------------------------------------------


def test_progress_lines_off_a_terminal_name_the_stage_and_estimate_the_rest():
    clock, stream = Clock(), io.StringIO()
    progress = Progress("simulating", unit="points", stream=stream, clock=clock, interval_s=10)
    assert progress.mode == "lines"
    clock.now = 0.5
    progress(1, 10)  # within the quiet first second: nothing
    assert stream.getvalue() == ""
    clock.now = 2.0
    progress(2, 10)  # 2 of 10 in 2 s: 8 left at 1 s each
    clock.now = 5.0
    progress(5, 10)  # within 10 s of the last line: nothing
    clock.now = 12.0
    progress(8, 10)
    clock.now = 13.0
    progress(10, 10)
    assert stream.getvalue().splitlines() == [
        "ddlsim: simulating: 2/10 points (20%), 2.0 s elapsed, about 8.0 s left",
        "ddlsim: simulating: 8/10 points (80%), 12 s elapsed, about 3.0 s left",
        "ddlsim: simulating: 10/10 points (100%), 13 s elapsed, done",
    ]


def test_progress_stages_each_get_their_own_line_and_clock():
    clock, stream = Clock(), io.StringIO()
    progress = Progress("bench", enabled=True, stream=stream, clock=clock)
    progress.stage("ping-pong", total=2, unit="sizes")
    clock.now = 4.0
    progress.advance()
    clock.now = 6.0
    progress.stage("collectives", total=4, unit="points")
    clock.now = 7.0
    progress.advance()
    assert stream.getvalue().splitlines() == [
        "ddlsim: ping-pong: 1/2 sizes (50%), 4.0 s elapsed, about 4.0 s left",
        "ddlsim: collectives: 1/4 points (25%), 1.0 s elapsed, about 3.0 s left",
    ]


def test_a_stage_that_may_stop_early_shows_no_time_left_and_says_when_it_ended():
    """plan's branch and bound walks at most every layout and prunes the rest: its first line said
    'about 2 h 57 min left' for a search that ended 0.1 s later."""
    clock, stream = Clock(), io.StringIO()
    progress = Progress("plan", enabled=True, stream=stream, clock=clock)
    progress.stage("bounds, then the closed form best first", total=5640, unit="layouts", estimate=False)
    clock.now = 1.9
    progress(1, 5640)
    clock.now = 2.0
    progress(16, 5640)  # within the interval: no line
    progress.close()  # the rest pruned
    assert stream.getvalue().splitlines() == [
        "ddlsim: bounds, then the closed form best first: 1 of at most 5640 layouts, 1.9 s elapsed",
        "ddlsim: bounds, then the closed form best first: 16 of at most 5640 layouts, 2.0 s elapsed, done",
    ]
    terminal = Terminal()
    bar = Progress("plan", enabled=True, stream=terminal)
    bar.mode = "bar"
    bar.stage("search", total=100, unit="layouts", estimate=False)
    bar(3, 100)
    bar.close()
    assert "3 of at most 100 layouts" in terminal.getvalue() and "<" not in terminal.getvalue()


def test_progress_draws_a_bar_on_a_terminal_and_nothing_when_off(monkeypatch):
    monkeypatch.delenv("DDLSIM_PROGRESS", raising=False)
    terminal = Terminal()
    progress = Progress("simulating", enabled=True, unit="points", stream=terminal)
    assert progress.mode == "bar"
    for done in range(1, 4):
        progress(done, 3)
    drawn = terminal.getvalue()
    assert "simulating" in drawn and "3/3" in drawn and "\r" in drawn
    quiet = io.StringIO()
    off = Progress("simulating", enabled=False, stream=quiet)
    off(1, 1)
    assert off.mode == "off" and quiet.getvalue() == ""


def test_progress_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("DDLSIM_PROGRESS", "off")
    assert Progress("x", stream=Terminal()).mode == "off"
    monkeypatch.setenv("DDLSIM_PROGRESS", "lines")
    assert Progress("x", stream=Terminal()).mode == "lines"
    assert Progress("x", enabled=False, stream=Terminal()).mode == "off"  # the flag wins


def test_progress_quiet_first_second_can_be_waived_by_the_parent(monkeypatch):
    clock, stream = Clock(), io.StringIO()
    monkeypatch.setenv("DDLSIM_PROGRESS", "lines")
    quiet = Progress("bench", stream=stream, clock=clock)
    quiet(1, 2)
    assert stream.getvalue() == ""  # work that may end within its first second says nothing yet
    monkeypatch.setenv("DDLSIM_PROGRESS_DELAY", "0")  # what ddlsim bench --progress passes its ranks
    at_once = Progress("bench", stream=stream, clock=clock)
    at_once(1, 2)
    assert stream.getvalue().startswith("ddlsim: bench: 1/2 (50%)")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.42, "0.4 s"), (12.4, "12 s"), (185, "3 min 05 s"), (7800, "2 h 10 min")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_collective_reports_progress_per_point_off_a_terminal(capsys):
    code, _, err = run(capsys, "collective", "--ranks", "4", "--message-bytes", "1KiB,2KiB", "--progress")
    assert code == 0
    assert err.splitlines()[-1].startswith("ddlsim: simulating allreduce (ring): 2/2 points (100%)")


# --- 4. sizes and counts as people write them ---------------------------------------------------------


def test_binary_size_ranges_land_on_their_end_like_nccl_tests():
    from ddlsim.hardware_models.units import parse_sizes

    sizes = parse_sizes("1KiB:1GiB:x2")
    assert sizes == tuple(float(2**k) for k in range(10, 31))


def test_a_size_range_ends_at_its_end_even_where_the_steps_miss_it():
    from ddlsim.hardware_models.units import parse_sizes

    sizes = parse_sizes("1KB:1GB:x2")  # 1000 x 2^19 = 524.288 MB, then the end point the user asked for
    assert sizes[-2:] == (524_288_000.0, 1e9) and len(sizes) == 21
    assert parse_sizes("2KiB:10KiB:+2KiB") == (2048.0, 4096.0, 6144.0, 8192.0, 10240.0)
    assert parse_sizes("1MB:4MB:x2") == (1e6, 2e6, 4e6)
    assert parse_sizes("64KiB") == (65536.0,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1GB:1KB:x2", "runs backwards (END 1000 B < START 1e+09 B)"),
        ("0.5", "not a whole number of bytes"),
        ("1.5B", "not a whole number of bytes"),
        ("1e308", "outside what is physically meaningful; allowed: 1 B to 1 EB"),
        ("inf", "cannot parse 'inf'"),
        ("nan", "cannot parse 'nan'"),
        ("0", "sizes must be > 0 bytes"),
        ("1KB:1MB:x1", "factor in '1KB:1MB:x1' must be a number >= 1.5"),
        ("1KB:1MB", "write START:END:xFACTOR or START:END:+STEP"),
    ],
)
def test_bad_sizes_say_what_is_wrong(text, message):
    from ddlsim.hardware_models.units import UnitError, parse_sizes

    with pytest.raises(UnitError, match=r"^--message-bytes: ") as caught:
        parse_sizes(text)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        ("parse_bandwidth", "1e-300 bit/s", "allowed: 1 bit/s to 8 Pbit/s"),
        ("parse_bandwidth", float("inf"), "not a finite number"),
        ("parse_bandwidth", "1e300 Gbit/s", "outside what is physically meaningful"),
        ("parse_bytes", float("nan"), "not a finite number"),
        ("parse_seconds", "1e30 s", "allowed: 1 fs to a year"),
        ("parse_flops", "1e40 FLOP/s", "outside what is physically meaningful"),
    ],
)
def test_absurd_quantities_are_refused(parse, value, message):
    from ddlsim.hardware_models import units

    with pytest.raises(units.UnitError, match=message):
        getattr(units, parse)(value)


def test_binary_sizes_print_in_binary_and_decimal_in_decimal():
    from ddlsim.reports.formatting import format_size

    assert [format_size(s) for s in (65536, 2**30, 1e6, 1.6e8, 1536, 3)] == [
        "64 KiB", "1 GiB", "1 MB", "160 MB", "1.536 kB", "3 B",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,2,4,...,32", (1, 2, 4, 8, 16, 32)),
        ("2,4,...,10", (2, 4, 6, 8, 10)),
        ("1:16:x2", (1, 2, 4, 8, 16)),
        ("1:100:x2", (1, 2, 4, 8, 16, 32, 64, 100)),
        ("2:8:+3", (2, 5, 8)),
        ("1:3", (1, 2, 3)),
        ("3", (3,)),
    ],
)
def test_parse_counts(text, expected):
    from ddlsim.simulator.parsing import parse_counts

    assert parse_counts(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,3,...,10", "the pattern 1,3,... does not reach 10"),
        ("16:1:x2", "runs backwards (END 1 < START 16)"),
        ("1,2,banana", "cannot parse '1,2,banana'"),
        ("0,1", "counts must be positive, got 0"),
        ("1,...,8", "'...' must follow two or more counts"),
        ("1:8:x1", "must be xF with F >= 2"),
        ("1e308", "cannot parse '1e308'"),
        ("1,100000000", "100,000,000 is past the largest count allowed, 16,777,216"),
    ],
)
def test_bad_counts_get_their_own_message(text, message):
    from ddlsim.simulator.parsing import InputError, parse_counts

    with pytest.raises(InputError, match=r"^nodes: ") as caught:
        parse_counts(text)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["collective", "--ranks", "1,3,...,10"], "ranks: the pattern 1,3,... does not reach 10"),
        (["simulate", "--nodes", "1,3,...,10"], "nodes: the pattern 1,3,... does not reach 10"),
        (["collective", "--message-bytes", "1GB:1KB:x2"], "runs backwards"),
        (["collective", "--message-bytes", "0.5"], "not a whole number of bytes"),
    ],
)
def test_the_precise_message_reaches_the_user(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and message in err


def test_help_says_which_size_units_are_decimal(capsys):
    with pytest.raises(SystemExit):
        main(["collective", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1 kB = 1000 B" in text and "1 KiB = 1024 B" in text and "1KiB:1GiB:x2" in text


# --- 5. files others can read; 9. valid JSON ------------------------------------------------------------


def test_atomic_writes_end_with_the_umask_mode_and_keep_an_existing_files_mode(tmp_path):
    import os
    import stat

    from ddlsim.simulator.records import atomic_open, write_csv

    old = os.umask(0o022)
    try:
        write_csv(tmp_path / "results.csv", [{"a": 1}], ("a",))
        assert stat.S_IMODE((tmp_path / "results.csv").stat().st_mode) == 0o644
        os.umask(0o007)
        with atomic_open(tmp_path / "group.txt") as handle:
            handle.write("x")
        assert stat.S_IMODE((tmp_path / "group.txt").stat().st_mode) == 0o660
        (tmp_path / "results.csv").chmod(0o640)  # a mode the owner chose survives a rewrite
        write_csv(tmp_path / "results.csv", [{"a": 2}], ("a",))
        assert stat.S_IMODE((tmp_path / "results.csv").stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_numpy_float_is_written_as_its_number(tmp_path):
    """A float64 from numpy is a float whose repr under numpy 2 is 'np.float64(0.79...)': the
    Horovod gallery entry's results.csv had that text in a column until write_csv took float() first."""
    import numpy as np

    from ddlsim.simulator.records import read_csv, write_csv

    write_csv(tmp_path / "r.csv", [{"a": np.float64(0.7969002150224421), "b": 0.5, "c": np.int64(3)}], "abc")
    (row,) = read_csv(tmp_path / "r.csv")
    assert row == {"a": "0.7969002150224421", "b": "0.5", "c": "3"}


def test_result_files_of_a_command_are_readable_by_others(capsys, tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        code, _, err = run(capsys, "collective", "--ranks", "4", "--message-bytes", "1MB", "--out", str(tmp_path / "c"))
    finally:
        os.umask(old)
    assert code == 0, err
    for name in ("results.csv", "setup.json"):
        assert stat.S_IMODE((tmp_path / "c" / name).stat().st_mode) == 0o644, name


def test_json_files_are_strict_json(tmp_path):
    import json

    from ddlsim.simulator.records import write_json, write_jsonl

    write_json(tmp_path / "s.json", {"median_ape": float("nan"), "rows": [1.5, float("inf")], "n": 0})
    text = (tmp_path / "s.json").read_text()
    assert "NaN" not in text and "Infinity" not in text

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    assert json.loads(text, parse_constant=refuse) == {"median_ape": None, "rows": [1.5, None], "n": 0}
    write_jsonl(tmp_path / "t.jsonl", [{"x": float("-inf")}])
    assert json.loads((tmp_path / "t.jsonl").read_text(), parse_constant=refuse) == {"x": None}


# --- 9. --out checked before the work starts -------------------------------------------------------------


def _sim_dir(tmp_path):
    """A small simulate result directory for the plot and report commands."""
    from ddlsim.simulator.records import write_csv

    run_dir = tmp_path / "sim"
    rows = [
        {"nodes": n, "devices": 8 * n, "iteration_s": 0.1 * (1 + n / 10), "compute_s": 0.1, "exposed_comm_s": 0.01 * n,
         "scaling_efficiency": 1 / (1 + n / 10), "throughput_samples_per_s": 640 * n / (1 + n / 10)}
        for n in (1, 2)
    ]  # fmt: skip
    write_csv(run_dir / "results.csv", rows, tuple(rows[0]))
    return run_dir


@pytest.mark.parametrize(
    ("command", "out_kind", "message"),
    [
        ("collective", "file", "is a file; give a directory to write results.csv, setup.json"),
        ("collective", "under_file", "is a file, not a directory"),
        ("collective", "unwritable", "cannot write in /sys: Permission denied"),
        ("plot", "directory", "is a directory; give the name of the file to write"),
        ("plot", "under_file", "is a file, not a directory"),
        ("plot", "unwritable", "cannot write in /sys"),
        ("report", "directory", "is a directory; give the name of the file to write"),
        ("report", "unwritable", "cannot write in /sys"),
        ("gallery", "file", "is a file; give a directory to write README.md, index.html"),
        ("bench", "file", "is a file; give a directory to write measurements.csv"),
        ("bench", "unwritable", "cannot write in /sys"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_work(capsys, tmp_path, command, out_kind, message):
    import os

    if out_kind == "unwritable" and os.access("/sys", os.W_OK) and os.geteuid() != 0:
        pytest.skip("/sys is writable here")
    (tmp_path / "a_file").write_text("keep me")
    (tmp_path / "a_dir").mkdir()
    out = {
        "file": tmp_path / "a_file", "directory": tmp_path / "a_dir", "under_file": tmp_path / "a_file" / "x",
        "unwritable": Path("/sys/ddlsim-out"),
    }[out_kind]  # fmt: skip
    argv = {
        "collective": ["collective", "--ranks", "4", "--message-bytes", "1MB"],
        "plot": ["plot", "scaling", str(_sim_dir(tmp_path))],
        "report": ["report", str(_sim_dir(tmp_path))],
        "gallery": ["report", "gallery"],
        "bench": ["bench", "-n", "2", "--benchmarks", "ping_pong"],
    }[command]
    code, stdout, err = run(capsys, *argv, "--out", str(out))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"ddlsim: error: --out {out}: ") and message in err
    assert ".tmp" not in err and stdout == ""  # the user's path, and nothing ran
    assert (tmp_path / "a_file").read_text() == "keep me" and list((tmp_path / "a_dir").iterdir()) == []


def test_unwritable_directory_is_refused_for_a_user_without_root(tmp_path):
    import os

    from ddlsim.simulator.cli.common import InputError, check_output

    if os.geteuid() == 0:
        pytest.skip("root writes anywhere; the /sys case covers a read-only place")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(InputError, match="cannot write in"):
        check_output(locked / "run", "directory")


def test_a_file_named_like_an_output_inside_the_directory_is_refused(tmp_path):
    from ddlsim.simulator.cli.common import InputError, check_output

    (tmp_path / "results.csv").mkdir()
    with pytest.raises(InputError, match=r"results\.csv is a directory, where the file results\.csv goes"):
        check_output(tmp_path, "directory", files=("results.csv",))
    check_output(tmp_path / "new" / "deeper", "directory", files=("results.csv",))  # created later: fine
    assert not (tmp_path / "new").exists()  # the check itself writes nothing


# --- 5. the gallery writes where the user says, and reports only read files -----------------------------


def test_gallery_defaults_to_the_working_directory_not_the_package(monkeypatch, tmp_path):
    import ddlsim
    from ddlsim.simulator.cli import gallery_runs

    monkeypatch.chdir(tmp_path)
    assert not gallery_runs.DEFAULT_OUT.is_absolute()
    assert gallery_runs.DEFAULT_OUT.resolve().parent == tmp_path
    package = Path(ddlsim.__file__).resolve().parent
    assert package not in gallery_runs.DEFAULT_OUT.resolve().parents


def test_reports_import_nothing_of_the_simulator_but_its_records():
    import re

    import ddlsim.reports

    folder = Path(ddlsim.reports.__file__).resolve().parent
    imports = {
        match
        for path in folder.glob("*.py")
        for match in re.findall(r"ddlsim\.simulator[.\w]*", path.read_text(encoding="utf-8"))
    }
    assert imports <= {"ddlsim.simulator.records"}, imports


# --- 6. quick to start --------------------------------------------------------------------------------


def _modules_after(code: str) -> set[str]:
    import subprocess
    import sys

    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    return set(result.stdout.split())


def test_help_imports_no_command_module_and_no_numerical_library():
    loaded = _modules_after(
        "from ddlsim.simulator.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert "ddlsim.simulator.cli.main" in loaded
    heavy = {"numpy", "simpy", "matplotlib", "torch", "importlib.metadata", "ddlsim.simulator.cli.simulate_command"}
    assert not heavy & loaded, heavy & loaded


def test_a_command_imports_only_its_own_module():
    loaded = _modules_after(
        "from ddlsim.simulator.cli.main import main\nmain(['collective', '--ranks', '2', '--message-bytes', '1KB'])"
    )
    assert "ddlsim.simulator.cli.collective_command" in loaded
    assert not {"matplotlib", "ddlsim.simulator.cli.simulate_command", "ddlsim.simulator.cli.bench_command"} & loaded


def test_the_closed_form_imports_no_numerical_library_nor_the_event_simulation(tmp_path):
    loaded = _modules_after(
        "from ddlsim.simulator.cli.main import main\n"
        f"main(['simulate', '--executor', 'analytic', '--nodes', '1000000', '--out', {str(tmp_path)!r}])"
    )
    assert "ddlsim.simulator.closed_form.training" in loaded
    heavy = {"numpy", "scipy", "simpy", "matplotlib", "torch", "ddlsim.simulator.engine.fabric",
             "ddlsim.simulator.executor.des", "ddlsim.simulator.training.transformer_trainer",
             "ddlsim.hardware_models.profile"}  # fmt: skip
    assert not heavy & loaded, heavy & loaded
    # the registries imported the one training algorithm and the one collective the run uses
    plugins = {module for module in loaded if module.endswith(("_training", "_collective"))}
    assert plugins == {"ddlsim.algorithms.sync_sgd_training", "ddlsim.algorithms.ring_collective"}


def test_every_registered_token_is_its_files_name():
    """What lets a registry import a token's file alone, and list the tokens without importing them."""
    from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
    from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS
    from ddlsim.registry import Registry

    for registry, suffix in ((TRAINING_ALGORITHMS, "_training"), (COLLECTIVE_ALGORITHMS, "_collective")):
        unloaded = Registry(registry.kind, package="ddlsim.algorithms", suffix=suffix)
        assert unloaded.names_from_files() == registry.names()


def test_version(capsys):
    import ddlsim

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"ddlsim {ddlsim.__version__}\n" and ddlsim.__version__[0].isdigit()


def test_the_lazy_help_of_each_command_is_the_commands_own():
    from ddlsim.simulator.cli.main import ALIASES, COMMANDS, build_parser

    loaded = build_parser(every=True)._subparsers._group_actions[0]  # type: ignore[union-attr]
    helps = {action.dest: action.help for action in loaded._choices_actions}
    assert {name: help_text for name, (_, help_text) in COMMANDS.items()} == {
        name: helps[name] for name in COMMANDS
    }
    assert set(loaded.choices) == set(COMMANDS) | set(ALIASES)


def test_malformed_options_are_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["collective", "--nics-per-node", "1e308"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith("ddlsim: error: argument --nics-per-node: --nics-per-node takes a whole number")
    with pytest.raises(SystemExit):
        main(["collective", "--oversubscription", "inf"])
    assert "must be in [1, 1024], got 'inf'" in capsys.readouterr().err


# --- 7. bench rows: ids unique per run; 9/10. bench input ---------------------------------------------------


class OneRank:
    """The one-rank side of a transport that BenchContext needs before any benchmark runs."""

    rank, size = 0, 1

    def allgather_object(self, value):
        return [value]


def test_bench_row_ids_are_unique_per_run():
    from ddlsim.real_runs.microbench import BenchContext, Stats

    ids = []
    for _ in range(2):
        context = BenchContext(OneRank())
        for size in (1024, 2048):
            context.add(kind="collective", collective="allreduce", algorithm="ring", ranks=1, message_bytes=size,
                        stats=Stats.of([1e-3, 2e-3]), bus_Bps=1e9)  # fmt: skip
        assert all(row["id"].startswith(f"BENCH-{context.run_id}-") for row in context.rows)
        ids.append([row["id"] for row in context.rows])
    assert len(set(ids[0])) == 4 and not set(ids[0]) & set(ids[1])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--collective-sizes", "0"], "--collective-sizes: sizes must be > 0 bytes"),
        (["--collective-sizes", "1KiB,0.5"], "not a whole number of bytes"),
        (["--collective-sizes", "64GiB"], "outside 1 B to 16 GiB"),
        (["--p2p-max-bytes", "1e308"], "outside what is physically meaningful"),
        (["--rank-counts", "2,9"], "--rank-counts: 9 is not between 2 and the 2 ranks of -n"),
        (["--batch-sizes", "16,0"], "--batch-sizes: counts must be positive"),
        (["--benchmarks", "pingpong"], "unknown benchmark(s) pingpong"),
    ],
)
def test_bench_refuses_bad_input_before_launching(capsys, tmp_path, argv, message):
    code, _, err = run(capsys, "bench", "-n", "2", *argv, "--out", str(tmp_path / "b"))
    assert code == 2 and err.count("\n") == 1 and message in err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
@pytest.mark.mpi
def test_two_bench_runs_share_no_row_id_and_report_progress(tmp_path):
    import os
    import subprocess
    import sys

    from ddlsim.simulator.records import read_csv

    pytest.importorskip("mpi4py")
    env = {**os.environ, "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}
    env.pop("DDLSIM_PROGRESS", None)
    env.pop("DDLSIM_PROGRESS_DELAY", None)
    ids = []
    for name in ("a", "b"):
        # --progress asked for explicitly reports from the first point, however fast this machine is
        command = [sys.executable, "-m", "ddlsim", "bench", "-n", "2", "--benchmarks", "ping_pong,collectives",
                   "--p2p-max-bytes", "64KiB", "--collective-sizes", "1KiB:4MiB:x4", "--repeats", "3", "--warmup", "1",
                   *(["--progress"] if name == "a" else []), "--out", str(tmp_path / name)]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        ids.append({row["id"] for row in read_csv(tmp_path / name / "measurements.csv")})
        if name == "a":
            assert "ddlsim: bench collectives: " in done.stderr and "points (100%)" in done.stderr
    assert ids[0] and ids[1] and not ids[0] & ids[1]


# --- 9. interrupting a process-pool sweep ---------------------------------------------------------------

SWEEP_SCRIPT = """
import signal, sys, time
# as started from a terminal: a shell that runs a command in the background without job control
# (a CI script's `cmd &`) starts it with SIGINT ignored, and Python then keeps it ignored, as nohup
# does; the test is of Ctrl-C at a terminal, so the child starts as one would there
signal.signal(signal.SIGINT, signal.default_int_handler)
from ddlsim.simulator import sweep
from ddlsim.simulator.scenario import Scenario

def slow_point(task):
    scenario, nodes = task
    time.sleep(0.2 if nodes == 4 else 60)  # the biggest point starts first and ends at once
    return {"nodes": nodes}

sweep._point = slow_point  # forked workers inherit it
try:
    sweep.run_sweep(Scenario(nodes=(1, 2, 3, 4)), workers=2, pool="process",
                    on_row=lambda index, row: print("row", index, row["nodes"], flush=True))
except sweep.SweepInterrupted as stop:
    print("kept", sorted(stop.rows), stop.signum, flush=True)
    sys.exit(128 + stop.signum)
"""


def _group_members(pgid: int) -> list[int]:
    import os

    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


@pytest.mark.parametrize("signum_name", ["SIGINT", "SIGTERM"])
def test_an_interrupted_sweep_stops_at_once_ends_its_workers_and_keeps_finished_points(signum_name):
    import os
    import signal
    import subprocess
    import sys
    import time

    signum = getattr(signal, signum_name)
    child = subprocess.Popen([sys.executable, "-c", SWEEP_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["row", "3", "4"]  # the finished point, as it finished
        time.sleep(0.3)  # the other points are running in the workers now
        assert len(_group_members(child.pid)) >= 3  # the parent and its two workers
        sent = time.monotonic()
        if signum == signal.SIGINT:  # Ctrl-C on a terminal reaches the whole process group
            os.killpg(child.pid, signum)
        else:  # a batch system's SIGTERM reaches the main process
            child.send_signal(signum)
        rest = child.stdout.read()
        code = child.wait(timeout=20)
        stopped_s = time.monotonic() - sent
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    # with what the child printed and logged, so that a failure says how the sweep ended
    assert code == 128 + signum and rest.split() == ["kept", "[3]", str(int(signum))], (code, rest, child.stderr.read())
    assert stopped_s < 3.0, stopped_s  # not the 60 s the running points would take
    time.sleep(0.2)
    assert _group_members(child.pid) == []  # no worker left behind


def test_sweep_rows_reach_the_callback_as_they_finish_in_order_of_nodes_at_the_end():
    from ddlsim.simulator.scenario import Scenario
    from ddlsim.simulator.sweep import run_sweep

    seen = []
    rows = run_sweep(Scenario(nodes=(1, 2), executor="analytic"), pool="serial", on_row=lambda i, row: seen.append(i))
    assert seen == [0, 1] and [row["nodes"] for row in rows] == [1, 2]


# --- 2 and 3. one known result, the same numbers and units in the terminal, the plot and the report ------------

KNOWN_ROWS = [  # nodes, iteration, compute, exposed (s), throughput (samples/s), speedup, efficiency (fraction)
    {"nodes": n, "devices": 8 * n, "global_batch": 256 * n, "iteration_s": t, "compute_s": 0.1, "exposed_comm_s": e,
     "comm_s": e, "throughput_samples_per_s": x, "speedup": s, "scaling_efficiency": f}
    for n, t, e, x, s, f in ((1, 0.15, 0.05, 1000.0, 8.0, 1.0), (2, 0.2, 0.1, 1500.0, 12.0, 0.75),
                             (4, 0.3, 0.2, 2000.4, 16.0, 0.5))
]  # fmt: skip
# what a reader should see, worked out by hand: 4 significant digits on a column's largest value
EXPECTED_TERMINAL = [
    "nodes devices global_batch iteration_s compute_s exposed_comm_s throughput_samples_per_s speedup "
    "scaling_efficiency_pct",
    "1 8 256 0.1500 0.1000 0.0500 1000 8.00 100.0",
    "2 16 512 0.2000 0.1000 0.1000 1500 12.00 75.0",
    "4 32 1024 0.3000 0.1000 0.2000 2000 16.00 50.0",
]
KNOWN_SUMMARY = {"n_predicted": 2, "n_cannot_model": 0, "median_ape": 0.405, "p90_ape": 0.55, "max_ape": 0.6,
                 "ci_level": 0.9, "ci_coverage": 0.5, "tolerance": 0.10, "passed": False}  # fmt: skip
HEADLINE = "median APE 40.5 %, p90 55 %, 90 % CI coverage 50 %, tolerance 10 %: FAIL"


@pytest.fixture
def known_results(tmp_path):
    import json

    from ddlsim.simulator.cli.validate_command import VALIDATION_COLUMNS
    from ddlsim.simulator.records import write_csv

    write_csv(tmp_path / "sim" / "results.csv", KNOWN_ROWS, tuple(KNOWN_ROWS[0]))
    rows = [
        {"id": "A-1", "kind": "collective", "metric": "time_s", "measured": 1e-3, "predicted": 1.405e-3,
         "error_pct": 40.5, "status": "predicted"},
        {"id": "A-2", "kind": "training", "metric": "throughput_samples_per_s", "measured": 1000.0,
         "predicted": 450.0, "error_pct": -55.0, "status": "predicted"},
    ]  # fmt: skip
    write_csv(tmp_path / "val" / "validation.csv", rows, VALIDATION_COLUMNS)
    (tmp_path / "val" / "summary.json").write_text(json.dumps(KNOWN_SUMMARY))
    return tmp_path


def test_the_terminal_table_shows_one_format_per_column_with_units(known_results):
    from ddlsim.simulator.cli.common import print_table

    out = io.StringIO()
    print_table(KNOWN_ROWS, [c for c in KNOWN_ROWS[0] if c != "comm_s"], out)
    assert [" ".join(line.split()) for line in out.getvalue().splitlines()] == EXPECTED_TERMINAL
    widths = {len(line) for line in out.getvalue().splitlines()}
    assert len(widths) == 1  # aligned


@pytest.mark.parametrize(
    ("column", "values", "shown"),
    [
        ("time_s", [97908.32, 1.94e5], ("s", ["97908", "194000"])),  # one notation, not 97908.32 then 1.94e+05
        ("time_s", [0.0006297, 0.0038], ("s", ["0.000630", "0.003800"])),  # not 0.0006297 beside 0.0038
        ("steps_to_target", [1234.2, 99.0], ("", ["1235", "99"])),  # a count of steps is whole
        ("comm_share", [0.5, float("nan"), None, ""], ("%", ["50.00", "-", "-", "-"])),  # - where it does not apply
        ("busbw_Bps", [1.2e9, 2.5e10], ("GB/s", ["1.20", "25.00"])),
        ("time_s", [1e-6, 1.0], ("s", ["1.000e-06", "1.000e+00"])),  # six decades: scientific for the column
    ],
)
def test_a_column_has_one_format(column, values, shown):
    from ddlsim.reports.formatting import format_column, quantity_of

    assert format_column(values, quantity_of(column)) == shown


def test_the_validation_plot_title_shows_percent_of_the_fractions(known_results):
    from ddlsim.reports import plots

    with plots.validate_figure(known_results / "val") as fig:
        assert fig._suptitle is not None and fig._suptitle.get_text() == HEADLINE
        labels = {ax.get_xlabel() for ax in fig.axes if ax.get_visible()}
    assert labels == {"measured time (s)", "measured throughput (samples/s)"}


def _html_text(html_text: str) -> list[str]:
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.cells: list[str] = []
            self.skip = False

        def handle_starttag(self, tag, attrs):
            self.skip = tag in ("style", "script", "title")

        def handle_data(self, data):
            if not self.skip and data.strip():
                self.cells.append(data.strip())

    parser = Text()
    parser.feed(html_text)
    return parser.cells


def test_the_html_report_shows_the_same_numbers_and_units(capsys, known_results):
    import shutil
    import subprocess

    out = known_results / "report.html"
    assert main(["report", str(known_results / "sim"), str(known_results / "val"), "--out", str(out)]) == 0
    pages = {"file": out.read_text(encoding="utf-8")}
    if shutil.which("chromium"):  # the page as a browser builds it
        dump = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom",
             f"--user-data-dir={known_results / 'profile'}", out.as_uri()],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        assert "<table" in dump.stdout, dump.stderr[-2000:]
        pages["chromium"] = dump.stdout
    for where, page in pages.items():
        text = _html_text(page)
        joined = " ".join(text)
        assert f"against a tolerance of 10 % median absolute percentage error: {HEADLINE}." in joined, where
        summary = dict(zip(text[text.index("summary") + 2 :: 2], text[text.index("summary") + 3 :: 2], strict=False))
        assert summary["median_ape"] == "40.5 %" and summary["tolerance"] == "10 %" and summary["passed"] == "FAIL"
        assert summary["ci_coverage"] == "50 %" and summary["n_predicted"] == "2"
        heads = text[text.index("nodes") : text.index("nodes") + 10]
        assert heads == ["nodes", "devices", "global batch", "iteration (s)", "compute (s)", "exposed comm (s)",
                         "comm (s)", "throughput (samples/s)", "speedup (x)", "scaling efficiency (%)"], where
        first = text[text.index("scaling efficiency (%)") + 1 :][:10]
        assert first == ["1", "8", "256", "0.1500", "0.1000", "0.0500", "0.0500", "1000", "8.00", "100.0"], where
        # the same figures as the terminal (EXPECTED_TERMINAL's first row, without comm)
        assert first[:6] + first[7:] == EXPECTED_TERMINAL[1].split(), where
        assert "1.41 ms" in text and "450 samples/s" in text, where  # each row's metric with its unit


# --- 9. profile files with a wrong type in a nested key ------------------------------------------------------

PROFILE = """schema_version = 1
description = "hand-written"
overlap_interference = { value = 0.0, source = "x" }
noise_sigma = { value = 0.05, source = "x" }
[devices.k80]
compute_efficiency = { value = 0.41, source = "fitted" }
[devices.k80.layer_efficiency]
conv = { value = 0.45, source = "fitted" }
[links.ib_fdr]
breakpoints_bytes = { value = [1e6], source = "fitted" }
alpha_s = { value = [2e-5, 5e-6], source = "fitted" }
beta_Bps = { value = [9e9, 1.2e10], source = "fitted" }
[[bootstrap]]
"devices.k80.compute_efficiency" = 0.40
"""


def test_the_profile_of_these_tests_loads(tmp_path):
    from ddlsim.hardware_models.profile import load_profile

    (tmp_path / "p.toml").write_text(PROFILE)
    profile = load_profile(tmp_path / "p.toml")
    assert profile.links["ib_fdr"].alpha_s == (2e-5, 5e-6) and profile.devices["k80"].compute_efficiency == 0.41


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("[devices.k80]\ncompute_efficiency = { value = 0.41, source = \"fitted\" }\n[devices.k80.layer_efficiency]\n"
         "conv = { value = 0.45, source = \"fitted\" }\n", "devices = 5\n", "key 'devices' must be a table, got 5"),
        ("[devices.k80]\ncompute_efficiency = { value = 0.41, source = \"fitted\" }\n[devices.k80.layer_efficiency]\n"
         "conv = { value = 0.45, source = \"fitted\" }\n", "devices = { k80 = 5 }\n",
         "key 'devices.k80' must be a table, got 5"),
        ("[devices.k80.layer_efficiency]\nconv = { value = 0.45, source = \"fitted\" }\n", "layer_efficiency = 5\n",
         "key 'layer_efficiency' must be a table, got 5"),
        ("alpha_s = { value = [2e-5, 5e-6]", "alpha_s = { value = 2e-5", "key 'alpha_s': value must be [numbers]"),
        ("compute_efficiency = { value = 0.41", "compute_efficiency = { value = [0.41]",
         "key 'compute_efficiency': value must be a number"),
        ('conv = { value = 0.45, source = "fitted" }', "conv = { value = 0.45, source = 5 }",
         "key 'conv': source must be a string"),
        ('conv = { value = 0.45, source = "fitted" }', "conv = 0.45", "key 'conv' must be a table"),
        ('description = "hand-written"', "description = 5", "key 'description' must be a string"),
        ('"devices.k80.compute_efficiency" = 0.40', '"devices.k80.compute_efficiency" = "high"',
         "[[bootstrap]] 1, key 'devices.k80.compute_efficiency': must be a number"),
        ('beta_Bps = { value = [9e9, 1.2e10]', 'beta_Bps = { value = [9e9, "fast"]',
         "key 'beta_Bps': must be a number"),
    ],
)
def test_a_wrong_type_anywhere_in_a_profile_is_one_clear_error(tmp_path, old, new, message):
    from ddlsim.hardware_models.profile import ProfileError, load_profile

    assert old in PROFILE
    text = PROFILE.replace(old, new)
    if new.startswith("devices = "):  # TOML: bare keys before the first table
        text = new + text.replace(new, "")
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(ProfileError) as caught:
        load_profile(tmp_path / "p.toml")
    assert message in str(caught.value) and str(tmp_path / "p.toml") in str(caught.value)


def test_a_profile_that_is_not_utf8_is_one_clear_error(tmp_path):
    from ddlsim.hardware_models.profile import ProfileError, load_profile

    (tmp_path / "p.toml").write_bytes(PROFILE.replace("hand-written", "hand-written \xe9").encode("latin-1"))
    with pytest.raises(ProfileError, match="not UTF-8 text"):
        load_profile(tmp_path / "p.toml")


# --- 9. a collective beyond reach is refused up front, with what it would cost ------------------------------


def test_a_collective_beyond_reach_is_refused_at_once_with_an_estimate(capsys):
    import time

    started = time.monotonic()
    code, _, err = run(capsys, "collective", "--ranks", "10000000", "--message-bytes", "1MB")
    assert code == 2 and err.count("\n") == 1 and time.monotonic() - started < 5
    assert "10,000,000 ranks is beyond reach of the message-level simulation (at most 1,048,576: " in err
    assert "4.3 GB per point" in err


def test_the_cost_note_scales_from_the_measured_points():
    from ddlsim.simulator.cli.collective_command import reach_note

    # 65,536 ranks: 3 s (log-many rounds) and 7 s (ring), as measured; twice the ranks: 6 s and 28 s
    note = reach_note(2**16)
    assert note.startswith("about 3.0 s and 0.3 GB per point") and "up to 7.0 s for a ring" in note
    assert reach_note(2**17).startswith("about 6.0 s and 0.5 GB") and "up to 28 s for a ring" in reach_note(2**17)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("bandwidth", '"1e-300 bit/s"', "outside what is physically meaningful; allowed: 1 bit/s to 8 Pbit/s"),
        ("bandwidth", "inf", "not a finite number"),
        ("bandwidth", "nan", "not a finite number"),
        ("latency", '"1e308 s"', "allowed: 1 fs to a year"),
    ],
)
def test_a_users_datasheet_with_an_absurd_number_is_refused(tmp_path, key, value, message):
    import re

    from ddlsim.hardware_models.catalog import CatalogError, load_link_file

    text = (Path(__file__).resolve().parents[1] / "hardware_models" / "links" / "ib_edr.toml").read_text()
    text = re.sub(rf"(\[{key}\]\nvalue = )[^\n]+", lambda m: m.group(1) + value, text)
    (tmp_path / "my_net.toml").write_text(text)
    with pytest.raises(CatalogError, match=re.escape(message)):
        load_link_file(tmp_path / "my_net.toml")


def test_collective_counts_and_sizes_are_bounded(capsys):
    with pytest.raises(SystemExit):
        main(["collective", "--devices-per-node", "100000"])
    assert "--devices-per-node must be in [1, 1024]" in capsys.readouterr().err


# --- 3. list training-algorithms; 8. every command in the README -------------------------------------------


def test_training_algorithm_descriptions_are_whole_and_plain(capsys):
    code, out, _ = run(capsys, "list", "training-algorithms")
    assert code == 0 and "`" not in out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    # sync_sgd's docstring opens with a paragraph that ends "... PyTorch DDP)."; async_msgd's spans two lines
    assert lines["sync_sgd"].rstrip().endswith("(the data-parallel baseline; Goyal et al. 2017, Horovod, PyTorch DDP).")
    assert "async_sgd whose servers keep a momentum buffer (the Async MSGD baseline" in lines["async_msgd"]


def test_the_readme_shows_every_command():
    import re

    from ddlsim.simulator.cli.main import COMMANDS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    use = readme[readme.index("## Use") :]
    shown = set(re.findall(r"^ddlsim ([a-z-]+)", use, flags=re.MULTILINE))
    assert set(COMMANDS) <= shown, set(COMMANDS) - shown
