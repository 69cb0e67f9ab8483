r"""JSON-schema constraints with llguidance: compile once per schema, one Grammar per request.

Guarantees:
- `compile_json_grammar` either returns a grammar that enforces EVERY assertion keyword of
  the schema (annotations such as title, description, default, examples carry none) or
  raises `ConstraintError` naming the problem: a schema that is not a JSON object, an
  invalid schema, a keyword llguidance does not implement (it runs with `lenient: False`),
  an overlapping oneOf (never approximated by anyOf), an "x-guidance" block (it would
  override those options), or a keyword nobody knows (a typo such as "maxLenght" is an
  error, not an ignored annotation; other "x-"-prefixed extension keys pass unchecked).
  Output is compact JSON (no whitespace between tokens), so a model cannot stall in
  whitespace.
- `JsonGrammar` follows the engine's Grammar protocol exactly: it never consumes a token its
  mask forbids (Pitfall 2: the matcher would enter an error state that rollback cannot
  undo), EOS is tracked here and never handed to the matcher (Pitfall 1: llguidance does not
  count an EOS consumed after completion, so a later rollback would undo one token too
  many), and rollback(n) restores exactly the state after the kept tokens, masks included.
- `validate_output` checks a finished output with jsonschema, independently of llguidance,
  in time linear in the output: the regex keywords (pattern, patternProperties and the
  additionalProperties that depends on them) match with RE2 (google-re2), never Python's
  backtracking `re` (`^(?:(a|a)*[^\s\S]|a{40})$` would take hours there). A schema's
  patterns are checked when it is compiled: each RE2 must compile it and each is at most
  MAX_PATTERN_CHARS long, all of them together at most MAX_PATTERNS_CHARS.

The checks a schema passes before it is compiled: schema_checks.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import llguidance
import llguidance.hf
import numpy as np
import torch
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from gateway.engine.constraints.patterns import (
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    MAX_PATTERNS_CHARS,
    PatternError,
    re2_validator,
)
from gateway.engine.constraints.schema_checks import (
    ConstraintError,
    canonical_schema,
    check_enforceable,
    check_patterns,
    schema_patterns,
    unknown_keywords,
)

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_OBJECT_SCHEMA: Final[dict[str, Any]] = {"type": "object"}
# llguidance's options; schemas may not carry their own ("x-guidance" is refused), and these
# are applied last anyway, so nothing a client sends can loosen them.
JSON_OPTIONS: Final[JsonCompileOptions] = {
    "whitespace_flexible": False,
    "lenient": False,
    "coerce_one_of": False,
}
GRAMMAR_CACHE_SIZE = 128
TOKENIZER_CACHE_SIZE = 8
MASK_WINDOW = 128  # masks kept for the last positions (> the engine's largest k)


# -- compiled grammars --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """One schema compiled for one tokenizer and vocabulary size; shared, never advanced.

    `new()` is cheap (a deep copy of the initial matcher) and gives a request its own state.
    """

    schema: dict[str, Any]  # the schema enforced ({"type": "object"} in json_object mode)
    digest: str  # sha256 of the canonical schema JSON
    vocab_size: int
    eos_token_ids: frozenset[int]
    _matcher: llguidance.LLMatcher = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def new(self) -> JsonGrammar:
        with self._lock:
            matcher = self._matcher.deep_copy()
        return JsonGrammar(matcher, self.vocab_size, self.eos_token_ids)


_lock = threading.Lock()
_tokenizers: OrderedDict[tuple[int, int], tuple[Any, llguidance.LLTokenizer]] = OrderedDict()
_grammars: OrderedDict[tuple[int, int, str], tuple[Any, CompiledGrammar]] = OrderedDict()


def _ll_tokenizer(tokenizer: Any, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of an HF fast tokenizer, cached per (tokenizer object, vocab size)."""
    key = (id(tokenizer), vocab_size)
    with _lock:
        hit = _tokenizers.get(key)
        if hit is not None and hit[0] is tokenizer:
            _tokenizers.move_to_end(key)
            return hit[1]
    try:
        ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    except ValueError as exc:  # not a fast tokenizer
        raise ConstraintError(f"JSON schema constraints need a fast tokenizer: {exc}") from None
    with _lock:
        _tokenizers[key] = (tokenizer, ll)  # the strong ref keeps id(tokenizer) unique
        _tokenizers.move_to_end(key)
        while len(_tokenizers) > TOKENIZER_CACHE_SIZE:
            _tokenizers.popitem(last=False)
    return ll


