"""No module of the project imports itself through others: the import graph (grimp, what
import-linter reads; imports for type checking only left out) has no cycle."""

from __future__ import annotations

import grimp

PACKAGES = ("gateway", "policies", "models_registry")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_project_has_no_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    assert cycles(graph) == []
    # negative control: one import back from the core to the speed package closes a cycle
    graph.add_import(importer="gateway.engine.batch.forward", imported="gateway.speed.fast")
    assert any("gateway.engine.batch.forward" in c for c in cycles(graph))
