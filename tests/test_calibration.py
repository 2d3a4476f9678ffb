"""Fitting recovers the parameters that generated synthetic measurements (with noise)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from ddlsim.hardware_models.profile import DeviceFit, LinkFit, Profile, load_profile, profile_to_toml
from ddlsim.simulator.calibration.fit import calibrate
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.calibration.predict import predict

KEY = "eth_10g@xeon_8180@ring"
SIZES = (1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6, 64e6)


def synthetic_collectives(truth: Profile, sigma: float, seed: int = 1, ranks=(2, 4, 8)) -> list[Measurement]:
    """Ring all-reduce times of the model under ``truth``, times lognormal noise of ``sigma``."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in ranks:
        for size in SIZES:
            row = Measurement(
                id=f"SYN-{p}-{int(size)}", kind="collective", metric="time_s", value=1.0, device="xeon_8180",
                devices_per_node=1, nodes=p, collective="allreduce", algorithm="ring", network="eth_10g",
                message_bytes=size, precision="fp32",
            )  # fmt: skip
            value = predict(row, truth).value
            assert value is not None
            rows.append(dataclasses.replace(row, value=value * float(np.exp(rng.normal(0.0, sigma)))))
    return rows


def test_link_alpha_beta_recovered_within_the_bootstrap_interval():
    truth = Profile(links={KEY: LinkFit((), (40e-6,), (0.9e9,))})
    result = calibrate(synthetic_collectives(truth, sigma=0.03), bootstrap=40, seed=3)
    fit = result.profile.links[KEY]
    assert fit.alpha_s[0] == pytest.approx(40e-6, rel=0.15)
    assert fit.beta_Bps[0] == pytest.approx(0.9e9, rel=0.05)
    samples = result.profile.bootstrap
    # alpha where it shows (the smallest messages' segment: 2 (p - 1) x 40 us against kB-sized
    # transfers), beta where it does (the largest's); alpha is under 2 % of a 16-64 MB all-reduce,
    # inside the 3 % noise, and its bootstrap there says nothing either way
    alphas = [s[f"links.{KEY}.alpha_s.0"] for s in samples]
    betas = [s[f"links.{KEY}.beta_Bps.{len(fit.beta_Bps) - 1}"] for s in samples]
    # the stated interval: the bootstrap's 2.5-97.5 percentiles, widened by the fitted noise
    widen = np.exp(2 * result.profile.noise_sigma)
    assert np.percentile(betas, 2.5) / widen <= 0.9e9 <= np.percentile(betas, 97.5) * widen
    assert np.percentile(alphas, 2.5) / widen <= 40e-6 <= np.percentile(alphas, 97.5) * widen
    assert result.profile.noise_sigma == pytest.approx(0.03, abs=0.015)


def test_protocol_switch_found_between_the_right_sizes():
    truth = Profile(links={KEY: LinkFit((100e3,), (5e-6, 80e-6), (0.3e9, 1.1e9))})
    result = calibrate(synthetic_collectives(truth, sigma=0.01), bootstrap=0)
    fit = result.profile.links[KEY]
    assert len(fit.breakpoints_bytes) >= 1
    assert any(64e3 < b < 256e3 for b in fit.breakpoints_bytes)
    assert fit.beta_Bps[-1] == pytest.approx(1.1e9, rel=0.05)
    assert fit.beta_Bps[0] == pytest.approx(0.3e9, rel=0.15)


def test_single_device_rows_pin_compute_and_predict_an_unmeasured_shape():
    """Rows generated with efficiency 0.45 and memory efficiency 0.6 on the P100 (datasheet: 0.55 and
    0.75): every measured shape is reproduced (pinned), and a batch never measured (128) is predicted
    by the fitted compute model within 5 % of the truth."""
    truth = Profile(devices={"p100_sxm2": DeviceFit(compute_efficiency=0.45, memory_efficiency=0.6)})

    def row_of(workload: str, batch: int) -> Measurement:
        row = Measurement(
            id=f"C-{workload}-{batch}", kind="training", metric="throughput_samples_per_s", value=1.0,
            device="p100_sxm2", devices_per_node=1, nodes=1, workload=workload, algorithm="ring",
            per_device_batch=batch, precision="fp32", source="synthetic",
        )  # fmt: skip
        value = predict(row, truth).value
        assert value is not None
        return dataclasses.replace(row, value=value)

    rows = [row_of(workload, 32) for workload in ("resnet50", "inception_v3", "vgg16", "alexnet", "resnet152")]
    result = calibrate(rows, bootstrap=0)
    for row in rows:  # the pinned shape reproduces its measurement
        assert predict(row, result.profile).value == pytest.approx(row.value, rel=1e-6)
    unmeasured = row_of("resnet50", 128)
    assert not result.profile.pins("p100_sxm2", "resnet50", "fp32", 128)
    assert predict(unmeasured, result.profile).value == pytest.approx(unmeasured.value, rel=0.05)
    assert predict(unmeasured, Profile()).value != pytest.approx(unmeasured.value, rel=0.05)  # datasheets alone miss


