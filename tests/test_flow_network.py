"""Flow-level sharing: tiny stories with timelines a reader can check by hand."""

import numpy as np
import pytest
import simpy

from ddlsim.hardware_models.network import alpha_beta_time_s, max_min_fair_rates
from ddlsim.simulator.engine import flow_network
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


def _reference_ends(flows, capacity):
    """End time of each (start, links, bytes) flow by the textbook fluid loop: at every start or end,
    re-rate all active flows with the reference progressive filling; nothing batched or pruned."""
    remaining = [nbytes for _, _, nbytes in flows]
    ends = [start if nbytes <= 0 else None for start, _, nbytes in flows]
    now = min(start for start, _, _ in flows)
    while any(end is None for end in ends):
        active = [i for i, (start, _, _) in enumerate(flows) if start <= now and ends[i] is None]
        rates = max_min_fair_rates([flows[i][1] for i in active], capacity) if active else []
        upcoming = [start for start, _, _ in flows if start > now]
        step = min([remaining[i] / rate for i, rate in zip(active, rates, strict=True)] + [u - now for u in upcoming])
        for i, rate in zip(active, rates, strict=True):
            remaining[i] -= rate * step
        now += step
        for i in active:
            if remaining[i] <= 1e-9 * flows[i][2]:
                ends[i] = now
    return ends


def _network_ends(flows, capacity, redundant=None):
    env = simpy.Environment()
    network = FlowNetwork(env, capacity, redundant)
    ends = [None] * len(flows)

    def flow(i, start, links, nbytes):
        yield env.timeout(start)
        yield network.transfer(links, nbytes)
        ends[i] = env.now

    for i, (start, links, nbytes) in enumerate(flows):
        env.process(flow(i, start, links, nbytes))
    env.run()
    return ends, network


def _random_flows(seed):
    """Random links, capacities (with ties), start times (with ties: same-instant batches) and sizes."""
    rng = np.random.default_rng(seed)
    links = int(rng.integers(2, 8))
    capacity = rng.choice([1e9, 2e9, 5e9, 10e9], size=links)
    flows = []
    for _ in range(int(rng.integers(1, 30))):
        route = sorted(set(rng.integers(0, links, size=int(rng.integers(1, 4))).tolist()))
        start = float(rng.choice([0.0, 1e-3, 2e-3])) if rng.random() < 0.5 else float(rng.random() * 3e-3)
        flows.append((start, route, float(rng.choice([0.0, 1e6, 3e6, 1e7]))))
    return flows, capacity


@pytest.mark.parametrize("seed", range(12))
def test_random_flows_end_when_the_reference_fluid_loop_says(seed):
    flows, capacity = _random_flows(seed)
    expected = _reference_ends(flows, capacity)
    ends, network = _network_ends(flows, capacity)
    np.testing.assert_allclose(ends, expected, rtol=1e-9)
    assert network.active_flows == 0


@pytest.mark.parametrize("small", [0, 10_000])
@pytest.mark.parametrize("seed", range(6))
def test_scalar_and_numpy_bookkeeping_each_match_the_reference(seed, small, monkeypatch):
    """Few flows in flight are kept in scalar Python, many in numpy arrays: either one alone, for
    the whole run, gives the reference loop's ends."""
    monkeypatch.setattr(flow_network, "_SMALL_FLOWS", small)
    monkeypatch.setattr(flow_network, "_SMALL_HOPS", small)
    monkeypatch.setattr(flow_network, "_SHORT_PATH", small)
    flows, capacity = _random_flows(seed)
    ends, network = _network_ends(flows, capacity)
    np.testing.assert_allclose(ends, _reference_ends(flows, capacity), rtol=1e-9)
    assert network.active_flows == 0


def test_a_prepared_route_is_the_same_as_its_links():
    """``route`` drops -1 padding and keeps the path's slowest link as the flow's bound."""
    env = simpy.Environment()
    network = FlowNetwork(env, np.array([10e9, 4e9, 8e9]))
    route = network.route(np.array([0, 1, -1, -1]))
    assert route.links == (0, 1) and route.cap_Bps == 4e9
    ends = []

    def flow(links):
        yield network.transfer(links, 4e6)
        ends.append(env.now)

    env.process(flow(route))
    env.process(flow([0, 1]))
    env.run()
    assert ends == pytest.approx([2e-3, 2e-3])  # the two share link 1: 2 GB/s each


def test_same_instant_starts_are_rated_once():
    """64 flows starting together into one port: one rate computation for all 64 starts, and none
    when they all end together (nothing is left to rate)."""
    flows = [(0.0, [0, 1 + i], 1e6) for i in range(64)]
    ends, network = _network_ends(flows, np.full(65, 10e9))
    assert ends == pytest.approx([64e6 / 10e9] * 64, rel=1e-12)
    assert network.rerates == 1


def test_redundant_link_changes_nothing():
    """Link 4 (30 GB/s) carries only flows that also cross links 0-2 (10 GB/s each): it cannot bind,
    and leaving it out (as ``Fabric.redundant`` marks a full-bisection leaf uplink) gives the same ends."""
    rng = np.random.default_rng(7)
    capacity = np.array([10e9, 10e9, 10e9, 4e9, 30e9])
    flows = [
        (float(rng.random() * 1e-3), [int(rng.integers(0, 3)), 4] + ([3] if rng.random() < 0.3 else []), 2e6)
        for _ in range(40)
    ]
    full, _ = _network_ends(flows, capacity)
    pruned, _ = _network_ends(flows, capacity, redundant=np.array([False, False, False, False, True]))
    np.testing.assert_allclose(pruned, full, rtol=1e-12)
    np.testing.assert_allclose(full, _reference_ends(flows, capacity), rtol=1e-9)
