"""Engine: validates a request, wires shaper / generator / proposer, runs the loop."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from gateway.engine.backends.base import BackendModel, decode_alone
from gateway.engine.batch.costs import ForwardCosts, probe
from gateway.engine.batch.scheduler import Batch
from gateway.engine.batch.slots import PREFILL_BUDGET, PREFILL_CHUNK
from gateway.engine.errors import EmptyPrompt, InvalidRequest, PromptTooLong
from gateway.engine.kpolicy import KPolicy
from gateway.engine.loop import LoopConfig, decode
from gateway.engine.models import LoadedModel, check_pair
from gateway.engine.output import OutputBuilder
from gateway.engine.proposers.base import Proposer
from gateway.engine.proposers.registry import ProposerInputs, build_proposer
from gateway.engine.sampling import LogitsShaper
from gateway.engine.schema import DecodeRequest, DecodeResult, Delta, Finished
from gateway.engine.stats import DecodeStats
from gateway.limits import MAX_K, MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class StepCost:
    """Measured at `rows` rows: verify[k] = a step verifying k + 1 tokens per row, in
    standard steps; draft_c = one draft forward / one standard step (None: not measured).
    A step counts its overhead outside the forwards (batch/costs.py `overhead`)."""

    rows: int
    verify: tuple[float, ...]
    draft_c: float | None


class Engine:
    """Decodes one request at a time on a target model, standard or speculative."""

    def __init__(self, target: LoadedModel) -> None:
        self._target = target
        self._checked_drafts: dict[int, LoadedModel] = {}
        # Measured forward costs by model (id of its LoadedModel): the target's and each
        # draft's, seeded by measure_costs and followed by every batch forward.
        self.costs: dict[int, ForwardCosts] = {}
        self.token_str: Callable[[int], str] = lru_cache(maxsize=65536)(self._token_str)

    @property
    def target(self) -> LoadedModel:
        return self._target

    @property
    def tokenizer(self) -> Any:
        return self._target.tokenizer

    @property
    def context_length(self) -> int:
        return self._target.context_length

    def _token_str(self, token_id: int) -> str:
        return str(self._target.tokenizer.decode([token_id]))

    def stream(
        self,
        req: DecodeRequest,
        draft: LoadedModel | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Delta | Finished]:
        """Validate now (errors raise before the first item), then yield deltas and, last,
        one Finished with the whole result."""
        cfg = self._prepare(req, draft)
        if isinstance(self._target.model, BackendModel):  # decodes in a batch (backends/)
            return decode_alone(self.batch(1), cfg, cancelled)
        if getattr(cfg.proposer, "tree", None) is not None:  # trees verify in a batch only
            return decode_alone(self.batch(1), cfg, cancelled)
        return decode(cfg, cancelled)

    def prepare(self, req: DecodeRequest, draft: LoadedModel | None = None) -> LoopConfig:
        """Validate (errors raise here) and wire a request for `Batch.add`."""
        return self._prepare(req, draft)

    @property
    def parkable(self) -> bool:
        """Whether its batch can park rows (`Batch.park`): on a backend's memory only where
        its model says its caches save and restore slots (a `parkable` attribute)."""
        model = self._target.model
        return not isinstance(model, BackendModel) or bool(getattr(model, "parkable", False))

    def batch(
        self, max_rows: int, prefill_chunk: int = PREFILL_CHUNK,
        prefill_budget: int = PREFILL_BUDGET,
    ) -> Batch:  # fmt: skip
        """A continuous batch of up to `max_rows` requests on this engine's target, each
        step prefilling at most `prefill_chunk` prompt tokens a row and `prefill_budget`
        in all (batch/scheduler.py)."""
        return Batch(self._target, max_rows, prefill_chunk, self.costs, prefill_budget)

    def measure_costs(
        self, max_rows: int, draft: LoadedModel | None = None, known: ForwardCosts | None = None
    ) -> ForwardCosts:
        """Time the target's (or a draft's) forwards for batches of up to `max_rows` rows
        (batch/costs.py), or start from ``known`` (the same model's forwards timed on this
        machine before); a second call for the same model returns the first result."""
        lm = self._target if draft is None else draft
        if id(lm) not in self.costs:
            tokens = (1, 2, 3, 5, 9) if draft is None else (1, 2)
            self.costs[id(lm)] = known if known is not None else probe(lm, max_rows, tokens)
        return self.costs[id(lm)]

    def cost_at(self, rows: int, k_max: int, draft: LoadedModel | None = None) -> StepCost | None:
        """The verify costs v(0..k_max) and the draft's c at `rows` rows, as measured."""
        target = self.costs.get(id(self._target))
        v = None if target is None else target.verify_costs(rows, k_max)
        if v is None or target is None:
            return None
        c = None
        d = None if draft is None else self.costs.get(id(draft))
        one = target.standard_step(rows)
        if d is not None and one:
            ds = d.seconds(rows, 1)
            c = None if ds is None else ds / one
        return StepCost(rows, v, c)

    def run(self, req: DecodeRequest, draft: LoadedModel | None = None) -> DecodeResult:
        for item in self.stream(req, draft):
            if isinstance(item, Finished):
                return item.result
        raise AssertionError("the decode loop ended without a Finished item")

    # -- preparation ---------------------------------------------------------------------

    def _prepare(self, req: DecodeRequest, draft: LoadedModel | None) -> LoopConfig:
        t = self._target
        sp = req.sampling
        self._validate(req)
        shaper = LogitsShaper.from_params(sp, t.vocab_size, t.device)
        seed = sp.seed if sp.seed is not None else secrets.randbits(63)
        generator = torch.Generator(device=t.device).manual_seed(seed)
        stats = DecodeStats(mode=req.mode)
        proposer: Proposer | None = None
        policy = None
        draft_ctx = None
        if req.mode == "speculative":
            name = req.proposer or "draft"
            stats.proposer = name
            if name == "draft" and draft is not None:
                self._check_draft(draft)
            built = build_proposer(name, ProposerInputs(req, t, draft, generator))
            proposer, draft_ctx = built.proposer, built.draft_context
            policy = self._k_policy(req, built.c0)
        output = OutputBuilder(t.tokenizer, req.prompt_ids, sp.stop, t.eos_token_ids, sp.max_tokens)
        return LoopConfig(
            target=t,
            prompt_ids=req.prompt_ids,
            shaper=shaper,
            generator=generator,
            output=output,
            stats=stats,
            max_tokens=sp.max_tokens,
            top_logprobs=sp.top_logprobs if sp.logprobs else None,
            token_str=self.token_str,
            grammar=req.grammar,
            proposer=proposer,
            policy=policy,
            draft_context_length=draft_ctx,
            cache_scope=req.cache_scope,
        )

    @staticmethod
    def _k_policy(req: DecodeRequest, static: float) -> KPolicy:
        """From the decision's prior; a seeded sampled request keeps the fixed prior and the
        static c, so that its seed alone decides its output (see kpolicy.py)."""
        sp = req.sampling
        if sp.temperature > 0 and sp.seed is not None:
            return KPolicy(req.k_min, req.k_max, c=static, measure_c=False)
        if req.k_prior is None:
            return KPolicy(req.k_min, req.k_max, c=static, may_pause=req.may_pause)
        prior = min(max(req.k_prior.acceptance, 0.0), 1.0)
        c = req.k_prior.c if req.k_prior.c > 0 else static
        return KPolicy(req.k_min, req.k_max, prior=prior, c=c, may_pause=req.may_pause)

    def _check_draft(self, draft: LoadedModel) -> None:
        if self._checked_drafts.get(id(draft)) is draft:
            return
        check_pair(self._target, draft)
        self._checked_drafts[id(draft)] = draft

    def _validate(self, req: DecodeRequest) -> None:
        t, sp = self._target, req.sampling
        vocab = t.vocab_size
        if not req.prompt_ids:
            raise EmptyPrompt()
        if len(req.prompt_ids) >= t.context_length:
            raise PromptTooLong(len(req.prompt_ids), t.context_length)
        if any(not 0 <= i < vocab for i in req.prompt_ids):
            raise InvalidRequest(f"prompt token ids must lie in [0, {vocab})")
        if req.mode not in ("standard", "speculative"):
            raise InvalidRequest(f"unknown mode {req.mode!r}")
        if not (math.isfinite(sp.temperature) and sp.temperature >= 0):
            raise InvalidRequest("temperature must be a finite number >= 0")
        if not 0.0 < sp.top_p <= 1.0:
            raise InvalidRequest("top_p must lie in (0, 1]")
        if sp.top_k < 0:
            raise InvalidRequest("top_k must be >= 0 (0 turns it off)")
        if sp.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1")
        if not 0 <= sp.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must lie in [0, {MAX_TOP_LOGPROBS}]")
        for i, v in sp.logit_bias:
            if not 0 <= i < vocab or not math.isfinite(v):
                raise InvalidRequest(f"logit_bias entry ({i}, {v}) is out of range")
        ids = (*(sp.allowed_token_ids or ()), *sp.banned_token_ids)
        if any(not 0 <= i < vocab for i in ids):
            raise InvalidRequest(f"allowed/banned token ids must lie in [0, {vocab})")
        if sp.allowed_token_ids is not None and not set(sp.allowed_token_ids) - set(
            sp.banned_token_ids
        ):
            raise InvalidRequest("allowed_token_ids minus banned_token_ids is empty")
        if not 0.0 <= req.min_draft_confidence <= 1.0:
            raise InvalidRequest("min_draft_confidence must lie in [0, 1]")
        if req.mode == "speculative" and not 1 <= req.k_min <= req.k_max <= MAX_K:
            raise InvalidRequest(f"need 1 <= k_min <= k_max <= {MAX_K}")
