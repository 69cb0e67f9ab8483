"""Several-row products on oneDNN with packed weights (gateway/engine/packed_linear.py):
values, bitwise the same row alone or among others, and a pack never outliving its weight's
values."""

from __future__ import annotations

import gc

import pytest
import torch

from gateway.engine import packed_linear
from gateway.engine.packed_linear import ROWS_MIN, product

pytestmark = pytest.mark.skipif(not packed_linear.AVAILABLE, reason="torch built without oneDNN")


def weight(out: int = 96, inp: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(out, inp, generator=g), requires_grad=False)


@pytest.mark.parametrize("rows", [1, 2, ROWS_MIN - 1, ROWS_MIN, 5, 9, 40, 128])
def test_equals_the_product_up_to_rounding(rows: int) -> None:
    w, x = weight(), torch.randn(rows, 64)
    with torch.inference_mode():
        got = product(x, w)
    assert got.shape == (rows, 96) and got.is_contiguous()
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-5)


def test_a_row_rounds_alike_alone_and_among_others_from_rows_min() -> None:
    """What makes a verify step's positions round as a standard step's of as many rows."""
    w, x = weight(8192, 256), torch.randn(128, 256)
    with torch.inference_mode():
        alone = product(x[:ROWS_MIN], w)
        for rows in (ROWS_MIN + 1, 9, 16, 40, 128):
            assert torch.equal(product(x[:rows], w)[:ROWS_MIN], alone), rows


def test_a_weight_is_packed_once() -> None:
    w, x = weight(), torch.randn(ROWS_MIN, 64)
    before = packed_linear.packs_made
    with torch.inference_mode():
        for _ in range(3):
            product(x, w)
    assert packed_linear.packs_made == before + 1


def test_a_repointed_weight_is_packed_anew() -> None:
    """`Joined` re-points a projection's weight at other memory: its old pack must not serve."""
    w, x = weight(seed=1), torch.randn(ROWS_MIN, 64)
    with torch.inference_mode():
        product(x, w)
        old = packed_linear._key(w)
        w.data = weight(seed=2).data.clone()
        torch.testing.assert_close(product(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert old not in packed_linear._packs  # the stale pack's memory is not kept


def test_forgotten_weights_keep_no_pack() -> None:
    kept, dropped, x = weight(seed=5), weight(seed=6), torch.randn(ROWS_MIN, 64)
    with torch.inference_mode():
        product(x, kept), product(x, dropped)
    packed_linear.forget([dropped])
    assert packed_linear._key(kept) in packed_linear._packs
    assert packed_linear._key(dropped) not in packed_linear._packs


def test_a_stale_pack_at_a_reused_address_never_serves() -> None:
    """A weight re-pointed elsewhere keeps its pack's entry alive; the memory its old values
    held, now another tensor's of the same shape (here a view of one buffer: what a freed
    block handed out again looks like), must give that tensor's values."""
    x = torch.randn(ROWS_MIN, 64)
    buffer = torch.randn(2, 96, 64)
    with torch.inference_mode():
        old = torch.nn.Parameter(buffer[0], requires_grad=False)
        product(x, old)
        old.data = weight(seed=4).data.clone()  # the memory is no longer the weight's
        buffer[0] = buffer[1]
        reused = buffer[0]
        assert packed_linear._key(reused) in packed_linear._packs  # what it would be served
        torch.testing.assert_close(product(x, reused), x @ reused.T, rtol=1e-5, atol=1e-5)


def test_a_pack_dies_with_its_weight_and_never_serves_another() -> None:
    """Another weight of the same shape, maybe at the same address: its own values."""
    x = torch.randn(ROWS_MIN, 64)
    with torch.inference_mode():
        for seed in range(5):
            w = weight(seed=seed)
            key = packed_linear._key(w)
            torch.testing.assert_close(product(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
            assert key in packed_linear._packs
            del w
            gc.collect()
            assert key not in packed_linear._packs


def test_the_compiled_op_equals_eager_and_reuses_the_pack() -> None:
    w, x = weight(), torch.randn(ROWS_MIN + 1, 64)
    torch._dynamo.reset()
    step = torch.compile(lambda x: torch.ops.gateway.linear_rows(x * 2, w).relu(), dynamic=True)
    with torch.inference_mode():
        expected = product(x * 2, w).relu()
        before = packed_linear.packs_made
        got = step(x)
        assert torch.equal(got, expected)
        x9 = torch.randn(9, 64)
        assert torch.equal(step(x9), product(x9 * 2, w).relu())
    assert packed_linear.packs_made == before  # the eager call's pack, found by the weight
