"""Models: CIFAR-style ResNets, Wide ResNets, a small CNN, an MLP, logistic regression,
and a small causal Transformer language model.

Use :func:`build_model` (images) or :func:`build_language_model` (tokens) to build one
by name; :data:`MODELS` and :data:`LANGUAGE_MODELS` list the usual names.
"""

from dana.models.registry import (
    LANGUAGE_MODELS,
    MODELS,
    build_language_model,
    build_model,
    context_length,
    count_parameters,
    is_language_model,
)
from dana.models.resnet import CifarResNet
from dana.models.small import MLP, SmallCNN, linear_model
from dana.models.transformer import GPT
from dana.models.wrn import WideResNet

__all__ = [
    "GPT",
    "LANGUAGE_MODELS",
    "MLP",
    "MODELS",
    "CifarResNet",
    "SmallCNN",
    "WideResNet",
    "build_language_model",
    "build_model",
    "context_length",
    "count_parameters",
    "is_language_model",
    "linear_model",
]
