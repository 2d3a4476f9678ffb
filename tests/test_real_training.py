"""Real sync SGD on one rank: the loss goes down; buckets are filled as the simulator fills them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mpi4py")

from ddlsim.real_runs.models import build_model
from ddlsim.real_runs.sync_training import TrainSettings, plan_buckets, train


@pytest.fixture(scope="module")
def world():
    from ddlsim.real_runs.transport import MpiTransport

    return MpiTransport()


@pytest.mark.parametrize("model", ["small_cnn", "resnet_small"])
def test_loss_goes_down_on_digits(world, model):
    rows = train(TrainSettings(model=model, iterations=60, bucket_bytes=20_000), world).rows
    first = np.mean([row["loss"] for row in rows[:5]])
    last = np.mean([row["loss"] for row in rows[-5:]])
    assert last < 0.8 * first, (first, last)


def test_buckets_close_once_full_in_backward_order():
    """small_cnn's layers, last first: fc2 650 params, fc1 32 832, conv2 4 640, conv1 160 (fp32:
    2 600 B, 131 328 B, 18 560 B, 640 B). A 100 kB bucket closes after fc1 (133 928 B >= 1e5); the
    rest (19 200 B) is the second bucket."""
    model = build_model("small_cnn", 1, 10)
    buckets = plan_buckets(model, 100e3, 4)
    sizes = [sum(p.numel() for p in bucket) * 4 for bucket in buckets]
    assert sizes == [133_928, 19_200]
    assert buckets[0][0] is list(model.parameters())[-2]  # fc2's weight comes first


def test_overlap_does_not_change_the_numbers(world):
    settings = TrainSettings(model="resnet_small", iterations=3, bucket_bytes=20_000)
    with_overlap = train(settings, world)
    without = train(TrainSettings(**{**settings.as_dict(), "overlap": False}), world)
    assert with_overlap.parameter_digest == without.parameter_digest
    assert with_overlap.buckets > 1
