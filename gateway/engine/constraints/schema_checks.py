"""What a JSON schema must pass before it is compiled into a grammar (json_schema.py): a
JSON object within the size limits (`canonical_schema`), only known keywords and valid
under its meta-schema, with regexes RE2 compiles within the pattern limits
(`check_enforceable`). Each refusal is a `ConstraintError` naming the problem."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from gateway.engine.constraints.patterns import (
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    MAX_PATTERNS_CHARS,
    PATTERNS_COMPILE_BUDGET_S,
    PatternError,
    compile_regex,
)
from gateway.engine.errors import EngineError
from gateway.limits import MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES


class ConstraintError(EngineError):
    """A schema the gateway cannot enforce exactly, or an output that breaks its schema."""


# Every keyword of JSON Schema drafts 4 to 2020-12, by where its subschemas sit.
def _keywords(names: str) -> frozenset[str]:
    return frozenset(names.split())


ONE_SCHEMA = _keywords(
    "additionalProperties additionalItems contains propertyNames not if then else "
    "unevaluatedItems unevaluatedProperties contentSchema"
)
SCHEMA_MAP = _keywords("properties patternProperties $defs definitions dependentSchemas")
SCHEMA_LIST = _keywords("allOf anyOf oneOf prefixItems")
_PLAIN = _keywords(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern maxItems minItems uniqueItems maxContains minContains maxProperties "
    "minProperties required dependentRequired format contentEncoding contentMediaType title "
    "description default deprecated readOnly writeOnly examples $schema $id id $ref $anchor "
    "$dynamicRef $dynamicAnchor $recursiveRef $recursiveAnchor $vocabulary $comment"
)


def unknown_keywords(schema: Any, path: str = "#") -> list[str]:
    """JSON pointers of keys that are no JSON Schema keyword and not an "x-..." extension,
    plus every "x-guidance" (it would change llguidance's options: separators, oneOf...)."""
    if not isinstance(schema, dict):
        return []
    found: list[str] = []
    for key, value in schema.items():
        here = f"{path}/{key}"
        if (key.startswith("x-") and key != "x-guidance") or key in _PLAIN:
            continue
        if key in ONE_SCHEMA:
            found += unknown_keywords(value, here)
        elif key in SCHEMA_MAP or key == "dependencies":
            for name, sub in value.items() if isinstance(value, dict) else ():
                found += unknown_keywords(sub, f"{here}/{name}")
        elif key in SCHEMA_LIST or key == "items":
            subs = value if isinstance(value, list) else [value]
            for i, sub in enumerate(subs):
                found += unknown_keywords(sub, f"{here}/{i}" if isinstance(value, list) else here)
        else:
            found.append(here)
    return found


def check_size(schema: Any) -> None:
    """Refuse a schema nested deeper than MAX_SCHEMA_DEPTH or with more than MAX_SCHEMA_NODES
    values, walking it without recursion (the checks after this one recurse)."""
    stack: list[tuple[Any, int]] = [(schema, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise ConstraintError(f"the JSON schema has more than {MAX_SCHEMA_NODES} values")
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict | list):
            if depth > MAX_SCHEMA_DEPTH:
                raise ConstraintError(
                    f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} objects and arrays"
                )
            stack.extend((child, depth + 1) for child in children)


def schema_patterns(schema: Any, path: str = "#") -> Iterator[tuple[str, Any]]:
    """(JSON pointer, regex) of every `pattern` value and `patternProperties` key, walking
    only schema positions (a property named "pattern" is not one). Call after check_size."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        here = f"{path}/{key}"
        if key == "pattern":
            yield here, value
        elif key == "patternProperties" and isinstance(value, dict):
            for name in value:
                yield f"{here}/{name}", name
        if key in ONE_SCHEMA:
            yield from schema_patterns(value, here)
        elif key in SCHEMA_MAP or key == "dependencies":
            for name, sub in value.items() if isinstance(value, dict) else ():
                yield from schema_patterns(sub, f"{here}/{name}")
        elif key in SCHEMA_LIST or key == "items":
            subs = value if isinstance(value, list) else [value]
            for i, sub in enumerate(subs):
                yield from schema_patterns(sub, f"{here}/{i}" if isinstance(value, list) else here)


def check_patterns(schema: Any) -> None:
    """ConstraintError unless every regex of the schema is a string of at most
    MAX_PATTERN_CHARS that RE2 compiles, MAX_PATTERNS_CHARS and MAX_PATTERNS in all, and
    their compiles take at most PATTERNS_COMPILE_BUDGET_S together."""
    total = count = 0
    deadline = time.perf_counter() + PATTERNS_COMPILE_BUDGET_S
    for where, pattern in schema_patterns(schema):
        if not isinstance(pattern, str):
            continue  # the meta-schema check names it
        count += 1
        if count > MAX_PATTERNS:
            raise ConstraintError(f"the schema has more than {MAX_PATTERNS} regexes")
        if time.perf_counter() > deadline:
            raise ConstraintError(
                f"the schema's regexes take more than {PATTERNS_COMPILE_BUDGET_S * 1000:.0f} "
                "ms to compile together; simplify them"
            )
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ConstraintError(
                f"the regex at {where} has {len(pattern)} characters; "
                f"at most {MAX_PATTERN_CHARS} are allowed"
            )
        total += len(pattern)
        if total > MAX_PATTERNS_CHARS:
            raise ConstraintError(
                f"the schema's regexes have more than {MAX_PATTERNS_CHARS} characters in all"
            )
        try:
            compile_regex(pattern)
        except PatternError as exc:
            raise ConstraintError(f"{exc} (at {where})") from None


def _check_schema(schema: dict[str, Any]) -> None:
    """Raise ConstraintError unless jsonschema accepts `schema` under its meta-schema."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ConstraintError(f"invalid JSON schema at #/{where}: {exc.message}") from None


def canonical_schema(schema: Any) -> str:
    """The canonical JSON of a schema (a JSON object within the size limits, checked without
    recursion), or ConstraintError."""
    if not isinstance(schema, dict):
        raise ConstraintError(f"the JSON schema must be a JSON object, not {type(schema).__name__}")
    check_size(schema)
    try:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"the JSON schema is not plain JSON: {exc}") from None


def check_enforceable(schema: dict[str, Any]) -> None:
    """ConstraintError unless every keyword is known (see the module docstring) and the
    schema is valid under its meta-schema. Call after `canonical_schema`."""
    unknown = unknown_keywords(schema)
    if unknown:
        raise ConstraintError(
            f"unknown or refused JSON schema keyword(s), not enforced: {', '.join(unknown)}"
        )
    _check_schema(schema)
    check_patterns(schema)
