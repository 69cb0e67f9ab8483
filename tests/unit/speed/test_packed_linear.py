"""Several-row products on oneDNN with packed weights (gateway/speed/packed_linear.py):
values, bitwise the same row alone or among others, and a pack never outliving its weight's
values; for both kernels of the op, the Python one and the C++ one (native.py), which must
also give the same products bitwise."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch

from gateway.speed import packed_linear
from gateway.speed.packed_linear import ROWS_MIN, NativeKernel, PythonKernel

pytestmark = pytest.mark.skipif(not packed_linear.AVAILABLE, reason="torch built without oneDNN")

Kernel = PythonKernel | NativeKernel


def native() -> NativeKernel:
    """The C++ kernel, or a skip where it is not built; CI builds it (a compiler is there:
    inductor needs one too), so there its absence fails."""
    if not packed_linear.NATIVE:
        assert os.environ.get("CI") != "true", "the C++ kernel was not built in CI"
        pytest.skip("the C++ kernel is not built here (native.py logged why)")
    assert isinstance(packed_linear.KERNEL, NativeKernel)
    return packed_linear.KERNEL


@pytest.fixture(params=["Python", "C++"])
def kernel(request: pytest.FixtureRequest) -> Kernel:
    """Each kernel with its own packs: the Python one called directly, the C++ one through
    the op."""
    return packed_linear.PYTHON if request.param == "Python" else native()


def weight(out: int = 96, inp: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(out, inp, generator=g), requires_grad=False)


@pytest.mark.parametrize("rows", [1, 2, ROWS_MIN - 1, ROWS_MIN, 5, 9, 40, 128])
def test_equals_the_product_up_to_rounding(kernel: Kernel, rows: int) -> None:
    w, x = weight(), torch.randn(rows, 64)
    with torch.inference_mode():
        got = kernel.product(x, w)
    assert got.shape == (rows, 96) and got.is_contiguous()
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-5)


def test_a_row_rounds_alike_alone_and_among_others_from_rows_min(kernel: Kernel) -> None:
    """What makes a verify step's positions round as a standard step's of as many rows."""
    w, x = weight(8192, 256), torch.randn(128, 256)
    with torch.inference_mode():
        alone = kernel.product(x[:ROWS_MIN], w)
        for rows in (ROWS_MIN + 1, 9, 16, 40, 128):
            assert torch.equal(kernel.product(x[:rows], w)[:ROWS_MIN], alone), rows


@pytest.mark.parametrize("rows", [1, 2, ROWS_MIN - 1, ROWS_MIN, 5, 9, 40])
def test_the_two_kernels_give_the_same_products_bitwise(rows: int) -> None:
    """Switching kernels (a host that cannot build the C++ one) changes no output."""
    cpp = native()
    w, x = weight(1536, 256), torch.randn(rows, 256)
    with torch.inference_mode():
        assert torch.equal(cpp.product(x, w), packed_linear.PYTHON.product(x, w))


def test_a_weight_is_packed_once(kernel: Kernel) -> None:
    w, x = weight(), torch.randn(ROWS_MIN, 64)
    before = kernel.packs_made()
    with torch.inference_mode():
        for _ in range(3):
            kernel.product(x, w)
    assert kernel.packs_made() == before + 1
    assert kernel.has_pack(w)


def test_few_rows_pack_nothing(kernel: Kernel) -> None:
    w = weight(seed=3)
    with torch.inference_mode():
        for rows in range(1, ROWS_MIN):
            kernel.product(torch.randn(rows, 64), w)
    assert not kernel.has_pack(w)


def test_a_repointed_weight_is_packed_anew(kernel: Kernel) -> None:
    """`Joined` re-points a projection's weight at other memory: its old pack must not serve."""
    w, x = weight(seed=1), torch.randn(ROWS_MIN, 64)
    with torch.inference_mode():
        kernel.product(x, w)
        kept = kernel.packs_kept()
        old = w.detach()  # the old memory, as another tensor
        w.data = weight(seed=2).data.clone()
        assert not kernel.has_pack(w) and not kernel.has_pack(old)
        torch.testing.assert_close(kernel.product(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert kernel.has_pack(w)
    assert kernel.packs_kept() <= kept  # the stale pack's memory is not kept


def test_forgotten_weights_keep_no_pack(kernel: Kernel) -> None:
    kept, dropped, x = weight(seed=5), weight(seed=6), torch.randn(ROWS_MIN, 64)
    with torch.inference_mode():
        kernel.product(x, kept), kernel.product(x, dropped)
    count = kernel.packs_kept()
    kernel.forget([dropped])
    assert kernel.has_pack(kept)
    assert not kernel.has_pack(dropped)
    assert kernel.packs_kept() == count - 1


def test_a_stale_pack_at_a_reused_address_never_serves(kernel: Kernel) -> None:
    """A weight re-pointed elsewhere keeps its pack's entry alive; the memory its old values
    held, now another tensor's of the same shape (here a view of one buffer: what a freed
    block handed out again looks like), must give that tensor's values."""
    x = torch.randn(ROWS_MIN, 64)
    buffer = torch.randn(2, 96, 64)
    with torch.inference_mode():
        old = torch.nn.Parameter(buffer[0], requires_grad=False)
        kernel.product(x, old)
        old.data = weight(seed=4).data.clone()  # the memory is no longer the weight's
        buffer[0] = buffer[1]
        reused = buffer[0]
        assert not kernel.has_pack(reused)
        got = kernel.product(x, reused)
        torch.testing.assert_close(got, x @ reused.T, rtol=1e-5, atol=1e-5)


def test_a_pack_dies_with_its_weight_and_never_serves_another(kernel: Kernel) -> None:
    """Another weight of the same shape, maybe at the same address: its own values; and the
    dead weight's pack is not kept past the next pack."""
    x = torch.randn(ROWS_MIN, 64)
    with torch.inference_mode():
        for seed in range(5):
            w = weight(seed=seed)
            torch.testing.assert_close(kernel.product(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
            assert kernel.has_pack(w)
            count = kernel.packs_kept()
            del w
            gc.collect()
        kernel.product(x, weight(seed=9))
    assert kernel.packs_kept() <= count


def test_the_compiled_op_equals_eager_and_reuses_the_pack() -> None:
    w, x = weight(), torch.randn(ROWS_MIN + 1, 64)
    torch._dynamo.reset()
    step = torch.compile(lambda x: torch.ops.gateway.linear_rows(x * 2, w).relu(), dynamic=True)
    with torch.inference_mode():
        expected = packed_linear.product(x * 2, w).relu()
        before = packed_linear.KERNEL.packs_made()
        got = step(x)
        assert torch.equal(got, expected)
        x9 = torch.randn(9, 64)
        assert torch.equal(step(x9), packed_linear.product(x9 * 2, w).relu())
    assert packed_linear.KERNEL.packs_made() == before  # the eager call's pack, found again


def test_without_a_compiler_the_python_kernel_serves(tmp_path) -> None:
    """A host that cannot build the C++ kernel (no compiler here) still has the op, with
    the same products, and says so."""
    code = (
        "import torch; from gateway.speed import packed_linear as p; "
        "w, x = torch.randn(96, 64), torch.randn(5, 64); "
        "assert torch.equal(p.product(x, w), p.PYTHON.product(x, w)); print(p.KERNEL.name)"
    )
    env = {**os.environ, "CXX": "no-such-compiler", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Python"
    assert "Python kernel (the C++ one: no C++ compiler" in done.stderr
