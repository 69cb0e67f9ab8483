"""llama.cpp as a model backend: a GGUF file served by the engine's batch path.

What it provides is the forward (backends/base.py): `LlamaCppModel` holds the weights
(llama_model); each cache the batch path asks for (a Batch's target slots, a draft's slots,
the cost probe's scratch slots) is its own llama_context (`LlamaCppCache`) with one
sequence per slot (seq id = slot). A forward is ONE llama_batch: every row's tokens at its
own positions (its slot's committed length onward) in its own sequence, with logits asked
for at the positions the caller wants; they come back as float32 torch tensors, and the
loop, verifier, proposers, grammars, sampling, logprobs and stop handling run on them
unchanged.

The slots' lengths (SlotCache.length) stay the truth, as for the torch path: the caller
commits by setting them. What a sequence holds past its slot's length (rejected draft
tokens, a leaving row's tokens after `take` reset the slot) is removed right before the
next forward writes there (`llama_memory_seq_rm`): rollback is sequence removal, done
lazily. A kept prefix moves between slots, and a parked row's slot is saved and restored,
as llama.cpp's copy of a sequence (`llama_state_seq_get_data` / `set_data`).

Each sequence has a KV stream of its own (llama.cpp's non-unified layout): a row's keys
and values sit in its stream's cells in position order whatever the other rows do, and
attention runs over its own cells only. In one shared pool of cells (`kv_unified`) a
row's cells land wherever cells are free, and the order its attention sums them in moves
its logits (after another row's cells were freed before it): with streams of their own a
row's logits are the same alone and beside any other rows (docs/backends.md). Their cost: a
forward whose rows bring different numbers of tokens is decoded by llama.cpp in several
passes (each pass an equal number per row).

Numerics: a forward is cut into llama_decode calls so that a token meets the same kernels
whatever the forward's shape (llamacpp_calls.py: prompts on ggml's tiled K-quant products,
decode and verify steps on its one-token kernels), and repacked weights are off (`load_gguf`),
so a token's logits do not depend on the forward's shape either; tests/unit/engine/llamacpp/
measure where outputs part and show each parting a near tie.

Imports llama_cpp (the `llama-cpp-python` package, the `llamacpp` extra): import this
module only where a GGUF model is loaded.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import llama_cpp as lc
import torch

from gateway.engine.backends import llamacpp_calls as calls_of
from gateway.engine.backends.base import BackendCache
from gateway.engine.backends.llamacpp_calls import Call, tiled_on, tiled_weights
from gateway.engine.batch.slots import Saved
from gateway.engine.errors import VocabularyMismatch
from gateway.engine.models import LoadedModel

log = logging.getLogger("gateway.engine.llamacpp")

N_BATCH = 512  # tokens one llama_decode takes at most; a larger forward is decoded in parts
KV_TYPES = {"f32": 0, "f16": 1}  # ggml_type of the KV cache's keys and values
_LOG_WARN = 3  # ggml_log_level: GGML_LOG_LEVEL_WARN (INFO = 2, ERROR = 4, CONT = 5)


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _log(level: int, text: bytes | None, _: Any) -> None:
    """llama.cpp's log lines: its errors as errors, its warnings as info (every context
    here is larger than the training context: each slot gets one), the rest dropped."""
    if text and level in (_LOG_WARN, _LOG_WARN + 1):
        log.log(logging.INFO if level == _LOG_WARN else logging.ERROR, text.decode().rstrip())


_ready = False


def _init() -> None:
    """Once per process, before any forward: llama.cpp's logging and backend."""
    global _ready
    if not _ready:
        lc.llama_log_set(_log, ctypes.c_void_p())
        lc.llama_backend_init()
        _ready = True


