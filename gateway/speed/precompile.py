"""Compiling some models' steps in a helper process while this process compiles another's.

Why: a cold compile (speed/compiled.py) is mostly one thread of Python (dynamo's tracing,
inductor's code generation) that now and then waits on a C++ compiler, so two compiles in
two processes overlap even on 2 cores: the demo target (53 s alone) and its draft (18.5 s
alone) compiled side by side in 58 s of wall time, against 72 s one after the other.

How: the caller (serving/models.py) loads every model first, so the linear forward of
each is decided once, in this process (speed/cpu_linear.py), then `start`s a helper
with one kind of step of the model it compiles itself (`Job.kinds`; the shares come out
about even) and the jobs of every other model. The helper
(`python -m gateway.speed.precompile`) loads each model the same way and runs
`compiled_model` with the same store (speed/store.py, Precompiled), which saves each
kind of step. Which side finishes first depends on the machine, so the shares are not
left fixed: both processes claim a kind before compiling it (`claimer`), the helper
going through its jobs from the first kind on, and the caller, done with its own model,
takes the helper's kinds from the last one back (`Helper.take_last`) until one the helper
has claimed. Then it `wait`s, and compiling the others loads what either saved. A stored
step is keyed by a fingerprint of the model, the code, the thread count and the machine,
so a step the helper compiled otherwise is never loaded: it compiles here, as does
whatever a failed or killed helper did not save.
The helper only ever costs the overlap.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import torch

from gateway.engine.batch.slots import PREFILL_CHUNK
from gateway.engine.models import LoadedModel
from gateway.speed.cpu_linear import uses_weight_major
from gateway.speed.kinds import Claim

log = logging.getLogger("gateway.speed.precompile")

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the gateway package


@dataclass(frozen=True)
class Job:
    """One model for the helper to compile: loaded as `load_model(path, device, dtype,
    draft_vocab, cpu_linear=weight_major)` (as the caller loaded it), compiled for `rows`
    rows of a batch prefilling `prefill_chunk` tokens a row (speed/compiled.py
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
    """Only these kinds of step (speed/kinds.py `kind`); empty: every kind."""

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
    """A running helper process; its output goes to this process's log, line by line.
    `takeable`: its jobs this process may take kinds of (`take_last`), with this process's
    loaded model of each; `claims`: the folder both claim kinds in (None: no taking)."""

    def __init__(
        self, process: subprocess.Popen[str], store: Path | None = None,
        claims: Path | None = None, takeable: list[tuple[LoadedModel, Job]] | None = None,
    ) -> None:  # fmt: skip
        self.process = process
        self.store, self.claims, self.takeable = store, claims, takeable or []
        assert process.stdout is not None
        self._reader = threading.Thread(
            target=_relay, args=(process.stdout,), name="compile-helper-log", daemon=True
        )
        self._reader.start()

    def take_last(self, progress: Callable[[str], None] = log.info) -> int:
        """Compile the helper's last kinds here, from its last job's last kind back, until
        one it has reached (`take_last`); how many were taken. Never raises: what is not
        taken, the helper compiles, or else this process after `wait`."""
        if self.claims is None or self.store is None or not self.takeable:
            return 0
        try:
            taken = take_last(self.takeable, self.store, self.claims, progress)
        except Exception as exc:
            log.warning("taking the compile helper's last kinds failed (%s: %s)",
                        type(exc).__name__, exc)  # fmt: skip
            return 0
        if taken:
            log.info("compiled %d of the compile helper's kinds here", taken)
        return taken

    def wait(self, timeout: float) -> bool:
        """Wait for the helper to finish (killing it past `timeout` seconds); whether it
        compiled every job. Its claims folder goes."""
        try:
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                log.warning("compile helper killed after %.0f s: the rest compiles here",
                            timeout)  # fmt: skip
                return False
        finally:
            self._drop_claims()
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
        self._drop_claims()

    def _drop_claims(self) -> None:
        if self.claims is not None:
            shutil.rmtree(self.claims, ignore_errors=True)


def start(jobs: list[Job], store: Path, models: list[LoadedModel | None] | None = None) -> Helper:
    """A helper process compiling `jobs` into `store`, with the calling thread's torch
    thread count (part of a stored step's fingerprint). `models`: this process's loaded
    model of each job, or None for a job it may not take kinds of; with one, both processes
    claim each kind before compiling it (`claimer`, in a fresh folder of the store), so
    that this process, done with its own share, can take the helper's last kinds
    (`Helper.take_last`)."""
    takeable = [(lm, job) for lm, job in zip(models or [], jobs, strict=False) if lm is not None]
    claims = None
    if takeable:
        store.mkdir(parents=True, exist_ok=True)
        claims = Path(tempfile.mkdtemp(prefix=".claims-", dir=store))
    spec = {
        "jobs": [asdict(j) for j in jobs],
        "store": str(store),
        "threads": torch.get_num_threads(),
        "claims": None if claims is None else str(claims),
    }
    env = dict(os.environ)  # the helper imports this gateway's code, wherever it runs from
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.speed.precompile"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", env=env,  # undecodable output must not stop the relay (and the pipe)
    )  # fmt: skip
    assert process.stdin is not None
    process.stdin.write(json.dumps(spec))
    process.stdin.close()
    log.info("compile helper (pid %d) compiling %d model(s) alongside", process.pid, len(jobs))
    return Helper(process, store, claims, takeable)


