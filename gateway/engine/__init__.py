"""gateway.engine: exact speculative and standard decoding on local transformers models.

Leaf package: torch + transformers only (no tenants, HTTP, database or YAML).
"""

from gateway.engine.backends.loading import load as load_backend
from gateway.engine.batch.costs import ForwardCosts
from gateway.engine.batch.scheduler import Batch, Event, Parked, Row
from gateway.engine.batch.slots import PREFILL_BUDGET, PREFILL_CHUNK
from gateway.engine.constraints import Grammar, TokenSequencesGrammar
from gateway.engine.detok import IncrementalDetokenizer
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
    default_device,
    init_torch_thread,
    load_model,
    serving_threads,
    wrap_model,
)
from gateway.engine.proposers import Proposal, Proposer
from gateway.engine.proposers.head import load_head_model
from gateway.engine.proposers.suffix import SuffixIndex
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
    "PREFILL_BUDGET",
    "PREFILL_CHUNK",
    "Batch",
    "DecodeRequest",
    "DecodeResult",
    "DecodeStats",
    "Delta",
    "EmptyPrompt",
    "Engine",
    "EngineError",
    "Event",
    "Finished",
    "ForwardCosts",
    "Grammar",
    "GrammarDeadEnd",
    "IncrementalDetokenizer",
    "InvalidRequest",
    "KPrior",
    "LoadedModel",
    "Parked",
    "PromptTooLong",
    "Proposal",
    "Proposer",
    "Row",
    "SamplingParams",
    "StepCost",
    "SuffixIndex",
    "TokenLogprob",
    "TokenSequencesGrammar",
    "UnsupportedModel",
    "VocabularyMismatch",
    "check_pair",
    "crop_cache",
    "default_device",
    "init_torch_thread",
    "load_backend",
    "load_head_model",
    "load_model",
    "serving_threads",
    "wrap_model",
]
