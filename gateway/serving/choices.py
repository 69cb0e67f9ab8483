"""n > 1: the choices of one request as separate decode rows, read as one stream.

Each choice is its own row of the target's batch (`InferenceWorker.submit_decode` puts
concurrent rows of one engine into one batch, so n choices share every target forward).
`merged_events` interleaves their events as they arrive; `merged_result` sums them into the
one result that usage, the audit record and the acceptance history read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from gateway.engine import DecodeResult, DecodeStats
from gateway.limits import INT64_MIN
from gateway.serving.worker import InferenceWorker, Job

_DONE = object()


def seed_of(seed: int | None, index: int) -> int | None:
    """Choice ``index``'s seed: the request's seed + index, wrapped into int64 (choice 0
    keeps the request's seed, so n = 1 decodes as before)."""
    if seed is None or index == 0:
        return seed
    return (seed + index - INT64_MIN) % 2**64 + INT64_MIN


async def merged_events(
    worker: InferenceWorker, jobs: Sequence[Job]
) -> AsyncIterator[tuple[int, Any]]:
    """(job index, event) of every job until all have ended; an error of one is raised."""
    if len(jobs) == 1:
        async for event in worker.events(jobs[0]):
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, job: Job) -> None:
        try:
            async for event in worker.events(job):
                await queue.put((index, event, None))
        except Exception as exc:
            await queue.put((index, None, exc))
            return
        await queue.put((index, _DONE, None))

    tasks = [asyncio.create_task(pump(i, job)) for i, job in enumerate(jobs)]
    try:
        running = len(tasks)
        while running:
            index, event, error = await queue.get()
            if error is not None:
                raise error
            if event is _DONE:
                running -= 1
                continue
            yield index, event
    finally:
        for task in tasks:
            task.cancel()


def _stats(all_stats: Sequence[DecodeStats]) -> DecodeStats:
    first = all_stats[0]
    out = DecodeStats(mode=first.mode, proposer=first.proposer, c=first.c)
    for st in all_stats:
        for name in ("drafted", "accepted", "rejected", "num_drafts", "target_forwards",
                     "draft_forwards", "generated_tokens"):  # fmt: skip
            setattr(out, name, getattr(out, name) + getattr(st, name))
        for name in ("draft_s", "verify_s", "prefill_s", "other_s"):
            setattr(out, name, getattr(out, name) + getattr(st, name))
        width = max(len(out.accepted_per_pos), len(st.accepted_per_pos))
        out.accepted_per_pos = [
            (out.accepted_per_pos[j] if j < len(out.accepted_per_pos) else 0)
            + (st.accepted_per_pos[j] if j < len(st.accepted_per_pos) else 0)
            for j in range(width)
        ]
        out.k_history += st.k_history
    out.final_k = first.final_k
    out.cached_prompt_tokens = first.cached_prompt_tokens  # the prompt counts once in usage
    decode_forwards = sum(st.target_forwards - (1 if st.prefill_s > 0 else 0) for st in all_stats)
    out.tokens_per_target_forward = (
        out.generated_tokens / decode_forwards if decode_forwards > 0 else 0.0
    )
    return out


def merged_result(results: Sequence[DecodeResult]) -> DecodeResult:
    """One result: the only one, or the choices' tokens, logprobs and counters summed (the
    text and finish reason are the first choice's; per-choice ones stay on the choices)."""
    if len(results) == 1:
        return results[0]
    return replace(
        results[0],
        token_ids=tuple(t for r in results for t in r.token_ids),
        logprobs=tuple(lp for r in results for lp in r.logprobs),
        stats=_stats([r.stats for r in results]),
    )
