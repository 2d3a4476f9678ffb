"""Torch definitions of the workload models, written out here (there is no torchvision).

Only ``generate.py`` imports this module; the simulator reads the generated tables and never needs
torch. Every arithmetic step is a leaf module, residual additions, concatenations and the two
attention matrix products included, so that forward hooks see it; the ``forward`` code of container
modules only reshapes. Each leaf module is used once (three ReLUs per bottleneck, not one reused),
so each row of a table is one call.

Layer names follow torchvision where torchvision has the model, so rows can be compared with its
printouts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


class Add(nn.Module):
    """Elementwise sum of its inputs: a residual connection."""

    def forward(self, *inputs: Tensor) -> Tensor:
        total = inputs[0]
        for other in inputs[1:]:
            total = total + other
        return total


class Concat(nn.Module):
    """Concatenation along the channel dimension (inception branches)."""

    def forward(self, *inputs: Tensor) -> Tensor:
        return torch.cat(inputs, dim=1)


class PositionalEncoding(nn.Module):
    """Scale token embeddings by sqrt(d_model) and add the sinusoidal position signal.

    Vaswani et al. 2017, section 3.4 (the scaling) and 3.5 (the encoding); no parameters.
    """

    def __init__(self, d_model: int, max_length: int) -> None:
        super().__init__()
        self.scale = math.sqrt(d_model)
        position = torch.arange(max_length, dtype=torch.float32).unsqueeze(1)
        frequency = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
        )
        encoding = torch.zeros(max_length, d_model)
        encoding[:, 0::2] = torch.sin(position * frequency)
        encoding[:, 1::2] = torch.cos(position * frequency)
        self.register_buffer("encoding", encoding, persistent=False)

    def forward(self, embedded: Tensor) -> Tensor:
        encoding: Tensor = self.encoding  # type: ignore[assignment]
        return embedded * self.scale + encoding[: embedded.shape[1]]


class AttentionScores(nn.Module):
    """Scaled dot products Q K^T / sqrt(d_k) per head, (batch, heads, query, key); causal masks the future."""

    def __init__(self, head_dim: int, causal: bool) -> None:
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.causal = causal

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        scores = torch.matmul(query, key.transpose(-2, -1)) * self.scale
        if self.causal:
            future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return scores


class AttentionContext(nn.Module):
    """Attention weights times values per head: (batch, heads, query, key) @ (batch, heads, key, d_v)."""

    def forward(self, weights: Tensor, value: Tensor) -> Tensor:
        return torch.matmul(weights, value)


# --- LeNet-5 -------------------------------------------------------------------------------------


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) as usually reimplemented: tanh, average pooling, full C3 table."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)  # C1: 32x32 -> 28x28
        self.tanh1 = nn.Tanh()
        self.pool1 = nn.AvgPool2d(2)  # S2: 14x14
        self.conv2 = nn.Conv2d(6, 16, 5)  # C3: 10x10
        self.tanh2 = nn.Tanh()
        self.pool2 = nn.AvgPool2d(2)  # S4: 5x5
        self.conv3 = nn.Conv2d(16, 120, 5)  # C5: 1x1
        self.tanh3 = nn.Tanh()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(120, 84)  # F6
        self.tanh4 = nn.Tanh()
        self.fc2 = nn.Linear(84, classes)  # output

    def forward(self, image: Tensor) -> Tensor:
        x = self.pool1(self.tanh1(self.conv1(image)))
        x = self.pool2(self.tanh2(self.conv2(x)))
        x = self.flatten(self.tanh3(self.conv3(x)))
        return self.fc2(self.tanh4(self.fc1(x)))


# --- AlexNet and VGG-16 (torchvision layouts) ------------------------------------------------------


class AlexNet(nn.Module):
    """AlexNet, torchvision's single-tower variant (Krizhevsky 2014, 'One weird trick'), no LRN."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(64, 192, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(192, 384, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Dropout(0.5),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Linear(4096, classes),
        )

    def forward(self, image: Tensor) -> Tensor:
        return self.classifier(self.flatten(self.avgpool(self.features(image))))


VGG16_CONFIG: tuple[int | str, ...] = (
    64, 64, "pool", 128, 128, "pool", 256, 256, 256, "pool", 512, 512, 512, "pool", 512, 512, 512, "pool",
)  # fmt: skip
# configuration E (VGG-19): a fourth 3x3 convolution in each of the last three blocks
VGG19_CONFIG: tuple[int | str, ...] = (
    64, 64, "pool", 128, 128, "pool", 256, 256, 256, 256, "pool", 512, 512, 512, 512, "pool",
    512, 512, 512, 512, "pool",
)  # fmt: skip


