"""Progress of long work on stderr: a bar on a terminal, a line per stage otherwise.

One facility for every command and library function that can run longer than a few seconds
(sweeps, microbenchmarks, fits, the gallery). It needs nothing from the command line::

    from ddlsim.simulator.progress import Progress

    progress = Progress("simulating", unit="points")
    for done, point in enumerate(points, start=1):
        simulate(point)
        progress(done, len(points))          # the call signature run_sweep's ``progress`` takes

    progress.stage("ping-pong", total=14, unit="sizes")   # a new stage: what it does and how much
    progress.advance()                                   # one more done
    progress.close()                                     # at the end (also when done == total)

How it shows (``mode``):

=========== ===============================================================================
``bar``     a tqdm bar that redraws in place: stage, count, rate, elapsed and time left
``lines``   plain lines for logs and batch jobs, e.g.
            ``ddlsim: simulating: 3/10 points (30%), 12 s elapsed, about 28 s left``:
            one when a stage first reports, then at most one per ``interval_s``, and one
            when it ends; nothing at all for work that ends within ``delay_s``
``off``     nothing
=========== ===============================================================================

``Progress(label, enabled=None)``: ``None`` picks ``bar`` when stderr is a terminal and ``lines``
otherwise (the environment variable ``DDLSIM_PROGRESS=bar|lines|off`` overrides the choice, which
is how ``ddlsim bench`` passes it to its ranks, with ``DDLSIM_PROGRESS_DELAY=0`` when ``--progress`` was
asked for explicitly); ``True`` shows progress at once (a bar on a
terminal, lines otherwise, without the quiet ``delay_s``); ``False`` shows nothing. Commands wire it
to ``--progress/--no-progress``. The estimate assumes the rest of the stage goes at the pace so far.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

MODES = ("bar", "lines", "off")
ENVIRONMENT = "DDLSIM_PROGRESS"
DELAY_ENVIRONMENT = "DDLSIM_PROGRESS_DELAY"


def format_duration(seconds: float) -> str:
    """A short human duration: ``0.4 s``, ``12 s``, ``3 min 05 s``, ``2 h 10 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def resolve_mode(enabled: bool | None, stream: TextIO) -> str:
    """``bar``, ``lines`` or ``off`` for an ``enabled`` setting (see the module docstring)."""
    if enabled is False:
        return "off"
    wanted = os.environ.get(ENVIRONMENT, "").strip().lower()
    if enabled is None and wanted in MODES:
        return wanted
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def inherited_delay_s() -> float:
    """The quiet first stretch a parent process asked for (``DDLSIM_PROGRESS_DELAY``), else 1 s."""
    try:
        return max(0.0, float(os.environ.get(DELAY_ENVIRONMENT, "1")))
    except ValueError:
        return 1.0


class Progress:
    """Reports ``done`` of ``total`` for the current stage; callable as ``progress(done, total)``."""

    def __init__(
        self,
        label: str,
        enabled: bool | None = None,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        delay_s: float | None = None,
        interval_s: float = 10.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.mode = resolve_mode(enabled, self.stream)
        # asked for explicitly: show at once; by default: stay quiet for work that ends within a second
        self.delay_s = delay_s if delay_s is not None else (0.0 if enabled else inherited_delay_s())
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self.label = label
        self.unit = unit
        self.total: int | None = None
        self.done = 0
        self._stage_started = self.started
        self._last_line: float | None = None
        self._bar: Any = None
        self.estimate = True  # False: the stage's total is an upper bound, no time left is shown

    # --- the interface -------------------------------------------------------------------------
    def __call__(self, done: int, total: int) -> None:
        """``done`` of ``total`` units of the current stage are finished."""
        if self.total is not None and total != self.total:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
        self.total = total
        self.done = done
        if self.mode == "bar":
            self._draw_bar()
        elif self.mode == "lines":
            self._maybe_line()
        if done >= total:
            self._end_stage()

    def advance(self, count: int = 1) -> None:
        """``count`` more units of the current stage are finished."""
        self(self.done + count, self.total if self.total is not None else self.done + count)

    def stage(self, label: str, total: int, unit: str | None = None, *, estimate: bool = True) -> None:
        """Start a new stage (``label``: what it does, ``total``: how many ``unit`` it has).

        ``estimate=False`` for a stage that may stop early (a search that prunes the rest): ``total``
        is then at most what it does, and no time left is shown, since the pace so far says nothing
        about when it stops."""
        self._end_stage()
        self.label = label
        self.unit = self.unit if unit is None else unit
        self.estimate = estimate
        self.total = total
        self.done = 0
        self._stage_started = self.clock()
        self._last_line = None

    def close(self) -> None:
        self._end_stage()

    # --- drawing -------------------------------------------------------------------------------
    def _draw_bar(self) -> None:
        if self._bar is None:
            from tqdm import tqdm  # only commands that draw a bar pay for the import

            self._bar = tqdm(
                total=self.total,
                desc=self.label,
                unit=f" {self.unit}" if self.unit else "it",
                file=self.stream,
                leave=True,
                dynamic_ncols=True,
                mininterval=0.2,
                delay=self.delay_s,
                # a stage that may stop early: its count and elapsed time, no rate-based time left
                **({} if self.estimate else {"bar_format": "{desc}: {n_fmt} of at most {total_fmt}{unit} [{elapsed}]"}),
            )
        self._bar.update(self.done - self._bar.n)

    def _maybe_line(self) -> None:
        now = self.clock()
        if now - self.started < self.delay_s:
            return
        finished = self.total is not None and self.done >= self.total
        if self._last_line is None or finished or now - self._last_line >= self.interval_s:
            self._last_line = now
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The status line of the current stage: what, how far, elapsed and the estimate left."""
        now = self.clock() if now is None else now
        elapsed = now - self._stage_started
        total = self.total or 0
        unit = f" {self.unit}" if self.unit else ""
        if not self.estimate:  # the total is an upper bound: no share and no time left
            text = f"ddlsim: {self.label}: {self.done} of at most {total}{unit}, {format_duration(elapsed)} elapsed"
            return text + (", done" if total and self.done >= total else "")
        text = f"ddlsim: {self.label}: {self.done}/{total}{unit}"
        if total:
            text += f" ({100 * self.done / total:.0f}%)"
        text += f", {format_duration(elapsed)} elapsed"
        if 0 < self.done < total:
            text += f", about {format_duration(elapsed / self.done * (total - self.done))} left"
        elif total and self.done >= total:
            text += ", done"
        return text

    def _end_stage(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        stopped_early = not self.estimate and self.total is not None and self.done < self.total
        if self.mode == "lines" and stopped_early and self._last_line is not None:
            # a search that pruned the rest: say it ended, as a finished stage does
            self.stream.write(self.line() + ", done\n")
            self.stream.flush()
            self._last_line = None
