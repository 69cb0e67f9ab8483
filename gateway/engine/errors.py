"""Errors the engine raises. The serving layer maps each to an OpenAI-shaped 4xx/5xx."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error raised on purpose by gateway.engine."""


class InvalidRequest(EngineError):
    """The request cannot be served as asked (bad k bounds, missing draft or prediction...)."""


class EmptyPrompt(InvalidRequest):
    """The prompt has no tokens: there is nothing to condition the first token on."""

    def __init__(self) -> None:
        super().__init__("the prompt is empty: at least one prompt token is required")


class PromptTooLong(InvalidRequest):
    """The prompt leaves no room for a single new token in the model's context."""

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        super().__init__(
            f"the prompt has {prompt_tokens} tokens but the context length is "
            f"{context_length}: at most {context_length - 1} prompt tokens fit"
        )


class VocabularyMismatch(EngineError):
    """Draft and target do not share one vocabulary, so draft tokens mean nothing to the target."""


class GrammarDeadEnd(EngineError):
    """The grammar allows no token (not even EOS) at some position."""


class UnsupportedModel(EngineError):
    """A model this engine cannot serve exactly; refused at load, with the reason."""
