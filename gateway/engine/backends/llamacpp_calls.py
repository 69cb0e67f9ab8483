"""How one forward of the llama.cpp backend is cut into llama_decode calls, so that every
token meets the same kernels whatever the forward's shape (backends/llamacpp.py).

ggml multiplies a K-quant weight matrix (Q2_K..Q6_K, IQ*) by a call's tokens with its tiled
product when the call holds 8 tokens or more, and with its one-token kernel (vec_dot) when
it holds fewer; the two round differently. Each is shape-invariant on its own side: the
tiled product gives a token the same result in any call of 8 tokens or more, vec_dot in any
call of 7 or fewer. So a model with such weights (`tiled_weights`) runs:

- a forward that is not a prompt's (decode and verify steps: their logits are used) in
  calls of at most `DECODE_PART` tokens, all on vec_dot;
- a prompt's forward (prefill chunks; only their keys and values are kept) one row's part
  per call, its chunk cut into even parts (70 tokens: two of 35, not 63 and 7), a chunk
  under `PROMPT_MIN` tokens padded to it with copies of its last token at the positions
  after it, all on the tiled product, which is the faster one for several tokens (from
  about 16 tokens a call; 8 cost what the one-token kernels do). The
  padding's keys and values are written past the row's length and dropped before its next
  forward; causal attention keeps them out of the real tokens' results.

A prompt token's keys and values then depend only on its context, and a decode step's logits
on the keys and values before it. Outside a prompt's positions, a slot's keys and values come
from vec_dot; `LlamaCppCache.reusable` keeps kept prefixes to the prompt part.

Every row's tokens also go ROW_PART (63) at a time: from 64 query tokens of one sequence
ggml's flash attention takes a tiled path whose logits are not the one-token path's.
"""

from __future__ import annotations

import os
import platform
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

ROW_PART = 63  # a row's tokens in one llama_decode at most (ggml's FA tiles from 64)
DECODE_PART = 7  # tokens of one llama_decode at most outside prompts (tiled from 8)
PROMPT_MIN = 8  # a prompt part's tokens in its llama_decode at least (padded)
TILED_TYPES = frozenset(
    ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
     "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
)  # fmt: skip  # ggml-cpu/tiled/tiled.cpp `ggml_tiled_supported`


def tiled_on() -> bool:
    """Whether ggml's tiled products run in this process: x86 (its AVX kernels) and
    GGML_CPU_TILED_MM unset or a non-zero number (ggml reads it once, as C's atoi)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    env = os.environ.get("GGML_CPU_TILED_MM")
    if env is None:
        return True
    m = re.match(r"\s*([+-]?\d+)", env)
    return m is not None and int(m.group(1)) != 0


def tiled_weights(path: str | Path) -> bool:
    """Whether the GGUF holds weights of a type the tiled product serves (read with the
    gguf package: the tensors' types, not their data)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return any(t.tensor_type.name in TILED_TYPES for t in reader.tensors)


@dataclass
class Call:
    """One llama_decode: its entries (token, position, sequence, whether its logits come
    back), which rows the returned logits belong to (row index, count, in order), and how
    far each row's sequence is written (padding included)."""

    ids: array = field(default_factory=lambda: array("i"))
    pos: array = field(default_factory=lambda: array("i"))
    seqs: array = field(default_factory=lambda: array("i"))
    outs: array = field(default_factory=lambda: array("b"))
    owners: list[tuple[int, int]] = field(default_factory=list)
    ends: list[tuple[int, int]] = field(default_factory=list)

    def add(self, row: int, seq: int, start: int, seg: list[int], flags: list[int]) -> None:
        self.ids.extend(seg)
        self.pos.extend(range(start, start + len(seg)))
        self.seqs.extend([seq] * len(seg))
        self.outs.extend(flags)
        n = sum(flags)
        if self.owners and self.owners[-1][0] == row:
            self.owners[-1] = (row, self.owners[-1][1] + n)
        else:
            self.owners.append((row, n))
        self.ends.append((row, start + len(seg)))

    def __len__(self) -> int:
        return len(self.ids)


def plan(
    slots: list[int], starts: list[int], tokens: list[list[int]], wants: list[int],
    prompt: bool, limit: int,
) -> list[Call]:  # fmt: skip
    """The calls of one forward: row r writes tokens[r] into sequence slots[r] from
    position starts[r], its last wants[r] tokens' logits come back. Rows go in slot order
    (llama.cpp puts only consecutive sequences in one pass). `prompt`: each row's tokens in
    even parts of at most ROW_PART, one call each, a part under PROMPT_MIN padded (only a
    row's whole chunk can be that short); otherwise the rows' ROW_PART-token parts in calls
    of at most `limit` tokens, as even as they go."""
    order = sorted(range(len(slots)), key=slots.__getitem__)
    calls: list[Call] = []
    if prompt:
        for r in order:
            at = 0
            for size in _even(len(tokens[r]), ROW_PART) if tokens[r] else []:
                seg = tokens[r][at : at + size]
                call = Call()
                call.add(r, slots[r], starts[r] + at, seg, _flags(tokens[r], wants[r], at, seg))
                pad = PROMPT_MIN - size
                if pad > 0:
                    call.add(r, slots[r], starts[r] + at + size, [seg[-1]] * pad, [0] * pad)
                calls.append(call)
                at += size
        return calls
    longest = max((len(t) for t in tokens), default=0)
    for lo in range(0, longest, ROW_PART):
        segs = [(r, tokens[r][lo : lo + ROW_PART]) for r in order if len(tokens[r]) > lo]
        for group in _packs(segs, limit):
            call = Call()
            for r, a, piece in group:
                at = lo + a
                call.add(r, slots[r], starts[r] + at, piece, _flags(tokens[r], wants[r], at, piece))
            calls.append(call)
    return calls


def _flags(row: list[int], wants: int, at: int, piece: list[int]) -> list[int]:
    """Which of `piece` (row[at : at + len(piece)]) want their logits: the row's last `wants`."""
    first = len(row) - wants
    return [1 if k >= first else 0 for k in range(at, at + len(piece))]


def _even(n: int, most: int) -> list[int]:
    """n split into ceil(n / most) sizes as even as they go, each at most `most`."""
    parts = -(-n // most)
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _packs(segs: list[tuple[int, list[int]]], limit: int) -> list[list[tuple[int, int, list[int]]]]:
    """One part's rows (row, tokens) in calls of at most `limit` tokens: a row longer than
    that in even pieces of its own; consecutive rows of one length together, as evenly as
    they go (llama.cpp decodes rows of unequal lengths in several passes anyway).
    Each call: [(row, offset in the part, tokens)]."""
    out: list[list[tuple[int, int, list[int]]]] = []
    i = 0
    while i < len(segs):
        n = len(segs[i][1])
        if n > limit:
            a = 0
            for size in _even(n, limit):
                out.append([(segs[i][0], a, segs[i][1][a : a + size])])
                a += size
            i += 1
            continue
        j = i
        while j < len(segs) and len(segs[j][1]) == n:
            j += 1
        run = segs[i:j]
        at = 0
        for size in _even(len(run), limit // n):
            out.append([(r, 0, seg) for r, seg in run[at : at + size]])
            at += size
        i = j
    return out
