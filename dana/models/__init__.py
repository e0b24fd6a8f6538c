"""Models: CIFAR-style ResNets, Wide ResNets, a small CNN, an MLP, logistic regression.

Use :func:`build_model` to build one by name; :data:`MODELS` lists the usual names.
"""

from dana.models.registry import MODELS, build_model, count_parameters
from dana.models.resnet import CifarResNet
from dana.models.small import MLP, SmallCNN, linear_model
from dana.models.wrn import WideResNet

__all__ = [
    "MLP",
    "MODELS",
    "CifarResNet",
    "SmallCNN",
    "WideResNet",
    "build_model",
    "count_parameters",
    "linear_model",
]