def _cached(tokenizer: Any, vocab_size: int, digest: str) -> CompiledGrammar | None:
    key = (id(tokenizer), vocab_size, digest)
    with _lock:
        hit = _grammars.get(key)
        if hit is not None and hit[0] is tokenizer:
            _grammars.move_to_end(key)
            return hit[1]
    return None


def compile_grammar_text(
    tokenizer: Any, text: str, vocab_size: int, schema: dict[str, Any], digest: str
) -> CompiledGrammar:
    """Compile an llguidance grammar (``text``: its JSON-schema or Lark form) and cache it
    under ``digest`` (the caller's hash of what the grammar enforces). ``schema`` is kept on
    the result for the record and for output validation."""
    hit = _cached(tokenizer, vocab_size, digest)
    if hit is not None:
        return hit
    ll = _ll_tokenizer(tokenizer, vocab_size)
    error = llguidance.LLMatcher.validate_grammar(text, ll)
    if error:
        raise ConstraintError(f"JSON schema not supported: {error}")
    matcher = llguidance.LLMatcher(ll, text, log_level=0)
    if matcher.is_error():
        raise ConstraintError(f"JSON schema not supported: {matcher.get_error()}")
    compiled = CompiledGrammar(schema, digest, vocab_size, frozenset(ll.eos_tokens), matcher)
    key = (id(tokenizer), vocab_size, digest)
    with _lock:
        _grammars[key] = (tokenizer, compiled)
        _grammars.move_to_end(key)
        while len(_grammars) > GRAMMAR_CACHE_SIZE:
            _grammars.popitem(last=False)
    return compiled


def compile_json_grammar(
    tokenizer: Any, schema: dict[str, Any] | None, vocab_size: int
) -> CompiledGrammar:
    """Compile `schema` (None: any JSON object, OpenAI's json_object mode) for `tokenizer`.

    Returns the cached CompiledGrammar when the same tokenizer object, vocab size and
    canonical schema JSON were compiled before (LRU of GRAMMAR_CACHE_SIZE entries).
    Raises ConstraintError (see the module docstring) for anything it cannot enforce.
    """
    effective = JSON_OBJECT_SCHEMA if schema is None else schema
    canonical = canonical_schema(effective)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    hit = _cached(tokenizer, vocab_size, digest)
    if hit is not None:
        return hit
    check_enforceable(effective)
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(effective, overrides=JSON_OPTIONS)
    except ValueError as exc:
        raise ConstraintError(f"JSON schema not supported: {exc}") from None
    return compile_grammar_text(tokenizer, text, vocab_size, json.loads(canonical), digest)


# -- the per-request grammar --------------------------------------------------------------


class _Node:
    """One grammar state in the tree of token paths walked since the last commit.

    The state after a token path is a function of the path, so a mask stays valid for as
    long as its node is reachable; re-walking the same draft after a rollback hits it.
    """

    __slots__ = ("children", "complete", "mask")

    def __init__(self, mask: torch.Tensor | None = None, complete: bool | None = None) -> None:
        self.mask = mask  # bool (V,) or None until asked
        self.complete = complete
        self.children: dict[int, _Node] = {}