class VGG16(nn.Module):
    """VGG-16, configuration D of Simonyan and Zisserman 2015, without batch normalisation (``config``
    VGG19_CONFIG gives configuration E, VGG-19)."""

    def __init__(self, classes: int = 1000, config: tuple[int | str, ...] = VGG16_CONFIG) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in config:
            if item == "pool":
                layers.append(nn.MaxPool2d(2, stride=2))
            else:
                assert isinstance(item, int)
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU()]
                channels = item
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(4096, classes),
        )

    def forward(self, image: Tensor) -> Tensor:
        return self.classifier(self.flatten(self.avgpool(self.features(image))))


# --- GoogLeNet and Inception-v3 (torchvision layouts) ----------------------------------------------


class BasicConv2d(nn.Module):
    """Convolution without bias, batch normalisation (eps 0.001), ReLU: torchvision's inception unit."""

    def __init__(self, in_channels: int, out_channels: int, **conv: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **conv)  # type: ignore[arg-type]
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.bn(self.conv(x)))


class GoogLeNetInception(nn.Module):
    """GoogLeNet inception module as in torchvision: its '5x5' branch uses a 3x3 convolution."""

    def __init__(
        self,
        in_channels: int,
        ch1x1: int,
        ch3x3red: int,
        ch3x3: int,
        ch5x5red: int,
        ch5x5: int,
        pool_proj: int,
    ) -> None:
        super().__init__()
        self.branch1 = BasicConv2d(in_channels, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(
            BasicConv2d(in_channels, ch3x3red, kernel_size=1),
            BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1),
        )
        self.branch3 = nn.Sequential(
            BasicConv2d(in_channels, ch5x5red, kernel_size=1),
            BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1),  # torchvision issue #906, kept
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True),
            BasicConv2d(in_channels, pool_proj, kernel_size=1),
        )
        self.concat = Concat()

    def forward(self, x: Tensor) -> Tensor:
        return self.concat(self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x))


class GoogLeNet(nn.Module):
    """GoogLeNet (Szegedy et al. 2015) as torchvision builds it: batch norm, no auxiliary heads."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception3a = GoogLeNetInception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = GoogLeNetInception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception4a = GoogLeNetInception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = GoogLeNetInception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = GoogLeNetInception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = GoogLeNetInception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = GoogLeNetInception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
        self.inception5a = GoogLeNetInception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = GoogLeNetInception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten()
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(1024, classes)

    def forward(self, image: Tensor) -> Tensor:
        x = self.maxpool1(self.conv1(image))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        for block in (
            self.inception4a,
            self.inception4b,
            self.inception4c,
            self.inception4d,
            self.inception4e,
        ):
            x = block(x)
        x = self.inception5b(self.inception5a(self.maxpool4(x)))
        return self.fc(self.dropout(self.flatten(self.avgpool(x))))


class InceptionA(nn.Module):
    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool_avg = nn.AvgPool2d(3, stride=1, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)
        self.concat = Concat()

    def forward(self, x: Tensor) -> Tensor:
        branch1x1 = self.branch1x1(x)
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = self.branch_pool(self.branch_pool_avg(x))
        return self.concat(branch1x1, branch5x5, branch3x3dbl, branch_pool)


class InceptionB(nn.Module):
    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_channels, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)
        self.branch_pool = nn.MaxPool2d(3, stride=2)
        self.concat = Concat()

    def forward(self, x: Tensor) -> Tensor:
        branch3x3 = self.branch3x3(x)
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return self.concat(branch3x3, branch3x3dbl, self.branch_pool(x))


class InceptionC(nn.Module):
    def __init__(self, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool_avg = nn.AvgPool2d(3, stride=1, padding=1)
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)
        self.concat = Concat()

    def forward(self, x: Tensor) -> Tensor:
        branch1x1 = self.branch1x1(x)
        branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        branch7x7dbl = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            branch7x7dbl = conv(branch7x7dbl)
        branch_pool = self.branch_pool(self.branch_pool_avg(x))
        return self.concat(branch1x1, branch7x7, branch7x7dbl, branch_pool)


class InceptionD(nn.Module):
    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)
        self.branch_pool = nn.MaxPool2d(3, stride=2)
        self.concat = Concat()

    def forward(self, x: Tensor) -> Tensor:
        branch3x3 = self.branch3x3_2(self.branch3x3_1(x))
        branch7x7x3 = self.branch7x7x3_1(x)
        for conv in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            branch7x7x3 = conv(branch7x7x3)
        return self.concat(branch3x3, branch7x7x3, self.branch_pool(x))


class InceptionE(nn.Module):
    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(in_channels, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3_concat = Concat()
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_concat = Concat()
        self.branch_pool_avg = nn.AvgPool2d(3, stride=1, padding=1)
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)
        self.concat = Concat()

    def forward(self, x: Tensor) -> Tensor:
        branch1x1 = self.branch1x1(x)
        branch3x3 = self.branch3x3_1(x)
        branch3x3 = self.branch3x3_concat(self.branch3x3_2a(branch3x3), self.branch3x3_2b(branch3x3))
        branch3x3dbl = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        branch3x3dbl = self.branch3x3dbl_concat(
            self.branch3x3dbl_3a(branch3x3dbl), self.branch3x3dbl_3b(branch3x3dbl)
        )
        branch_pool = self.branch_pool(self.branch_pool_avg(x))
        return self.concat(branch1x1, branch3x3, branch3x3dbl, branch_pool)


class InceptionV3(nn.Module):
    """Inception-v3 (Szegedy et al. 2016) as torchvision builds it, without the auxiliary classifier."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(3, stride=2)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, channels_7x7=128)
        self.Mixed_6c = InceptionC(768, channels_7x7=160)
        self.Mixed_6d = InceptionC(768, channels_7x7=160)
        self.Mixed_6e = InceptionC(768, channels_7x7=192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.5)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(2048, classes)

    def forward(self, image: Tensor) -> Tensor:
        x = image
        for name in (
            "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1", "Conv2d_4a_3x3",
            "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
            "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool", "dropout", "flatten", "fc",
        ):  # fmt: skip
            x = getattr(self, name)(x)
        return x


