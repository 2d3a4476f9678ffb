"""Flow-level sharing: tiny stories with timelines a reader can check by hand."""

import numpy as np
import pytest
import simpy

from ddlsim.hardware_models.network import alpha_beta_time_s, max_min_fair_rates
from ddlsim.simulator.engine.flow_network import FlowNetwork


def test_alpha_beta():
    """2 us + 1 MB / 1 GB/s = 1.002 ms."""
    assert alpha_beta_time_s(1e6, 2e-6, 1e9) == pytest.approx(1.002e-3)


def test_max_min_two_on_one_link():
    """Two flows on a 10 B/s link get 5 each; a flow alone on a 3 B/s link gets 3."""
    assert max_min_fair_rates([[0], [0], [1]], np.array([10.0, 3.0])).tolist() == [5.0, 5.0, 3.0]


def test_max_min_bottleneck_frees_capacity():
    """Flows a (links 0,1) and b (link 1) share link 1 (4 B/s): 2 each; flow c takes the 8 left on link 0."""
    assert max_min_fair_rates([[0, 1], [1], [0]], np.array([10.0, 4.0])).tolist() == [2.0, 2.0, 8.0]


def _story(starts_and_bytes, capacity=10e9):
    env = simpy.Environment()
    network = FlowNetwork(env, np.array([capacity]))
    log = []

    def flow(name, start, nbytes):
        yield env.timeout(start)
        yield network.transfer([0], nbytes)
        log.append((name, round(env.now * 1e3, 9)))

    for name, start, nbytes in starts_and_bytes:
        env.process(flow(name, start, nbytes))
    env.run()
    return log


def test_two_flows_share_then_finish_together():
    """10 MB each on 10 GB/s from t=0: each gets 5 GB/s, both end at 2 ms."""
    assert sorted(_story([("a", 0, 10e6), ("b", 0, 10e6)])) == [("a", 2.0), ("b", 2.0)]


def test_late_flow_slows_early_one():
    """a alone for 0.5 ms (5 MB done), then both at 5 GB/s: a ends at 1.5 ms; b has 5 MB left at full rate: 2.0 ms."""
    assert _story([("a", 0, 10e6), ("b", 0.5e-3, 10e6)]) == [("a", 1.5), ("b", 2.0)]


def test_zero_bytes_is_instant():
    assert _story([("a", 1e-3, 0)]) == [("a", 1.0)]