def test_profile_round_trips_through_toml(tmp_path):
    truth = Profile(links={KEY: LinkFit((1e5,), (1e-6, 2e-5), (3e8, 1e9), "test")}, noise_sigma=0.04)
    result = calibrate(synthetic_collectives(truth, sigma=0.02, ranks=(2, 4)), bootstrap=5)
    path = tmp_path / "profile.toml"
    path.write_text(profile_to_toml(result.profile))
    loaded = load_profile(path)
    assert loaded.links == {k: dataclasses.replace(v) for k, v in result.profile.links.items()}
    assert loaded.flat() == pytest.approx(result.profile.flat())
    assert loaded.bootstrap == result.profile.bootstrap
    assert loaded.data_sha256 == result.profile.data_sha256 and len(loaded.data_sha256) == 64


def test_rank_jitter_is_recovered_from_rows_made_with_it_and_round_trips(tmp_path):
    """Multi-device training rows whose values the model gives at rank jitter 0.08: the fit finds
    0.08 back (to its grid), ``ideal()`` switches it off, and the profile file keeps it."""
    from ddlsim.simulator.calibration.fit import fit_rank_jitter
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    published = read_measurements([packaged_published_dev()]).rows
    rows = [row for row in published if row.id.startswith("TFBENCH-0") and row.devices > 1
            and row.metric == "throughput_samples_per_s"][:8]  # fmt: skip
    assert len(rows) == 8 and len({row.devices for row in rows}) > 1
    truth = Profile(rank_jitter_sigma=0.08)
    made = [dataclasses.replace(row, value=predict(row, truth).value) for row in rows]
    quiet = [predict(row, Profile()).value for row in rows]
    assert all(m < q for m, q in zip((row.value for row in made), quiet, strict=True))  # the slowest rank costs
    fitted = fit_rank_jitter(Profile(), made)
    assert fitted.rank_jitter_sigma == pytest.approx(0.08, abs=0.005)
    assert "8 multi-device training rows" in fitted.sources["rank_jitter_sigma"]
    assert fitted.ideal().rank_jitter_sigma == 0.0
    assert f"slowest of {rows[0].devices} ranks" in predict(rows[0], fitted).detail  # named where it applies
    path = tmp_path / "p.toml"
    path.write_text(profile_to_toml(fitted))
    assert load_profile(path).rank_jitter_sigma == pytest.approx(fitted.rank_jitter_sigma)


def _jitter_rows(sigma: float, count: int) -> list[Measurement]:
    """``count`` TFBENCH multi-GPU synthetic-data rows (2-8 P100), valued as the model gives them at ``sigma``."""
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    published = read_measurements([packaged_published_dev()]).rows
    rows = [row for row in published if row.id.startswith("TFBENCH-0") and row.devices > 1
            and "synthetic" in row.notes and row.metric == "throughput_samples_per_s"][:count]  # fmt: skip
    truth = Profile(rank_jitter_sigma=sigma)
    return [dataclasses.replace(row, value=predict(row, truth).value) for row in rows]


def test_rank_jitter_leaves_out_real_data_rows_whose_input_pipeline_it_would_absorb():
    """Real-data rows carry an input-pipeline cost the model does not have, and it grows with the
    devices a host feeds: rows 25 % slower than the model at 0.05 must not raise the fitted sigma."""
    from ddlsim.simulator.calibration.fit import fit_rank_jitter

    made = _jitter_rows(0.05, 8)
    real = [
        dataclasses.replace(row, id=row.id + "R", value=row.value * 0.75, source="TF benchmarks, real-data table",
                            notes="real ImageNet input (input pipeline and disk included)")
        for row in made[:4]
    ]  # fmt: skip
    fitted = fit_rank_jitter(Profile(), made + real)
    assert fitted.rank_jitter_sigma == pytest.approx(0.05, abs=0.005)
    source = fitted.sources["rank_jitter_sigma"]
    assert "8 multi-device training rows (2-4 devices, 4 real-data rows left out)" in source
    alone = fit_rank_jitter(Profile(), real)  # nothing left to fit: said, not silently 0
    assert alone.rank_jitter_sigma == 0.0
    assert "4 real-data rows left out" in alone.sources["rank_jitter_sigma"]


