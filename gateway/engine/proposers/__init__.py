"""Proposers: anything that drafts tokens for the verifier."""

from gateway.engine.proposers.base import ModelProposer, Proposal, Proposer
from gateway.engine.proposers.draft_model import DraftModelProposer
from gateway.engine.proposers.prediction import PredictionProposer
from gateway.engine.proposers.prompt_lookup import PromptLookupProposer
from gateway.engine.proposers.suffix import SuffixIndex, SuffixParams, SuffixProposer

__all__ = [
    "DraftModelProposer",
    "ModelProposer",
    "PredictionProposer",
    "PromptLookupProposer",
    "Proposal",
    "Proposer",
    "SuffixIndex",
    "SuffixParams",
    "SuffixProposer",
]
