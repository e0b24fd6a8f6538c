"""FlatModel: the module computes at any flat vector without copying it, exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dana.train.task.flat import FlatModel


def small_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    ).double()


def data(n: int = 16):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,))


def reference_gradient(params: torch.Tensor, x, y) -> tuple[torch.Tensor, float]:
    """The same gradient the plain way: a fresh module loaded with ``params``."""
    net = small_net()
    torch.nn.utils.vector_to_parameters(params, net.parameters())
    net.train()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()]), loss.item()


def test_gradient_at_rows_of_a_matrix_is_the_plain_gradient():
    flat, (x, y) = FlatModel(small_net()), data()
    rows = flat.flat.repeat(3, 1) + 0.1 * torch.randn(3, flat.d, dtype=torch.float64)
    before = rows.clone()
    for i in (0, 2, 1, 1):
        grad, loss = flat.gradient(rows[i], x, y, F.cross_entropy)
        # BatchNorm's running statistics move with every call; they do not enter training.
        ref_grad, ref_loss = reference_gradient(rows[i], x, y)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
        assert loss == pytest.approx(ref_loss, rel=1e-12)
    assert torch.equal(rows, before)  # computing at a vector never writes it


def test_gradient_of_a_copy_and_of_a_view_agree():
    flat, (x, y) = FlatModel(small_net()), data()
    p = flat.flat + 0.05
    g_view = flat.gradient(p, x, y, F.cross_entropy)[0].clone()
    # Non-contiguous and other-dtype vectors are copied in; the result is the same.
    strided = torch.stack([p, torch.zeros_like(p)], 1)[:, 0]
    assert not strided.is_contiguous()
    g_strided = flat.gradient(strided, x, y, F.cross_entropy)[0].clone()
    torch.testing.assert_close(g_strided, g_view, rtol=1e-12, atol=0)
    g_float = flat.gradient(p.float(), x, y, F.cross_entropy)[0]
    torch.testing.assert_close(g_float, g_view, rtol=1e-5, atol=1e-6)


def test_load_gives_the_module_its_own_copy():
    net = small_net()
    flat = FlatModel(net)
    p = flat.flat + 1.0
    flat.gradient(p, *data(), F.cross_entropy)
    flat.load(p)
    p.zero_()  # the caller's vector changes; the module keeps what was loaded
    assert torch.equal(torch.nn.utils.parameters_to_vector(net.parameters()), flat.flat)
    assert float(flat.flat.abs().min()) > 0


def test_evaluate_sees_the_vector_it_is_given_in_eval_mode():
    net = small_net()
    flat, (x, y) = FlatModel(net), data()
    flat.gradient(flat.flat, x, y, F.cross_entropy)
    p = flat.flat * 0.5
    loss, error = flat.evaluate(p, x, y, F.cross_entropy)
    ref = small_net()
    torch.nn.utils.vector_to_parameters(p, ref.parameters())
    ref.load_state_dict({**ref.state_dict(), **flat.buffers_state()})
    ref.eval()
    with torch.no_grad():
        assert loss == pytest.approx(F.cross_entropy(ref(x), y).item(), rel=1e-12)
    assert not net.training
    flat.gradient(p, x, y, F.cross_entropy)
    assert net.training  # back to training mode for the next gradient


def test_a_parameter_the_loss_ignores_gets_a_zero_gradient():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.used(x)

    flat = FlatModel(TwoHeads())
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    grad, _ = flat.gradient(flat.flat.clone(), x, y, F.cross_entropy)
    assert grad[:10].abs().sum() > 0 and torch.equal(grad[10:], torch.zeros(10))


def test_no_trainable_parameters_is_an_error():
    net = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatModel(net)
