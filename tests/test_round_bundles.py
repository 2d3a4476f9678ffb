"""Rounds checked and committed per bundle of same-route transfers (``round_bundles``) give what the
hop lists give, to the bit; per-run reductions (``round_fluid.Runs``) give what ``reduceat`` gives."""

import numpy as np
import pytest

from ddlsim.simulator.engine.round_fluid import Runs


@pytest.mark.parametrize("sizes", [[1] * 5, [2] * 6, [3] * 4, [6] * 3, [8] * 5, [12] * 2, [80] * 2, [1, 3, 2, 8, 1]])
def test_run_reductions_equal_reduceat(sizes):
    """Equal widths (folded in pairs, then position by position) and unequal ones, with ties."""
    bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    runs = Runs.of_bounds(bounds, int(np.sum(sizes)))
    assert runs.width == (sizes[0] if len(set(sizes)) == 1 and sizes[0] <= 64 else 0)
    values = np.random.default_rng(len(sizes)).integers(0, 4, int(np.sum(sizes))) * 0.25
    for ufunc in (np.minimum, np.maximum):
        reduced = runs.reduce(values, ufunc)
        np.testing.assert_array_equal(reduced, ufunc.reduceat(values, bounds))
        assert not np.shares_memory(reduced, values)
    np.testing.assert_array_equal(runs.spread(np.arange(len(sizes))), np.repeat(np.arange(len(sizes)), sizes))


def test_runs_of_labels_only_where_each_label_is_one_run():
    runs = Runs.of_labels(np.array([0, 0, 1, 1, 1, 2]))
    assert runs is not None and runs.bounds.tolist() == [0, 2, 5] and runs.width == 0
    assert Runs.of_labels(np.array([0, 1, 0])) is None
    assert Runs.of_labels(np.array([0, 0, 1, 1])).width == 2
