"""The weight-major fp32 linear forward (gateway/speed/cpu_linear.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from gateway.engine.draft_head import DRAFT_VOCAB_FILE, head_logits
from gateway.engine.engine import MAX_K
from gateway.engine.models import cache_kwarg
from gateway.speed import cpu_linear, load_fast
from gateway.speed.cpu_linear import ROWS_MAX, forward, use_weight_major_linear
from gateway.speed.fast import lean_of

CPU = torch.device("cpu")


def patched(layer: nn.Module) -> bool:
    return getattr(layer.forward, "__func__", None) is forward


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (1, 7), (3, 5), (1, MAX_K + 1), (ROWS_MAX,)])
def test_matches_torch_linear_up_to_rounding(shape, bias, monkeypatch) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=bias)
    x = torch.randn(*shape, 48)
    expected = F.linear(x, layer.weight, layer.bias)
    assert use_weight_major_linear(layer) == 1 and patched(layer)
    monkeypatch.setattr(cpu_linear.F, "linear", None)  # the weight-major path must not call it
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == expected.shape == (*shape, 80)
    assert got.is_contiguous()  # laid out as F.linear's: downstream kernels stay the same
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, torch.zeros_like(got))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (2, 1)])
def test_compiled_one_row_is_a_reduction_and_several_rows_a_product(shape, bias) -> None:
    """Traced by torch.compile, a one-row input is multiplied and summed (inductor
    generates that reduction; no library product, see cpu_linear.linear) and several rows
    keep the W @ x^T product; both give F.linear's values."""
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=bias)
    use_weight_major_linear(layer)
    x = torch.randn(*shape, 48)
    ops: list[str] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.inference_mode():
        got = torch.compile(layer, backend=backend, fullgraph=True)(x)
    products = [op for op in ops if "matmul" in op or "mm" in op or "linear" in op]
    rows = x.numel() // x.shape[-1]
    assert (products == []) == (rows == 1), ops
    assert got.shape == (*shape, 80) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_every_verify_step_fits_under_rows_max() -> None:
    assert ROWS_MAX >= MAX_K + 1


calls: list[int] = []


def spy_linear(x, w, b=None):
    calls.append(x.shape[0])
    return torch.matmul(x, w.T) + (0 if b is None else b)


@pytest.mark.parametrize("grad", [True, False])
def test_long_inputs_and_training_keep_torch_path(grad, monkeypatch) -> None:
    layer = nn.Linear(16, 8)
    use_weight_major_linear(layer)
    monkeypatch.setattr(cpu_linear.F, "linear", spy_linear)
    calls.clear()
    rows = 2 if grad else ROWS_MAX + 1
    x = torch.randn(rows, 16)
    with torch.set_grad_enabled(grad):
        y = layer(x)
    assert calls == [rows]
    if grad:
        y.sum().backward()
        torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(8, 16))


def test_weights_moved_off_fp32_keep_torch_path(monkeypatch) -> None:
    layer = nn.Linear(16, 8)
    use_weight_major_linear(layer)
    layer.to(torch.bfloat16)
    monkeypatch.setattr(cpu_linear.F, "linear", spy_linear)
    calls.clear()
    with torch.inference_mode():
        layer(torch.randn(3, 16, dtype=torch.bfloat16))
    assert calls == [3]


def test_only_fp32_cpu_linear_layers_are_patched() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Embedding(10, 4), nn.Linear(4, 4).bfloat16())
    assert use_weight_major_linear(model) == 1
    assert patched(model[0]) and not patched(model[2])


@pytest.mark.parametrize("pays", [True, False])
def test_by_default_load_model_patches_where_the_measurement_says(
    model_dirs, monkeypatch, pays: bool
) -> None:
    from gateway.speed import attach as models

    seen = []
    monkeypatch.setattr(models, "weight_major_pays", lambda m, served: seen.append(m) or pays)
    lm = load_fast(model_dirs["llama"], device="cpu")
    lin = [m for m in lm.model.modules() if type(m) is nn.Linear]
    assert seen == [lm.model] and lin and all(patched(m) == pays for m in lin)


