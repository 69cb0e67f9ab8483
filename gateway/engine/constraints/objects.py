"""Schemas as frameworks send them: an object generates only the properties it names.

Pydantic, LangChain, the OpenAI SDK's helpers and most agent frameworks emit object schemas
that list `properties` and say nothing of others. By the letter of JSON Schema such an object
may carry any other key too, and a grammar that follows the letter lets a model invent keys
(`{"name": "Ann", "age": 3, " or ": "), ' + …`) until max_tokens cuts the JSON. What those
schemas mean in practice is "these properties": xgrammar (vLLM's default) generates only
them unless the schema allows more explicitly, and so does this engine by default.

`named_properties_only` returns a copy of a schema in which every object schema that names
its properties and says nothing of others (no additionalProperties, patternProperties or
unevaluatedProperties) allows only those. It leaves alone the objects where closing could
forbid what a sibling allows: an object combined with allOf, anyOf, oneOf, $ref, if,
dependentSchemas, dependencies or a dynamic reference, and the members of an allOf (each
names only its share of the properties). Every output it permits is valid under the schema
as written: it only narrows what is generated.
"""

from __future__ import annotations

from typing import Any

from gateway.engine.constraints.schema_checks import (
    ONE_SCHEMA,
    SCHEMA_LIST,
    SCHEMA_MAP,
    check_size,
)

_SAYS_OTHERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_COMBINED = (
    "allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas", "dependencies",
    "$dynamicRef", "$recursiveRef",
)  # fmt: skip


def named_properties_only(schema: Any) -> Any:
    """`schema` with its plain named-property objects closed (see the module docstring).
    Raises ConstraintError for a schema over the size limits (schema_checks.check_size)."""
    check_size(schema)  # bounds the recursion below
    return _close(schema, in_all_of=False)


def _close(schema: Any, in_all_of: bool) -> Any:
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ONE_SCHEMA:
            out[key] = _close(value, False)
        elif key in SCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: _close(sub, False) for name, sub in value.items()}
        elif key in SCHEMA_LIST and isinstance(value, list):
            out[key] = [_close(sub, key == "allOf") for sub in value]
        elif key == "items":
            items = value if isinstance(value, list) else None
            out[key] = [_close(s, False) for s in items] if items else _close(value, False)
        else:
            out[key] = value
    if _closable(schema, in_all_of):
        out["additionalProperties"] = False
    return out


def _closable(schema: dict[str, Any], in_all_of: bool) -> bool:
    return (
        isinstance(schema.get("properties"), dict)
        and not in_all_of
        and not any(key in schema for key in _SAYS_OTHERS)
        and not any(key in schema for key in _COMBINED)
    )