def test_rank_jitter_is_not_set_by_one_row_it_cannot_explain():
    """One synthetic row 40 % slower than the model at any plausible sigma (a cost of its own) among
    sixteen made at 0.05 (2-8 GPUs): the soft-L1 loss keeps sigma within a grid step of 0.05, where
    squared error chases the row to 0.0675."""
    from ddlsim.simulator.calibration.fit import fit_rank_jitter

    made = _jitter_rows(0.05, 16)
    outlier = dataclasses.replace(made[-1], id="OUTLIER", value=made[-1].value * 0.6)
    fitted = fit_rank_jitter(Profile(), [*made, outlier])
    assert fitted.rank_jitter_sigma == pytest.approx(0.05, abs=0.003)
    # the note names the profile's sigma as it is, not rounded to another grid point (0.0525, not 0.052)
    named = re.search(r"rank jitter ([0-9.]+):", predict(made[-1], fitted).detail)
    assert named and float(named.group(1)) == pytest.approx(fitted.rank_jitter_sigma, rel=1e-6)


def test_overlap_interference_is_recovered_and_leaves_out_real_data_rows():
    """DGX-1 rows (1-8 P100, AlexNet and VGG16 with NCCL) made at interference 0.4 over a fitted NVLink:
    the fit finds 0.4 back; real-data copies 25 % slower (an input pipeline the model does not have)
    do not move it."""
    from ddlsim.simulator.calibration.fit import fit_interference
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    published = {row.id: row for row in read_measurements([packaged_published_dev()]).rows}
    base = Profile(links={"nvlink1": LinkFit((1e5,), (1e-6, 2e-5), (3e9, 1e10), "test")})
    truth = dataclasses.replace(base, overlap_interference=0.4)
    ids = ("TFBENCH-004", "TFBENCH-005", "TFBENCH-009", "TFBENCH-010", "TFBENCH-014", "TFBENCH-019", "TFBENCH-020")
    made = [dataclasses.replace(published[i], value=predict(published[i], truth).value) for i in ids]
    single = [row for row in made if row.devices == 1]
    assert all(predict(row, base).value > row.value * 1.01 for row in made if row.devices > 1)  # it costs
    real = [
        dataclasses.replace(row, id=row.id + "R", value=row.value * 0.75, source="TF benchmarks, real-data table",
                            notes="real ImageNet input (input pipeline and disk included)")
        for row in made if row.devices > 1
    ]  # fmt: skip
    for rows in (made, made + real):
        fitted, _ = fit_interference(base, rows, single)
        assert fitted.overlap_interference == pytest.approx(0.4, abs=0.011)
        assert "R," not in fitted.sources["overlap_interference"] + ","


def test_a_shape_pinned_only_by_multi_device_rows_reproduces_them_under_the_rank_jitter():
    """MLPerf's one-node rows (8-16 GPUs, no single-GPU row of their shape) pin their own compute. The
    pin must be one rank's pace, with the expected slowest of N ranks divided out: otherwise the
    prediction pays the jitter twice and comes out 5-10% slow on the very rows it was pinned to. The
    jitter itself is fitted on rows whose compute those rows do not pin (the TFBENCH multi-GPU rows)."""
    from ddlsim.simulator.calibration.fit import calibrate
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    published = read_measurements([packaged_published_dev()]).rows
    mlperf = [row for row in published if row.id in ("MLPERF-023", "MLPERF-044", "MLPERF-048")]
    tfbench = [row for row in published if row.id.startswith("TFBENCH-0") and int(row.id[-3:]) <= 79]
    profile = calibrate(mlperf + tfbench, bootstrap=0).profile
    assert profile.rank_jitter_sigma > 0.02
    assert "MLPERF" not in profile.sources["rank_jitter_sigma"]
    for row in mlperf:
        assert row.devices >= 8
        assert predict(row, profile).value == pytest.approx(row.value, rel=0.01), row.id