@pytest.mark.parametrize("pays", [True, False])
def test_a_model_to_be_compiled_is_timed_on_the_compiled_steps_products(
    model_dirs, monkeypatch, pays: bool
) -> None:
    """With compiled=True the verdict times what the compiled step multiplies by: each
    layer's joined q/k/v and gate/up (speed/lean.py Joined), not the parts, and the head;
    where it pays, the joined layers get the weight-major forward with the model's."""
    from gateway.speed import attach as models

    timed: list[list[nn.Linear]] = []
    monkeypatch.setattr(models, "weight_major_pays", lambda m, served: timed.append(served) or pays)
    lm = load_fast(model_dirs["llama"], device="cpu", compiled=True)
    assert lean_of(lm) is not None and lean_of(lm).joined is not None
    joined = lean_of(lm).joined
    cfg = lm.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * head_dim
    (served,) = timed
    assert len(served) == 4 * cfg.num_hidden_layers + 1
    assert served[0] is joined[0].qkv and served[0].weight.shape[0] == qkv_rows
    assert served[2] is joined[0].gate_up and served[-1] is lm.model.get_output_embeddings()
    assert all(patched(m) == pays for m in served)
    assert all(patched(m) == pays for m in lm.model.modules() if type(m) is nn.Linear)


def test_the_measurement_compares_both_forms_on_the_models_shapes(model_dirs, monkeypatch) -> None:
    calls = {"torch": 0, "ours": 0}
    real_linear, real_f = cpu_linear.linear, cpu_linear.F.linear

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(cpu_linear, "_verdicts", {})
    monkeypatch.setattr(cpu_linear, "_verdict_file", None)  # a gateway test may have set one
    monkeypatch.setattr(cpu_linear, "linear", count("ours", real_linear))
    monkeypatch.setattr(cpu_linear.F, "linear", count("torch", real_f))
    off = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    verdict = cpu_linear.weight_major_pays(off.model)
    assert isinstance(verdict, bool) and calls["torch"] > 0 and calls["ours"] > 0
    calls.update(torch=0, ours=0)
    assert cpu_linear.weight_major_pays(off.model) is verdict  # measured once per shape set
    assert calls == {"torch": 0, "ours": 0}


@pytest.mark.parametrize("slower", ["ours", "torch"])
def test_the_verdict_follows_the_products_of_a_steps_rows(model_dirs, monkeypatch, slower) -> None:
    """The verdict times the products themselves, at a decode step's, a verify step's and a
    batch step's rows: the form made slower (100 us more a product) loses."""
    import time

    rows_seen: set[int] = set()
    real = {"ours": cpu_linear.linear, "torch": cpu_linear.F.linear}

    def timed(name):
        def wrapped(x, w, b=None):
            rows_seen.add(x.shape[0])
            if name == slower:
                time.sleep(1e-4)
            return real[name](x, w, b)

        return wrapped

    monkeypatch.setattr(cpu_linear, "_verdicts", {})
    monkeypatch.setattr(cpu_linear, "_verdict_file", None)
    monkeypatch.setattr(cpu_linear, "linear", timed("ours"))
    monkeypatch.setattr(cpu_linear.F, "linear", timed("torch"))
    off = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    rows_seen.clear()  # the load's own forwards

    def no_forward(*_a, **_k):  # the products are timed, not the model's forward
        raise AssertionError("the verdict ran the model's forward")

    monkeypatch.setattr(off.model, "forward", no_forward)
    assert cpu_linear.weight_major_pays(off.model) is (slower == "torch")
    # slower at one row decides alone: the several-row products (and their packs) are skipped
    expected = set(cpu_linear.PROBE_ROWS) if slower == "torch" else {cpu_linear.PROBE_ROWS[0]}
    assert rows_seen == expected


@pytest.mark.parametrize("one_row_max", [1.0, 1e9], ids=["one-row-rule", "control-sum-only"])
def test_a_form_slower_at_one_row_loses_even_where_the_sum_pays(
    model_dirs, monkeypatch, one_row_max
) -> None:
    """Weight-major 1 ms slower a product at one row, torch's 2 ms slower at several: the
    sum favours weight-major, a decode step does not; the one-row rule keeps torch's."""
    import time

    real = {"ours": cpu_linear.linear, "torch": cpu_linear.F.linear}

    def timed(name):
        def wrapped(x, w, b=None):
            several = x.shape[0] > 1
            if (name == "ours" and not several) or (name == "torch" and several):
                time.sleep(1e-3 if name == "ours" else 2e-3)
            return real[name](x, w, b)

        return wrapped

    monkeypatch.setattr(cpu_linear, "_verdicts", {})
    monkeypatch.setattr(cpu_linear, "_verdict_file", None)
    monkeypatch.setattr(cpu_linear, "ONE_ROW_MAX", one_row_max)
    off = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    monkeypatch.setattr(cpu_linear, "linear", timed("ours"))
    monkeypatch.setattr(cpu_linear.F, "linear", timed("torch"))
    assert cpu_linear.weight_major_pays(off.model) is (one_row_max > 1.0)


