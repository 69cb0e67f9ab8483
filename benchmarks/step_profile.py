"""Where a decoding step's time goes outside the target and draft forwards, in-process and
over HTTP (issue 20: goal under 10% of a step).

    python -m benchmarks step_profile [--quick]

In-process (a process of its own): the demo target and draft v2 in one continuous batch
(`Engine.batch`, what the gateway's inference thread steps), greedy, 64 new tokens on the
held-out prompts, speculative with 1 and 8 rows and standard with 1 row. Every function a
step runs through is timed (benchmarks/_phases.py: exclusive seconds per phase), so the
report says per step how many ms are model compute (the lean decoder's or compiled step's
tensor work, target and draft) and how many are the rest (input and mask shaping, the
draft's sampling, verification, detokenizing, bookkeeping).

Over HTTP: a real gateway process with the same wrappers (`python -m benchmarks._phases`)
serves the same requests streamed by 1 and by 8 clients; snapshots taken (SIGUSR1) around
each window give the server's phases, and the client's wall time gives what lies outside
the inference thread's steps (the worker hand-off, the event loop, SSE, the audit write,
and the wait between one request and the next).

Before and after in one run: `STEP_PROFILE_BEFORE=<git revision>` also measures that
revision (a temporary `git worktree` given this checkout's _phases.py and step_profile.py;
phases it lacks are skipped), each case before then after, and reports both.

Compiled steps: `GATEWAY_COMPILE=on` (or `auto`) compiles the in-process side's target and
draft as the gateway does (speed/compiled.py, steps precompiled into var/bench-compile-
cache, shared by the runs) and the gateway inherits the setting; `setup.compile` says
which ran. The README quotes that run from step_profile_compiled.json (a copy).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.concurrency import MODES, NEW_TOKENS, _prompts
from benchmarks.llamacpp import COMPILE_CACHE  # shared by the runs: a restart loads steps

ROOT = Path(__file__).resolve().parent.parent
CASES = (("speculative", 1), ("speculative", 8), ("standard", 1))
COMPUTE = ("target_compute", "draft_compute", "draft_head")
WORKER = ("worker_admit", "worker_emit")  # the inference thread, outside Batch.step


def _child_main(argv: list[str]) -> None:
    """The in-process side: prints one JSON line."""
    from benchmarks import _phases
    from benchmarks._pairs import load_pair
    from gateway.engine import DecodeRequest, Engine, SamplingParams, init_torch_thread

    init_torch_thread()
    requests_per_case = int(argv[0])
    _phases.install()
    setting = _compile_setting()
    pair = load_pair(compiled=setting != "off")  # as the gateway loads it
    target, draft = pair.target, pair.drafts["v2"]
    if setting != "off":
        from gateway.speed.warmup import CompileOptions, compiled_model

        store, auto = COMPILE_CACHE / "precompiled", setting == "auto"
        target = compiled_model(target, 8, options=CompileOptions(store=store, measure=auto))[0]
        draft = compiled_model(
            draft, 8, draft=True, options=CompileOptions(store=store, measure=auto)
        )[0]
    engine = Engine(target)
    ids = [tuple(engine.tokenizer(p)["input_ids"]) for p in _prompts()]
    batch = engine.batch(8)

    def go(mode: str, rows: int, offset: int) -> tuple[float, int]:
        sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        kw: dict[str, Any] = {}
        if mode == "speculative":
            kw = {"mode": "speculative", "proposer": "draft"}
        tokens = 0
        t0 = time.perf_counter()
        for i in range(rows):
            req = DecodeRequest(ids[(offset + i) % len(ids)], sp, **kw)
            batch.add(engine.prepare(req, draft if mode == "speculative" else None))
        while batch.rows:
            for _, events in batch.step():
                tokens += sum(len(getattr(e, "token_ids", ())) for e in events)
        return time.perf_counter() - t0, tokens

    out: dict[str, Any] = {"wrapper_cost_us": round(1e6 * _phases.wrapper_cost(), 2)}
    for mode, rows in CASES:
        go(mode, rows, 0)  # untimed: first allocations, the draft's slots
        before = _phases.snapshot()
        wall, tokens = 0.0, 0
        for n in range(max(1, requests_per_case // rows)):
            w, t = go(mode, rows, n * rows)
            wall += w
            tokens += t
        out[f"{mode}_{rows}"] = _summary(_phases.difference(_phases.snapshot(), before), wall,
                                         tokens)  # fmt: skip
    print(json.dumps(out))


def _summary(phases: dict[str, Any], wall: float, tokens: int) -> dict[str, Any]:
    """Per step: ms by phase; shares of the step (inside Batch.step) and of the wall."""
    seconds = {k: v for k, v in phases["seconds"].items() if v > 0}
    steps = max(1, phases["calls"].get("step_other", 0))
    inside = sum(v for k, v in seconds.items() if k not in WORKER)
    compute = sum(seconds.get(k, 0.0) for k in COMPUTE)
    return {
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "steps": steps,
        "tokens_per_step": round(tokens / steps, 2),
        "wall_ms_per_step": round(1000 * wall / steps, 3),
        "step_ms": round(1000 * inside / steps, 3),
        "phase_ms_per_step": {
            k: round(1000 * v / steps, 3) for k, v in sorted(seconds.items(), key=lambda x: -x[1])
        },
        "calls_per_step": {k: round(v / steps, 2) for k, v in phases["calls"].items() if v},
        "outside_forwards_share_of_step": round(1 - compute / inside, 3) if inside else None,
        "outside_forwards_share_of_wall": round(1 - compute / wall, 3),
    }


def _compile_setting() -> str:
    """GATEWAY_COMPILE read as the gateway reads it (off, on or auto; a bad value raises)."""
    from gateway.serving import _compile_mode
    from gateway.settings import Settings

    return _compile_mode(Settings.from_env().compile)


def _compile_env() -> dict[str, str]:
    """The environment of a compiled run's processes: the shared compile cache."""
    if _compile_setting() == "off":
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": str(COMPILE_CACHE)}


