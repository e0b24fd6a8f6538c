"""Tests for dana.models: shapes, parameter counts, names, determinism, flat parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dana.errors import ConfigError
from dana.models import MODELS, CifarResNet, WideResNet, build_model, count_parameters

# Every model on both input kinds; wrn-28-10 (36M parameters) only in the count test.
FAST_MODELS = ["resnet8", "resnet20", "wrn-10-2", "wrn-16-4", "cnn", "mlp", "linear"]


@pytest.mark.parametrize("name", FAST_MODELS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (1, 16, 16)])
def test_output_shape(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, in_channels=shape[0], image_size=shape[1], num_classes=7)
    x = torch.randn(4, *shape)
    out = model(x)
    assert out.shape == (4, 7) and out.dtype == torch.float32
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert model(x[:1]).shape == (1, 7)


def test_every_listed_model_builds() -> None:
    for name in MODELS:
        if name != "wrn-28-10":
            assert isinstance(build_model(name, 3, 32, 10), nn.Module)


def test_parameter_counts() -> None:
    # He et al. 2016, Table 6 ("0.27M", "0.85M") with option A (parameter-free) shortcuts.
    assert count_parameters(build_model("resnet20", 3, 32, 10)) == 269_722
    assert count_parameters(build_model("resnet56", 3, 32, 10)) == 853_018
    # Option B adds a 1x1 conv and BatchNorm at the two downsampling blocks.
    assert count_parameters(CifarResNet(20, 3, 10, shortcut="B")) == 272_474
    # Zagoruyko and Komodakis 2016: WRN-16-4 2.7M, WRN-28-10 36.5M.
    assert count_parameters(build_model("wrn-16-4", 3, 32, 10)) == 2_748_890
    assert count_parameters(build_model("wrn-28-10", 3, 32, 10)) == pytest.approx(36.5e6, rel=0.01)
    assert count_parameters(build_model("linear", 1, 28, 10)) == 784 * 10 + 10


def test_resnet_option_a_has_no_projection() -> None:
    model = build_model("resnet20", 3, 32, 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 19 and all(m.kernel_size == (3, 3) for m in convs)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 19


def test_cnn_and_resnet_have_batchnorm() -> None:
    for name in ("cnn", "resnet20", "wrn-16-4"):
        model = build_model(name, 1, 28, 10)
        assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def test_any_valid_depth_and_case() -> None:
    assert isinstance(build_model("resnet14", 1, 28, 10), CifarResNet)
    assert isinstance(build_model("ResNet32", 1, 28, 10), CifarResNet)
    assert isinstance(build_model("wrn-22-1", 1, 28, 10), WideResNet)


@pytest.mark.parametrize(
    "name, match",
    [
        ("resnet21", "6n\\+2"),
        ("resnet2", "6n\\+2"),
        ("wrn-15-4", "6n\\+4"),
        ("wrn-16-0", "width"),
        ("vgg16", "unknown model 'vgg16'; valid: resnetN"),
        ("resnet", "unknown model"),
        ("", "unknown model"),
    ],
)
def test_bad_names(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_model(name, 3, 32, 10)


def test_model_dataset_mismatch() -> None:
    with pytest.raises(ConfigError, match="'cnn' needs images of at least 4x4.*1x2x2"):
        build_model("cnn", 1, 2, 10)
    with pytest.raises(ConfigError, match="'resnet20'.*3x3x3"):
        build_model("resnet20", 3, 3, 10)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("mlp", 1, 28, 1)
    with pytest.raises(ConfigError, match="in_channels"):
        build_model("linear", 0, 28, 10)
    assert build_model("linear", 1, 1, 2)(torch.randn(3, 1, 1, 1)).shape == (3, 2)


@pytest.mark.parametrize("name", ["resnet8", "wrn-10-1", "cnn", "mlp", "linear"])
def test_deterministic_given_seed(name: str) -> None:
    def params(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        model = build_model(name, 1, 28, 10)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.equal(params(0), params(0))
    assert not torch.equal(params(0), params(1))


@pytest.mark.parametrize("name", ["resnet8", "wrn-10-1", "cnn", "mlp", "linear"])
def test_parameters_as_views_of_one_flat_buffer(name: str) -> None:
    """The trainer's layout: every parameter a view into one flat tensor."""
    torch.manual_seed(0)
    model = build_model(name, 1, 28, 10)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    params = list(model.parameters())
    flat = torch.cat([p.detach().flatten() for p in params])
    offset = 0
    for p in params:
        p.data = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    before = flat.clone()
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert torch.equal(flat, before), "a forward or backward pass changed the parameters"
    assert all(p.data.data_ptr() >= flat.data_ptr() for p in params)
    model.eval()
    out = model(x)
    flat.mul_(0.5)  # an update to the flat buffer is seen by the model
    assert not torch.allclose(model(x), out)
