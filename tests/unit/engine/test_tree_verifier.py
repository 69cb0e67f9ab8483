"""The tree verifier: greedy is the chain rule on a chain and the longest argmax path on a
tree; sampled, the first two emitted tokens follow the target's joint distribution on
several tree shapes (chi-square), and a wrong multi-candidate rule fails that test."""

from __future__ import annotations

import math

import pytest
import torch

from gateway.engine.tree_verifier import (
    children_of,
    depths,
    path_rows,
    verify_tree_greedy,
    verify_tree_sampled,
)
from gateway.engine.verifier import verify_greedy

VOCAB = 5
DRAWS = 6000


def critical_value(df: int, z: float = 3.719) -> float:
    """Upper 1e-4 quantile of chi-square(df) (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


class World:
    """A target p and a draft q over VOCAB tokens for every context (a tuple of tokens),
    drawn once per context from a seeded generator: p and q differ enough that both the
    acceptance and the residual carry mass."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._p: dict[tuple[int, ...], torch.Tensor] = {}
        self._q: dict[tuple[int, ...], torch.Tensor] = {}

    def _dist(self, table: dict, ctx: tuple[int, ...], salt: int) -> torch.Tensor:
        if ctx not in table:
            g = torch.Generator().manual_seed(hash((self.seed, salt, ctx)) % (2**31))
            table[ctx] = torch.softmax(
                torch.randn(VOCAB, generator=g, dtype=torch.float64) * 1.5, -1
            )
        return table[ctx]

    def p(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self._dist(self._p, ctx, 1)

    def q(self, ctx: tuple[int, ...]) -> torch.Tensor:
        return self._dist(self._q, ctx, 2)


def draft_tree(world: World, widths: list[int], gen: torch.Generator):
    """Children of every node at depth d drawn i.i.d. from q at that node, widths[d] of them
    (breadth-first order). Returns tokens, parents, q rows (n, V), p rows (n + 1, V)."""
    tokens: list[int] = []
    parents: list[int] = []
    q_rows: list[torch.Tensor] = []
    paths: list[tuple[int, ...]] = [()]  # per feed row
    frontier = [-1]
    for width in widths:
        nxt = []
        for par in frontier:
            ctx = paths[par + 1]
            q = world.q(ctx)
            for _ in range(width):
                x = int(torch.multinomial(q, 1, generator=gen))
                tokens.append(x)
                parents.append(par)
                q_rows.append(q)
                paths.append((*ctx, x))
                nxt.append(len(tokens) - 1)
        frontier = nxt
    p_rows = torch.stack([world.p(c) for c in paths])
    q_t = torch.stack(q_rows) if q_rows else torch.zeros(0, VOCAB, dtype=torch.float64)
    return tokens, parents, q_t, p_rows


def pair_counts(widths: list[int], seed: int, residual_of=None) -> torch.Tensor:
    """Counts of the first two emitted tokens over DRAWS tree steps (the second drawn from
    the target after the first when the step emitted one token only)."""
    world = World(seed)
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    kw = {} if residual_of is None else {"residual_of": residual_of}
    for _ in range(DRAWS):
        tokens, parents, q, p = draft_tree(world, widths, gen)
        v = verify_tree_sampled(tokens, parents, q, p, gen, **kw)
        out = [tokens[a] for a in v.path] + [v.token]
        if len(out) == 1:
            out.append(int(torch.multinomial(world.p((out[0],)), 1, generator=gen)))
        counts[out[0], out[1]] += 1
    return counts


def chi_square(widths: list[int], seed: int, counts: torch.Tensor) -> tuple[float, float]:
    world = World(seed)
    expect = torch.stack([world.p(())[a] * world.p((a,)) for a in range(VOCAB)]) * DRAWS
    keep = expect > 5
    stat = float((((counts - expect) ** 2) / expect)[keep].sum())
    return stat, critical_value(int(keep.sum()) - 1)


SHAPES = [[1, 1, 1], [3], [2, 2], [3, 1, 1], [4, 2]]


@pytest.mark.parametrize("widths", SHAPES, ids=str)
def test_sampled_tree_emits_the_target_distribution(widths: list[int]) -> None:
    stat, critical = chi_square(widths, 11, pair_counts(widths, 11))
    assert stat < critical, (stat, critical)


def no_subtraction(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A wrong multi-candidate rule: a rejected candidate's q is not taken out of the
    residual (the next sibling is tested against r unchanged)."""
    return r


@pytest.mark.parametrize("widths", [[3], [2, 2]], ids=str)
def test_the_distribution_test_catches_a_rule_that_keeps_the_rejected_mass(widths) -> None:
    """Negative control: the same test must fail the wrong rule."""
    counts = pair_counts(widths, 11, residual_of=no_subtraction)
    stat, critical = chi_square(widths, 11, counts)
    assert stat > critical, (stat, critical)


def test_tree_helpers() -> None:
    parents = [-1, -1, 0, 0, 2]
    assert children_of(parents) == [[0, 1], [2, 3], [], [4], [], []]
    assert depths(parents) == [1, 1, 2, 2, 3]
    assert path_rows([0, 2, 4]) == [0, 1, 3, 5]
    with pytest.raises(ValueError):
        children_of([-1, 3])


@pytest.mark.parametrize("trial", range(30))
def test_greedy_on_a_chain_is_the_chain_rule(trial: int) -> None:
    gen = torch.Generator().manual_seed(trial)
    n = int(torch.randint(0, 6, (1,), generator=gen))
    draft = torch.randint(0, 3, (n,), generator=gen).tolist()
    argmax = torch.randint(0, 3, (n + 1,), generator=gen).tolist()
    chain = verify_greedy(draft, argmax)
    tree = verify_tree_greedy(draft, list(range(-1, n - 1)), argmax)
    assert tree.path == list(range(chain.accepted)) and tree.token == chain.token


def test_greedy_takes_the_branch_the_target_agrees_with() -> None:
    # root -> {5 (node 0), 7 (node 1)}; node 0 -> 2 (node 2); node 1 -> 3 (node 3) -> 4 (node 4)
    tokens, parents = [5, 7, 2, 3, 4], [-1, -1, 0, 1, 3]
    # argmax per feed row: root 7, node0 2, node1 3, node2 9, node3 4, node4 8
    v = verify_tree_greedy(tokens, parents, [7, 2, 3, 9, 4, 8])
    assert v.path == [1, 3, 4] and v.token == 8
    v = verify_tree_greedy(tokens, parents, [5, 1, 3, 9, 4, 8])
    assert v.path == [0] and v.token == 1
    v = verify_tree_greedy(tokens, parents, [6, 1, 3, 9, 4, 8])
    assert v.path == [] and v.token == 6