@pytest.mark.parametrize("pays", [True, False])
def test_a_measurement_that_keeps_torchs_forward_keeps_no_packs(model_dirs, monkeypatch, pays):
    """The timing's verify steps pack the weights (packed_linear.py); where torch's forward
    wins, those packs would never serve, so they go."""
    from gateway.speed import packed_linear

    monkeypatch.setattr(cpu_linear, "_verdicts", {})
    monkeypatch.setattr(cpu_linear, "_verdict_file", None)
    monkeypatch.setattr(cpu_linear, "MARGIN", 1e9 if pays else 0.0)  # the verdict, forced
    monkeypatch.setattr(cpu_linear, "ONE_ROW_MAX", 1e9 if pays else 0.0)
    off = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    assert cpu_linear.weight_major_pays(off.model) is pays
    weights = [m.weight for m in off.model.modules() if type(m) is nn.Linear]
    kept = [w for w in weights if packed_linear.KERNEL.has_pack(w)]
    assert bool(kept) == (pays and packed_linear.AVAILABLE)


def test_load_model_patches_when_told_and_can_opt_out(model_dirs) -> None:
    on = load_fast(model_dirs["llama"], device="cpu", cpu_linear=True)
    off = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    lin_on = [m for m in on.model.modules() if type(m) is nn.Linear]
    lin_off = [m for m in off.model.modules() if type(m) is nn.Linear]
    assert lin_on and all(patched(m) for m in lin_on)
    assert lin_off and not any(patched(m) for m in lin_off)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        a, b = on.model(input_ids=ids).logits, off.model(input_ids=ids).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_reduced_draft_head_follows_cpu_linear(model_dirs, tmp_path, monkeypatch) -> None:
    path = tmp_path / "draft"
    shutil.copytree(model_dirs["draft"], path)
    (path / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": [0, 3, 5, 9, 40, 41]}))
    on = load_fast(path, device="cpu", cpu_linear=True)
    off = load_fast(path, device="cpu", cpu_linear=False)
    vocab = on.vocab_size
    assert on.draft_head is not None and on.draft_head.linear is cpu_linear.linear
    assert off.draft_head is not None and off.draft_head.linear is None
    rows = []
    for lm in (on, off):
        monkeypatch.setattr(cpu_linear.F, "linear", spy_linear)
        calls.clear()
        head, kw = lm.draft_head, cache_kwarg(lm.model)
        with torch.inference_mode():
            rows.append(head_logits(lm.model, head, kw, [5, 9, 3], DynamicCache(), CPU))
        assert (calls == []) is (lm is on)  # F.linear (backbone and head) only when opted out
        monkeypatch.undo()
    torch.testing.assert_close(rows[0], rows[1], rtol=1e-5, atol=1e-5)
    assert rows[0].shape == (1, vocab) and torch.isfinite(rows[0]).sum() == 6


def test_a_kept_verdict_is_read_back_instead_of_measured_again(
    model_dirs, tmp_path, monkeypatch
) -> None:
    """With keep_verdicts (the gateway's GATEWAY_CPU_LINEAR=auto), a start measures once
    and keeps the verdict; the next start (a fresh process: no verdict in memory) reads it
    back and does not measure, even where a new timing would now say the other; a damaged
    file is measured again."""
    path = tmp_path / "var" / "linear-verdicts.json"
    says = {"pays": True}
    measured: list[bool] = []

    def measure(*_a):
        measured.append(says["pays"])
        return says["pays"]

    monkeypatch.setattr(cpu_linear, "_measure", measure)
    monkeypatch.setattr(cpu_linear, "_verdict_file", None)
    monkeypatch.setattr(cpu_linear, "_verdicts", {})
    cpu_linear.keep_verdicts(path)
    model = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False).model
    assert cpu_linear.weight_major_pays(model) is True and measured == [True]
    assert list(json.loads(path.read_text()).values()) == [True]

    monkeypatch.setattr(cpu_linear, "_verdicts", {})  # the next start
    says["pays"] = False
    assert cpu_linear.weight_major_pays(model) is True and measured == [True]

    path.write_text("{not json")
    monkeypatch.setattr(cpu_linear, "_verdicts", {})
    assert cpu_linear.weight_major_pays(model) is False and measured == [True, False]
    assert list(json.loads(path.read_text()).values()) == [False]  # kept anew
