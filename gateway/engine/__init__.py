"""gateway.engine: exact speculative and standard decoding on local transformers models.

Leaf package: torch + transformers only (no tenants, HTTP, database or YAML).
"""

from gateway.engine.batch.costs import ForwardCosts
from gateway.engine.constraints import Grammar, TokenSequencesGrammar
from gateway.engine.engine import Engine, StepCost
from gateway.engine.errors import (
    EmptyPrompt,
    EngineError,
    GrammarDeadEnd,
    InvalidRequest,
    PromptTooLong,
    UnsupportedModel,
    VocabularyMismatch,
)
from gateway.engine.kpolicy import KPrior
from gateway.engine.models import (
    LoadedModel,
    check_pair,
    crop_cache,
    init_torch_thread,
    load_model,
    wrap_model,
)
from gateway.engine.proposers import Proposal, Proposer
from gateway.engine.schema import (
    DecodeRequest,
    DecodeResult,
    Delta,
    Finished,
    SamplingParams,
    TokenLogprob,
)
from gateway.engine.stats import DecodeStats

__all__ = [
    "DecodeRequest",
    "DecodeResult",
    "DecodeStats",
    "Delta",
    "EmptyPrompt",
    "Engine",
    "EngineError",
    "Finished",
    "ForwardCosts",
    "Grammar",
    "GrammarDeadEnd",
    "InvalidRequest",
    "KPrior",
    "LoadedModel",
    "PromptTooLong",
    "Proposal",
    "Proposer",
    "SamplingParams",
    "StepCost",
    "TokenLogprob",
    "TokenSequencesGrammar",
    "UnsupportedModel",
    "VocabularyMismatch",
    "check_pair",
    "crop_cache",
    "init_torch_thread",
    "load_model",
    "wrap_model",
]
