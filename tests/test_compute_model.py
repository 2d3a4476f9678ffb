"""The per-layer compute entry point and the compute model fitted across devices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ddlsim.hardware_models.catalog import load_device
from ddlsim.hardware_models.compute import (
    ComputeModel,
    architecture,
    layer_time_s,
    optimizer_update_time_s,
    roofline_time_s,
)
from ddlsim.hardware_models.profile import ComputeFit, Profile
from ddlsim.simulator.calibration.compute_fit import ComputeModelFit, to_values
from ddlsim.simulator.calibration.fit import calibrate
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.calibration.predict import predict, training_scenario
from ddlsim.simulator.training.trainers import layer_times, step_profile

P100 = load_device("p100_sxm2")  # 10.6 TFLOP/s fp32, 732 GB/s


def test_layer_time_hand_numbers():
    """1e12 FLOP at efficiency 0.5 of 10.6 TFLOP/s = 0.18868 s; half_batch = batch halves the
    efficiency (0.37736 s); 732e9 bytes at 732 GB/s x 0.5 = 2 s; 1e6 FLOP in 3 kernels of 10 us = 30 us."""
    plain = ComputeModel(default_efficiency=0.5, memory_efficiency=0.5)
    assert layer_time_s("conv", 1e12, 0.0, 64, P100, "fp32", plain) == pytest.approx(1e12 / 5.3e12)
    half = dataclasses.replace(plain, half_batch=64.0)
    assert layer_time_s("conv", 1e12, 0.0, 64, P100, "fp32", half) == pytest.approx(2e12 / 5.3e12)
    assert layer_time_s("relu", 0.0, 732e9, 64, P100, "fp32", plain) == pytest.approx(2.0)
    launch = dataclasses.replace(plain, launch_s=10e-6)
    assert layer_time_s("conv", 1e6, 0.0, 1, P100, "fp32", launch, kernels=3) == pytest.approx(30e-6)
    # the launch floor hides behind a longer kernel: 1e12 FLOP is unchanged
    assert layer_time_s("conv", 1e12, 0.0, 64, P100, "fp32", launch, kernels=3) == pytest.approx(1e12 / 5.3e12)


def test_without_a_model_the_roofline_of_the_datasheet():
    """No profile: the datasheet's efficiency (P100: 0.55) and no fixed cost, as before."""
    assert roofline_time_s(1e12, 0.0, P100, "fp32", "conv") == pytest.approx(1e12 / (10.6e12 * 0.55))
    assert layer_time_s("conv", 1e12, 0.0, 1, P100, "fp32") == roofline_time_s(1e12, 0.0, P100, "fp32", "conv")
    # SGD with momentum: 5 fp32 arrays per weight at 732 GB/s x 0.75
    assert optimizer_update_time_s(1e6, P100, "fp32") == pytest.approx(20e6 / (732e9 * 0.75))


def test_architecture_is_read_from_the_datasheet():
    assert [architecture(load_device(t)) for t in ("k80", "p100_pcie", "v100_sxm3_h", "a100_sxm4", "knl_7250")] == [
        "kepler",
        "pascal",
        "volta",
        "ampere",
        "knights_landing",
    ]


def _row(device: str, workload: str, batch: int, precision: str = "fp32", devices: int = 1) -> Measurement:
    return Measurement(
        id=f"{device}-{workload}-{batch}-{precision}-{devices}", kind="training", metric="throughput_samples_per_s",
        value=1.0, device=device, devices_per_node=devices, nodes=1, workload=workload, algorithm="nccl",
        intra_node_link="nvlink2" if devices > 1 else "", per_device_batch=batch, precision=precision, source="test",
    )  # fmt: skip


def test_the_vectorised_fit_computes_what_the_training_model_computes():
    """The fit's own arrays give the same compute time as simulator.training.trainers at any parameters."""
    rows = [_row("p100_sxm2", "resnet50", 64), _row("v100_sxm2", "inception_v3", 32, "fp16"), _row("k80", "vgg16", 8)]
    model = ComputeModelFit(rows, Profile())
    rng = np.random.default_rng(4)
    theta = rng.normal(0.0, 0.3, len(model.names))
    theta[[i for i, name in enumerate(model.names) if name.startswith("launch_s.")]] = np.log(3e-4)
    total, _ = model.times(theta)
    profile = Profile(compute=ComputeFit(to_values(model.names, theta)))
    for row, fitted in zip(rows, total, strict=True):
        scenario = training_scenario(row, profile)
        compute_s = step_profile(scenario, layer_times(scenario), momentum=True).compute_s
        assert compute_s == pytest.approx(fitted, rel=1e-9)


