"""A library's own thresholds split its link fits: its protocol changes (MLSL's large-message path at
128 MiB) and the sizes where its selector changes algorithm."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.link_fit import (
    _segmentations,
    algorithm_breakpoints,
    fit_links,
    forced_breakpoints,
    library_breakpoints,
)
from ddlsim.simulator.calibration.measurements import read_measurement_file
from ddlsim.simulator.calibration.predict import predict

DATA = Path(__file__).resolve().parents[1] / "simulator" / "calibration" / "data" / "published_dev.csv"
MIB_128 = 128 * 2**20


def test_only_mlsl_declares_a_threshold():
    assert library_breakpoints("opa_100@knl_7250@mlsl") == (MIB_128,)
    assert library_breakpoints("ib_fdr@titanx_pascal@nccl") == ()
    assert library_breakpoints("opa_100") == ()


def test_every_split_breaks_at_a_threshold_the_sizes_straddle():
    sizes = np.array([4e5, 1.2e7, 6.7e7, 1.5e8, 2.6e8])
    splits = _segmentations(sizes, (MIB_128,))
    assert splits and all(MIB_128 in split for split in splits)
    assert all(len(split) <= 2 for split in splits)
    # the data's own cut in the threshold's gap (between 67 and 153 MB) is not offered again
    assert not any(any(6.7e7 < cut < 1.5e8 and cut != MIB_128 for cut in split) for split in splits)
    # a threshold outside the sizes changes nothing
    assert _segmentations(sizes[:3], (MIB_128,)) == _segmentations(sizes[:3])
    # a size equal to the threshold is on the large side
    assert _segmentations(np.array([1e6, MIB_128]), (MIB_128,)) == [(MIB_128,)]


def test_the_deepbench_mlsl_fit_breaks_at_128_mib_and_fits_both_sides():
    rows = [row for row in read_measurement_file(DATA) if row.device == "knl_7250"]
    fits = fit_links(Profile(), rows, np.random.default_rng(0), 0)
    (key,) = fits.groups
    fit = fits.profile.links[key]
    assert MIB_128 in fit.breakpoints_bytes
    # DeepBench's 153 and 258 MB rows at 2 and 4 nodes: the large-message path costs a fixed ~18 ms
    # a call at both scales (a per-step alpha would have to triple), its bytes move at the mid-size
    # path's rate (the size slopes give 13.2 GB/s on either side of the threshold)
    large = fit.segment(MIB_128)
    assert 0.010 < fit.call_s[large] < 0.030
    assert fit.alpha_s[large] < 1e-4
    assert abs(fit.beta_Bps[large] / fit.beta_Bps[large - 1] - 1) < 0.25
    for row in rows:
        value = predict(row, fits.profile).value
        assert value is not None and abs(value / row.value - 1) < 0.08, row.id


def test_a_segment_never_holds_two_of_the_librarys_algorithms():
    rows = read_measurement_file(DATA)
    knl = [row for row in rows if row.device == "knl_7250"]
    # MLSL's selector: halving-doubling up to 1 MiB, ring above; DeepBench measured 0.4 MB, then 12.4 MB
    assert algorithm_breakpoints("opa_100@knl_7250@mlsl", knl) == (math.sqrt(400000 * 12390400),)
    assert forced_breakpoints("opa_100@knl_7250@mlsl", knl) == (math.sqrt(400000 * 12390400), MIB_128)
    # NCCL across nodes: a tree up to 256 KiB a node, so 0.4 MB on 2 and 4 nodes, a ring from 12.4 MB
    # (rows that leave the adapters per node open are read as one adapter, as the prediction does)
    titanx = [row for row in rows if row.device == "titanx_pascal" and row.nodes > 1 and row.algorithm == "nccl"]
    assert titanx and any(row.nics_per_node is None for row in titanx)
    assert algorithm_breakpoints("ib_fdr@titanx_pascal@nccl", titanx) == (math.sqrt(400000 * 12390400),)
    # one algorithm at every size, or an algorithm token rather than a library: nothing to break at
    one_node = [row for row in titanx if row.message_bytes and row.message_bytes > 1e6]
    assert algorithm_breakpoints("ib_fdr@titanx_pascal@nccl", one_node) == ()
    assert algorithm_breakpoints("ib_fdr@gpu@ring", titanx) == ()


def test_the_deepbench_mlsl_fit_grows_with_size_at_32_nodes():
    """Fitted on 2 and 4 nodes, MLSL on KNL at 32 nodes takes longer for a larger message. One alpha
    fitted across 0.4 MB (halving-doubling, 2 log2 p steps) and 12.4 MB (ring, 2 (p - 1) steps) had
    put 12.4 MB at 3.73 ms and 16.8 MB at 2.92 ms."""
    rows = [row for row in read_measurement_file(DATA) if row.device == "knl_7250"]
    fits = fit_links(Profile(), rows, np.random.default_rng(0), 0)
    largest = [dataclasses.replace(row, nodes=32) for row in rows if row.nodes == 4]
    times = [predict(row, fits.profile).value for row in sorted(largest, key=lambda row: row.message_bytes or 0)]
    assert all(value is not None for value in times)
    assert times == sorted(times), times
