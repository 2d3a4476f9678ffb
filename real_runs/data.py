"""Training data for real runs: scikit-learn's digits (real, ships with the package) or synthetic.

``load_dataset(name, seed)`` returns ``Dataset(images, labels, classes)`` with images as float32
``(N, C, H, W)`` and labels int64. ``digits``: the 1,797 8x8 handwritten digits of UCI (Alpaydin &
Kaynak 1998) bundled with scikit-learn, scaled to [0, 1]. ``synthetic``: Gaussian images whose
labels a fixed random linear map decides, so the task is learnable and the data free (throughput
runs at any image size).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddlsim.registry import Registry


@dataclass(frozen=True)
class Dataset:
    images: np.ndarray  # float32 (N, C, H, W)
    labels: np.ndarray  # int64 (N,)
    classes: int

    @property
    def in_channels(self) -> int:
        return int(self.images.shape[1])


DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset")


def _digits_table() -> np.ndarray:
    """scikit-learn's ``digits.csv.gz`` (64 pixels in 0..16, then the label), read without importing
    scikit-learn (importing it takes seconds per rank)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits dataset needs scikit-learn; install it with pip install 'ddlsim[real]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if path.exists():
        return np.loadtxt(path, delimiter=",")
    from sklearn.datasets import load_digits  # a layout we do not know: ask scikit-learn itself

    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target])


@DATASETS.register("digits")
def digits(seed: int = 0, samples: int = 0, image_size: int = 8) -> Dataset:
    table = _digits_table()
    images = (table[:, :64].reshape(-1, 8, 8) / 16.0).astype(np.float32)[:, None, :, :]
    labels = table[:, 64].astype(np.int64)
    if samples:
        images, labels = images[:samples], labels[:samples]
    return Dataset(images, labels, 10)


@DATASETS.register("synthetic")
def synthetic(
    seed: int = 0, samples: int = 2048, image_size: int = 32, channels: int = 3, classes: int = 10
) -> Dataset:
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((samples or 2048, channels, image_size, image_size), dtype=np.float32)
    projection = rng.standard_normal((channels * image_size * image_size, classes)).astype(np.float32)
    labels = np.argmax(images.reshape(len(images), -1) @ projection, axis=1).astype(np.int64)
    return Dataset(images, labels, classes)


def load_dataset(name: str, seed: int = 0, samples: int = 0, image_size: int = 0) -> Dataset:
    """Registered dataset ``name``; ``samples``/``image_size`` of 0 keep the dataset's default."""
    kwargs = {"seed": seed, "samples": samples}
    if image_size:
        kwargs["image_size"] = image_size
    return DATASETS.get(name)(**kwargs)


def shard_batches(
    dataset: Dataset, shard: int, shards: int, batch: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless ``(images, labels)`` batches of ``shard``'s share of the data (every epoch reshuffled
    by ``seed`` and the epoch number, identically on every shard, then dealt round-robin)."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(len(dataset.labels))[shard::shards]
        if len(order) < batch:
            raise ValueError(f"shard {shard} of {shards} holds {len(order)} samples, fewer than a batch of {batch}")
        for start in range(0, len(order) - batch + 1, batch):
            take = order[start : start + batch]
            yield dataset.images[take], dataset.labels[take]
        epoch += 1