def test_analytic_jacobian_matches_finite_differences():
    rows = [_row("p100_sxm2", "alexnet", 256), _row("v100_sxm2", "resnet50", 2, "fp16")]
    model = ComputeModelFit(rows, Profile())
    theta = np.full(len(model.names), 0.1)
    theta[[i for i, name in enumerate(model.names) if name.startswith("launch_s.")]] = np.log(2e-5)
    total, jacobian = model.times(theta)
    for column in range(len(model.names)):
        step = np.zeros_like(theta)
        step[column] = 1e-6
        numeric = (model.times(theta + step)[0] - total) / 1e-6
        np.testing.assert_allclose(jacobian[:, column], numeric, rtol=1e-4, atol=1e-12)


def test_the_kept_times_of_the_last_point_are_the_times_at_that_point():
    """times() keeps its last answer for the optimizer's Jacobian call: asking again at that point, after
    the caller changed the arrays it got, and after another point, gives the times a fresh model gives."""
    rows = [_row("p100_sxm2", "alexnet", 256), _row("v100_sxm2", "resnet50", 2, "fp16")]
    model, fresh = ComputeModelFit(rows, Profile()), ComputeModelFit(rows, Profile())
    theta = np.full(len(model.names), 0.1)
    total, jacobian = model.times(theta)
    total *= 2.0
    jacobian[:] = 0.0
    for point in (theta, theta + 0.05, theta):
        kept, fresh_answer = model.times(point), fresh._times(point, None)
        np.testing.assert_array_equal(kept[0], fresh_answer[0])
        np.testing.assert_array_equal(kept[1], fresh_answer[1])


def test_a_device_without_rows_is_predicted_from_its_generation():
    """Truth: Pascal runs at 0.7 of its datasheet efficiency, small batches pay a 50 us launch floor.
    Rows of the P100 SXM2 and the K80 calibrate; the P100 PCIe, never measured, is predicted within
    10 % (the datasheets alone are 25 % or more off), and the fit finds Pascal slower than Kepler."""
    truth = Profile(compute=ComputeFit({"factor.architecture.pascal": 0.7, "launch_s.gpu": 5e-5}))

    def measured(row: Measurement) -> Measurement:
        value = predict(row, truth).value
        assert value is not None
        return dataclasses.replace(row, value=value)

    rows = [
        measured(_row(device, workload, batch))
        for device in ("p100_sxm2", "k80")
        for workload in ("resnet50", "vgg16", "inception_v3")
        for batch in (4, 64)
    ]
    fit = calibrate(rows, bootstrap=0).profile
    assert fit.compute is not None
    assert fit.compute.values["factor.architecture.pascal"] < fit.compute.values["factor.architecture.kepler"]
    for workload, batch in (("resnet50", 32), ("vgg16", 16)):
        unseen = measured(_row("p100_pcie", workload, batch))
        assert predict(unseen, fit).value == pytest.approx(unseen.value, rel=0.10)
        assert predict(unseen, Profile()).value > 1.25 * unseen.value


def test_small_batches_cost_more_per_sample_with_a_fixed_cost():
    """ResNet-50 on a V100: at batch 1 the 30 us launch floor of its ~600 kernels per step (18.5 ms)
    dominates; at batch 64 the model is within 10 % of the plain roofline."""

    def per_sample(profile: Profile, batch: int) -> float:
        row = _row("v100_sxm2", "resnet50", batch, "fp16")
        scenario = training_scenario(row, profile)
        return step_profile(scenario, layer_times(scenario), momentum=True).compute_s / batch

    fixed = Profile(compute=ComputeFit({"launch_s.gpu": 3e-5, "half_batch.gpu": 2.0}))
    assert per_sample(fixed, 1) > 7 * per_sample(fixed, 8) > 7 * per_sample(fixed, 64) / 2.5
    assert per_sample(fixed, 1) > 10 * per_sample(Profile(), 1)
    assert per_sample(fixed, 64) == pytest.approx(per_sample(Profile(), 64), rel=0.10)