# --- ResNets (torchvision v1.5: stride in the 3x3 convolution) ------------------------------------


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module | None:
    """A residual block's projection shortcut (1x1 convolution and batch norm) where its output's shape
    differs from its input's; None (the identity) where it does not."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(out_channels))  # fmt: skip


class Bottleneck(nn.Module):
    """1x1, 3x3 (stride here, v1.5), 1x1 x4 convolutions with batch norm, plus the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample = _shortcut(in_channels, out_channels, stride)
        self.add = Add()
        self.relu3 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(self.add(out, identity))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm (stride in the first), plus the shortcut: ResNet-18/34."""

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = _shortcut(in_channels, width, stride)
        self.add = Add()
        self.relu2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu2(self.add(out, identity))


class ResNet(nn.Module):
    """ResNet (He et al. 2016) with ``blocks`` residual blocks per stage: bottlenecks (50 layers and
    deeper), or ``block=BasicBlock`` (18 and 34)."""

    def __init__(
        self,
        blocks: tuple[int, int, int, int],
        classes: int = 1000,
        block: type[Bottleneck] | type[BasicBlock] = Bottleneck,
    ) -> None:
        super().__init__()
        expansion = block.expansion
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        stages: list[nn.Sequential] = []
        for stage, count in enumerate(blocks):
            width = 64 * 2**stage
            stride = 1 if stage == 0 else 2
            stage_blocks = []
            for index in range(count):
                stage_blocks.append(block(in_channels, width, stride if index == 0 else 1))
                in_channels = width * expansion
            stages.append(nn.Sequential(*stage_blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512 * expansion, classes)

    def forward(self, image: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(image))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.flatten(self.avgpool(x)))


# --- Transformer base (Vaswani et al. 2017) ------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Multi-head attention, section 3.2.2: projections, scores, softmax, context, output projection."""

    def __init__(self, d_model: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.scores = AttentionScores(self.head_dim, causal)
        self.softmax = nn.Softmax(dim=-1)
        self.context = AttentionContext()
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, query: Tensor, memory: Tensor) -> Tensor:
        q = self._split_heads(self.q_proj(query))
        k = self._split_heads(self.k_proj(memory))
        v = self._split_heads(self.v_proj(memory))
        context = self.context(self.softmax(self.scores(q, k)), v)
        batch, _, length, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """Position-wise feed-forward network, section 3.3: linear, ReLU, linear."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.relu(self.linear1(x)))


class SublayerOutput(nn.Module):
    """LayerNorm(x + Dropout(sublayer(x))), the post-norm residual of section 5.4."""

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.add = Add()
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, sublayer_output: Tensor) -> Tensor:
        return self.norm(self.add(x, self.dropout(sublayer_output)))


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, heads, causal=False)
        self.self_attention_output = SublayerOutput(d_model, dropout)
        self.feed_forward = FeedForward(d_model, d_ff)
        self.feed_forward_output = SublayerOutput(d_model, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = self.self_attention_output(x, self.self_attention(x, x))
        return self.feed_forward_output(x, self.feed_forward(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, heads, causal=True)
        self.self_attention_output = SublayerOutput(d_model, dropout)
        self.cross_attention = MultiHeadAttention(d_model, heads, causal=False)
        self.cross_attention_output = SublayerOutput(d_model, dropout)
        self.feed_forward = FeedForward(d_model, d_ff)
        self.feed_forward_output = SublayerOutput(d_model, dropout)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        x = self.self_attention_output(x, self.self_attention(x, x))
        x = self.cross_attention_output(x, self.cross_attention(x, memory))
        return self.feed_forward_output(x, self.feed_forward(x))


class Embedder(nn.Module):
    """Token embedding, then scaling, positional encoding and dropout (sections 3.4, 3.5, 5.4)."""

    def __init__(self, embedding: nn.Embedding, d_model: int, max_length: int, dropout: float) -> None:
        super().__init__()
        self.embedding = embedding
        self.positional_encoding = PositionalEncoding(d_model, max_length)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.dropout(self.positional_encoding(self.embedding(tokens)))


class Transformer(nn.Module):
    """Encoder-decoder Transformer, post-norm, one vocabulary shared by source and target.

    The source embedding, the target embedding and the pre-softmax projection share one weight
    matrix (section 3.4), so the decoder embedding and the output projection own no parameters.
    The output is the logits; the loss is not part of the table.
    """

    def __init__(
        self,
        vocabulary: int = 37000,
        d_model: int = 512,
        heads: int = 8,
        d_ff: int = 2048,
        layers: int = 6,
        dropout: float = 0.1,
        max_length: int = 512,
    ) -> None:
        super().__init__()
        shared = nn.Embedding(vocabulary, d_model)
        target = nn.Embedding(vocabulary, d_model)
        target.weight = shared.weight
        self.encoder = Embedder(shared, d_model, max_length, dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers)
        )
        self.decoder = Embedder(target, d_model, max_length, dropout)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers)
        )
        self.output_projection = nn.Linear(d_model, vocabulary, bias=False)
        self.output_projection.weight = shared.weight

    def forward(self, source: Tensor, target: Tensor) -> Tensor:
        memory = self.encoder(source)
        for encoder_layer in self.encoder_layers:
            memory = encoder_layer(memory)
        x = self.decoder(target)
        for decoder_layer in self.decoder_layers:
            x = decoder_layer(x, memory)
        return self.output_projection(x)


# --- The catalogue -------------------------------------------------------------------------------

TRANSFORMER_TOKENS = 128  # per sample: 128 source tokens and 128 target tokens


@dataclass(frozen=True)
class ModelSpec:
    """How to build one workload model and feed it one batch; the texts go into the table's header."""

    build: Callable[[], nn.Module]
    example_inputs: Callable[[int], tuple[Tensor, ...]]  # batch size -> inputs, on the current device
    sample_shape: tuple[int, ...]
    description: str
    source: str