def claimer(folder: Path) -> Claim:
    """A `warm_up` claim shared by the processes compiling into one store: a kind is this
    process's when it creates `folder`/<the kind's stored step name> first (O_EXCL, atomic
    between processes). A folder that cannot be written claims everything: two processes
    may then compile the same kind, which costs time, never a wrong step (the same
    fingerprint, the same step)."""

    def claim(name: str) -> bool:
        try:
            os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            log.warning("compile claim %s not written (%s): compiling it here", name, exc)
            return True

    return claim


def take_last(
    models: list[tuple[LoadedModel, Job]], store: Path, claims: Path,
    progress: Callable[[str], None] = log.info,
) -> int:  # fmt: skip
    """In the calling process, once its own share is compiled: compile the helper's jobs'
    kinds from the last one back (the helper goes from the first on), each claimed first,
    until a kind the helper claimed (the kinds before it are the helper's too); each is
    saved to `store`, where both processes' later loads find it. Returns how many kinds
    were taken. `models`: the helper's jobs with this process's loaded model of each."""
    from gateway.speed.store import step_paths
    from gateway.speed.warmup import CompileOptions, WarmShare, compiled_model, left_to_other

    claim = claimer(claims)
    taken = 0
    for lm, job in reversed(models):
        paths = step_paths(lm, job.rows, job.draft, store, job.prefill_chunk)
        for name, path in reversed(paths.items()):
            if (job.kinds and name not in job.kinds) or path.exists():
                continue  # not the job's, or stored (by the helper, or by an earlier start)
            if not claim(path.name):
                progress(left_to_other(lm.path, name))
                return taken  # the helper is compiling it: what comes before is its own
            options = CompileOptions(store=store, prefill_chunk=job.prefill_chunk)
            share = WarmShare(kinds=frozenset({name}))
            compiled_model(lm, job.rows, job.draft, options, progress, share)
            taken += 1
    return taken


def _relay(stream: IO[str]) -> None:
    for line in stream:
        if line.strip():
            log.info("compile helper: %s", line.rstrip())


def main() -> int:
    """The helper: reads its spec (JSON) from stdin, compiles each job into the store."""
    from gateway.engine.models import init_torch_thread
    from gateway.speed.attach import load_fast
    from gateway.speed.warmup import CompileOptions, WarmShare, compiled_model

    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    spec = json.load(sys.stdin)
    init_torch_thread(int(spec["threads"]))
    store = Path(spec["store"])
    claim = None if spec.get("claims") is None else claimer(Path(spec["claims"]))
    failed = 0
    for raw in spec["jobs"]:
        job = Job(**{**raw, "kinds": tuple(raw.get("kinds", ()))})
        try:  # a job that fails leaves its model to the caller; the next ones still run
            lm = load_fast(
                job.path, job.device, job.dtype, draft_vocab=job.draft_vocab,
                cpu_linear=job.weight_major,
            )  # fmt: skip
            options = CompileOptions(store=store, prefill_chunk=job.prefill_chunk)
            share = WarmShare(kinds=frozenset(job.kinds) or None, claim=claim)
            _, seconds = compiled_model(
                lm, job.rows, job.draft, options, lambda m: print(m, flush=True), share
            )
        except Exception as exc:
            failed += 1
            print(f"{job.path}: not compiled ({type(exc).__name__}: {exc})", flush=True)
            continue
        print(f"{job.path}: compiled in {seconds:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
