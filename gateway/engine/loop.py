"""The decoding loop: standard decoding is the speculative loop with k = 0.

Invariant: the target's KV cache holds every committed token except the last one, so each
step feeds [last committed token, d_1..d_n] (n = 0 in standard mode) in ONE forward and gets
n + 1 target distributions back (see verifier.py for accepted / recovered / bonus).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from gateway.engine.constraints.base import Grammar, next_token_mask
from gateway.engine.errors import GrammarDeadEnd
from gateway.engine.kpolicy import KPolicy
from gateway.engine.models import LoadedModel, cache_kwarg, crop_cache, forward_logits
from gateway.engine.output import OutputBuilder, token_logprobs
from gateway.engine.proposers.base import Proposal, Proposer
from gateway.engine.proposers.head import feature_layers
from gateway.engine.sampling import LogitsShaper, argmax_rows
from gateway.engine.schema import DecodeResult, Delta, Finished
from gateway.engine.stats import DecodeStats
from gateway.engine.tree_step import tree_plan, tree_verdict
from gateway.engine.tree_verifier import depths, path_rows
from gateway.engine.verifier import verify_greedy, verify_sampled


class TargetRunner:
    """The target model and one request's KV cache."""

    def __init__(self, lm: LoadedModel) -> None:
        self._model = lm.model
        self._device = lm.device
        self._kwarg = cache_kwarg(lm.model)
        self.cache = DynamicCache()
        self.forwards = 0
        self.decode_forwards = 0
        self.decode_forward_s = 0.0

    def forward(self, ids: list[int], keep: int = 0) -> torch.Tensor:
        """Logits of the last `keep` positions (all when 0): (keep or len(ids), V)."""
        logits = forward_logits(self._model, self._kwarg, ids, self.cache, self._device, keep)
        self.forwards += 1
        return logits  # (t, V)

    def forward_tapped(
        self, ids: list[int], layers: tuple[int, ...], keep: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits and the hidden states after `layers` (0: the embeddings) at
        every fed position, side by side: (len(ids), len(layers) x H)."""
        x = torch.tensor([ids], dtype=torch.long, device=self._device)  # (1, t)
        out = self._model(
            input_ids=x, use_cache=True, logits_to_keep=keep, output_hidden_states=True,
            **{self._kwarg: self.cache},
        )  # fmt: skip
        self.forwards += 1
        feats = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # (t, taps H)
        return out.logits[0], feats

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length)


@dataclass
class LoopConfig:
    """Everything one request's loop needs, prepared and validated by Engine."""

    target: LoadedModel
    prompt_ids: tuple[int, ...]
    shaper: LogitsShaper
    generator: torch.Generator | None
    output: OutputBuilder
    stats: DecodeStats
    max_tokens: int
    top_logprobs: int | None  # None => no logprobs
    token_str: Callable[[int], str]
    grammar: Grammar | None = None
    proposer: Proposer | None = None
    policy: KPolicy | None = None
    draft_context_length: int | None = None
    cache_scope: str | None = None  # batch/prefix.py: who may reuse this prompt's prefix


def _masks(cfg: LoopConfig, draft: list[int]) -> tuple[list[int], int, torch.Tensor | None]:
    """Walk the grammar along the draft: one mask per verified position (n + 1, V).

    The draft is cut before its first token the grammar forbids (the verifier would reject
    it with certainty; p is 0 there, so the residual is p itself: cutting is exact) and
    after EOS. Returns (draft, tokens consumed into the grammar, masks or None).
    """
    eos = cfg.target.eos_token_ids
    cut = next((j + 1 for j, d in enumerate(draft) if d in eos), len(draft))
    draft = draft[:cut]
    g = cfg.grammar
    if g is None:
        return draft, 0, None
    vocab, dev = cfg.target.vocab_size, cfg.target.device
    rows, consumed = [], 0
    for j, d in enumerate(draft):
        mask = next_token_mask(g, vocab, eos, dev)  # (V,)
        rows.append(mask)
        if not bool(mask[d]):
            draft = draft[:j]
            break
        if d not in eos:
            g.consume(d)
            consumed += 1
    if len(rows) == len(draft):  # the bonus position
        rows.append(next_token_mask(g, vocab, eos, dev))
    return draft, consumed, torch.stack(rows)  # (n + 1, V)


@dataclass
class StepPlan:
    """Steps 2-4 of one request's step: what it feeds to the target next."""

    draft: list[int]  # cut at forbidden tokens and EOS
    q: torch.Tensor | None  # the draft's distributions, (k, V), None when model-free
    consumed: int  # draft tokens consumed into the grammar
    masks: torch.Tensor | None  # grammar masks, (n + 1, V)
    parents: list[int] | None = None  # a tree's (tree_verifier.py); None: a chain
    path: list[int] | None = None  # a tree's accepted nodes, set by settle_step


NO_PROPOSAL = Proposal([])


class RowTimes:
    """Wall time of one request's proposing and verifying (stats.draft_s / verify_s)."""

    def __init__(self) -> None:
        self.draft_s = 0.0
        self.verify_s = 0.0


def plan_k(cfg: LoopConfig, ctx: list[int], cancelled: Callable[[], bool] | None) -> int | None:
    """Steps 2-3a: this step's k (0: standard); None when the request is finished
    (cancelled, or no room left)."""
    out = cfg.output
    # 2. Cancellation and room left (max_tokens, context length).
    if cancelled is not None and cancelled():
        out.finish("cancelled")
        return None
    room = min(cfg.max_tokens - len(out.token_ids), cfg.target.context_length - len(ctx))
    if room <= 0:
        out.finish("length")
        return None
    # 3a. Choose k (k = 0: standard decoding).
    k = 0
    if cfg.proposer is not None and cfg.policy is not None:
        k = min(cfg.policy.choose(), room - 1)
        if cfg.draft_context_length is not None:
            k = min(k, cfg.draft_context_length - len(ctx) + 1)
    return max(k, 0)


def plan_masks(cfg: LoopConfig, k: int, proposal: Proposal, times: RowTimes) -> StepPlan:
    """Step 4 after the proposal (3b) for this step's k."""
    if k > 0:
        cfg.stats.k_history.append(k)
    t0 = time.perf_counter()
    with torch.inference_mode():
        if k > 0 and proposal.parents is not None:  # a tree (tree_step.py)
            tokens, parents, q, tree_masks = tree_plan(cfg, proposal)
            times.verify_s += time.perf_counter() - t0
            return StepPlan(tokens, q, 0, tree_masks, parents if tokens else None)
        # 4. Grammar masks per position; the draft is cut at forbidden tokens and EOS.
        draft, consumed, masks = _masks(cfg, proposal.tokens[:k])
    times.verify_s += time.perf_counter() - t0
    return StepPlan(draft, proposal.probs, consumed, masks)


def plan_step(
    cfg: LoopConfig, ctx: list[int], cancelled: Callable[[], bool] | None, times: RowTimes
) -> StepPlan | None:
    """Steps 2-4 of a request alone; None when it is finished."""
    k = plan_k(cfg, ctx, cancelled)
    if k is None:
        return None
    t0 = time.perf_counter()
    proposal = NO_PROPOSAL
    if k > 0 and cfg.proposer is not None:
        with torch.inference_mode():  # per block: a generator must not leak the mode
            proposal = cfg.proposer.propose(ctx, k)  # 3b.
    times.draft_s += time.perf_counter() - t0
    return plan_masks(cfg, k, proposal, times)


def settle_step(
    cfg: LoopConfig, ctx: list[int], plan: StepPlan, logits: torch.Tensor, times: RowTimes
) -> int:
    """Steps 5-8 after the target forward over [last] + draft (logits (n + 1, V)): accept,
    roll back grammar and proposer, emit into cfg.output and ctx. Returns m, the accepted
    draft tokens (the caller rolls the target's cache back to len(ctx) - 1)."""
    t0 = time.perf_counter()
    out, stats, shaper, draft, n = cfg.output, cfg.stats, cfg.shaper, plan.draft, len(plan.draft)
    with torch.inference_mode():
        z = shaper.shape(logits, plan.masks)  # (n + 1, V)
        if (plan.masks is not None or shaper.allowed is not None) and not bool(
            torch.isfinite(z).any(dim=-1).all()
        ):
            raise GrammarDeadEnd(f"no token is allowed after {len(out.token_ids)} tokens")
        # 6. Accept / reject: m accepted, then the recovered or bonus token.
        tree = plan.parents
        if tree is not None:  # a path down the tree (tree_verifier.py)
            tv, p = tree_verdict(shaper, z, draft, tree, plan.q, cfg.generator)
            plan.path, m, token = tv.path, tv.accepted, tv.token
            kept, rows, n = [draft[a] for a in tv.path], path_rows(tv.path), max(depths(tree))
        elif shaper.greedy:
            p = None
            verdict = verify_greedy(draft, argmax_rows(z))
        else:
            p = shaper.probs(z)  # (n + 1, V)
            q_n = None if plan.q is None else plan.q[:n].to(p.device, p.dtype)  # (n, V)
            d = torch.tensor(draft, dtype=torch.long, device=p.device)  # (n,)
            verdict = verify_sampled(d, q_n, p, cfg.generator)
        if tree is None:
            m, token = verdict.accepted, verdict.token
            kept, rows = draft[:m], list(range(m + 1))
        # 7. Roll back the grammar and the proposer (the caller rolls back the target cache).
        if cfg.grammar is not None:
            cfg.grammar.rollback(plan.consumed - min(m, plan.consumed))
        if cfg.proposer is not None and n:
            cfg.proposer.on_verified(m)
        if cfg.policy is not None and n:
            cfg.policy.update(n, m)
        stats.record_verify(n, m)
        # 8. Emit accepted + recovered/bonus tokens one by one (EOS, stop, max_tokens).
        emitted = [*kept, token]
        lps = None
        if cfg.top_logprobs is not None:
            lp = shaper.logprobs(z[rows], None if p is None else p[rows])  # (m+1, V)
            lps = token_logprobs(lp, emitted, cfg.top_logprobs, cfg.token_str)
    times.verify_s += time.perf_counter() - t0
    for j, tok in enumerate(emitted):
        if lps is not None:
            out.logprobs.append(lps[j])
        ctx.append(tok)
        done = out.push(tok)
        if cfg.grammar is not None and (j == m or tree is not None) and not done:
            cfg.grammar.consume(tok)  # a chain's accepted tokens were consumed in step 4
        if done:
            out.finish(out.finish_reason or "stop")
            break
    return m


def finish_result(
    cfg: LoopConfig, times: RowTimes, t_start: float, forwards: int, c: float | None
) -> Finished:
    """The request's last item: its result with every counter filled in."""
    out, stats = cfg.output, cfg.stats
    stats.finish(len(out.token_ids), forwards, getattr(cfg.proposer, "forwards", 0))
    stats.draft_s, stats.verify_s = times.draft_s, times.verify_s
    stats.c = c
    stats.other_s = max(0.0, time.perf_counter() - t_start - times.draft_s - times.verify_s)
    return Finished(
        DecodeResult(
            token_ids=tuple(out.token_ids),
            text=out.text,
            finish_reason=out.finish_reason or "stop",
            logprobs=tuple(out.logprobs),
            prompt_tokens=len(cfg.prompt_ids),
            stats=stats,
        )
    )


def decode(cfg: LoopConfig, cancelled: Callable[[], bool] | None) -> Iterator[Delta | Finished]:
    """One request alone: steps 1-9 on its own DynamicCache."""
    t_start = time.perf_counter()
    if getattr(cfg.proposer, "tree", None) is not None:
        raise ValueError("a tree-drafting request decodes in a batch (Engine.stream)")
    stats, out = cfg.stats, cfg.output
    runner = TargetRunner(cfg.target)
    ctx = list(cfg.prompt_ids)
    times = RowTimes()
    # A proposer that reads the target's hidden states (a feature head) gets those of
    # every committed position: the prefill's, then each verify's first m + 1.
    taps = feature_layers(cfg.proposer)
    feats = None
    # 1. Prefill: cache every prompt token but the last.
    t0 = time.perf_counter()
    with torch.inference_mode():
        if len(ctx) > 1 and taps is None:
            runner.forward(ctx[:-1], keep=1)
        elif len(ctx) > 1 and taps is not None:
            _, feats = runner.forward_tapped(ctx[:-1], taps, keep=1)
            cfg.proposer.on_features(0, feats)  # type: ignore[union-attr]
    stats.prefill_s = time.perf_counter() - t0 if len(ctx) > 1 else 0.0
    while out.finish_reason is None:
        plan = plan_step(cfg, ctx, cancelled, times)  # 2-4
        if plan is None:
            break
        # 5. Verify: ONE target forward over [last] + draft -> n + 1 distributions.
        t0 = time.perf_counter()
        with torch.inference_mode():
            if taps is None:
                logits = runner.forward([ctx[-1], *plan.draft])  # (n + 1, V)
            else:
                logits, feats = runner.forward_tapped([ctx[-1], *plan.draft], taps)
        runner.decode_forwards += 1
        runner.decode_forward_s += time.perf_counter() - t0
        times.verify_s += time.perf_counter() - t0
        before = len(ctx)
        m = settle_step(cfg, ctx, plan, logits, times)  # 6-8
        runner.crop(before + m)  # 7. the cache: every committed token but the last
        if taps is not None and feats is not None:  # positions before - 1 .. before - 1 + m
            cfg.proposer.on_features(before - 1, feats[: m + 1])  # type: ignore[union-attr]
        # 9. Update c (draft step / target step) for the k policy; stream the delta.
        if cfg.policy is not None and cfg.proposer is not None:
            cfg.policy.observe_c(_measure_c(cfg, runner))
        delta = out.delta()
        if delta is not None:
            yield delta
    final = out.delta()
    if final is not None:
        yield final
    yield finish_result(cfg, times, t_start, runner.forwards, _measure_c(cfg, runner))


def _measure_c(cfg: LoopConfig, runner: TargetRunner) -> float | None:
    """Mean draft forward time / mean target decode forward time (None without a model)."""
    forwards = getattr(cfg.proposer, "forwards", 0)
    if not forwards or not runner.decode_forwards:
        return None
    draft_step = getattr(cfg.proposer, "forward_s", 0.0) / forwards
    return draft_step / (runner.decode_forward_s / runner.decode_forwards)
