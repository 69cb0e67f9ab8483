r"""Schema regexes under RE2 (google-re2): compiled in time and memory bounded by their
size, matched in time linear in the text. Python's backtracking `re`, which jsonschema uses
for `pattern`, `patternProperties` and the `additionalProperties` that depends on them, takes
exponential time on a pattern such as `^(?:(a|a)*[^\s\S]|a{40})$` (hours); RE2 never
backtracks. `re2_validator` gives a jsonschema validator class those three keywords matched
by RE2; `compile_regex` compiles (and caches) one regex or raises `PatternError`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Final

import re2  # type: ignore[import-untyped]

MAX_PATTERN_CHARS: Final = 1_000
"""Longest regex of one `pattern` value or `patternProperties` key (RE2's compile time and
memory grow with it; 1,000 characters is far beyond any real field format)."""
MAX_PATTERNS_CHARS: Final = 10_000
"""Most characters of all the regexes of one schema together."""
MAX_PATTERNS: Final = 64
"""Most regexes in one schema (each distinct one is compiled)."""
PATTERNS_COMPILE_BUDGET_S: Final = 0.1
"""Longest time the compiles of one schema's new regexes may take together: RE2 holds the
interpreter lock while it compiles, so this bounds how long one schema can stall every
other thread (the event loop included). Real field formats compile in microseconds."""
RE2_MAX_MEM: Final = 1 << 20
"""RE2's memory budget per regex (1 MiB, against its default 8 MiB): a regex whose program
would be larger is refused in milliseconds instead of compiled for hundreds."""
PATTERN_CACHE_SIZE = 512


class PatternError(ValueError):
    """A regex RE2 cannot compile (unsupported syntax, or past RE2_MAX_MEM)."""


_lock = threading.Lock()
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the client's 400, not a log line
_RE2_OPTIONS.max_mem = RE2_MAX_MEM
_patterns: OrderedDict[str, Any] = OrderedDict()


def compile_regex(pattern: str) -> Any:
    """The RE2 of a schema regex (LRU cached); PatternError if RE2 cannot compile it."""
    with _lock:
        hit = _patterns.get(pattern)
        if hit is not None:
            _patterns.move_to_end(pattern)
            return hit
    try:
        compiled = re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        message = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise PatternError(f"the regex {pattern!r} is not supported: {message}") from None
    with _lock:
        _patterns[pattern] = compiled
        while len(_patterns) > PATTERN_CACHE_SIZE:
            _patterns.popitem(last=False)
    return compiled


def _search(pattern: str, text: str) -> bool:
    return compile_regex(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for k, v in instance.items():
            if _search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)
    ]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        joined = ", ".join(repr(each) for each in sorted(extras))
        if patterns:
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} do(es) not match any of the regexes: {listed}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({joined} unexpected)")


_RE2_VALIDATORS: dict[Any, Any] = {}


def re2_validator(cls: Any) -> Any:
    """`cls` (a jsonschema validator class) with its regex keywords matched by RE2."""
    import jsonschema

    with _lock:
        extended = _RE2_VALIDATORS.get(cls)
        if extended is None:
            extended = jsonschema.validators.extend(
                cls,
                {
                    "pattern": _pattern,
                    "patternProperties": _pattern_properties,
                    "additionalProperties": _additional_properties,
                },
            )
            _RE2_VALIDATORS[cls] = extended
    return extended
