"""Can this draft serve this target? Same token -> id map, same logits width.

Speculative decoding compares the draft's and the target's distributions position by
position over token ids, so the two tokenizers must agree on every id. Pre-tokenisation may
differ (only the target tokenizes prompts), the id map may not.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from models_registry.errors import IncompatibleDraft, ModelNotFound, RegistryError
from models_registry.weights import read_config


@dataclass(frozen=True)
class TokenizerInfo:
    """A tokenizer reduced to what compatibility needs."""

    vocab: dict[str, int]
    """token -> id, added/special tokens included."""

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def fingerprint(self) -> str:
        """``sha256:<12 hex>`` of the sorted token -> id map; equal maps, equal fingerprints."""
        canon = json.dumps(sorted(self.vocab.items(), key=lambda kv: (kv[1], kv[0])))
        return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()[:12]


def read_tokenizer(model_dir: Path) -> TokenizerInfo:
    """Read the token -> id map from ``tokenizer.json``, else ``vocab.json`` (+ added tokens),
    else whatever ``transformers`` can open locally. Never loads model weights."""
    if not model_dir.is_dir():
        raise ModelNotFound(f"model directory {model_dir} does not exist")
    tok_json = model_dir / "tokenizer.json"
    if tok_json.is_file():
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(tok_json))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise RegistryError(f"{tok_json}: unreadable tokenizer: {exc}") from exc
        return TokenizerInfo(vocab=dict(tok.get_vocab(with_added_tokens=True)))
    vocab_json = model_dir / "vocab.json"
    if vocab_json.is_file():
        vocab = {str(k): int(v) for k, v in json.loads(vocab_json.read_text("utf-8")).items()}
        added = model_dir / "added_tokens.json"
        if added.is_file():
            vocab.update({str(k): int(v) for k, v in json.loads(added.read_text("utf-8")).items()})
        return TokenizerInfo(vocab=vocab)
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:
        raise ModelNotFound(f"no readable tokenizer files in {model_dir}: {exc}") from exc
    return TokenizerInfo(vocab={str(k): int(v) for k, v in auto.get_vocab().items()})


def first_difference(draft: dict[str, int], target: dict[str, int]) -> str | None:
    """Describe the first token (by target id, then draft id) whose ids disagree; None if equal."""
    for token, tid in sorted(target.items(), key=lambda kv: (kv[1], kv[0])):
        did = draft.get(token)
        if did is None:
            return f"token {token!r} (id {tid} in target) is missing from the draft"
        if did != tid:
            return f"token {token!r} is id {tid} in target but id {did} in draft"
    for token, did in sorted(draft.items(), key=lambda kv: (kv[1], kv[0])):
        if token not in target:
            return f"token {token!r} (id {did} in draft) is not in the target's vocabulary"
    return None


def check_tokenizer_compatible(draft_dir: Path, target_dir: Path) -> TokenizerInfo:
    """Raise IncompatibleDraft unless the draft's tokenizer equals the target's id for id.

    Also compares ``config.json`` ``vocab_size`` (the logits width) when both configs have it.
    Returns the (shared) tokenizer info.
    """
    draft, target = read_tokenizer(Path(draft_dir)), read_tokenizer(Path(target_dir))
    diff = first_difference(draft.vocab, target.vocab)
    if diff is not None:
        raise IncompatibleDraft(
            f"draft tokenizer in {draft_dir} differs from target tokenizer in {target_dir}: "
            f"vocab size {draft.vocab_size} vs {target.vocab_size}; first difference: {diff}"
        )
    d_width = read_config(Path(draft_dir)).vocab_size
    t_width = read_config(Path(target_dir)).vocab_size
    if d_width is not None and t_width is not None and d_width != t_width:
        raise IncompatibleDraft(
            f"draft logits width (config vocab_size) {d_width} differs from target's {t_width}"
        )
    return draft
