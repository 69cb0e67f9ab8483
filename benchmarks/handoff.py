"""What handing a step's events to the event loop costs a decode step, in-process: the
part of issue 20's HTTP profile that the gateway's design decides (serving/jobs.py `Outbox`).

    python -m benchmarks handoff [--quick]

A child process steps the demo target's standard decoding at 1 row, greedy, 64 tokens
on the held-out prompts, on a worker thread (as the gateway's inference thread; the main
thread never runs torch). After every step it hands off in one of these ways, all of
them alternating within every round:
- `none`: nothing;
- `thread_<B>us`: `call_soon_threadsafe` to an asyncio loop on the main thread, whose
  callback runs B us of Python: what the gateway does, with B = 0 (an empty wake-up), 100
  (about the loop's work for one streamed chunk) and 300;
- `process_<B>us`: one byte written to a pipe read by another process, which then runs
  the same B us. That is the engine and the event loop in separate processes, with no
  GIL in common; the two cores are still shared.

Reported per variant: the median over rounds of the median decode step (ms, the prefill
step left out) and of tokens/s, and `added_ms`: the median over rounds of the step's time
over `none`'s in the same round (the machine drifts between rounds). Compiled
steps with `GATEWAY_COMPILE=on` or `auto` (the steps stored in var/bench-compile-cache,
as the other benchmarks).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.concurrency import NEW_TOKENS, _prompts
from benchmarks.step_profile import _compile_env, _compile_setting

ROOT = Path(__file__).resolve().parent.parent
BURSTS_US = (0, 100, 300)


def _burn(us: int) -> None:
    """`us` microseconds of Python (holding the GIL, as the loop's work does)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _reader(fd: int) -> None:
    """The other process: for every 2-byte count read, that many microseconds of Python."""
    while chunk := os.read(fd, 2):
        _burn(int.from_bytes(chunk, "little"))
    os._exit(0)


def _child_main(rounds: int) -> None:
    """Prints one JSON line: per variant, each round's median step ms and tokens/s."""
    import asyncio
    import threading

    read_fd, write_fd = os.pipe()
    if os.fork() == 0:  # before any thread or torch import: a plain process
        os.close(write_fd)
        _reader(read_fd)
    os.close(read_fd)
    loop = asyncio.new_event_loop()

    def wake(us: int) -> Callable[[], object]:
        return lambda: loop.call_soon_threadsafe(_burn, us)

    def send(us: int) -> Callable[[], object]:
        count = us.to_bytes(2, "little")
        return lambda: os.write(write_fd, count)

    # Each variant's hand-off, built once (nothing is parsed inside the timed step).
    hand_offs: dict[str, Callable[[], object] | None] = {"none": None}
    hand_offs.update({f"thread_{us}us": wake(us) for us in BURSTS_US})
    hand_offs.update({f"process_{us}us": send(us) for us in BURSTS_US})
    seen: dict[str, list[tuple[float, float]]] = {v: [] for v in hand_offs}

    def worker() -> None:
        try:
            _steps(rounds, hand_offs, seen)
        finally:
            loop.call_soon_threadsafe(loop.stop)

    thread = threading.Thread(target=worker, name="handoff-inference")
    thread.start()
    loop.run_forever()
    thread.join()
    os.close(write_fd)
    print(json.dumps(seen))


def _steps(
    rounds: int, hand_offs: dict[str, Callable[[], object] | None], seen: dict[str, Any]
) -> None:
    from benchmarks._pairs import load_pair
    from gateway.engine import DecodeRequest, Engine, SamplingParams, init_torch_thread

    init_torch_thread()
    compiled = _compile_setting() != "off"
    target = load_pair(compiled=compiled).target  # as the gateway loads it
    if compiled:
        from benchmarks.llamacpp import COMPILE_CACHE
        from gateway.speed.warmup import CompileOptions, compiled_model

        target = compiled_model(
            target, 8, options=CompileOptions(store=COMPILE_CACHE / "precompiled")
        )[0]
    engine = Engine(target)
    ids = [tuple(engine.tokenizer(p)["input_ids"]) for p in _prompts()]
    batch = engine.batch(8)
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)

    def go(variant: str) -> tuple[float, float]:
        hand_off = hand_offs[variant]
        steps: list[float] = []
        tokens, t0 = 0, time.perf_counter()
        for prompt in ids:
            batch.add(engine.prepare(DecodeRequest(prompt, sp), None))
            first = True
            while batch.rows:
                t = time.perf_counter()
                for _, events in batch.step():
                    tokens += sum(len(getattr(e, "token_ids", ())) for e in events)
                if hand_off is not None:
                    hand_off()
                if not first:  # the prefill step is left out
                    steps.append(time.perf_counter() - t)
                first = False
        return 1000 * statistics.median(steps), tokens / (time.perf_counter() - t0)

    go("none")  # untimed: first allocations
    variants = list(hand_offs)
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for variant in order:
            seen[variant].append(go(variant))


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    rounds = 2 if quick else 8
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.handoff", "child", str(rounds)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, check=True,
        env={**os.environ, **_compile_env()},
    )  # fmt: skip
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    step = {v: statistics.median(ms for ms, _ in runs) for v, runs in seen.items()}
    rate = {v: statistics.median(tps for _, tps in runs) for v, runs in seen.items()}
    return {
        "setup": {
            "rows": 1,
            "new_tokens": NEW_TOKENS,
            "rounds": rounds,
            "compile": _compile_setting(),
            "bursts_us": list(BURSTS_US),
        },
        "step_ms": {v: round(ms, 3) for v, ms in step.items()},
        "tokens_per_s": {v: round(tps, 1) for v, tps in rate.items()},
        "added_ms": {v: round(_added(r, seen["none"]), 3) for v, r in seen.items() if v != "none"},
        "rounds_step_ms": {v: [round(ms, 3) for ms, _ in runs] for v, runs in seen.items()},
    }


def _added(runs: list[list[float]], none: list[list[float]]) -> float:
    """The median over rounds of a variant's step ms minus `none`'s in the same round."""
    return statistics.median(a[0] - b[0] for a, b in zip(runs, none, strict=True))


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    _child_main(int(sys.argv[2]))
