"""Loading a causal LM + tokenizer from a local directory, pairing checks, KV cache helpers."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from gateway.engine.draft_head import DraftHead, build_head, read_draft_vocab
from gateway.engine.errors import VocabularyMismatch
from gateway.engine.families import check_servable, context_length

if TYPE_CHECKING:
    from gateway.engine.batch.forward import FastForward


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for decoding. vocab_size is the width of the model's logits."""

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    path: str
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    draft_head: DraftHead | None = None  # a reduced output head for drafting (draft_head.py)
    fast: FastForward | None = None
    """A faster way to run some of its batch steps (batch/forward.py `FastForward`), which
    the speed package (gateway/speed) attaches at load; None: the model's own forward."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def init_torch_thread(threads: int | None = None) -> None:
    """Set up the calling thread as the one that runs torch: its intra-op thread count
    (None keeps torch's default, the physical cores). Call it first on the thread that loads
    and runs the models (see gateway/serving/worker.py for why one thread owns torch)."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"torch threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def serving_threads() -> int:
    """The intra-op threads a server's inference thread takes by default: torch's default
    (the physical cores) less one, at least one. The core left over runs the event loop
    (HTTP, streaming, templating): when every core runs a kernel's thread team, whatever
    else the process does preempts one of its threads and the others wait for it at each
    parallel region's end."""
    return max(1, torch.get_num_threads() - 1)


def _eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        for i in source if isinstance(source, list | tuple) else [source]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)


def wrap_model(
    model: Any,
    tokenizer: Any,
    path: str = "<memory>",
    device: torch.device | None = None,
    draft_vocab: list[int] | None = None,
) -> LoadedModel:
    """Describe an already-built model (eval mode) as a LoadedModel; with `draft_vocab`, it
    drafts among those token ids only (see draft_head.py). Raises UnsupportedModel for a
    model the engine cannot serve exactly (families.py)."""
    model.eval()
    check_servable(model)  # raises UnsupportedModel, with the reason
    param = next(model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device or param.device,
        dtype=param.dtype,
        path=path,
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        context_length=context_length(model.config),
        eos_token_ids=_eos_ids(model, tokenizer),
        draft_head=None if draft_vocab is None else build_head(model, draft_vocab),
    )


def load_model(
    path: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    draft_vocab: bool = True,
) -> LoadedModel:
    """AutoModelForCausalLM + AutoTokenizer from a local directory (never the hub).

    Device defaults to CUDA when available, else CPU; dtype (a torch dtype or its name, e.g.
    "bfloat16") to bf16 on CUDA, fp32 on CPU.
    A `draft_vocab.json` in the directory gives the model a reduced drafting head (used when
    it drafts, never when it is the target); draft_vocab=False ignores that file.
    """
    dev = torch.device(device) if device is not None else default_device()
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elif isinstance(dtype, str):
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype) or not named.is_floating_point:
            raise ValueError(f"unknown model dtype {dtype!r} (float32, bfloat16, float16)")
        dtype = named
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    model.to(dev)
    model.requires_grad_(False)
    vocab = read_draft_vocab(path) if draft_vocab else None
    return wrap_model(model, tokenizer, str(path), dev, vocab)


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise VocabularyMismatch unless draft token ids mean the same strings as the target's."""
    if target.vocab_size != draft.vocab_size:
        raise VocabularyMismatch(
            f"vocab sizes differ: target logits have {target.vocab_size} entries, "
            f"draft logits {draft.vocab_size}"
        )
    t_vocab: dict[str, int] = target.tokenizer.get_vocab()
    d_vocab: dict[str, int] = draft.tokenizer.get_vocab()
    if len(t_vocab) != len(d_vocab):
        raise VocabularyMismatch(
            f"tokenizer vocab sizes differ: target {len(t_vocab)}, draft {len(d_vocab)}"
        )
    if t_vocab != d_vocab:
        t_by_id = {i: s for s, i in t_vocab.items()}
        d_by_id = {i: s for s, i in d_vocab.items()}
        for i in sorted(set(t_by_id) | set(d_by_id)):
            if t_by_id.get(i) != d_by_id.get(i):
                raise VocabularyMismatch(
                    f"token id {i} differs: target {t_by_id.get(i)!r}, draft {d_by_id.get(i)!r}"
                )


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of a KV cache.

    transformers 5.24's DynamicCache.crop(n) takes a negative n (drop the last -n positions)
    and raises on a positive n, so we translate an absolute length into that.
    """
    current = cache.get_seq_length()
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    if length < current:
        cache.crop(length - current)


def cache_kwarg(model: Any) -> str:
    """Name of the forward's KV-cache argument: `cache` since transformers 5.2x (the old
    `past_key_values` is deprecated there and costs a warning per call), else the old one."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward_logits(
    model: Any, kwarg: str, ids: list[int], cache: DynamicCache, device: torch.device, keep: int
) -> torch.Tensor:
    """One KV-cached forward of `ids` (appended to `cache`): logits of the last `keep`
    positions, all when keep == 0. Returns (keep or len(ids), V)."""
    x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, t)
    out = model(input_ids=x, use_cache=True, logits_to_keep=keep, **{kwarg: cache})
    return out.logits[0]  # (t, V)
