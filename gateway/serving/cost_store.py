"""Forward costs measured at load, kept for the next start on the same machine.

At load the pool times each model's forwards for every row bucket (engine/batch/costs.py
`probe`), so that auto mode's cost model starts from measurements. At realistic sizes on a
CPU that is most of the start. The timings depend on the model's weights and forward
strategy and on the machine, not on anything a restart changes, so they are kept in the var
dir (``forward-costs.json``) under a key naming all of those: the weights' checksum, device,
dtype, the rows probed, the compiled kinds and lean decoder, the torch version, and the
machine as compiled steps and linear verdicts name it (speed/cpu_linear.py
`machine_identity`: CPU model and capability, cores, threads). A start with the same key
adopts them instead of probing; any difference probes again. They are a starting point
either way: the batch goes on observing every real forward and follows the machine's actual
load. An unreadable file is ignored (and rewritten at the next probe).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gateway.engine import ForwardCosts, LoadedModel
from gateway.speed.cpu_linear import machine_identity
from models_registry.manifest import ModelEntry


def cost_key(entry: ModelEntry, lm: LoadedModel, rows: int, options: str = "") -> str:
    """What the timings of ``lm``'s forwards for up to ``rows`` rows depend on.
    ``options``: the pool's settings that change the forward (e.g. its CPU linear form)."""
    fast = lm.fast.describe() if lm.fast is not None else {"compiled": None, "decoder": None}
    return json.dumps({
        "weights": entry.sha256, "model": entry.key, "device": str(lm.device),
        "dtype": str(next(lm.model.parameters()).dtype), "rows": rows,
        **fast, "options": options, "torch": torch.__version__, "machine": machine_identity(),
    }, sort_keys=True)  # fmt: skip


class CostStore:
    """The kept forward costs, one JSON file: key -> [[row bucket, tokens, seconds], ...]."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, list[list[float]]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> ForwardCosts | None:
        points = self._read().get(key)
        if not isinstance(points, list) or not points:
            return None
        try:
            means = {(int(r), int(t)): float(s) for r, t, s in points}
        except (TypeError, ValueError):
            return None
        return ForwardCosts(means=means)

    def put(self, key: str, costs: ForwardCosts) -> None:
        data = self._read()
        data[key] = [[r, t, s] for (r, t), s in sorted(costs.means.items())]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.path)
