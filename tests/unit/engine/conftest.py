"""The engine tests' tiny models (tests/support/models.py)."""

from tests.support.models import draft_lm, gpt2_lm, llama_lm, model_dirs, tokenizer

__all__ = ["draft_lm", "gpt2_lm", "llama_lm", "model_dirs", "tokenizer"]