def _images(channels: int, size: int) -> Callable[[int], tuple[Tensor, ...]]:
    return lambda batch: (torch.zeros(batch, channels, size, size),)


def _token_pairs(batch: int) -> tuple[Tensor, ...]:
    tokens = torch.zeros(batch, TRANSFORMER_TOKENS, dtype=torch.long)
    return tokens, tokens.clone()


MODELS: dict[str, ModelSpec] = {
    "lenet": ModelSpec(
        LeNet5,
        _images(1, 32),
        (1, 32, 32),
        "LeNet-5 (LeCun et al. 1998) on one 1x32x32 image, as commonly reimplemented: tanh, average "
        "pooling without trainable coefficients, fully connected C3, linear output instead of RBF",
        "61,706 parameters by hand: C1 156 + C3 2,416 + C5 48,120 + F6 10,164 + output 850",
    ),
    "alexnet": ModelSpec(
        AlexNet,
        _images(3, 224),
        (3, 224, 224),
        "AlexNet, torchvision's single-tower variant (Krizhevsky 2014), one 3x224x224 image",
        "torchvision alexnet: 61,100,840 parameters, 0.71 GMAC",
    ),
    "vgg16": ModelSpec(
        VGG16,
        _images(3, 224),
        (3, 224, 224),
        "VGG-16 (Simonyan and Zisserman 2015, configuration D, no batch norm), one 3x224x224 image",
        "torchvision vgg16: 138,357,544 parameters, 15.47 GMAC",
    ),
    "vgg19": ModelSpec(
        lambda: VGG16(config=VGG19_CONFIG),
        _images(3, 224),
        (3, 224, 224),
        "VGG-19 (Simonyan and Zisserman 2015, configuration E, no batch norm), one 3x224x224 image",
        "torchvision vgg19: 143,667,240 parameters, 19.63 GMAC",
    ),
    "googlenet": ModelSpec(
        GoogLeNet,
        _images(3, 224),
        (3, 224, 224),
        "GoogLeNet (Szegedy et al. 2015) as torchvision builds it (batch norm, 3x3 in the '5x5' branch), "
        "without the auxiliary classifiers, one 3x224x224 image",
        "torchvision googlenet without aux heads: 6,624,904 parameters, 1.50 GMAC",
    ),
    "inception_v3": ModelSpec(
        InceptionV3,
        _images(3, 299),
        (3, 299, 299),
        "Inception-v3 (Szegedy et al. 2016) as torchvision builds it, without the auxiliary classifier "
        "(torchvision's 27.2 M includes it), one 3x299x299 image",
        "Keras InceptionV3: 23,851,784 parameters (Szegedy et al. 2016: 23.8 M); "
        "torchvision inception_v3: 27,161,264 with the 3,326,696-parameter auxiliary head",
    ),
    "resnet18": ModelSpec(
        lambda: ResNet((2, 2, 2, 2), block=BasicBlock),
        _images(3, 224),
        (3, 224, 224),
        "ResNet-18 (He et al. 2016; torchvision, two 3x3 convolutions per block), one 3x224x224 image",
        "torchvision resnet18: 11,689,512 parameters, 1.81 GMAC",
    ),
    "resnet34": ModelSpec(
        lambda: ResNet((3, 4, 6, 3), block=BasicBlock),
        _images(3, 224),
        (3, 224, 224),
        "ResNet-34 (He et al. 2016; torchvision, two 3x3 convolutions per block), one 3x224x224 image",
        "torchvision resnet34: 21,797,672 parameters, 3.66 GMAC",
    ),
    "resnet50": ModelSpec(
        lambda: ResNet((3, 4, 6, 3)),
        _images(3, 224),
        (3, 224, 224),
        "ResNet-50 v1.5 (He et al. 2016; torchvision, stride in the 3x3 convolution), one 3x224x224 image",
        "torchvision resnet50: 25,557,032 parameters, 4.09 GMAC",
    ),
    "resnet101": ModelSpec(
        lambda: ResNet((3, 4, 23, 3)),
        _images(3, 224),
        (3, 224, 224),
        "ResNet-101 v1.5 (He et al. 2016; torchvision, stride in the 3x3 convolution), one 3x224x224 image",
        "torchvision resnet101: 44,549,160 parameters, 7.80 GMAC",
    ),
    "resnet152": ModelSpec(
        lambda: ResNet((3, 8, 36, 3)),
        _images(3, 224),
        (3, 224, 224),
        "ResNet-152 v1.5 (He et al. 2016; torchvision, stride in the 3x3 convolution), one 3x224x224 image",
        "torchvision resnet152: 60,192,808 parameters, 11.51 GMAC",
    ),
    "transformer_base": ModelSpec(
        Transformer,
        _token_pairs,
        (TRANSFORMER_TOKENS,),
        f"Transformer base (Vaswani et al. 2017): d_model 512, 6 encoder and 6 decoder layers, 8 heads, "
        f"d_ff 2048, post-norm, shared 37000-token vocabulary with tied embeddings and output projection; "
        f"one sample is {TRANSFORMER_TOKENS} source and {TRANSFORMER_TOKENS} target tokens; "
        f"output is the logits (loss not included)",
        "Vaswani et al. 2017, table 3: base model 65 M parameters",
    ),
    "transformer_big": ModelSpec(
        lambda: Transformer(d_model=1024, heads=16, d_ff=4096, dropout=0.3),
        _token_pairs,
        (TRANSFORMER_TOKENS,),
        f"Transformer big (Vaswani et al. 2017, table 3): d_model 1024, 6 encoder and 6 decoder layers, 16 "
        f"heads, d_ff 4096, post-norm, shared 37000-token vocabulary with tied embeddings and output "
        f"projection; one sample is {TRANSFORMER_TOKENS} source and {TRANSFORMER_TOKENS} target tokens; "
        f"output is the logits (loss not included)",
        "Vaswani et al. 2017, table 3: big model 213 M parameters",
    ),
}
