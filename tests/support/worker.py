"""The inference worker as the serving tests drive it: a started worker, and an engine on
the tiny target whose batch forwards are spied on or replaced."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.serving.worker import InferenceWorker, WorkerOptions
from gateway.speed import load_fast
from models_registry.manifest import load_manifest
from tests.integration import tiny_models


def started(
    max_active: int = 1, on_start: Callable[[], None] | None = None, **options: Any
) -> InferenceWorker:
    worker = InferenceWorker(
        WorkerOptions(capacity=8, max_active=max_active, **options), on_start=on_start
    )
    worker.start()
    return worker


def spied_engine(tmp_path: Path, monkeypatch, seen: Callable[..., None]):  # type: ignore[no-untyped-def]
    """An engine on the tiny target whose batch forwards are shown to `seen(slots, tokens,
    keyword arguments)` before they run."""
    from gateway.engine import Engine

    manifest = load_manifest(tiny_models.build(tmp_path))
    target = load_fast(manifest.targets()[0].path, device="cpu", draft_vocab=False)

    def spy(real):  # type: ignore[no-untyped-def]
        def forward(model, step, fast=None):  # type: ignore[no-untyped-def]
            keys = {"keep_last": step.keep_last, "backbone": step.backbone}
            seen(step.slots, step.tokens, keys)
            return real(model, step, fast)

        return forward

    patch_target_forwards(monkeypatch, spy)
    return Engine(target)


def patch_target_forwards(monkeypatch, wrap: Callable[..., Any]) -> None:  # type: ignore[no-untyped-def]
    """The batch's target forwards, prefills (batch/scheduler.py) and decode and verify
    steps (batch/verify_step.py), replaced by ``wrap(batched_forward)``."""
    from gateway.engine.batch import forward, scheduler, verify_step

    wrapped = wrap(forward.batched_forward)
    for module in (scheduler, verify_step):
        assert module.batched_forward is forward.batched_forward, module
        monkeypatch.setattr(module, "batched_forward", wrapped)


def counted_engine(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """An engine on the tiny target that records the rows of each decoding forward (prefills
    left out), and a greedy request builder that never ends early (EOS banned)."""
    from gateway.engine import DecodeRequest, SamplingParams

    decode_rows: list[int] = []
    engine = spied_engine(
        tmp_path, monkeypatch,
        lambda slots, tokens, kw: None if kw.get("keep_last") else decode_rows.append(len(slots)),
    )  # fmt: skip
    eos = engine.target.model.config.eos_token_id

    def request(prompt: tuple[int, ...], n: int) -> DecodeRequest:
        sampling = SamplingParams(temperature=0.0, max_tokens=n, banned_token_ids=(eos,))
        return DecodeRequest(prompt, sampling)

    return engine, decode_rows, request
