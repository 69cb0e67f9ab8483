"""The Grammar protocol: a per-request, stateful constraint on which token may come next.

The loop asks `allowed_mask` before every token it samples or verifies, for the target AND
for a draft model, so p and q are masked the same way (exactness holds). During a verify
step the loop consumes the drafted tokens to obtain the masks at later positions, then
`rollback`s the ones the verifier rejected. EOS is handled by the loop: it is allowed exactly
when `is_complete()` is true (and is then the only choice if the mask allows nothing else).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Grammar(Protocol):
    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        """bool (vocab_size,): tokens allowed as the NEXT token after those consumed."""
        ...

    def consume(self, token_id: int) -> None:
        """Advance by one token; only called with tokens the mask allowed."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last n consumed tokens."""
        ...

    def is_complete(self) -> bool:
        """True when the consumed tokens form a complete sentence (EOS is allowed here)."""
        ...


def next_token_mask(
    grammar: Grammar, vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """The grammar's mask with the loop's EOS rule: EOS allowed iff the grammar is complete,
    and forced when the grammar allows nothing else (a dead end ends the output).

    bool (vocab_size,) on `device`.
    """
    mask = grammar.allowed_mask(vocab_size).to(device=device, dtype=torch.bool)  # (V,)
    eos = [i for i in eos_token_ids if i < vocab_size]
    if eos:
        eos_t = torch.tensor(eos, device=device)
        mask[eos_t] = grammar.is_complete()
        if not bool(mask.any()):
            mask[eos_t] = True
    return mask
