"""The weight-major fp32 linear forward (gateway/engine/cpu_linear.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gateway.engine import load_model
from gateway.engine.cpu_linear import ROWS_MAX, _forward, use_weight_major_linear


def patched(layer: nn.Module) -> bool:
    return getattr(layer.forward, "__func__", None) is _forward


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (1, 7), (3, 5), (ROWS_MAX,), (1, ROWS_MAX + 1)])
def test_matches_torch_linear_up_to_rounding(shape, bias) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=bias)
    x = torch.randn(*shape, 48)
    expected = F.linear(x, layer.weight, layer.bias)
    assert use_weight_major_linear(layer) == 1 and patched(layer)
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == expected.shape == (*shape, 80)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, torch.zeros_like(got))


def test_training_keeps_torch_path_and_gradients() -> None:
    layer = nn.Linear(16, 8)
    use_weight_major_linear(layer)
    x = torch.randn(2, 16)
    layer(x).sum().backward()
    assert layer.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(8, 16))


def test_only_fp32_cpu_linear_layers_are_patched() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Embedding(10, 4), nn.Linear(4, 4).bfloat16())
    assert use_weight_major_linear(model) == 1
    assert patched(model[0]) and not patched(model[2])


def test_load_model_patches_by_default_and_can_opt_out(model_dirs) -> None:
    on = load_model(model_dirs["llama"], device="cpu")
    off = load_model(model_dirs["llama"], device="cpu", cpu_linear=False)
    lin_on = [m for m in on.model.modules() if type(m) is nn.Linear]
    lin_off = [m for m in off.model.modules() if type(m) is nn.Linear]
    assert lin_on and all(patched(m) for m in lin_on)
    assert lin_off and not any(patched(m) for m in lin_off)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        a, b = on.model(input_ids=ids).logits, off.model(input_ids=ids).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
