"""Output constraints: the Grammar protocol, JSON schemas, tool calls by family, reasoning
formats. What the service layers use is exported here (their import contract)."""

from gateway.engine.constraints.base import Grammar
from gateway.engine.constraints.json_schema import *  # noqa: F403  (its __all__)
from gateway.engine.constraints.json_schema import (
    CompiledGrammar,
    ConstraintError,
    compile_json_grammar,
    validate_output,
)
from gateway.engine.constraints.objects import named_properties_only
from gateway.engine.constraints.reasoning import Channels, ChannelsFirst, Markers, ThinkingFirst
from gateway.engine.constraints.token_list import TokenSequencesGrammar
from gateway.engine.constraints.tool_calls import (
    ToolError,
    ToolMode,
    ToolSpec,
    check_tools,
    compile_tool_grammar,
)
from gateway.engine.constraints.tool_formats import FORMATS, HERMES, ToolFormat

__all__ = [
    "FORMATS",
    "HERMES",
    "Channels",
    "ChannelsFirst",
    "CompiledGrammar",
    "ConstraintError",
    "Grammar",
    "Markers",
    "ThinkingFirst",
    "TokenSequencesGrammar",
    "ToolError",
    "ToolFormat",
    "ToolMode",
    "ToolSpec",
    "check_tools",
    "compile_json_grammar",
    "compile_tool_grammar",
    "named_properties_only",
    "validate_output",
]