def test_box_least_squares_is_the_bounded_optimum():
    """The link fit's one- and two-column bounded least squares (no iterative solver) reaches the
    residual scipy's lsq_linear reaches, on random problems whose optimum is often on a bound."""
    from scipy.optimize import lsq_linear

    from ddlsim.simulator.calibration.link_fit import _box_least_squares

    rng = np.random.default_rng(7)
    for trial in range(300):
        columns = 1 + trial % 2
        a = rng.normal(size=(6, columns))
        y = rng.normal(size=6)
        low = rng.uniform(-1.0, 0.0, size=columns)
        high = low + rng.uniform(0.05, 1.0, size=columns)
        ours = _box_least_squares(a, y, low, high)
        assert np.all((low - 1e-12 <= ours) & (ours <= high + 1e-12))
        reference = lsq_linear(a, y, bounds=(low, high), tol=1e-12).x
        rss_ours, rss_reference = (float(np.sum((a @ x - y) ** 2)) for x in (ours, reference))
        assert rss_ours <= rss_reference * (1 + 1e-7) + 1e-12


def test_a_row_the_rest_of_the_model_overruns_keeps_its_link_at_the_datasheet():
    """DeepBench's one OpenMPI row (0.4 MB on 4 TitanX boxes) is faster than the model's intra-node
    part alone: no bandwidth fits it, and the fit keeps the datasheet's rather than the range's top."""
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    rows = [row for row in read_measurements([packaged_published_dev()]).rows if row.device == "titanx_pascal"]
    fit = calibrate(rows, bootstrap=0).profile.links["ib_fdr@gpu@openmpi"]  # Open MPI: pooled over GPUs
    assert fit.beta_Bps == pytest.approx((6e9,), rel=0.01)  # FDR's payload rate per port


def _fit(beta_Bps: float) -> LinkFit:
    return LinkFit((), (1e-6,), (beta_Bps,), "test")


def test_a_fit_pooled_over_gpus_serves_a_gpu_without_its_own_and_never_a_cpu():
    profile = Profile(links={"ib_fdr@gpu@ring": _fit(4e9), "ib_fdr@p100_pcie@ring": _fit(2e9)})
    assert profile.link_fit_key("ib_fdr", "titanx_pascal@ring@allreduce") == "ib_fdr@gpu@ring"
    assert profile.link_fit_key("ib_fdr", "p100_pcie@ring@allreduce") == "ib_fdr@p100_pcie@ring"  # its own wins
    assert profile.link_fit_key("ib_fdr", "knl_7250@ring@allreduce") is None  # a CPU is not a GPU
    assert profile.link_fit_key("ib_fdr", "titanx_pascal@nccl@allreduce") is None  # other software
    assert profile.link_fit_key("ib_fdr", "titanx_pascal") is None  # a kind without software scopes nothing


def test_network_fits_pool_over_gpus_only_where_the_software_stages_through_host():
    from ddlsim.simulator.calibration.link_fit import link_group

    def row(device: str, algorithm: str, nodes: int) -> Measurement:
        return Measurement(
            id="R", kind="collective", collective="allreduce", algorithm=algorithm,
            device=device, devices_per_node=8 if device != "knl_7250" else 1, nodes=nodes,
            intra_node_link="pcie3_x16" if device != "knl_7250" else "", network="ib_fdr" if nodes > 1 else "",
            message_bytes=64e6, precision="fp32", metric="time_s", value=0.05,
        )  # fmt: skip

    assert link_group(row("titanx_pascal", "ring", 2)) == "ib_fdr@gpu@ring"  # MPI point-to-point
    assert link_group(row("p100_pcie", "openmpi", 2)) == "ib_fdr@gpu@openmpi"  # openib: no GPUDirect RDMA
    assert link_group(row("p100_pcie", "nccl", 2)) == "ib_fdr@p100_pcie@nccl"  # GPUDirect RDMA: the box's
    assert link_group(row("knl_7250", "ring", 2)) == "ib_fdr@knl_7250@ring"  # host memory already
    assert link_group(row("titanx_pascal", "ring", 1)) == "pcie3_x16@titanx_pascal@ring"  # one node: the box


