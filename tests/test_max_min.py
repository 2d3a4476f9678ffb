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


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 25))
def test_per_flow_bounds_are_private_links(seed, links, flows):
    """``bound`` gives what a private link per flow gives, bit for bit, and the reference's answer
    with those links; some flows cross no shared link (then their bound is their rate)."""
    rng = np.random.default_rng(seed)
    capacity = rng.choice([1.0, 2.0, 5.0, 10.0], size=links)
    bound = rng.choice([0.5, 1.0, 3.0, 20.0], size=flows)
    routes = [sorted(set(rng.integers(0, links, size=rng.integers(0, 4)).tolist())) for _ in range(flows)]
    owner = np.array([f for f, route in enumerate(routes) for _ in route], dtype=np.int64)
    link = np.array([lk for route in routes for lk in route], dtype=np.int64)
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
