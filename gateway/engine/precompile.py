"""Compiling some models' steps in a helper process while this process compiles another's.

Why: a cold compile (engine/compiled.py) is mostly one thread of Python (dynamo's tracing,
inductor's code generation) that now and then waits on a C++ compiler, so two compiles in
two processes overlap even on 2 cores: the demo target (53 s alone) and its draft (18.5 s
alone) compiled side by side in 58 s of wall time, against 72 s one after the other.

How: the caller (serving/models.py) loads every model first, so the linear forward of
each is decided once, in this process (engine/cpu_linear.py), then `start`s a helper
with one kind of step of the model it compiles itself (`Job.kinds`; the shares come out
about even) and the jobs of every other model. The helper
(`python -m gateway.engine.precompile`) loads each model the same way and runs
`compiled_model` with the same store (engine/compiled.py, Precompiled), which saves each
kind of step. When the caller is done with its own model it `wait`s, and compiling the
others loads what the helper saved. A stored step is keyed by a fingerprint of the model,
the code, the thread count and the machine, so a step the helper compiled otherwise is
never loaded: it compiles here, as does whatever a failed or killed helper did not save.
The helper only ever costs the overlap.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import torch

from gateway.engine.batch.slots import PREFILL_CHUNK
from gateway.engine.cpu_linear import uses_weight_major
from gateway.engine.models import LoadedModel

log = logging.getLogger("gateway.engine.precompile")

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the gateway package


@dataclass(frozen=True)
class Job:
    """One model for the helper to compile: loaded as `load_model(path, device, dtype,
    draft_vocab, cpu_linear=weight_major)` (as the caller loaded it), compiled for `rows`
    rows of a batch prefilling `prefill_chunk` tokens a row (engine/compiled.py
    `batch_buffers`), as a draft's drafting step or a target's verify step."""

    path: str
    device: str
    dtype: str
    draft_vocab: bool
    weight_major: bool
    rows: int
    draft: bool
    prefill_chunk: int = PREFILL_CHUNK
    kinds: tuple[str, ...] = ()
    """Only these kinds of step (engine/compiled.py `kind`); empty: every kind."""

    @classmethod
    def of(
        cls, lm: LoadedModel, rows: int, draft: bool, prefill_chunk: int = PREFILL_CHUNK,
        kinds: tuple[str, ...] = (),
    ) -> Job:  # fmt: skip
        """The job that compiles `lm` as the caller will: its linear forward as it was
        decided here, its reduced drafting head if it has one."""
        return cls(
            path=lm.path, device=str(lm.device), dtype=str(lm.dtype).removeprefix("torch."),
            draft_vocab=lm.draft_head is not None, weight_major=uses_weight_major(lm.model),
            rows=rows, draft=draft, prefill_chunk=prefill_chunk, kinds=kinds,
        )  # fmt: skip


class Helper:
    """A running helper process; its output goes to this process's log, line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        assert process.stdout is not None
        self._reader = threading.Thread(
            target=_relay, args=(process.stdout,), name="compile-helper-log", daemon=True
        )
        self._reader.start()

    def wait(self, timeout: float) -> bool:
        """Wait for the helper to finish (killing it past `timeout` seconds); whether it
        compiled every job."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            log.warning("compile helper killed after %.0f s: the rest compiles here", timeout)
            return False
        self._reader.join(5)
        if code != 0:
            log.warning("compile helper failed (exit %d): what it did not save compiles here", code)
        return code == 0

    def kill(self) -> None:
        """Stop the helper (the start it served failed) and reap it."""
        if self.process.poll() is None:
            self.process.kill()
            log.info("compile helper stopped")
        self.process.wait()


def start(jobs: list[Job], store: Path) -> Helper:
    """A helper process compiling `jobs` into `store`, with the calling thread's torch
    thread count (part of a stored step's fingerprint)."""
    spec = {
        "jobs": [asdict(j) for j in jobs],
        "store": str(store),
        "threads": torch.get_num_threads(),
    }
    env = dict(os.environ)  # the helper imports this gateway's code, wherever it runs from
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.engine.precompile"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", env=env,  # undecodable output must not stop the relay (and the pipe)
    )  # fmt: skip
    assert process.stdin is not None
    process.stdin.write(json.dumps(spec))
    process.stdin.close()
    log.info("compile helper (pid %d) compiling %d model(s) alongside", process.pid, len(jobs))
    return Helper(process)


def _relay(stream: IO[str]) -> None:
    for line in stream:
        if line.strip():
            log.info("compile helper: %s", line.rstrip())


def main() -> int:
    """The helper: reads its spec (JSON) from stdin, compiles each job into the store."""
    from gateway.engine.compiled import compiled_model
    from gateway.engine.models import init_torch_thread, load_model

    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    spec = json.load(sys.stdin)
    init_torch_thread(int(spec["threads"]))
    store = Path(spec["store"])
    failed = 0
    for raw in spec["jobs"]:
        job = Job(**{**raw, "kinds": tuple(raw.get("kinds", ()))})
        try:  # a job that fails leaves its model to the caller; the next ones still run
            lm = load_model(
                job.path, job.device, job.dtype, draft_vocab=job.draft_vocab,
                cpu_linear=job.weight_major,
            )  # fmt: skip
            _, seconds = compiled_model(
                lm, job.rows, job.draft, progress=lambda m: print(m, flush=True), store=store,
                kinds=frozenset(job.kinds) or None, prefill_chunk=job.prefill_chunk,
            )  # fmt: skip
        except Exception as exc:
            failed += 1
            print(f"{job.path}: not compiled ({type(exc).__name__}: {exc})", flush=True)
            continue
        print(f"{job.path}: compiled in {seconds:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
