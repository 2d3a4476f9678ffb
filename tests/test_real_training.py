"""Real sync SGD on one rank (the sync_sgd role program on torch): the loss goes down; buckets are
filled as the simulator fills them; overlap does not change the numbers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mpi4py")

from ddlsim.algorithms.training_algorithm import make_options
from ddlsim.real_runs.algorithm_runs import RunSettings, _GradientBuckets, run_algorithm
from ddlsim.real_runs.models import build_model


def settings(model: str, steps: int, **options) -> RunSettings:
    return RunSettings(
        algorithm="sync_sgd", options=make_options("sync_sgd", options), model=model, steps=steps, learning_rate=1.0
    )


@pytest.fixture(scope="module")
def world():
    from ddlsim.real_runs.transport import MpiTransport

    return MpiTransport()


@pytest.mark.parametrize("model", ["small_cnn", "resnet_small"])
def test_loss_goes_down_on_digits(world, model):
    losses = run_algorithm(settings(model, 60, bucket_bytes=20_000), world).losses
    first = np.mean(losses[:5])
    last = np.mean(losses[-5:])
    assert last < 0.8 * first, (first, last)


def test_buckets_close_once_full_in_backward_order():
    """small_cnn's layers, last first: fc2 650 params, fc1 32 832, conv2 4 640, conv1 160 (fp32:
    2 600 B, 131 328 B, 18 560 B, 640 B). A 100 kB bucket closes after fc1 (133 928 B >= 1e5); the
    rest (19 200 B) is the second bucket."""
    model = build_model("small_cnn", 1, 10)
    buckets = _GradientBuckets(model, 100e3, "fp32").params
    sizes = [sum(p.numel() for p in bucket) * 4 for bucket in buckets]
    assert sizes == [133_928, 19_200]
    assert buckets[0][0] is list(model.parameters())[-2]  # fc2's weight comes first


def test_overlap_does_not_change_the_numbers(world):
    with_overlap = run_algorithm(settings("resnet_small", 3, bucket_bytes=20_000), world)
    without = run_algorithm(settings("resnet_small", 3, bucket_bytes=20_000, overlap=False), world)
    assert with_overlap.weights_digest == without.weights_digest
    assert with_overlap.buckets > 1


def test_fp16_gradients_travel_in_half_the_bytes():
    model = build_model("small_cnn", 1, 10)
    full, half = _GradientBuckets(model, 1e9, "fp32"), _GradientBuckets(model, 1e9, "fp16")
    assert half.empty(0).nbytes * 2 == full.empty(0).nbytes == 153_128
    # the bucket threshold counts wire bytes: 100 kB holds fc2 + fc1 in fp32 but the whole model in fp16
    assert len(_GradientBuckets(model, 100e3, "fp32").params) == 2
    assert len(_GradientBuckets(model, 100e3, "fp16").params) == 1
