"""Everyday use (issue 15): progress, numbers with units, tables, sizes, files, start-up, bad input."""

from __future__ import annotations

import io

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
    from ddlsim.hardware_models.units import format_bytes

    assert [format_bytes(s) for s in (65536, 2**30, 1e6, 1.6e8, 1536, 3)] == [
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
    from ddlsim.simulator.cli.parsing import parse_counts

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
    from ddlsim.simulator.cli.parsing import InputError, parse_counts

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