class LlamaCppModel:
    """A GGUF model's weights in llama.cpp (CPU). `config` holds what the engine reads of a
    model's config (layers, for the k policy's static c); `slot_cache` builds the contexts
    its forwards run in."""

    parkable = True  # its caches save and restore a slot (`LlamaCppCache.save`, `restore`)

    def __init__(
        self, path: str | Path, threads: int | None = None, kv_type: str = "f16",
        n_batch: int = N_BATCH, repack: bool = False,
    ) -> None:  # fmt: skip
        _init()
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = repack  # see `load_gguf`
        handle = lc.llama_model_load_from_file(str(path).encode(), params)
        if not handle:
            raise ValueError(f"llama.cpp could not load {path}")
        self.handle = handle
        self._finalizer = weakref.finalize(self, lc.llama_model_free, handle)
        self.path = str(path)
        self.threads = threads if threads is not None else max(1, os.cpu_count() or 1)
        self.kv_type = kv_type
        self.n_batch = n_batch
        # ggml's tiled products serve this model's forwards of 8 tokens or more (unless
        # repacked: repacked weights take their own kernels): llamacpp_calls.py
        self.tiled = tiled_on() and not repack and tiled_weights(path)
        self.vocab = lc.llama_model_get_vocab(handle)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.context_train = int(lc.llama_model_n_ctx_train(handle))
        self.config = SimpleNamespace(
            model_type="gguf",
            num_hidden_layers=int(lc.llama_model_n_layer(handle)),
            hidden_size=int(lc.llama_model_n_embd(handle)),
            vocab_size=self.n_vocab,
        )

    def slot_cache(self, slots: int, capacity: int, pad: int = 0) -> LlamaCppCache:
        return LlamaCppCache(self, slots, capacity, pad)

    def special_ids(self) -> list[int]:
        """The GGUF's end-of-generation token ids (eos, eot) that exist."""
        ids = [int(lc.llama_vocab_eos(self.vocab)), int(lc.llama_vocab_eot(self.vocab))]
        return [i for i in ids if 0 <= i < self.n_vocab]

    def parameters(self) -> Iterator[torch.Tensor]:
        """No torch parameters: the weights are llama.cpp's. One empty float32 CPU tensor
        stands for them where a caller reads a model's dtype and device off its first
        parameter (the cost store's key names the GGUF by its checksum)."""
        yield torch.empty(0, dtype=torch.float32)

    def forward(self, *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        """Not served: a llama.cpp model decodes through the batch path (Engine.batch), whose
        forwards run on its slot caches. (`cache` names the cache argument for
        models.cache_kwarg.)"""
        raise NotImplementedError(
            "a llama.cpp model decodes through a batch (Engine.batch), not alone (Engine.stream)"
        )

    __call__ = forward


class LlamaCppCache(BackendCache):
    """`slots` sequences of up to `capacity` tokens in one llama_context (seq id = slot)."""

    parkable = True  # a slot is saved and restored as llama.cpp's copy of its sequence

    def __init__(
        self, model: LlamaCppModel, slots: int, capacity: int, pad: int = 0,
        unified: bool = False,
    ) -> None:  # fmt: skip
        """unified: one pool of cells for all sequences (llama.cpp's kv_unified) instead of
        a stream each; its rows' logits depend on where their cells land (module doc)."""
        super().__init__(slots, capacity, pad)
        self.model = model  # keeps the weights alive as long as the context
        params = lc.llama_context_default_params()
        n_batch = model.n_batch
        slack = calls_of.PROMPT_MIN if model.tiled else 0  # a prompt part's padding past the end
        stream = -(-(capacity + slack) // 256) * 256  # cells per sequence (padded to 256)
        params.n_ctx = slots * stream  # split evenly into the sequences' streams
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = slots
        params.n_threads = params.n_threads_batch = model.threads
        params.kv_unified = unified
        params.type_k = params.type_v = KV_TYPES[model.kv_type]
        params.no_perf = True
        ctx = lc.llama_init_from_model(model.handle, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {slots} x {capacity}")
        batch = lc.llama_batch_init(n_batch, 0, 1)
        self._ctx, self._batch = ctx, batch
        self._finalizer = weakref.finalize(self, _free, ctx, batch)
        for i in range(n_batch):  # every entry is in one sequence, set once
            batch.n_seq_id[i] = 1
        self._seq_of = [batch.seq_id[i] for i in range(n_batch)]  # entry i's seq id array
        self._mem = lc.llama_get_memory(ctx)
        self._n_batch = n_batch
        self.held = [0] * slots  # positions 0..held[s]-1 of sequence s are in the memory
        self.prompted = [0] * slots  # positions 0..prompted[s]-1 written by prompt forwards
        self.decodes = 0  # llama_decode calls

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Sequence src's positions 0..n-1 into sequence dst, which drops what it held: a
        copy of src's sequence (`save`) put into dst, then dst's positions from n on
        dropped. Not `llama_memory_seq_cp`: between streams it copies at the next decode,
        reading the source stream then, after `restore` may have written another row into
        it."""
        if n <= 0 or src == dst:
            return
        if n > self.held[src]:
            raise ValueError(f"slot {src} holds {self.held[src]} positions, not {n}")
        self._put(dst, self._state(src))
        lc.llama_memory_seq_rm(self._mem, dst, n, -1)
        self.held[dst] = n
        self.prompted[dst] = min(n, self.prompted[src])

    def save(self, slot: int) -> Saved:
        """Sequence `slot`'s committed positions as llama.cpp's own copy of a sequence
        (`llama_state_seq_get_data`: its cells' positions, keys and values), bytes held in
        one uint8 tensor (`Saved.keys`), and how many of them prompt forwards wrote
        (`Saved.values`, one int64); what it held past its length is dropped first."""
        n = self.length[slot]
        self._trim(slot, n)
        if not n:
            return Saved(0, [], [])
        return Saved(n, [self._state(slot)], [torch.tensor([min(n, self.prompted[slot])])])

    def restore(self, slot: int, saved: Saved) -> None:
        """A saved sequence into sequence `slot` (a taken slot), bit for bit: its cells as
        they were, so its next forwards give the logits it would have had unparked."""
        if saved.length and not saved.keys:
            raise RuntimeError("a saved slot's keys and values are missing")
        self._put(slot, saved.keys[0] if saved.length else None)
        self.held[slot] = self.length[slot] = saved.length
        self.prompted[slot] = int(saved.values[0][0]) if saved.values else 0

    def _state(self, slot: int) -> torch.Tensor:
        """The bytes of llama.cpp's copy of sequence `slot` (every position it holds)."""
        size = lc.llama_state_seq_get_size(self._ctx, slot)
        data = torch.empty(size, dtype=torch.uint8)
        got = lc.llama_state_seq_get_data(self._ctx, _bytes(data), size, slot)
        if got == 0 or got > size:
            raise RuntimeError(f"llama.cpp could not copy sequence {slot} ({got} of {size})")
        return data[:got]

    def _put(self, slot: int, data: torch.Tensor | None) -> None:
        """Sequence `slot` emptied, then given the sequence copied in `data` (`_state`)."""
        lc.llama_memory_seq_rm(self._mem, slot, -1, -1)
        self.held[slot] = self.prompted[slot] = 0
        if data is not None:
            data = data.contiguous()
            if lc.llama_state_seq_set_data(self._ctx, _bytes(data), data.numel(), slot) == 0:
                raise RuntimeError(f"llama.cpp could not put a sequence into slot {slot}")

    def forward(
        self, slots: list[int], tokens: list[list[int]], keep_last: bool, logits: bool = True,
        prompt: bool = False,
    ) -> list[torch.Tensor]:  # fmt: skip
        """`prompt`: the rows feed prompt chunks (their logits at most the last token's), which
        a model with tiled weights runs on ggml's tiled products (llamacpp_calls.py)."""
        starts = [self.length[s] for s in slots]
        for s, st, row in zip(slots, starts, tokens, strict=True):
            if st + len(row) > self.capacity:
                raise ValueError("a row would write past its slot's capacity")
            self._trim(s, st)
        tiled = self.model.tiled
        prompt = prompt and tiled and (keep_last or not logits)
        wants = [0 if not logits else 1 if keep_last else len(t) for t in tokens]
        limit = min(self._n_batch, calls_of.DECODE_PART) if tiled else self._n_batch
        calls = calls_of.plan(slots, starts, tokens, wants, prompt, limit)
        got: list[list[torch.Tensor]] = [[] for _ in slots]  # each row's outputs, in order
        ends = [st + len(t) for st, t in zip(starts, tokens, strict=True)]
        try:
            for call in calls:
                out = self._decode(call)  # (outputs, V)
                at = 0
                for r, k in call.owners:
                    if k:
                        got[r].append(out[at : at + k])
                    at += k
                for r, end in call.ends:
                    ends[r] = max(ends[r], end)
        except BaseException:
            for s, st in zip(slots, starts, strict=True):  # whatever landed goes again
                lc.llama_memory_seq_rm(self._mem, s, st, -1)
                self.held[s] = st
                self.prompted[s] = min(self.prompted[s], st)
            raise
        for s, st, row, end in zip(slots, starts, tokens, ends, strict=True):
            self.held[s] = end
            was = self.prompted[s]  # a prompt's part goes on only where a prompt's left off
            grows = (prompt or not tiled) and was >= st
            self.prompted[s] = st + len(row) if grows else min(was, st)
        v = self.model.n_vocab
        return [g[0] if len(g) == 1 else torch.cat(g) if g else torch.empty((0, v)) for g in got]

    def reusable(self, slot: int, n: int) -> int:
        """Of a slot's first n positions, how many a kept prefix may lend: with tiled weights
        only those its prompt forwards wrote (a fresh prefill gives a prompt's keys and values
        from the tiled product, a decode step from vec_dot)."""
        return min(n, self.prompted[slot])

    def _trim(self, slot: int, start: int) -> None:
        """Sequence `slot` back to positions 0..start-1 (its committed tokens)."""
        held = self.held[slot]
        if held > start:
            lc.llama_memory_seq_rm(self._mem, slot, start, -1)
            self.held[slot] = start
            self.prompted[slot] = min(self.prompted[slot], start)
        elif held < start:
            raise RuntimeError(f"slot {slot} holds {held} positions, its length is {start}")

    def _decode(self, call: Call) -> torch.Tensor:
        """One llama_decode of `call`'s entries: their outputs' logits, (outputs, V) float32,
        copied once out of llama.cpp's buffer into a new tensor."""
        b = self._batch
        n = len(call)
        ctypes.memmove(b.token, call.ids.buffer_info()[0], 4 * n)
        ctypes.memmove(b.pos, call.pos.buffer_info()[0], 4 * n)
        ctypes.memmove(b.logits, call.outs.buffer_info()[0], n)
        seq_of, seqs = self._seq_of, call.seqs
        for i in range(n):
            seq_of[i][0] = seqs[i]
        b.n_tokens = n
        rc = lc.llama_decode(self._ctx, b)
        self.decodes += 1
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} ({n} tokens)")
        wanted = sum(call.outs)
        out = torch.empty((wanted, self.model.n_vocab), dtype=torch.float32)
        if wanted:
            src = ctypes.addressof(lc.llama_get_logits(self._ctx).contents)
            ctypes.memmove(out.data_ptr(), src, out.numel() * 4)
        return out


def _bytes(data: torch.Tensor) -> Any:
    """A uint8 CPU tensor's memory as the `uint8_t *` llama.cpp's state calls take."""
    return ctypes.cast(data.data_ptr(), ctypes.POINTER(ctypes.c_uint8))


def _free(ctx: Any, batch: Any) -> None:
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)


def load_gguf(
    path: str | Path,
    tokenizer: Any = None,
    context_length: int | None = None,
    threads: int | None = None,
    kv_type: str = "f16",
    repack: bool = False,
) -> LoadedModel:
    """A GGUF model for the batch path. `tokenizer`: a Hugging Face tokenizer, or the
    directory holding one (default: the GGUF's own directory); its ids must mean the GGUF's
    (a conversion keeps them). The context length is the GGUF's training context, or
    `context_length` when smaller; eos ids are the tokenizer directory's
    generation_config.json's, the tokenizer's and the GGUF's.

    `repack`: let llama.cpp lay quantized weights out for its multi-token kernels (its
    "extra buffer types": CPU repacking). Off by default: exactness. Repacked weights take
    a 4-token product for a call's tokens in fours and a one-token one for the rest, which
    round differently, so a token's logits would depend on the calls it was fed in."""
    from transformers import AutoTokenizer

    model = LlamaCppModel(path, threads, kv_type, repack=repack)
    tok_dir = Path(path).parent if tokenizer is None else tokenizer
    if isinstance(tok_dir, str | Path):
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    if len(tokenizer) > model.n_vocab:
        raise VocabularyMismatch(
            f"the tokenizer has {len(tokenizer)} tokens, the GGUF's vocabulary {model.n_vocab}"
        )
    ctx = model.context_train
    if context_length is not None:
        ctx = min(ctx, context_length) if ctx > 0 else context_length
    eos: list[int] = []
    gen = Path(tok_dir) / "generation_config.json" if isinstance(tok_dir, str | Path) else None
    found = json.loads(gen.read_text()).get("eos_token_id") if gen and gen.exists() else None
    for i in [
        *(found if isinstance(found, list) else [found]),
        tokenizer.eos_token_id,
        *model.special_ids(),
    ]:
        if isinstance(i, int) and 0 <= i < model.n_vocab and i not in eos:
            eos.append(i)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        dtype=torch.float32,
        path=str(path),
        vocab_size=model.n_vocab,
        context_length=ctx,
        eos_token_ids=tuple(eos),
    )
