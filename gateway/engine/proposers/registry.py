"""The proposers by name: what a request's `proposer` names, built for it.

A new proposer is one module in this folder (the two verbs of base.py) and one entry here,
which the engine looks up by name; the names a request, a policy and an audit record may
carry are listed where each is validated (engine/schema.py, the HTTP schemas, the audit
types).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gateway.engine.backends.base import BackendModel
from gateway.engine.errors import InvalidRequest
from gateway.engine.kpolicy import static_c
from gateway.engine.models import LoadedModel
from gateway.engine.proposers.base import Proposer
from gateway.engine.proposers.draft_model import DraftModelProposer
from gateway.engine.proposers.head import HeadProposer, is_head
from gateway.engine.proposers.prediction import PredictionProposer
from gateway.engine.proposers.prompt_lookup import PromptLookupProposer
from gateway.engine.proposers.suffix import SuffixProposer
from gateway.engine.proposers.tree import TreeShape
from gateway.engine.sampling import LogitsShaper
from gateway.engine.schema import DecodeRequest
from gateway.limits import MAX_K


@dataclass(frozen=True)
class ProposerInputs:
    """What a proposer is built from: the request, its target, the draft model the request
    was given (checked against the target by the engine; None: none), and the request's
    generator (a sampling draft draws from it)."""

    req: DecodeRequest
    target: LoadedModel
    draft: LoadedModel | None
    generator: torch.Generator


@dataclass(frozen=True)
class Built:
    """A proposer for one request; `draft_context`: the draft model's context length (the
    loop caps k by it), `c0`: its cost per drafted token relative to a target forward
    before any is measured (model-free proposers cost about nothing)."""

    proposer: Proposer
    draft_context: int | None = None
    c0: float = 0.0


def _draft(x: ProposerInputs) -> Built:
    draft, sp = x.draft, x.req.sampling
    if draft is None:
        raise InvalidRequest("speculative decoding with proposer 'draft' needs a draft")
    if is_head(draft):  # a draft version that is a feature head (registry kind `head`)
        return _head(x)
    shaper = LogitsShaper.from_params(sp, draft.vocab_size, draft.device)
    proposer = DraftModelProposer(
        draft, shaper, x.generator, x.req.grammar, x.target.eos_token_ids,
        min_confidence=x.req.min_draft_confidence, tree=_tree(x),
    )  # fmt: skip
    c0 = static_c(x.target.model.config, draft.model.config)
    return Built(proposer, draft.context_length, c0)


def _head(x: ProposerInputs) -> Built:
    """A feature head (proposers/head.py), the request's draft version of kind `head`."""
    draft, sp = x.draft, x.req.sampling
    if draft is None or not is_head(draft):
        raise InvalidRequest("proposer 'head' needs a draft head (a draft of kind 'head')")
    head = draft.model
    shaper = LogitsShaper.from_params(sp, x.target.vocab_size, x.target.device)
    proposer = HeadProposer(
        head, shaper, x.generator, x.req.grammar, x.target.eos_token_ids,
        capacity=x.target.context_length + 2 * MAX_K + 2,
        min_confidence=x.req.min_draft_confidence,
    )  # fmt: skip
    proposer.tree = _tree(x)
    # One layer (and the output head) against the target's layers.
    c0 = 1.5 / max(1, head.cfg.target_layers)
    return Built(proposer, None, c0)


def _tree(x: ProposerInputs) -> TreeShape | None:
    """The request's tree shape (None: chains), where its target can verify trees: a
    backend's model (llama.cpp) verifies chains only."""
    if not x.req.tree or isinstance(x.target.model, BackendModel):
        return None
    try:
        return TreeShape.of(x.req.tree)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc


def _prompt_lookup(x: ProposerInputs) -> Built:
    return Built(PromptLookupProposer())


def _suffix(x: ProposerInputs) -> Built:
    # A seeded sampled request drafts from its own text only, so that its seed alone
    # decides its output (a shared index changes with other requests).
    sp = x.req.sampling
    seeded = sp.temperature > 0 and sp.seed is not None
    src = None if seeded else x.req.suffix_source
    return Built(SuffixProposer(None if src is None else src.index()))


def _prediction(x: ProposerInputs) -> Built:
    if not x.req.prediction:
        raise InvalidRequest("proposer 'prediction' needs the prediction text")
    ids = x.target.tokenizer(x.req.prediction, add_special_tokens=False)["input_ids"]
    return Built(PredictionProposer(ids, len(x.req.prompt_ids)))


PROPOSERS: dict[str, Callable[[ProposerInputs], Built]] = {
    "draft": _draft,
    "head": _head,
    "prompt_lookup": _prompt_lookup,
    "suffix": _suffix,
    "prediction": _prediction,
}
"""Builders by proposer name (a request's `proposer`; the policy's names)."""


def build_proposer(name: str, inputs: ProposerInputs) -> Built:
    """The named proposer for the request; InvalidRequest for an unknown name."""
    build = PROPOSERS.get(name)
    if build is None:
        raise InvalidRequest(f"unknown proposer {name!r}")
    return build(inputs)
