"""The FastForward the speed package attaches to a model (batch/forward.py `FastForward`):
its compiled forwards for the steps they serve (compiled.py, steps.py), else its lean
decoder (lean.py), else nothing (the model's own forward runs the step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gateway.engine.batch.forward import Step, eager_inputs, finish, model_layout
from gateway.engine.batch.slots import SlotCache
from gateway.speed.steps import compiled_step

if TYPE_CHECKING:
    from gateway.engine.models import LoadedModel
    from gateway.speed.compiled import CompiledForwards
    from gateway.speed.lean import LeanDecoder


@dataclass(frozen=True)
class Accelerated:
    """A model's faster forwards: `lean`, the lean decoder (the same logits as the model's
    forward, less overhead); `compiled`, its compiled step (built from the lean decoder)."""

    lean: LeanDecoder | None = None
    compiled: CompiledForwards | None = None
    taps = True  # it fills a step's FeatureTap: the lean decoder runs such a step

    def __call__(self, model: Any, step: Step) -> list[torch.Tensor] | None:
        # A compiled step returns its logits only: a step with a tap runs lean (or eager);
        # its masks are its own (chains): a step with a tree runs lean (or eager) too.
        if self.compiled is not None and step.tap is None and not step.trees:
            done = compiled_step(self.compiled, step, model_layout(model).device)
            if done is not None:
                return done
        if self.lean is None:
            return None
        inputs = eager_inputs(model, step)
        assert not isinstance(inputs.mask, dict)  # a lean decoder serves uniform layouts only
        keep = [len(x) - 1 for x in step.tokens] if step.keep_last else None
        hidden = step.backbone or step.head is not None
        states: list[torch.Tensor] | None = None if step.tap is None else []
        out = self.lean(
            inputs.ids, inputs.mask, inputs.position_ids, step.cache, keep=keep,
            backbone=hidden, states=states,
        )  # (B, T or 1, H or V)  # fmt: skip
        if step.tap is not None and states is not None:
            step.tap.fill(states, step)
        return finish(out, step)

    def slot_cache(self, layers: int, capacity: int) -> SlotCache | None:
        if self.compiled is None or self.compiled.buffers is None:
            return None
        return self.compiled.slot_cache(layers, capacity)

    def describe(self) -> dict[str, Any]:
        compiled = self.compiled
        return {
            "compiled": None if compiled is None else sorted(compiled.kinds),
            "decoder": None if self.lean is None else type(self.lean).__name__,
        }


def lean_of(lm: LoadedModel) -> LeanDecoder | None:
    """The model's lean decoder, if the speed package gave it one."""
    return lm.fast.lean if isinstance(lm.fast, Accelerated) else None


def compiled_of(lm: LoadedModel) -> CompiledForwards | None:
    """The model's compiled forwards, if it has them."""
    return lm.fast.compiled if isinstance(lm.fast, Accelerated) else None
