"""The engine's public request and response types (other packages code against these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from gateway.engine.constraints.base import Grammar
from gateway.engine.kpolicy import KPrior
from gateway.engine.stats import DecodeStats

if TYPE_CHECKING:  # proposers/ imports the models, which import this module
    from gateway.engine.proposers.suffix import SuffixIndex

Mode = Literal["standard", "speculative"]
ProposerName = Literal["draft", "prompt_lookup", "prediction", "suffix"]
FinishReason = Literal["stop", "length", "cancelled"]
DEFAULT_MIN_DRAFT_CONFIDENCE = 0.0


class SuffixSource(Protocol):
    """A shared suffix index handed over by its owner (proposers/suffix.py)."""

    def index(self) -> SuffixIndex:
        """The index, up to date; called on the decoding thread, the only one that reads
        or changes it."""
        ...


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 => greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 => off
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0  # 0..20
    logit_bias: tuple[tuple[int, float], ...] = ()  # applied to target AND draft logits
    allowed_token_ids: tuple[int, ...] | None = None  # None => all allowed
    banned_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class DecodeRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    mode: Mode = "standard"
    proposer: ProposerName | None = None  # speculative with None => "draft"
    k_min: int = 1
    k_max: int = 8
    prediction: str | None = None  # text for the "prediction" proposer
    # The draft model stops drafting after a token it gave less than this probability.
    min_draft_confidence: float = DEFAULT_MIN_DRAFT_CONFIDENCE
    grammar: Grammar | None = None  # per-request, stateful: use a fresh one per request
    # Where the k policy starts (the policy decision's acceptance and c); None: the default
    # prior. Ignored by seeded sampled requests, which keep the fixed prior (kpolicy.py).
    k_prior: KPrior | None = None
    # Inside a batch, a step may draft nothing (k = 0) when speculating would cost the batch
    # more than it gains at the batch's measured forward costs (auto mode); else k >= k_min.
    may_pause: bool = False
    # Inside a batch: whose kept prompt prefixes this request may reuse and leave behind
    # (batch/prefix.py; the serving layer passes the tenant). None: neither.
    cache_scope: str | None = None
    # Proposer "suffix": where the shared index comes from (the serving layer passes the
    # tenant's); None: the request's own prompt and output only.
    suffix_source: SuffixSource | None = None
    # A tree of candidates per step instead of a chain (proposers "draft" and "head";
    # proposers/tree.py): children of the main chain's node at each depth, the main child
    # included, e.g. (3, 2); () or all ones: a chain. Off on a backend's model (chains only).
    tree: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...]  # (token_id, token, logprob), most likely first


@dataclass(frozen=True)
class DecodeResult:
    """token_ids: every emitted token, EOS included when it ended the output (its text is
    not in `text`); text: the decoded output, cut before a stop string."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    logprobs: tuple[TokenLogprob, ...]
    prompt_tokens: int
    stats: DecodeStats


@dataclass(frozen=True)
class Delta:
    """Streamed piece: tokens committed since the last delta and the text now final."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class Finished:
    result: DecodeResult
