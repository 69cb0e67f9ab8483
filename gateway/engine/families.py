"""Which model families the engine serves exactly, and the check a model passes at load.

The families in CHECKED are those whose tiny random models decode token for token as
transformers' `generate` through every path of the engine (standard, speculative, a mixed
continuous batch, a reused prompt prefix; tests/unit/engine/families). A model of another
family is served only when a probe at load shows that the batch path's forward (a slot cache
filled in chunks, rows of several lengths, one and several tokens a step) gives the logits
the model's own full forward gives; otherwise it is refused with the reason. Either way a
model whose layers attend in a way a slot cache cannot hold (recurrent or compressed
attention) is refused (batch/masks.py `attention_layout`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from gateway.engine.batch.masks import attention_layout
from gateway.engine.errors import UnsupportedModel

log = logging.getLogger("gateway.engine.families")

CHECKED = frozenset({
    "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "granite", "olmo2",
    "mixtral", "gpt_neox", "gpt2", "gpt_oss", "llama4_text", "cohere2",
})  # fmt: skip
PROBE_TOKENS = 40  # the probe's sequence: two prefill chunks, then steps of one and four tokens
TOLERANCE = 1e-3  # the probe's largest logit difference, relative to the largest logit


def check_servable(model: Any) -> None:
    """Raise UnsupportedModel, with the reason, unless `model` can be served exactly: its
    attention layout is one the masks serve, and its family is CHECKED or passes `probe`."""
    kind = getattr(model.config, "model_type", None)
    attention_layout(model.config)  # raises for a layer type a slot cache cannot hold
    if kind in CHECKED:
        return
    try:
        worst = probe(model)
    except Exception as exc:
        raise UnsupportedModel(
            f"{kind}: not a family this engine was checked for, and its forward on the "
            f"engine's slot cache failed ({type(exc).__name__}: {exc})"
        ) from exc
    if worst > TOLERANCE:
        raise UnsupportedModel(
            f"{kind}: not a family this engine was checked for, and its logits on the "
            f"engine's slot cache differ from its own forward's by {worst:.3g} (relative); "
            "serving it would change its output"
        )
    log.warning(
        "%s: not in the engine's family conformance suite; served because its slot-cache "
        "forward matched its own (largest difference %.2g)", kind, worst,
    )  # fmt: skip


def probe(model: Any) -> float:
    """The largest difference, relative to the largest logit, between the model's own
    forward over a sequence (no cache) and the engine's batch forward building the same
    sequence on a slot cache: two rows of different lengths, prefilled in two chunks, then
    steps of one token and of four."""
    from gateway.engine.batch.forward import Step, batched_forward
    from gateway.engine.batch.slots import SlotCache

    cfg = model.config
    device = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    n = min(PROBE_TOKENS, context_length(cfg) - 1)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, vocab, (n,), generator=gen).tolist() for _ in range(2)]
    seqs[1] = seqs[1][: n - 7]
    with torch.inference_mode():
        whole = [model(input_ids=torch.tensor([s], device=device)).logits[0] for s in seqs]
        cache = SlotCache(int(cfg.num_hidden_layers), 2, n + 8, pad=8)
        slots = [cache.take(), cache.take()]
        got: list[list[torch.Tensor]] = [[], []]
        for feeds in _schedule(seqs):
            rows = [r for r in range(2) if feeds[r]]
            step = Step(cache, [slots[r] for r in rows], [feeds[r] for r in rows])
            out = batched_forward(model, step)
            for r, logits in zip(rows, out, strict=True):
                got[r].append(logits)
                cache.length[slots[r]] += len(feeds[r])
    worst = 0.0
    for ref, parts in zip(whole, got, strict=True):
        mine = torch.cat(parts)
        scale = float(ref.abs().max()) or 1.0
        worst = max(worst, float((mine.float() - ref.float()).abs().max()) / scale)
    return worst


def _schedule(seqs: list[list[int]]) -> list[list[list[int]]]:
    """Per step, each row's feed: a third of the row's sequence, then up to its half (two
    prefill chunks), then one token, four, one... to the end (rows of different lengths)."""
    steps: list[list[list[int]]] = []
    at = [0, 0]
    sizes = [lambda s: len(s) // 3, lambda s: len(s) // 2 - len(s) // 3]
    for size in sizes:
        steps.append([s[at[r] : at[r] + size(s)] for r, s in enumerate(seqs)])
        at = [a + len(f) for a, f in zip(at, steps[-1], strict=True)]
    width = 1
    while any(a < len(s) for a, s in zip(at, seqs, strict=True)):
        steps.append([s[a : a + width] for a, s in zip(at, seqs, strict=True)])
        at = [min(len(s), a + width) for a, s in zip(at, seqs, strict=True)]
        width = 5 - width  # 1, 4, 1, 4...
    return steps


def context_length(config: Any) -> int:
    """The model's context length, from whichever field its config names it by."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"cannot find the context length in {type(config).__name__}")
