"""CIFAR-style ResNet (He et al., 2016, "Deep Residual Learning", section 4.2).

Depth ``6n + 2``: a 3x3 conv to 16 channels, three stages of ``n`` basic blocks at
16, 32 and 64 channels (stride 2 at the start of stages 2 and 3), global average
pooling and a linear classifier. Kaiming (He-normal) initialisation.

Shortcuts are option A by default, as the paper uses for its CIFAR networks: the
identity, and where the shape changes, strided subsampling with zero-padded extra
channels (no parameters). ResNet-20 for 10 classes and 3 input channels then has
269,722 parameters (the paper's "0.27M"). Option B (``shortcut="B"``) projects
with a 1x1 strided conv and BatchNorm where the shape changes, which adds 2,752
parameters to ResNet-20 (272,474 in all). Global average pooling makes any input
size work (e.g. 1 x 28 x 28).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BasicBlock", "CifarResNet", "kaiming_init"]


def kaiming_init(model: nn.Module) -> None:
    """He-normal conv and linear weights, zero biases, BatchNorm weight 1 and bias 0."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a shortcut (option A or B), then ReLU."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1, shortcut: str = "A"):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.extra_channels = planes - in_planes
        self.projection: nn.Module | None = None
        if shortcut == "B" and (stride != 1 or in_planes != planes):
            self.projection = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """Identity, or (A) subsample and zero-pad the new channels, or (B) project."""
        if self.projection is not None:
            return self.projection(x)
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra_channels:
            before = self.extra_channels // 2
            x = F.pad(x, (0, 0, 0, 0, before, self.extra_channels - before))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images: ``CifarResNet(depth=20)`` is ResNet-20."""

    def __init__(
        self, depth: int, in_channels: int = 3, num_classes: int = 10, shortcut: str = "A"
    ):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1, got {depth}")
        if shortcut not in ("A", "B"):
            raise ValueError(f"CIFAR ResNet shortcut must be 'A' or 'B', got {shortcut!r}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks: list[nn.Module] = []
        in_planes = 16
        for stage, planes in enumerate((16, 32, 64)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(in_planes, planes, stride, shortcut))
                in_planes = planes
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.blocks(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)
