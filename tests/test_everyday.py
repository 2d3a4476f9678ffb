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
