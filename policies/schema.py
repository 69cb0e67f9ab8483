"""JSON Schema (Draft 2020-12) of a policy document, and humane error messages.

One schema serves both kinds of document: `policies/bundles/default.yaml` must be complete
(every key required), a tenant document (`tenants/<tenant>.yaml`) may set any subset and is
deep-merged over the default. Unknown keys are refused everywhere, so a typo never silently
does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from gateway.limits import MAX_K

Schema = dict[str, Any]

ENFORCEMENT: Schema = {"enum": ["enforce", "dryrun"]}
PROPOSER: Schema = {"enum": ["draft", "prompt_lookup", "prediction", "suffix"]}
UNIT: Schema = {"type": "number", "minimum": 0, "maximum": 1}
NON_NEGATIVE: Schema = {"type": "number", "minimum": 0}
COUNT: Schema = {"type": "integer", "minimum": 0}
TOKEN_IDS: Schema = {"type": "array", "items": COUNT, "uniqueItems": True}
PER_MINUTE: Schema = {"type": ["integer", "null"], "minimum": 1}
CAP: Schema = {"type": ["integer", "null"], "minimum": 1}


def _obj(properties: dict[str, Schema], *, optional: Sequence[str] = ()) -> Schema:
    """An object schema with no unknown keys; `required` is filled in by `_complete`."""
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "x-optional": list(optional),
    }


def _document_properties() -> dict[str, Schema]:
    prior = _obj({"acceptance": UNIT, "c": NON_NEGATIVE})
    return {
        "description": {"type": "string"},
        "mode": {"enum": ["auto", "speculative", "standard"]},
        "client_override": _obj({"allow": {"type": "boolean"}, "enforcement": ENFORCEMENT}),
        "speculation": _obj(
            {
                "proposers": {"type": "array", "items": PROPOSER, "uniqueItems": True},
                "draft_versions": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "uniqueItems": True,
                },
                "k": _obj(
                    {
                        "min": {"type": "integer", "minimum": 1, "maximum": MAX_K},
                        "max": {"type": "integer", "minimum": 1, "maximum": MAX_K},
                    }
                ),
                "min_max_tokens": COUNT,
                "enforcement": ENFORCEMENT,
                # children of the main chain's node per depth ([3, 2]); []: chains
                "tree": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": 8},
                    "maxItems": 4,
                },
            },
            optional=("tree",),
        ),
        "determinism": _obj(
            {"seed_forces_standard": {"type": "boolean"}, "enforcement": ENFORCEMENT}
        ),
        "load": _obj(
            {"shed_queue_depth": {"type": "integer", "minimum": 1}, "enforcement": ENFORCEMENT}
        ),
        "auto": _obj(
            {
                "margin": {"type": "number", "minimum": 0, "maximum": 10},
                "hysteresis": {"type": "number", "minimum": 0, "maximum": 10},
                "probe_rate": UNIT,
                "ewma": {
                    # Exactly one of the two; replaced as a whole by a tenant document.
                    "type": "object",
                    "properties": {
                        "alpha": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        "half_life": {"type": "number", "exclusiveMinimum": 0},
                    },
                    "additionalProperties": False,
                    "minProperties": 1,
                    "maxProperties": 1,
                },
                "min_samples": COUNT,
                "prior": _obj(
                    {"draft": prior, "prompt_lookup": prior, "prediction": prior, "suffix": prior}
                ),
            }
        ),
        "retention": _obj({"payload_days": COUNT}),
        "rate_limits": _obj(
            {
                "requests_per_minute": PER_MINUTE,
                "tokens_per_minute": PER_MINUTE,
                "enforcement": ENFORCEMENT,
            }
        ),
        "tokens": _obj({"allowed_token_ids": TOKEN_IDS, "banned_token_ids": TOKEN_IDS}),
        "fairness": _obj(
            {
                "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
                "max_concurrent_requests": CAP,
                "max_rows": CAP,
                "max_queued": CAP,
            }
        ),
        "reasoning": _obj({"max_tokens": CAP}),
    }


def _complete(schema: Schema, *, required: bool) -> Schema:
    """Copy `schema`, stripping the private `x-optional` marker and, when `required`, making
    every property of every object required (except those marked optional)."""
    out = {k: v for k, v in schema.items() if k != "x-optional"}
    props = schema.get("properties")
    if isinstance(props, dict):
        out["properties"] = {k: _complete(v, required=required) for k, v in props.items()}
        if required and schema.get("type") == "object" and "maxProperties" not in schema:
            optional = set(schema.get("x-optional", ()))
            out["required"] = [k for k in props if k not in optional]
    return out


_ROOT = _obj(_document_properties(), optional=("description",))
TENANT_SCHEMA: Schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://spec-gateway.local/policies/tenant.schema.json",
    **_complete(_ROOT, required=False),
}
DEFAULT_SCHEMA: Schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://spec-gateway.local/policies/default.schema.json",
    **_complete(_ROOT, required=True),
}
TENANT_VALIDATOR = Draft202012Validator(TENANT_SCHEMA)
DEFAULT_VALIDATOR = Draft202012Validator(DEFAULT_SCHEMA)

ATOMIC_PATHS: frozenset[tuple[str, ...]] = frozenset({("auto", "ewma")})
"""Objects a tenant document replaces whole instead of deep-merging into."""


def format_path(path: Iterable[str | int]) -> str:
    """("speculation", "proposers", 1) -> "speculation.proposers[1]"; () -> "(document)"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def schema_problems(validator: Draft202012Validator, doc: object) -> list[tuple[str, str]]:
    """Every schema violation as (json path, what is wrong), in document order."""
    problems: list[tuple[str, str]] = []
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        problems.extend(_humane(error))
    return problems


_JSON_TYPE = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _humane(error: ValidationError) -> list[tuple[str, str]]:
    path = tuple(error.absolute_path)
    where = format_path(path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(schema.get("properties", {}))
        unknown = [k for k in error.instance if k not in allowed]
        return [
            (format_path((*path, str(k))), f"unknown key (allowed: {', '.join(allowed)})")
            for k in unknown
        ]
    if error.validator == "type":
        got = _JSON_TYPE.get(type(error.instance), type(error.instance).__name__)
        want = error.validator_value
        want_text = " or ".join(want) if isinstance(want, list) else str(want)
        article = "an" if got[0] in "aeiou" else "a"
        return [(where, f"{error.instance!r} is {article} {got}, expected {want_text}")]
    if error.validator == "enum":
        options = ", ".join(str(v) for v in error.validator_value)
        return [(where, f"{error.instance!r} is not one of: {options}")]
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [(format_path((*path, missing)), "required key is missing")]
    if error.validator in ("minProperties", "maxProperties") and path[-1:] == ("ewma",):
        return [(where, "set exactly one of: alpha, half_life")]
    if error.validator == "uniqueItems":
        return [(where, "has duplicate items")]
    return [(where, error.message)]
