"""The model pool: targets and draft versions loaded from the manifest, on one device.

Every load runs on the inference thread (``runner`` is the worker's ``call``): that thread
owns torch, see worker.py. Checksums are computed in a helper thread (no torch there), so a
long hash does not stall decoding. Targets load at start; drafts load lazily and can be loaded or
unloaded while the gateway runs: a request holds a reference to the LoadedModel it started
with, so unloading only drops the pool's reference and requests in flight finish on their
version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.engine import (
    PREFILL_CHUNK,
    Engine,
    LoadedModel,
    UnsupportedModel,
    check_pair,
    load_backend,
    load_head_model,
)
from gateway.serving.cost_store import CostStore, cost_key
from gateway.serving.errors import GatewayError
from gateway.speed import load_fast
from gateway.speed.fast import compiled_of, lean_of
from gateway.speed.kept_parity import KeptParity
from gateway.speed.warmup import CompileOptions, compiled_model
from models_registry.manifest import Manifest, ModelEntry, load_manifest, verify_sha256

log = logging.getLogger("gateway.models")

Runner = Callable[[Callable[[], Any]], Awaitable[Any]]


@dataclass(frozen=True)
class DraftHandle:
    entry: ModelEntry
    model: LoadedModel


@dataclass(frozen=True)
class PoolOptions:
    """How the pool loads its models (the gateway's settings, serving/__init__.py)."""

    device: str | None = None
    """torch device (GATEWAY_DEVICE); None: CUDA when present, else the CPU."""
    dtype: str | None = None
    """Model dtype (GATEWAY_DTYPE); None: fp32 on the CPU, bf16 on CUDA."""
    probe_rows: int = 0
    """> 0: time each model's forwards for batches of up to that many rows when it loads
    (Engine.measure_costs), so the cost model starts from measurements."""
    compile_rows: Callable[[int], int] | None = None
    """The rows of a target's batch, from its context length: what its steps are compiled
    for (a draft's slots are as many as its target's rows)."""
    cpu_linear: bool | None = None
    """The CPU linear form (speed/cpu_linear.py); None: measured at load."""
    compile_mode: str = "off"
    """GATEWAY_COMPILE: on or auto compiles the batch path's steps (speed/compiled.py);
    auto then serves compiled only the kinds of step that measured faster. Either way
    every draft of the manifest loads at start too, since compiling later would stall the
    inference thread."""
    graphs_mode: str = "off"
    """GATEWAY_CUDA_GRAPHS, for a model on CUDA: pad its steps to buckets and replay them
    as captured graphs (speed/graphs.py); on, auto or off as compile_mode."""
    compile_store: Path | None = None
    """Where compiled steps are kept for the next start (speed/store.py)."""
    prefill_chunk: int = PREFILL_CHUNK
    """GATEWAY_PREFILL_CHUNK: steps are compiled for the slot buffers such a batch
    allocates (speed/store.py `batch_buffers`)."""


class ModelPool:
    def __init__(
        self, manifest: Manifest, runner: Runner, options: PoolOptions | None = None
    ) -> None:
        o = options or PoolOptions()
        self.manifest = manifest
        self.device = o.device
        self.dtype = o.dtype
        self._run = runner
        self.probe_rows = o.probe_rows
        self.compile_rows = o.compile_rows
        self.compile_mode = o.compile_mode
        self.graphs_mode = o.graphs_mode
        self.compile_store = o.compile_store
        self.prefill_chunk = o.prefill_chunk
        # Weights already hashed to their manifest checksum, by their files' stats
        # (models_registry verify_sha256): a restart does not read unchanged shards again.
        # None: every load hashes.
        self.verified: Path | None = None
        # Forward costs timed at an earlier start with the same model and machine
        # (serving/cost_store.py); None: every load probes.
        self.costs: CostStore | None = None
        # Lean decoders that passed their parity check at an earlier start with the same
        # weights, code and machine (speed/kept_parity.py); None: every load checks.
        self.parity: KeptParity | None = None
        self.cpu_linear = o.cpu_linear  # None: measured at load (speed/cpu_linear.py)
        self._started = False
        self._engines: dict[str, tuple[ModelEntry, Engine]] = {}
        self._drafts: dict[tuple[str, str], DraftHandle] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_manifest(
        cls, path: str, runner: Runner, options: PoolOptions | None = None
    ) -> ModelPool:
        if not Path(path).exists():
            raise FileNotFoundError(f"model manifest not found: {path} (set GATEWAY_MODELS)")
        return cls(load_manifest(path), runner, options)

    async def load_targets(self) -> None:
        """Load every target (and, when compiling or capturing, every draft) before serving."""
        for entry in self.manifest.targets():
            _, engine = await self.target(entry.name)
            if any(self._fast(engine.target)):
                for version in self.draft_versions(entry.name):
                    await self.draft(entry.name, version)
        self._started = True

    def _load(self, entry: ModelEntry, draft_vocab: bool) -> LoadedModel:
        """The entry's model as the pool loads it (on the inference thread): a target
        without its drafting head (draft_vocab False), a draft with it. A model the engine
        cannot serve exactly answers 503 model_unsupported, with the reason."""
        try:
            if entry.backend not in (None, "torch"):  # a GGUF on llama.cpp: engine/backends/
                return load_backend(str(entry.path), entry.backend, self.device)
            kept = None if self.parity is None else (self.parity, entry.sha256)
            return load_fast(
                str(entry.path), self.device, self.dtype, draft_vocab, self.cpu_linear,
                compiled=self.compile_mode != "off", kept=kept,
            )  # fmt: skip
        except UnsupportedModel as exc:
            log.error("%s v%s refused: %s", entry.name, entry.version, exc)
            raise GatewayError(
                "unavailable", f"{entry.name} v{entry.version} cannot be served: {exc}",
                code="model_unsupported",
            ) from exc  # fmt: skip

    # -- targets -----------------------------------------------------------------------

    def target_names(self) -> list[str]:
        return [e.name for e in self.manifest.targets()]

    async def target(self, name: str) -> tuple[ModelEntry, Engine]:
        """The target's engine; loaded on the inference thread on first use (a target
        registered while the gateway runs)."""
        with self._lock:
            if name in self._engines:
                return self._engines[name]
        entries = [e for e in self.manifest.targets() if e.name == name]
        if not entries:
            raise GatewayError(
                "not_found",
                f"The model '{name}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        entry = entries[-1]
        await asyncio.to_thread(verify_sha256, entry, self.verified)  # no torch: decoding goes on
        engine: Engine = await self._run(lambda: self._load_target(entry))
        with self._lock:
            self._engines.setdefault(name, (entry, engine))
            return self._engines[name]

    def _load_target(self, entry: ModelEntry) -> Engine:
        """On the inference thread."""
        model = self._load(entry, draft_vocab=False)
        engine = Engine(self._compiled(model, entry, model.context_length, draft=False))
        self._probe(engine, None, entry)
        return engine

    def _fast(self, model: LoadedModel) -> tuple[bool, bool]:
        """(compile with inductor, capture CUDA graphs) for this model."""
        graphs = self.graphs_mode != "off" and model.device.type == "cuda"
        return self.compile_mode != "off" and self.compile_rows is not None, graphs

    def _compiled(
        self, model: LoadedModel, entry: ModelEntry, context: int, draft: bool
    ) -> LoadedModel:
        """`model` compiled for its target's batch: `context` is the target's context length,
        which sets the batch's rows (a draft's slots are as many as its target's rows; the
        step takes the slot buffers' sizes as constants, speed/compiled.py
        `batch_buffers`, so the count must match)."""
        inductor, graphs = self._fast(model)
        if not (inductor or graphs) or self.compile_rows is None:
            return model
        if lean_of(model) is None:  # a backend's model, or a family without a lean decoder
            log.info("%s v%s runs eager: nothing of it to compile", entry.name, entry.version)
            return model
        if self._started:
            log.warning(
                "%s v%s loaded after start runs eager: compiling it now would stall every "
                "request on the inference thread (restart to compile it)",
                entry.name, entry.version,
            )  # fmt: skip
            return model
        rows = self.compile_rows(context)
        measure = (inductor and self.compile_mode == "auto") or (
            graphs and self.graphs_mode == "auto"
        )
        try:
            options = CompileOptions(
                inductor=inductor,
                graphs=graphs,
                store=self.compile_store,
                measure=measure,
                prefill_chunk=self.prefill_chunk,
            )
            fast, seconds = compiled_model(model, rows, draft, options=options, progress=log.info)
        except Exception as exc:  # an architecture or device inductor cannot compile
            log.warning(
                "%s v%s runs eager: compiling its forwards failed (%s: %s)",
                entry.name, entry.version, type(exc).__name__, exc,
            )  # fmt: skip
            return model
        how = " and ".join(
            w for w, on in (("compiled", inductor), ("captured as CUDA graphs", graphs)) if on
        )
        done = compiled_of(fast)
        if done is None:
            log.info("%s v%s runs eager: no kind of step measured faster %s (%.1f s)",
                     entry.name, entry.version, how, seconds)  # fmt: skip
        else:
            log.info("%s v%s %s for %d rows (%s) in %.1f s", entry.name, entry.version, how,
                     rows, ", ".join(sorted(done.kinds)), seconds)  # fmt: skip
        return fast

    def _probe(self, engine: Engine, draft: LoadedModel | None, entry: ModelEntry) -> None:
        if self.probe_rows <= 0:
            return
        rows = self.probe_rows  # up to the batch's own rows (a KV budget can cap them)
        if self.compile_rows is not None:
            rows = min(rows, self.compile_rows(engine.target.context_length))
        t0 = time.perf_counter()
        lm = engine.target if draft is None else draft
        key = cost_key(entry, lm, rows, f"cpu_linear={self.cpu_linear}")
        known = self.costs.get(key) if self.costs is not None else None
        costs = engine.measure_costs(rows, draft, known)
        if known is None and self.costs is not None:
            self.costs.put(key, costs)
        log.info(
            "forward costs of %s v%s %s for up to %d rows: %d shapes in %.2f s",
            entry.name, entry.version, "measured" if known is None else "kept from a start",
            rows, len(costs.means), time.perf_counter() - t0,
        )  # fmt: skip

    # -- drafts ------------------------------------------------------------------------

    def draft_versions(self, target: str) -> tuple[str, ...]:
        return tuple(e.version for e in self.manifest.drafts_for(target))

    async def draft(self, target: str, version: str) -> DraftHandle:
        """The draft version's handle, loaded (and checked against its target) on the
        inference thread on first use."""
        entry = next((e for e in self.manifest.drafts_for(target) if e.version == version), None)
        if entry is None:
            raise GatewayError("not_found", f"no draft version {version} for {target}")
        key = (entry.name, entry.version)
        with self._lock:
            handle = self._drafts.get(key)
        if handle is not None:
            return handle
        _, engine = await self.target(target)
        await asyncio.to_thread(verify_sha256, entry, self.verified)
        model: LoadedModel = await self._run(lambda: self._load_draft(entry, engine))
        with self._lock:
            return self._drafts.setdefault(key, DraftHandle(entry, model))

    def _load_draft(self, entry: ModelEntry, engine: Engine) -> LoadedModel:
        """On the inference thread. A head (kind ``head``) loads on its target's embeddings
        and output head; it has no forwards of its own to compile or probe."""
        if entry.kind == "head":
            return load_head_model(str(entry.path), engine.target)
        model = self._load(entry, draft_vocab=True)
        check_pair(engine.target, model)
        model = self._compiled(model, entry, engine.target.context_length, draft=True)
        self._probe(engine, model, entry)
        return model

    def loaded_draft_models(self, target: str) -> dict[str, LoadedModel]:
        """Version -> model of this target's drafts loaded so far."""
        names = {e.name for e in self.manifest.drafts_for(target)}
        with self._lock:
            return {v: h.model for (n, v), h in self._drafts.items() if n in names}

    def unload_draft(self, name: str, version: str) -> bool:
        with self._lock:
            return self._drafts.pop((name, version), None) is not None

    def loaded_drafts(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._drafts)
