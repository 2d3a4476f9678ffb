"""``round_fluid.fluid_ends`` against fluid simulations worked out by hand."""

import numpy as np

from ddlsim.simulator.engine.round_fluid import fluid_ends


def test_flows_that_start_together_share_then_the_last_speeds_up():
    """Two flows of 10 and 30 bytes start at 0 on one link of 10 B/s: 5 B/s each until the first
    ends at 2, then the second alone at 10 B/s for its last 20 bytes, ending at 4. The first step
    has every flow under way (its entries passed uncopied), the second only one."""
    owner, link = np.array([0, 1]), np.array([0, 0])
    ends = fluid_ends(owner, link, np.array([10.0]), np.array([10.0, 30.0]), np.zeros(2))
    np.testing.assert_allclose(ends, [2.0, 4.0], rtol=1e-12)


def test_a_later_flow_joins_one_under_way():
    """20 bytes from 0 and 10 bytes from 1 on one link of 10 B/s (and each on a link of its own):
    the first goes alone at 10 B/s until 1, then both at 5 B/s, and both end at 3. The first step
    has only one flow under way."""
    owner, link = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 2])
    capacity = np.array([10.0, 100.0, 100.0])
    ends = fluid_ends(owner, link, capacity, np.array([20.0, 10.0]), np.array([0.0, 1.0]))
    np.testing.assert_allclose(ends, [3.0, 3.0], rtol=1e-12)


def test_spans_lists_every_range_in_order_below_and_above_its_few_ranges_cut():
    """``spans`` (a few ranges listed in Python, more through array passes) gives lo[i], ...,
    lo[i] + counts[i] - 1 for every i in order, empty ranges included, either way."""
    from ddlsim.simulator.engine.round_structures import _FEW_SPANS, spans

    rng = np.random.default_rng(7)
    for size in (0, 1, 2, _FEW_SPANS - 1, _FEW_SPANS, _FEW_SPANS + 1, 3 * _FEW_SPANS):
        lo = rng.integers(0, 1000, size)
        counts = rng.integers(0, 4, size)
        expected = [p for start, count in zip(lo, counts, strict=True) for p in range(start, start + count)]
        got = spans(lo, counts)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.array(expected, dtype=np.int64))
