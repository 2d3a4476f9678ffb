"""Flow-level bandwidth sharing in SimPy: concurrent transfers share links max-min fairly.

Each active flow has bytes left and a rate. Whenever a flow starts or ends, every flow is
advanced to ``now`` at its old rate, rates are recomputed (``max_min_fair_rates``) and the next
completion is scheduled. A stale wake-up (rates changed since it was scheduled) is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from ddlsim.hardware_models.network import max_min_fair_rates

_FINISH_TOLERANCE = 1e-12  # relative: a flow projected to end within this of now has ended


@dataclass
class _Flow:
    links: tuple[int, ...]
    remaining: float
    rate: float
    finish: float
    done: simpy.Event


class FlowNetwork:
    def __init__(self, env: simpy.Environment, capacity_Bps: np.ndarray) -> None:
        self.env = env
        self.capacity_Bps = np.asarray(capacity_Bps, dtype=np.float64)
        self._flows: list[_Flow] = []
        self._updated = env.now
        self._generation = 0

    @property
    def active_flows(self) -> int:
        return len(self._flows)

    def transfer(self, links, nbytes: float) -> simpy.Event:
        """An event that fires when ``nbytes`` have crossed ``links`` (link ids; -1 entries ignored)."""
        done = self.env.event()
        path = tuple(int(link) for link in links if link >= 0)
        if nbytes <= 0 or not path:
            done.succeed()
            return done
        self._advance()
        self._flows.append(_Flow(path, float(nbytes), 0.0, np.inf, done))
        self._reschedule()
        return done

    def _advance(self) -> None:
        elapsed = self.env.now - self._updated
        if elapsed > 0:
            for flow in self._flows:
                flow.remaining -= flow.rate * elapsed
        self._updated = self.env.now

    def _reschedule(self) -> None:
        now = self.env.now
        if self._flows:
            rates = max_min_fair_rates([flow.links for flow in self._flows], self.capacity_Bps)
            for flow, rate in zip(self._flows, rates, strict=True):
                flow.rate = float(rate)
                flow.finish = now + max(flow.remaining, 0.0) / flow.rate
        self._generation += 1
        if self._flows:
            generation = self._generation
            delay = max(min(flow.finish for flow in self._flows) - now, 0.0)
            self.env.timeout(delay).callbacks.append(lambda _event: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        now = self.env.now
        limit = now + _FINISH_TOLERANCE * max(abs(now), 1e-9)
        finished = [flow for flow in self._flows if flow.finish <= limit]
        self._flows = [flow for flow in self._flows if flow.finish > limit]
        for flow in finished:
            flow.done.succeed()
        self._reschedule()
