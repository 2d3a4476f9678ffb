"""The vectorised max-min solver equals the reference progressive filling on random instances."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlsim.hardware_models.network import max_min_fair_rates, max_min_fair_rates_flat


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 25))
def test_flat_equals_reference(seed, links, flows):
    rng = np.random.default_rng(seed)
    capacity = rng.choice([1.0, 2.0, 5.0, 10.0], size=links)  # repeated values make ties
    routes = [sorted(set(rng.integers(0, links, size=rng.integers(1, 4)).tolist())) for _ in range(flows)]
    owner = np.array([f for f, route in enumerate(routes) for _ in route])
    link = np.array([lk for route in routes for lk in route])
    expected = max_min_fair_rates(routes, capacity)
    np.testing.assert_allclose(max_min_fair_rates_flat(owner, link, flows, capacity), expected, rtol=1e-12)


def _random_flows(seed: int, links: int, flows: int):
    """(link capacities, flow bounds, routes, and the routes flat: hop owners, hop links) of a random
    instance; some flows cross no link."""
    rng = np.random.default_rng(seed)
    capacity = rng.choice([1.0, 2.0, 5.0, 10.0], size=links)
    bound = rng.choice([0.5, 1.0, 3.0, 20.0], size=flows)
    routes = [sorted(set(rng.integers(0, links, size=rng.integers(0, 4)).tolist())) for _ in range(flows)]
    owner = np.array([f for f, route in enumerate(routes) for _ in route], dtype=np.int64)
    link = np.array([lk for route in routes for lk in route], dtype=np.int64)
    return capacity, bound, routes, owner, link


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 25))
def test_per_flow_bounds_are_private_links(seed, links, flows):
    """``bound`` gives what a private link per flow gives, bit for bit, and the reference's answer
    with those links; some flows cross no shared link (then their bound is their rate)."""
    capacity, bound, routes, owner, link = _random_flows(seed, links, flows)
    private = max_min_fair_rates_flat(
        np.concatenate([owner, np.arange(flows)]),
        np.concatenate([link, links + np.arange(flows)]),
        flows,
        np.concatenate([capacity, bound]),
    )
    np.testing.assert_array_equal(max_min_fair_rates_flat(owner, link, flows, capacity, bound=bound), private)
    expected = max_min_fair_rates(
        [[*route, links + f] for f, route in enumerate(routes)], np.concatenate([capacity, bound])
    )
    np.testing.assert_allclose(private, expected, rtol=1e-12)


def test_levels_by_hand():
    """Flow 0 on link A (10), flow 1 on A and B (4), flow 2 on B: B's share 2 freezes flows 1 and 2,
    then A has 8 left for flow 0. Both passes freeze a link at exactly the level."""
    owner = np.array([0, 1, 1, 2])
    link = np.array([0, 0, 1, 1])
    levels = []
    rates = max_min_fair_rates_flat(owner, link, 3, np.array([10.0, 4.0]), levels=levels)
    np.testing.assert_array_equal(rates, [8.0, 2.0, 2.0])
    assert levels == [(2.0, True), (8.0, True)]


def test_levels_report_a_pass_that_freezes_a_link_above_its_level():
    """Two lone flows on links of capacity 1 and 1 + 5e-13: within the tolerance, so one pass freezes
    both at 1 (the second link's share is not the level: not exact); links 2e-12 apart take two passes;
    a bound within the tolerance above the level is not exact either."""
    owner, link = np.array([0, 1]), np.array([0, 1])
    levels = []
    rates = max_min_fair_rates_flat(owner, link, 2, np.array([1.0, 1.0 + 5e-13]), levels=levels)
    np.testing.assert_array_equal(rates, [1.0, 1.0])
    assert levels == [(1.0, False)]
    levels = []
    rates = max_min_fair_rates_flat(owner, link, 2, np.array([1.0, 1.0 + 2e-12]), levels=levels)
    np.testing.assert_array_equal(rates, [1.0, 1.0 + 2e-12])
    assert levels == [(1.0, True), (1.0 + 2e-12, True)]
    levels = []
    rates = max_min_fair_rates_flat(
        owner, link, 2, np.array([1.0, 3.0]), bound=np.array([5.0, 1.0 + 5e-13]), levels=levels
    )
    np.testing.assert_array_equal(rates, [1.0, 1.0])
    assert levels == [(1.0, False)]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 25))
def test_asking_for_levels_changes_no_rate(seed, links, flows):
    """The rates with ``levels`` asked for are those without, bit for bit; every rate is one of the
    levels reported, and every level is some flow's rate."""
    capacity, bound, _, owner, link = _random_flows(seed, links, flows)
    levels = []
    rates = max_min_fair_rates_flat(owner, link, flows, capacity, bound=bound, levels=levels)
    np.testing.assert_array_equal(rates, max_min_fair_rates_flat(owner, link, flows, capacity, bound=bound))
    assert set(rates.tolist()) == {level for level, _ in levels}
