"""Small, fast models: a BatchNorm CNN, an MLP and a linear (logistic regression) model."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP", "SmallCNN", "linear_model"]


def _conv_out(size: int) -> int:
    """Output side of a 3x3, stride-2, padding-1 convolution."""
    return (size - 1) // 2 + 1


class SmallCNN(nn.Module):
    """Two strided conv-BN-ReLU layers (32 and 64 channels), a 128-unit hidden layer.

    conv3x3(32, stride 2)-BN-ReLU, conv3x3(64, stride 2)-BN-ReLU, linear(128)-ReLU,
    linear(classes). Strided convolutions instead of max pooling keep it cheap on
    a CPU (28x28, batch 128: about 8 ms forward and backward on 2 cores).
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 32):
        super().__init__()
        side = _conv_out(_conv_out(image_size))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * side * side, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """A multi-layer perceptron on the flattened image: ReLU hidden layers, then logits."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def linear_model(in_features: int, num_classes: int) -> nn.Module:
    """Multinomial logistic regression: flatten, one linear layer (logits)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))
