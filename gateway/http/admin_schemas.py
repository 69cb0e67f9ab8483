"""Admin request bodies (msgspec structs): the shapes OpenAPI documents and the HTTP edge
decodes. They check JSON types; the serving layer still checks the values (non-empty names,
ranges, roles, guard thresholds, compatibility) and gets the fields the client sent as a dict
(`bodies.sent`). Optional fields default to ``UNSET`` so that an absent field stays absent."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

VERSION = "A version label; an integer is read as text."


class ModelRegister(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Register a model version from a local directory (hashed and checked, servable at once)."""

    name: Annotated[str, Meta(description="Model name (a target's or a draft's).")]
    version: Annotated[str | int, Meta(description=VERSION)]
    role: Annotated[str, Meta(description="'target' or 'draft'.")]
    path: Annotated[str, Meta(description="Local directory holding the model files.")]
    target: Annotated[
        str | UnsetType | None, Meta(description="The target a draft proposes for (drafts only).")
    ] = UNSET


class GuardSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Automatic rollback thresholds; a missing field takes the registry's default."""

    min_samples: Annotated[
        int | UnsetType, Meta(description="Requests each arm needs before the guard judges.")
    ] = UNSET
    max_acceptance_drop: Annotated[
        float | UnsetType, Meta(description="Largest absolute fall of acceptance, in [0, 1].")
    ] = UNSET
    max_latency_regression: Annotated[
        float | UnsetType, Meta(description="Largest relative rise of per-token latency.")
    ] = UNSET
    window: Annotated[
        int | UnsetType, Meta(description="Most recent requests per arm to judge on (0 = all).")
    ] = UNSET


class RolloutStart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Start a canary rollout of a registered draft version."""

    target: Annotated[str, Meta(description="The served target model.")]
    draft: Annotated[str, Meta(description="The draft model's name.")]
    version: Annotated[str | int, Meta(description=VERSION)]
    canary_percent: Annotated[
        float, Meta(description="Share of traffic (0 to 100) the new version gets.")
    ]
    baseline_version: Annotated[
        str | int | UnsetType | None,
        Meta(description="Version the canary is compared with (default: what serves now)."),
    ] = UNSET
    sticky: Annotated[
        bool | UnsetType, Meta(description="Keep each tenant on one arm (default false).")
    ] = UNSET
    guard: GuardSpec | UnsetType | None = UNSET


class DecodingFeatures(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The request's ``decoding`` extension, as the OpenAI endpoints take it."""

    mode: Literal["auto", "speculative", "standard"] | UnsetType = UNSET
    proposer: Literal["draft", "prompt_lookup", "prediction", "suffix"] | UnsetType | None = UNSET
    k: int | UnsetType | None = UNSET


class RequestFeatures(msgspec.Struct, kw_only=True):
    """What the policy may know about a request. Other fields of a pasted request body are
    ignored; a missing field takes the dry run's default."""

    endpoint: Annotated[
        str | UnsetType, Meta(description="'chat.completions' (default) or 'completions'.")
    ] = UNSET
    model: str | UnsetType = UNSET
    decoding: DecodingFeatures | UnsetType | None = UNSET
    max_tokens: Annotated[int | UnsetType, Meta(description="Default 256.")] = UNSET
    temperature: Annotated[float | UnsetType, Meta(description="Default 1.0.")] = UNSET
    top_p: Annotated[float | UnsetType, Meta(description="Default 1.0.")] = UNSET
    seed: int | UnsetType | None = UNSET
    prediction: Annotated[
        bool | str | dict[str, Any] | UnsetType | None,
        Meta(description="OpenAI `prediction` (or true) when the request carries one."),
    ] = UNSET
    constraint: Annotated[
        Literal["none", "json_object", "json_schema", "tools", "logit_bias"] | UnsetType,
        Meta(description="The output constraint (default 'none')."),
    ] = UNSET
    prompt_tokens: Annotated[int | UnsetType, Meta(description="Default 0.")] = UNSET
    draft_versions: Annotated[
        list[str] | UnsetType, Meta(description="Draft versions the request may use.")
    ] = UNSET


class PolicyResolve(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Dry run: the decision a request of ``tenant`` with these features would get."""

    tenant: Annotated[str, Meta(description="The tenant whose policy decides.")]
    request: RequestFeatures | UnsetType | None = UNSET


MAX_LIFETIME_S = 10 * 365 * 86_400
MAX_GRACE_S = 30 * 86_400
ExpiresIn = (
    Annotated[
        int, Meta(ge=1, le=MAX_LIFETIME_S, description="Seconds until the key expires (401).")
    ]
    | UnsetType
    | None
)


class OperatorCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A named operator and its first key (shown once)."""

    name: Annotated[
        str,
        Meta(
            pattern="^[a-z0-9][a-z0-9._-]{0,63}$",
            description="Unique name; the actor of the admin events it causes.",
        ),
    ]
    role: Annotated[
        Literal["admin", "policy-author", "rollout-operator", "auditor"],
        Meta(description="What the operator may do (docs/operations.md: named operators)."),
    ]
    expires_in_s: ExpiresIn = UNSET


class OperatorKeyCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Another key for an operator (shown once)."""

    expires_in_s: ExpiresIn = UNSET


class KeyRotate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Issue a successor key; the old one keeps working for the grace period."""

    grace_s: Annotated[
        int, Meta(ge=0, le=MAX_GRACE_S, description="Seconds the old key stays valid (0: now).")
    ] = 3600
    expires_in_s: ExpiresIn = UNSET


POLICY_DOCUMENT = (
    "A tenant's policy document (a JSON object): any subset of the default bundle's keys, "
    "deep-merged over it and checked against policies/schema.py; unknown keys are refused."
)
