"""The control plane runs without torch: importing the coordinator, the ingress, the
routers, the journal, the config or the protocol layer in a fresh interpreter loads no
torch (import-linter checks the same statically, `make contracts`)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

TORCH_FREE = (
    "marconi_ray.serve.coordinator.actor",
    "marconi_ray.serve.ingress.api",
    "marconi_ray.serve.ingress.pinned_router",
    "marconi_ray.serve.coordinator.routing.routers",
    "marconi_ray.serve.coordinator.journal",
    "marconi_ray.serve.config",
    "marconi_ray.protocol.planner",
    "marconi_ray.protocol.ops",
    "marconi_kernels.choices",
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    heavy = ("torch", "marconi_kernels.dispatch")
    code = f"import sys, {module}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", (module, out.stdout, out.stderr[-2000:])


def test_the_check_sees_torch_when_it_is_imported() -> None:
    code = "import sys, marconi_ray.engine.engine; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True"


def _import_cycles(graph: Any, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module among `modules`."""
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v] - {v}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return cycles


def _package_graph(grimp: Any, graph: Any, package: str) -> tuple[Any, set[str]]:
    """`package`'s children, each standing for everything under it, and the direct imports
    between them."""
    children = set(graph.find_children(package))
    squashed = grimp.ImportGraph()
    for child in children:
        squashed.add_module(child)
    for child in children:
        for module in {child, *graph.find_descendants(child)}:
            for imported in graph.find_modules_directly_imported_by(module):
                other = next((c for c in children if imported.startswith(c + ".")), imported)
                if other in children and other != child:
                    squashed.add_import(importer=child, imported=other)
    return squashed, children


def test_no_import_cycles() -> None:
    """No module imports itself through others, counting every import (function-local and
    TYPE_CHECKING ones too), and no two sibling subpackages import each other."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("marconi_ray", "loadgen", "marconi_kernels", cache_dir=None)
    assert _import_cycles(graph, set(graph.modules)) == []
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        squashed, children = _package_graph(grimp, graph, package)
        assert _import_cycles(squashed, children) == [], package


def test_the_cycle_check_sees_a_cycle() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.a.x", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a.x", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    assert _import_cycles(graph, set(graph.modules)) == []
    graph.add_import(importer="p.c", imported="p.a")
    assert _import_cycles(graph, set(graph.modules)) == []  # p.a is not p.a.x
    squashed, children = _package_graph(grimp, graph, "p")
    assert _import_cycles(squashed, children) == [["p.a", "p.b", "p.c"]]
    graph.add_import(importer="p.c", imported="p.a.x")
    assert _import_cycles(graph, set(graph.modules)) == [["p.a.x", "p.b", "p.c"]]
