"""The package's import graph, built from every module's imports (function-level and
TYPE_CHECKING ones included), follows the layer order of docs/ARCHITECTURE.md: a package imports
only packages in lower layers, and no two packages import each other, even indirectly."""

from __future__ import annotations

from fixtures.import_graph import MODULES, imported_modules, package_edges, package_of

# Highest layer first. A package may import any package in a lower layer, none in its own layer
# or above. "pytgi" is the package's own __init__ (the lazy `LLM` / `SamplingParams` exports).
LAYERS: list[set[str]] = [
    {"pytgi", "__main__", "deploy"},  # deploy: pytgi on cluster engines (Ray Serve)
    {"cli"},
    {"benchmark"},
    {"server", "runtime"},  # runtime: the engine with its workers, and the offline LLM
    {"router"},
    {"metrics"},
    {"engine"},
    {"worker"},
    {"sampling"},
    {"models"},
    {"layers"},
    {"backends", "distributed"},
    {"grammar"},
    {"tokenizer"},
    {"messages"},  # what crosses the engine's boundaries: plain data
    {"demo_model", "utils", "envs"},
    {"config"},
    {"errors", "version"},
]
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}


def test_every_package_has_a_layer():
    packages = {package_of(module) for module in MODULES}
    assert packages - RANK.keys() == set()


def test_imports_point_downward():
    upward = {
        edge: modules for edge, modules in package_edges().items() if RANK[edge[0]] >= RANK[edge[1]]
    }
    assert upward == {}


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for source, target in package_edges():
        graph.setdefault(source, set()).add(target)
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []


def test_engine_imports_neither_workers_nor_models():
    reached = {target for source, target in package_edges() if source == "engine"}
    assert reached & {"worker", "models", "layers", "backends", "sampling"} == set()


def test_function_level_and_relative_imports_are_seen():
    """The graph sees imports inside functions, and `from pytgi import x` as the module x."""
    source = "def f():\n    from pytgi import envs\n    from ..worker import executor\n"
    found = imported_modules("pytgi.engine.probe", source)
    assert found == {"pytgi.envs", "pytgi.worker.executor"}
