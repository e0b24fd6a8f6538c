"""Build a model by name: ``build_model("resnet20", 3, 32, 10)``.

Image models (:data:`MODELS`): ``resnetN`` (CIFAR-style ResNet, N = 6n+2: 20, 32, 44,
56, 110, ...), ``wrn-D-W`` (Wide ResNet, D = 6n+4: ``wrn-16-4``, ``wrn-28-10``, ...),
``cnn``, ``mlp`` and ``linear``. Language models (:data:`LANGUAGE_MODELS`, for token
data: ``build_language_model("transformer-tiny", vocab=256)``): the causal Transformer
of :mod:`dana.models.transformer` in the sizes of :data:`TRANSFORMER_SIZES`, or any
size as ``transformer-L-W-T`` (L layers of width W, a multiple of 32, with W/32 heads,
and a context of T tokens). Construction draws from torch's global generator, so the
same ``torch.manual_seed`` gives the same initial weights.
"""

from __future__ import annotations

import re

from torch import nn

from dana.errors import ConfigError
from dana.models.resnet import CifarResNet
from dana.models.small import MLP, SmallCNN, linear_model
from dana.models.transformer import GPT
from dana.models.wrn import WideResNet

__all__ = [
    "LANGUAGE_MODELS",
    "MODELS",
    "TRANSFORMER_SIZES",
    "build_language_model",
    "build_model",
    "context_length",
    "count_parameters",
    "is_language_model",
    "model_depth",
]

MODELS = (
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
    "resnet110",
    "wrn-16-4",
    "wrn-28-10",
    "cnn",
    "mlp",
    "linear",
)
_VALID = (
    "resnetN with N = 6n+2 (resnet20, resnet32, resnet44, resnet56, resnet110, ...), "
    "wrn-D-W with D = 6n+4 and W >= 1 (wrn-16-4, wrn-28-10, ...), cnn, mlp, linear"
)
#: The named Transformer sizes: (layers, width, context); heads = width / 32.
TRANSFORMER_SIZES = {
    "transformer-tiny": (2, 64, 64),  # 0.12M parameters: minutes on two CPU cores
    "transformer-mini": (4, 128, 128),  # 0.84M
    "transformer-small": (6, 256, 256),  # 4.8M
}
LANGUAGE_MODELS = tuple(TRANSFORMER_SIZES)
#: Each attention head's width.
HEAD_WIDTH = 32
_VALID_LM = (
    f"{', '.join(LANGUAGE_MODELS)}, or transformer-L-W-T (L layers of width W, a multiple "
    f"of {HEAD_WIDTH}, context T tokens), e.g. transformer-3-96-128"
)
# Smallest image side each family accepts: the convnets downsample twice.
_MIN_IMAGE_SIZE = {"resnet": 4, "wrn": 4, "cnn": 4, "mlp": 1, "linear": 1}


def count_parameters(model: nn.Module) -> int:
    """The number of trainable scalars in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def is_language_model(name: str) -> bool:
    """Whether ``name`` names a language model (takes token sequences, not images)."""
    return name.strip().lower().startswith("transformer")


def _transformer_size(name: str) -> tuple[int, int, int]:
    """(layers, width, context) of a Transformer's name, or ConfigError."""
    key = name.strip().lower()
    if key in TRANSFORMER_SIZES:
        return TRANSFORMER_SIZES[key]
    m = re.fullmatch(r"transformer-(\d+)-(\d+)-(\d+)", key)
    if not m:
        raise ConfigError(f"unknown language model {name!r}; valid: {_VALID_LM}")
    layers, width, context = (int(g) for g in m.groups())
    if layers < 1 or context < 1 or width < HEAD_WIDTH or width % HEAD_WIDTH:
        raise ConfigError(
            f"model {name!r}: needs layers >= 1, a width that is a multiple of {HEAD_WIDTH} "
            f"and a context >= 1, got {layers}, {width}, {context}"
        )
    return layers, width, context


