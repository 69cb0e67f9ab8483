"""Which prefilling rows feed which tokens of their prompt in a step's prefill forward
(batch/scheduler.py, step 1)."""

from __future__ import annotations

from gateway.engine.batch.rows import Row

TAIL = 4  # a row prefilling alone takes a rest of up to 1/TAIL chunk with its chunk


def prefill_group(waiting: list[Row], chunk: int, budget: int) -> list[tuple[Row, list[int]]]:
    """The rows of `waiting` (the prefilling rows, oldest first; at least one) that feed
    the next prefill forward, each with its tokens: at most `chunk` tokens a row, within
    a budget of `budget` tokens (rows x longest chunk, padding included): arrivals that
    come together prefill together, where the matrix products are more efficient per
    token. A row joins the oldest one's forward only if its prompt is as far along,
    within one chunk: the forward attends every row over the longest row's keys, and a
    fresh arrival beside a long prompt's late chunk would attend over thousands of masked
    ones.

    A row that prefills alone takes the rest of its prompt whole when that rest is at
    most a chunk and a quarter (`TAIL`) and within the budget: a forward's fixed cost
    is large against a few tokens', so a prompt just over a chunk prefilled as two
    forwards costs more than one, and its first token comes a step later. Alone, no other row
    is padded to its width, so a slot's pad still holds every filler."""
    group: list[tuple[Row, list[int]]] = []
    width = 0  # the first row's chunk: the others feed at most as many tokens
    for row in waiting:
        left = len(row.cfg.prompt_ids) - 1 - row.prefilled
        if not group:
            width = min(left, chunk)
        elif (len(group) + 1) * width > budget:
            break
        elif abs(row.prefilled - group[0][0].prefilled) > chunk:
            continue  # every row attends to the group's longest span: keep them close
        take = min(left, width)
        group.append((row, row.ctx[row.prefilled : row.prefilled + take]))
    if len(group) == 1:  # a short rest of one row's prompt goes in now, not a step later
        row, tokens = group[0]
        left = len(row.cfg.prompt_ids) - 1 - row.prefilled
        if left - len(tokens) <= chunk // TAIL and left <= budget:
            group[0] = (row, row.ctx[row.prefilled : row.prefilled + left])
    return group