def test_one_boxs_ring_rows_predict_the_other_boxs_over_the_same_network():
    """DeepBench's ring all-reduce (baidu-allreduce on CUDA-aware Open MPI) over FDR: fitted to the
    P100 box's rows, it predicts the TitanX box's within 15 %; from the datasheets it was 2.7x fast."""
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    rows = read_measurements([packaged_published_dev()]).rows
    profile = calibrate([row for row in rows if row.device == "p100_pcie"], bootstrap=0).profile
    titanx_ring = [row for row in rows if row.device == "titanx_pascal" and row.algorithm == "ring"]
    assert len(titanx_ring) == 2
    for row in titanx_ring:
        assert predict(row, profile).value == pytest.approx(row.value, rel=0.15), row.id
        assert predict(row, Profile()).value < 0.5 * row.value, row.id  # the datasheets' path


def test_a_simulated_training_run_uses_the_link_fitted_for_its_device_and_library():
    """calibrate keys a link fit by the software of its collective rows (``token@device@nccl``); a
    training simulation on that device with that library takes it (simulate had looked the fit up
    by the device alone and silently kept the datasheet), and one with another algorithm does not."""
    from ddlsim.algorithms.training_algorithm import make_options
    from ddlsim.simulator.closed_form.training import closed_form_result
    from ddlsim.simulator.scenario import Scenario

    slow = LinkFit((), (5e-6,), (1e9,), "test: a slow PCIe share, 1 GB/s")
    profile = Profile(links={"pcie3_x16@titanx_pascal@nccl": slow})

    def comm(collective: str, fitted: Profile | None) -> float:
        scenario = Scenario(workload="resnet50", device="titanx_pascal", devices_per_node=8, intra_node="pcie3_x16",
                            nodes=(1,), stragglers="none", profile=fitted,
                            options=make_options("sync_sgd", {"collective": collective}))  # fmt: skip
        return closed_form_result(scenario, 1).comm_s

    assert comm("nccl", profile) > 3 * comm("nccl", None)
    assert comm("ring", profile) == pytest.approx(comm("ring", None), rel=1e-12)


def test_simulate_names_the_fitted_links_it_uses(tmp_path, capsys):
    """simulate's profile line names the links whose fits the run takes, and says so when a profile
    has nothing for the run's hardware and software."""
    from ddlsim.simulator.cli.main import main

    saved = tmp_path / "mine.toml"
    fit = LinkFit((), (5e-6,), (1e9,), "test")
    saved.write_text(profile_to_toml(Profile(links={"pcie3_x16@titanx_pascal@nccl": fit}, description="test")))
    flags = ["simulate", "--workload", "resnet50", "--device", "titanx_pascal", "--devices-per-node", "8",
             "--intra-node", "pcie3_x16", "--nodes", "1", "--executor", "analytic", "--no-progress",
             "--profile", str(saved)]  # fmt: skip
    assert main([*flags, "--collective", "nccl", "--out", str(tmp_path / "a")]) == 0
    assert "calibrated links (pcie3_x16)" in capsys.readouterr().out
    assert main([*flags, "--collective", "ring", "--out", str(tmp_path / "b")]) == 0
    assert "nothing in it applies to this run (a data-parallel calibration)" in capsys.readouterr().out


def test_a_measured_training_row_uses_the_link_fitted_for_its_library():
    """A training row names its library (nccl); its prediction resolves the library to an algorithm,
    yet takes the link fitted for that device and library, as the collective rows key it (the lookup
    had used the resolved algorithm and found nothing). Another library's row does not take it."""
    slow = LinkFit((), (5e-6,), (1e9,), "test: a slow PCIe share, 1 GB/s")
    profile = Profile(links={"pcie3_x16@titanx_pascal@nccl": slow})

    def rate(library: str, fitted: Profile | None) -> float:
        row = Measurement(
            id="T-1", kind="training", metric="throughput_samples_per_s", value=1.0, device="titanx_pascal",
            devices_per_node=8, nodes=1, intra_node_link="pcie3_x16", workload="alexnet", algorithm=library,
            per_device_batch=64, precision="fp32", source="synthetic",
        )  # fmt: skip
        value = predict(row, fitted).value
        assert value is not None
        return value

    assert rate("nccl", profile) < 0.9 * rate("nccl", None)
    assert rate("mpich", profile) == pytest.approx(rate("mpich", None), rel=1e-12)
