"""The torch models the real harness trains and benchmarks: a small CNN and a scaled-down ResNet.

Both take ``(batch, channels, height, width)`` images and return class logits. They are small on
purpose (a laptop trains them in seconds) but have the structure of the workloads the simulator
models: convolutions, batch norm and residual blocks, a fully connected head. ``MODELS`` maps a
token to a factory ``(in_channels, classes) -> nn.Module``.
"""

from __future__ import annotations

from collections.abc import Callable

from ddlsim.registry import Registry


def _torch():
    try:
        import torch
    except ImportError as error:  # pragma: no cover - the [real] extra installs it
        raise ImportError("torch is not installed; install it with pip install 'ddlsim[real]'") from error
    return torch


MODELS: Registry[Callable[..., object]] = Registry("real-run model")


@MODELS.register("small_cnn")
def small_cnn(in_channels: int = 1, classes: int = 10):
    """conv3x3(16) relu, conv3x3(32) relu, maxpool 2, average pool to 4x4, fc(64) relu, fc(classes)."""
    nn = _torch().nn
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 16, 64),
        nn.ReLU(),
        nn.Linear(64, classes),
    )


def _basic_block(channels_in: int, channels_out: int, stride: int):
    """ResNet's basic block (He et al. 2016): two conv3x3 + BN, identity or 1x1 projection shortcut."""
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):  # type: ignore[name-defined]  # torch is imported lazily
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels_out)
            self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels_out)
            self.shortcut = nn.Identity()
            if stride != 1 or channels_in != channels_out:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out)
                )

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + self.shortcut(x))

    return BasicBlock()


@MODELS.register("resnet_small")
def resnet_small(in_channels: int = 1, classes: int = 10, width: int = 16, blocks_per_stage: int = 1):
    """A CIFAR-style ResNet scaled down: stem conv3x3(width), three stages of basic blocks at
    width, 2 width, 4 width (stride 2 between stages), global average pool, fc(classes)."""
    nn = _torch().nn
    layers = [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    channels = width
    for stage in range(3):
        out = width * 2**stage
        for block in range(blocks_per_stage):
            layers.append(_basic_block(channels, out, 2 if stage and block == 0 else 1))
            channels = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


@MODELS.register("digits_mlp")
def digits_mlp(in_channels: int = 1, classes: int = 10, image_size: int = 8, hidden: int = 64):
    """flatten, fc(hidden) relu, fc(classes): learns the 8x8 digits in tens of steps (the CNNs above
    are slower to train in a CI-sized budget)."""
    nn = _torch().nn
    return nn.Sequential(
        nn.Flatten(), nn.Linear(in_channels * image_size * image_size, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def build_model(name: str, in_channels: int, classes: int):
    """An instance of registered model ``name`` (unknown names list the valid ones)."""
    return MODELS.get(name)(in_channels=in_channels, classes=classes)
