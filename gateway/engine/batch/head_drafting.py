"""Rows drafting with a feature head in a continuous batch: the target's hidden states they
read, asked of the batch's prefill and verify forwards and handed to each row's proposer.

A head row proposes alone (its own small KV cache, proposers/head.py), at no target cost;
what the batch does for it is ask the shared target forward for the hidden states at its
taps (batch/forward.py `FeatureTap`: the union of the stepping rows' taps; a forward
without a head row computes none) and give each head row those of the positions it
committed: a prefill chunk's, or a verify's first m + 1.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.engine.batch.forward import FeatureTap
from gateway.engine.loop import LoopConfig
from gateway.engine.proposers.head import feature_layers


def step_tap(cfgs: Iterable[LoopConfig]) -> FeatureTap | None:
    """A tap for a forward of these rows: the hidden states any of their proposers reads,
    or None when none reads any."""
    layers: set[int] = set()
    for cfg in cfgs:
        layers.update(feature_layers(cfg.proposer) or ())
    return FeatureTap(tuple(sorted(layers))) if layers else None


def hand_features(
    cfg: LoopConfig, tap: FeatureTap | None, row: int, start: int, count: int,
    fed: list[int] | None = None,
) -> None:  # fmt: skip
    """Row `row` of the tapped forward committed positions start .. start + count - 1: its
    proposer gets their states, if it reads any: those of the row's first `count` fed
    tokens, or of its fed tokens `fed` (a tree's root and accepted path)."""
    layers = feature_layers(cfg.proposer)
    if tap is None or layers is None or count <= 0:
        return
    feats = tap.of(row, layers)
    feats = feats[:count] if fed is None else feats[fed[:count]]
    cfg.proposer.on_features(start, feats)  # type: ignore[union-attr]
