"""Batched drafting: the rows of a batch that draft with one draft model share its forwards.

Each row's DraftModelProposer keeps its draft KV in a slot of this draft's SlotCache
(`join`), so a proposal is the proposer's three verbs (begin / take / end) with the
forwards run here, for every drafting row at once:

1. begin: each row syncs its slot to its committed context (rolling back rejected draft
   tokens is lowering the slot's length) and names its first feed: the tokens the draft
   has not seen (1 + accepted ones, usually 1-5).
2. One draft forward over every row still drafting (batch/forward.py: per-row positions
   and masks), each row's feed at its own slot length; a row with a long first feed (more
   than SHORT_FEED tokens, e.g. a draft that joined late) runs alone so that the others are
   not padded to it.
3. take: each row drafts one token from its logits with its own shaper, grammar and
   generator, and says whether it goes on (k reached, EOS, low confidence, nothing
   allowed stop it). Repeat 2-3 until no row goes on; end gives each row's Proposal.

A row's tokens depend on its logits and its own state only, so drafting in company gives
the tokens drafting alone gives (up to the shared forward's rounding); and whatever the
draft proposes, the verifier's output is exact.

The prompt is prefilled into the draft slot beside the target's chunked prefill
(`prefill`; no logits are needed: through the backbone only, or through a reduced head's
small product), so the first proposal feeds one token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from gateway.engine.backends.base import slot_cache
from gateway.engine.batch.costs import ForwardCosts
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.prefix import PrefixCache
from gateway.engine.batch.slots import SlotCache
from gateway.engine.models import LoadedModel
from gateway.engine.proposers.base import Proposal
from gateway.engine.proposers.draft_model import DraftModelProposer

SHORT_FEED = 16  # longer first feeds run in a forward of their own


class SlotKV:
    """A proposer's draft KV: one slot of a DraftBatch's cache."""

    def __init__(self, cache: SlotCache, slot: int) -> None:
        self.cache = cache
        self.slot = slot

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.cache.length[self.slot]:
            raise ValueError(f"cannot crop slot {self.slot} to {length}")
        self.cache.length[self.slot] = length


class DraftBatch:
    """Draft slots of one draft model for up to `max_rows` rows."""

    def __init__(
        self, draft: LoadedModel, max_rows: int, pad: int, costs: ForwardCosts | None = None
    ) -> None:
        self.draft = draft
        self.costs = ForwardCosts() if costs is None else costs  # observed on every step
        pad = max(pad, SHORT_FEED)
        self.cache = slot_cache(draft.model, max_rows, draft.context_length, pad=pad)
        self.members: dict[int, SlotKV] = {}  # id(proposer) -> its slot
        self.prefixes = PrefixCache(self.cache)  # prompt prefixes kept in free draft slots
        self.forwards = 0
        self.forward_s = 0.0

    def join(
        self, proposer: DraftModelProposer, scope: str | None = None, prompt: Sequence[int] = ()
    ) -> None:
        """A slot for `proposer`, holding the longest prefix of `prompt` that `scope` left in
        a free one (batch/prefix.py, as the target's slots do)."""
        slot, reused = self.prefixes.take(scope, prompt)
        kv = SlotKV(self.cache, slot)
        proposer.use_kv(kv, prompt[:reused])
        self.members[id(proposer)] = kv

    def leave(self, proposer: DraftModelProposer, scope: str | None = None) -> None:
        """Free the proposer's slot, noting the tokens its keys and values hold for `scope`
        (its request's, as at `join`)."""
        kv = self.members.pop(id(proposer), None)
        if kv is not None:
            held = proposer.fed_ids[: self.cache.length[kv.slot]]
            self.cache.release(kv.slot)
            self.prefixes.keep(kv.slot, scope, held)

    def prefill(self, items: list[tuple[DraftModelProposer, list[int]]]) -> None:
        """Feed prompt chunks the target is prefilling, in one forward; a row whose draft
        context is too short is skipped (its first proposal then feeds what is missing)."""
        fits = [
            (p, ids) for p, ids in items
            if ids and self.cache.length[self.members[id(p)].slot] + len(ids) <= self.cache.capacity
        ]  # fmt: skip
        if not fits:
            return
        t0 = time.perf_counter()
        # No logits are needed: the backbone only; with a reduced head, its logits all the
        # same (one small product on the last position), so that a faster forward built
        # with the head inside (gateway/speed) can take a short chunk.
        head = self.draft.draft_head
        slots = [self.members[id(p)].slot for p, _ in fits]
        step = Step(self.cache, slots, [ids for _, ids in fits], True, head is None, head,
                    prompt=True)  # fmt: skip
        batched_forward(self.draft.model, step, self.draft.fast)
        spent = time.perf_counter() - t0
        for p, ids in fits:
            self.cache.length[self.members[id(p)].slot] += len(ids)
            p.fed_tokens(ids, spent, step=False)

    def propose(
        self, asks: list[tuple[DraftModelProposer, Sequence[int], int]]
    ) -> list[Proposal | Exception]:
        """One proposal per (proposer, committed context, k), drafted in shared forwards;
        a row whose own step raised (its grammar, say) gets its exception instead, and the
        others go on."""
        feeds: dict[int, list[int]] = {}
        failed: dict[int, Exception] = {}
        for i, (p, ctx, k) in enumerate(asks):
            try:
                feed = p.begin(ctx, k)  # 1.
            except Exception as exc:
                failed[i] = exc
                continue
            if feed is not None:
                feeds[i] = feed
        while feeds:
            short = [i for i in feeds if len(feeds[i]) <= SHORT_FEED]
            groups = [short] if short else []
            groups += [[i] for i in feeds if len(feeds[i]) > SHORT_FEED]
            nxt: dict[int, list[int]] = {}
            for group in groups:
                props = [asks[i][0] for i in group]
                logits = self._forward(props, [feeds[i] for i in group])  # 2. [(1, V)]
                for i, p, z in zip(group, props, logits, strict=True):
                    try:
                        feed = p.take(z)  # 3.
                    except Exception as exc:
                        failed[i] = exc
                        continue
                    if feed is not None:
                        nxt[i] = feed
            feeds = nxt
        out: list[Proposal | Exception] = []
        for i, (p, _, _) in enumerate(asks):
            if i in failed:
                out.append(failed[i])
                continue
            try:
                out.append(p.end())
            except Exception as exc:
                out.append(exc)
        return out

    def _forward(
        self, props: list[DraftModelProposer], feeds: list[list[int]]
    ) -> list[torch.Tensor]:
        """One forward of each proposer's feed into its slot: the last position's (1, V)."""
        t0 = time.perf_counter()
        d = self.draft
        slots = [self.members[id(p)].slot for p in props]
        step = Step(self.cache, slots, feeds, keep_last=True, head=d.draft_head)
        out = batched_forward(d.model, step, d.fast)  # [(1, V)]
        spent = time.perf_counter() - t0
        self.costs.observe(len(props), max(len(f) for f in feeds), spent)
        for p, s, feed in zip(props, slots, feeds, strict=True):
            self.cache.length[s] += len(feed)
            p.fed_tokens(feed, spent)
        self.forwards += 1
        self.forward_s += spent
        return out