def model_depth(name: str) -> int:
    """The layers the model ``name`` stacks: a Transformer's layers, a (Wide) ResNet's
    depth, 1 for ``cnn``, ``mlp`` and ``linear``; at most the number of tensors its
    ``state_dict`` holds. ConfigError for a name dana does not build."""
    if is_language_model(name):
        return _transformer_size(name)[0]
    numbers = _parse(name.strip().lower())[1]
    return numbers[0] if numbers else 1


def context_length(name: str) -> int:
    """The number of tokens the language model ``name`` sees at once (its sequences')."""
    return _transformer_size(name)[2]


def build_language_model(name: str, vocab: int) -> nn.Module:
    """A freshly initialised language model over ``vocab`` tokens (ConfigError for an
    unknown name or an image model's).

    >>> count_parameters(build_language_model("transformer-tiny", vocab=256))
    120576
    """
    if not is_language_model(name):
        raise ConfigError(
            f"model {name!r} takes images, and this dataset holds text; choose a language "
            f"model: {_VALID_LM}"
        )
    if vocab < 2:
        raise ConfigError(f"model {name!r}: the vocabulary must hold at least 2 tokens")
    layers, width, context = _transformer_size(name)
    return GPT(vocab, context, layers, width, width // HEAD_WIDTH)


def _parse(name: str) -> tuple[str, tuple[int, ...]]:
    """Split a model name into its family and its numbers, or raise ConfigError."""
    if is_language_model(name):
        raise ConfigError(
            f"model {name!r} is a language model: it takes token sequences, give it "
            "--dataset text; for images choose: " + _VALID
        )
    if name in ("cnn", "mlp", "linear"):
        return name, ()
    if m := re.fullmatch(r"resnet(\d+)", name):
        depth = int(m.group(1))
        if depth < 8 or (depth - 2) % 6:
            raise ConfigError(
                f"model {name!r}: ResNet depth must be 6n+2 with n >= 1 "
                f"(8, 14, 20, 26, 32, 44, 56, 110, ...), got {depth}"
            )
        return "resnet", (depth,)
    if m := re.fullmatch(r"wrn-(\d+)-(\d+)", name):
        depth, width = int(m.group(1)), int(m.group(2))
        if depth < 10 or (depth - 4) % 6:
            raise ConfigError(
                f"model {name!r}: Wide ResNet depth must be 6n+4 with n >= 1 "
                f"(10, 16, 22, 28, 40, ...), got {depth}"
            )
        if width < 1:
            raise ConfigError(f"model {name!r}: Wide ResNet width must be at least 1")
        return "wrn", (depth, width)
    raise ConfigError(f"unknown model {name!r}; valid: {_VALID}; language models: {_VALID_LM}")


def build_model(name: str, in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """A freshly initialised model for ``in_channels x image_size x image_size`` inputs.

    Raises :class:`ConfigError` for an unknown name, a depth not of the required
    form, or a dataset the model cannot take (images too small, bad sizes).

    >>> count_parameters(build_model("resnet20", in_channels=3, image_size=32, num_classes=10))
    269722
    """
    family, numbers = _parse(name.strip().lower())
    for what, value, low in (
        ("in_channels", in_channels, 1),
        ("image_size", image_size, 1),
        ("num_classes", num_classes, 2),
    ):
        if value < low:
            raise ConfigError(f"model {name!r}: {what} must be at least {low}, got {value}")
    min_size = _MIN_IMAGE_SIZE[family]
    if image_size < min_size:
        raise ConfigError(
            f"model {name!r} needs images of at least {min_size}x{min_size}; the dataset's "
            f"images are {in_channels}x{image_size}x{image_size}"
        )
    in_features = in_channels * image_size * image_size
    if family == "resnet":
        return CifarResNet(numbers[0], in_channels, num_classes)
    if family == "wrn":
        return WideResNet(numbers[0], numbers[1], in_channels, num_classes)
    if family == "cnn":
        return SmallCNN(in_channels, image_size, num_classes)
    if family == "mlp":
        return MLP(in_features, num_classes)
    return linear_model(in_features, num_classes)
