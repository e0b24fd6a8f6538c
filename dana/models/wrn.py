"""Wide ResNet WRN-depth-width (Zagoruyko and Komodakis, 2016, "Wide Residual Networks").

Depth ``6n + 4``: a 3x3 conv to 16 channels, three stages of ``n`` pre-activation
blocks (BN-ReLU-conv3x3, BN-ReLU-conv3x3) at ``16w``, ``32w`` and ``64w`` channels
(stride 2 at the start of stages 2 and 3), a 1x1 conv shortcut where the shape
changes, then BN-ReLU, global average pooling and a linear classifier. No dropout.
WRN-16-4 on CIFAR-10 has about 2.75M parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dana.models.resnet import kaiming_init

__all__ = ["WideBlock", "WideResNet"]


class WideBlock(nn.Module):
    """Pre-activation basic block; the shortcut is a 1x1 conv when the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.bn2(out)))
        # As in the authors' code, a projection shortcut reads the pre-activation.
        skip = x if self.shortcut is None else self.shortcut(pre)
        return out + skip


class WideResNet(nn.Module):
    """WRN-depth-width: ``WideResNet(16, 4)`` is WRN-16-4."""

    def __init__(self, depth: int, width: int, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"Wide ResNet depth must be 6n+4 with n >= 1, got {depth}")
        if width < 1:
            raise ValueError(f"Wide ResNet width must be at least 1, got {width}")
        n = (depth - 4) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        blocks: list[nn.Module] = []
        in_planes = 16
        for stage, planes in enumerate((16 * width, 32 * width, 64 * width)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(WideBlock(in_planes, planes, stride))
                in_planes = planes
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(in_planes)
        self.fc = nn.Linear(in_planes, num_classes)
        kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.conv1(x))
        out = F.relu(self.bn(out))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)
