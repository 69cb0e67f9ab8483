"""Output constraints: the Grammar protocol and simple implementations."""

from gateway.engine.constraints.base import Grammar
from gateway.engine.constraints.json_schema import *  # noqa: F403  (its __all__)
from gateway.engine.constraints.token_list import TokenSequencesGrammar

__all__ = ["Grammar", "TokenSequencesGrammar"]
