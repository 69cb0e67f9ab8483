"""Errors raised by the registry. Each message names the model, field or token at fault."""

from __future__ import annotations


class RegistryError(Exception):
    """Base class: every error this package raises on bad input or bad files."""


class ManifestError(RegistryError, ValueError):
    """The manifest file is malformed (missing key, unknown role, duplicate entry...)."""


class ModelNotFound(RegistryError, LookupError):
    """No such model in the manifest, or its directory / weights are missing on disk."""


class IntegrityError(RegistryError):
    """The weights on disk do not hash to the manifest's sha256."""


class IncompatibleDraft(RegistryError):
    """A draft's tokenizer (or logits width) differs from its target's."""


class InvalidTransition(RegistryError):
    """A rollout was asked to move to a state its current state cannot reach."""


class InvalidConfig(RegistryError, ValueError):
    """A rollout or guard field is out of range; the message names the field."""