class JsonGrammar:
    """The engine's Grammar over one llguidance matcher (one request; not thread-safe).

    allowed_mask(V) returns a fresh bool (V,) tensor: the matcher's mask, padded with False
    (or cut) when V differs from the compiled vocab size. EOS in the mask follows llguidance
    (allowed when accepting); the loop's next_token_mask applies its own EOS rule on top.
    After an EOS has been consumed nothing else is allowed.
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_ids: frozenset[int]
    ) -> None:
        self._m = matcher
        self._vocab = vocab_size
        self._eos = eos_token_ids
        self._path: list[_Node] = [_Node()]  # _path[i]: the state after i consumed tokens
        self._tokens: list[int] = []
        self._bitmask = allocate_token_bitmask(1, vocab_size)  # (1, ceil(V / 32)) int32
        self.mask_computations = 0
        self.mask_seconds = 0.0

    @property
    def consumed(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    def _ended(self) -> bool:
        return bool(self._tokens) and self._tokens[-1] in self._eos

    def _mask(self) -> torch.Tensor:
        node = self._path[-1]
        if node.mask is None:
            t0 = time.perf_counter()
            fill_next_token_bitmask(self._m, self._bitmask)
            # token i is bit i % 32 of word i // 32: little-endian bytes, little bit order
            words = np.ascontiguousarray(self._bitmask[0], dtype="<i4")  # (W,)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self._vocab]
            node.mask = torch.from_numpy(bits.view(np.bool_))  # (V,) bool, owns its buffer
            self.mask_seconds += time.perf_counter() - t0
            self.mask_computations += 1
        return node.mask

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        mask = self._mask()  # (V_g,)
        if vocab_size == self._vocab:
            return mask.clone()
        out = torch.zeros(vocab_size, dtype=torch.bool)  # (vocab_size,)
        n = min(vocab_size, self._vocab)
        out[:n] = mask[:n]
        return out

    def _allowed(self, token_id: int) -> bool:
        node = self._path[-1]
        if node.mask is not None:
            return bool(node.mask[token_id])
        return self._m.validate_tokens([token_id]) == 1

    def consume(self, token_id: int) -> None:
        """Advance by one token. Raises ValueError (state unchanged) for a forbidden token."""
        node = self._path[-1]
        if not 0 <= token_id < self._vocab or self._ended():
            raise ValueError(f"token {token_id} is not allowed here")
        if token_id in self._eos:
            if not self.is_complete():
                raise ValueError(f"EOS ({token_id}) is not allowed before the JSON is complete")
            child = node.children.get(token_id) or _Node(
                torch.zeros(self._vocab, dtype=torch.bool), True
            )  # EOS never reaches the matcher (Pitfall 1)
        else:
            if not self._allowed(token_id):
                raise ValueError(f"token {token_id} is not allowed here")
            if not self._m.consume_token(token_id):
                raise RuntimeError(f"llguidance rejected an allowed token: {self._m.get_error()}")
            child = node.children.get(token_id) or _Node()
        node.children = {token_id: child}  # the other branches were rolled back for good
        self._path.append(child)
        self._tokens.append(token_id)
        if len(self._path) > MASK_WINDOW:
            self._path[-MASK_WINDOW - 1].mask = None

    def rollback(self, n: int) -> None:
        """Undo the last n consumed tokens (EOS included: it counts as one token here)."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot roll back {n} of {len(self._tokens)} tokens")
        if n == 0:
            return
        real = sum(1 for t in self._tokens[-n:] if t not in self._eos)
        if real and not self._m.rollback(real):
            raise RuntimeError(f"llguidance rollback failed: {self._m.get_error()}")
        del self._tokens[-n:]
        del self._path[-n:]

    def is_complete(self) -> bool:
        node = self._path[-1]
        if node.complete is None:
            node.complete = bool(self._m.is_accepting())
        return node.complete


def validate_output(text: str, schema: dict[str, Any] | None) -> None:
    """Raise ConstraintError unless `text` is one JSON document valid under `schema`
    (None: any JSON object). Uses jsonschema (the schema's $schema, else Draft 2020-12,
    formats checked where jsonschema can) with RE2 for the regex keywords, independent of
    the grammar that produced it. A regex RE2 cannot compile is a ConstraintError (the
    grammar's compile refuses such a schema first). Runs in a helper thread, not the event
    loop (`gateway.serving.tool_output.check_output`)."""
    import jsonschema

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"the output is not valid JSON: {exc}") from None
    if schema is None:
        if not isinstance(doc, dict):
            raise ConstraintError(f"the output is JSON but not an object: {type(doc).__name__}")
        return
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = re2_validator(cls)(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    except PatternError as exc:  # the grammar's compile refuses such a schema first
        raise ConstraintError(str(exc)) from None
    if error is not None:
        raise ConstraintError(
            f"the output violates the schema at {error.json_path}: {error.message}"
        )


__all__ = [
    "MAX_PATTERNS",
    "MAX_PATTERNS_CHARS",
    "MAX_PATTERN_CHARS",
    "CompiledGrammar",
    "ConstraintError",
    "JsonGrammar",
    "canonical_schema",
    "check_enforceable",
    "check_patterns",
    "compile_grammar_text",
    "compile_json_grammar",
    "schema_patterns",
    "unknown_keywords",
    "validate_output",
]
