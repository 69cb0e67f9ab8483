"""The detokenizer calls the `tokenizers` library's decode directly where transformers'
decode adds nothing to it (gateway/engine/detok.py `native_decode`): the same text for
every window it decodes, and the same streamed output; where transformers would change the
text (clean-up of spaces, an overridden `_decode`) it is not used."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gateway.engine.detok import IncrementalDetokenizer, native_decode

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "models_registry" / "demo" / "demo-code-target-v1"
TEXTS = [
    json.loads(x)["prompt"]
    for x in (ROOT / "benchmarks" / "prompts" / "code.jsonl").read_text().splitlines()
    if x.strip()
] + ["price: 3 € — naïve café 😀 ok", "a\n\n\tb  c"]


@pytest.fixture(scope="module")
def demo():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(DEMO), local_files_only=True)


def test_the_demo_tokenizer_is_decoded_natively(demo) -> None:
    assert native_decode(demo) is not None


def test_every_window_decodes_to_transformers_text(demo) -> None:
    native = native_decode(demo)
    rng = random.Random(49)
    specials = list(demo.all_special_ids)
    for text in TEXTS:
        ids = demo(text, add_special_tokens=False)["input_ids"]
        for _ in range(40):
            a = rng.randrange(len(ids))
            window = ids[a : a + rng.randrange(1, 8)]
            if specials and rng.random() < 0.3:
                window.insert(rng.randrange(len(window) + 1), rng.choice(specials))
            want = demo.decode(window, skip_special_tokens=True)
            assert native(window, skip_special_tokens=True) == want


def test_streamed_text_is_the_same_either_way(demo, monkeypatch) -> None:
    def stream(ids: list[int]) -> list[str]:
        detok = IncrementalDetokenizer(demo, tuple(ids[:5]))
        return [detok.push(i) for i in ids[5:]] + [detok.flush()]

    fast = [stream(demo(t, add_special_tokens=False)["input_ids"]) for t in TEXTS]
    monkeypatch.setattr("gateway.engine.detok.native_decode", lambda tok: None)
    slow = [stream(demo(t, add_special_tokens=False)["input_ids"]) for t in TEXTS]
    assert fast == slow


def test_not_used_where_transformers_changes_the_text(demo) -> None:
    """The control: a tokenizer that cleans up spaces, or overrides `_decode`, keeps
    transformers' decode."""
    clean = AutoTokenizer.from_pretrained(
        str(DEMO), local_files_only=True, clean_up_tokenization_spaces=True
    )
    assert native_decode(clean) is None

    class Own(type(demo)):  # type: ignore[misc]
        def _decode(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super()._decode(*args, **kwargs).upper()

    own = Own.from_pretrained(str(DEMO), local_files_only=True)
    assert native_decode(own) is None
    detok = IncrementalDetokenizer(own)
    ids = own("abc def", add_special_tokens=False)["input_ids"]
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "ABC DEF"