def _in_process(requests_per_case: int, root: Path = ROOT) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.step_profile", "child", str(requests_per_case)],
        cwd=root, capture_output=True, text=True, check=True,
        env={**os.environ, **_compile_env()},
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _snapshot(pid: int, path: Path) -> dict[str, Any]:
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.time() + 30
    while not path.exists():
        if time.time() > deadline:
            raise RuntimeError("the gateway wrote no phase snapshot")
        time.sleep(0.05)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _over_http(requests_per_case: int, root: Path = ROOT) -> dict[str, Any]:
    from benchmarks import _phases
    from benchmarks.concurrency import (  # this checkout's, in the driver
        Clients,
        _runs,
        warm_gateway,
    )

    prompts = _prompts()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "phases.json"
        with warm_gateway(
            prompts, module="benchmarks._phases", cwd=root, GATEWAY_PHASES_OUT=str(dump),
            GATEWAY_MAX_BATCH="8", GATEWAY_MAX_ACTIVE="16", **_compile_env(),
        ) as (gw, key):  # fmt: skip
            for mode, clients in CASES:
                per_client = max(1, requests_per_case // clients)
                before = _snapshot(gw.pid, dump)
                load = Clients(
                    url=gw.url, key=key, count=clients, per_client=per_client, decoding=MODES[mode]
                )
                runs, wall = _runs(load, prompts)
                phases = _phases.difference(_snapshot(gw.pid, dump), before)
                out[f"{mode}_{clients}"] = _summary(phases, wall, sum(r["tokens"] for r in runs))
    return out


@contextmanager
def _checkout(rev: str) -> Iterator[Path]:
    """A temporary worktree of `rev` carrying this checkout's profiling modules."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
        try:
            for name in ("_phases.py", "step_profile.py"):
                shutil.copy(ROOT / "benchmarks" / name, path / "benchmarks" / name)
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                           check=False, capture_output=True)  # fmt: skip


def _rev(ref: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip()


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    n = 4 if quick else 16
    before_rev = os.environ.get("STEP_PROFILE_BEFORE")
    setup = {
        "commit": _rev("HEAD"),
        "draft": "demo-code-draft@2",
        "greedy": True,
        "new_tokens": NEW_TOKENS,
        "requests_per_case": n,
        "goal_outside_forwards_share": 0.10,
        "compile": _compile_setting(),
    }
    if not before_rev:
        return {"setup": setup, "in_process": _in_process(n), "http": _over_http(n)}
    with _checkout(before_rev) as old:
        setup["before_commit"] = _rev(before_rev)
        before_in, after_in = _in_process(n, old), _in_process(n)
        before_http, after_http = _over_http(n, old), _over_http(n)
    return {
        "setup": setup,
        "in_process": after_in,
        "http": after_http,
        "before": {"in_process": before_in, "http": before_http},
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'case':16} {'side':10} {'tok/s':>7} {'ms/step':>8} {'step ms':>8} "
             f"{'outside/step':>12} {'outside/wall':>12}"]  # fmt: skip
    runs = [("", result)] + ([("before ", result["before"])] if "before" in result else [])
    for label, res in runs:
        for side in ("in_process", "http"):
            for case, r in res[side].items():
                if not isinstance(r, dict):
                    continue
                lines.append(
                    f"{label + case:16} {side:10} {r['tokens_per_s']:7} "
                    f"{r['wall_ms_per_step']:8} {r['step_ms']:8} "
                    f"{r['outside_forwards_share_of_step']:12} "
                    f"{r['outside_forwards_share_of_wall']:12}"
                )
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    _child_main(sys.argv[2:])
