"""The regression gate: a draft version is promoted only if speculation changed no token.

Speculative decoding must change speed, never output. The gateway's serving layer decodes
each prompt of the regression set greedily twice, standard and speculative with the
candidate draft, and hands the token ids here; ``gate`` blocks promotion on the first
difference, naming the prompt and the token position.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models_registry.errors import RegistryError

DEFAULT_SET = Path(__file__).with_name("regression") / "prompts.jsonl"


@dataclass(frozen=True)
class RegressionPrompt:
    id: str
    prompt: str
    max_new_tokens: int = 64


@dataclass(frozen=True)
class RegressionResult:
    """Greedy token ids for one prompt, decoded both ways."""

    prompt_id: str
    standard_tokens: tuple[int, ...]
    speculative_tokens: tuple[int, ...]


@dataclass(frozen=True)
class Mismatch:
    prompt_id: str
    position: int
    """Index into the generated tokens of the first difference."""
    standard_token: int | None
    """None where the standard output ended before ``position``."""
    speculative_token: int | None


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    reason: str
    checked: int
    first_mismatch: Mismatch | None = None


def load_regression_set(path: str | Path | None = None) -> tuple[RegressionPrompt, ...]:
    """Read a JSONL prompt set (one ``{"id", "prompt", "max_new_tokens"?}`` per line)."""
    path = Path(path) if path is not None else DEFAULT_SET
    prompts: list[RegressionPrompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            item = RegressionPrompt(
                id=str(raw["id"]),
                prompt=str(raw["prompt"]),
                max_new_tokens=int(raw.get("max_new_tokens", 64)),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"{path}:{lineno}: bad regression prompt: {exc!r}") from exc
        if item.id in seen:
            raise RegistryError(f"{path}:{lineno}: duplicate prompt id {item.id!r}")
        if not item.prompt or item.max_new_tokens < 1:
            raise RegistryError(f"{path}:{lineno}: empty prompt or max_new_tokens < 1")
        seen.add(item.id)
        prompts.append(item)
    if not prompts:
        raise RegistryError(f"{path}: the regression set is empty")
    return tuple(prompts)


def first_mismatch(result: RegressionResult) -> Mismatch | None:
    """The first position where the two decodings differ (a length difference counts)."""
    std, spec = tuple(result.standard_tokens), tuple(result.speculative_tokens)
    for pos, (a, b) in enumerate(zip(std, spec, strict=False)):
        if a != b:
            return Mismatch(result.prompt_id, pos, a, b)
    if len(std) != len(spec):
        pos = min(len(std), len(spec))
        return Mismatch(
            result.prompt_id,
            pos,
            std[pos] if pos < len(std) else None,
            spec[pos] if pos < len(spec) else None,
        )
    return None


def gate(
    results: Sequence[RegressionResult],
    prompts: Sequence[RegressionPrompt] | None = None,
) -> GateVerdict:
    """Pass only if every result matches token for token (and, given ``prompts``, every
    prompt of the set has exactly one result)."""
    if not results:
        return GateVerdict(False, "no regression results: promotion needs evidence", 0)
    ids = [r.prompt_id for r in results]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        return GateVerdict(False, f"prompt {dupes[0]!r} has more than one result", len(results))
    if prompts is not None:
        missing = [p.id for p in prompts if p.id not in set(ids)]
        if missing:
            return GateVerdict(
                False,
                f"{len(missing)} regression prompt(s) without a result, first {missing[0]!r}",
                len(results),
            )
    for result in results:
        mismatch = first_mismatch(result)
        if mismatch is not None:
            return GateVerdict(
                False,
                f"prompt {mismatch.prompt_id!r}: speculative output differs from standard at "
                f"token {mismatch.position} (standard {mismatch.standard_token}, "
                f"speculative {mismatch.speculative_token})",
                len(results),
                mismatch,
            )
    total = sum(len(r.standard_tokens) for r in results)
    return GateVerdict(True, f"{len(results)} prompts, {total} tokens identical", len(results))
