"""Configuration reaches the code through the frozen configs, and no module keeps hidden process
state, checked over the source: only the entry points and the config builders import
`pytgi.envs` (the one reader of os.environ), the threading defaults are set once at the entry
points, and no module rebinds a global but the two that own process-wide state (the rank, the
tracer)."""

from __future__ import annotations

import ast

from fixtures.import_graph import MODULES, imported_modules

# the CLI (pytgi, text-generation-launcher and their subcommands) and the offline API's config
# builder
ENVS_READERS = ("pytgi.cli.", "pytgi.benchmark.engine.cli", "pytgi.runtime.build")
# the process's tensor-parallel rank and group (torch.distributed's state is per process too),
# and the API process's OpenTelemetry tracer (OpenTelemetry's provider is process-wide too)
GLOBAL_OWNERS = {"pytgi.distributed.parallel_state", "pytgi.utils.tracing"}


def sources() -> dict[str, ast.Module]:
    return {module: ast.parse(path.read_text()) for module, path in MODULES.items()}


def test_only_entry_points_and_config_builders_import_envs():
    importers = {
        module
        for module, path in MODULES.items()
        if "pytgi.envs" in imported_modules(module, path.read_text(), path.name == "__init__.py")
    }
    assert importers and {m for m in importers if not m.startswith(ENVS_READERS)} == set()


def test_only_envs_reads_the_environment():
    readers = {
        module
        for module, tree in sources().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv")
    }
    assert readers == {"pytgi.envs"}


def test_threading_defaults_are_set_once_at_the_entry_points():
    callers = set()
    for module, tree in sources().items():
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and _called_name(node) == "set_default_threading_env":
                    callers.add(f"{module}.{function.name}")
    assert callers == {"pytgi.cli.main.main", "pytgi.cli.main.launcher_main"}


def test_no_module_rebinds_a_global_outside_the_state_owners():
    rebinders = {
        module
        for module, tree in sources().items()
        if any(isinstance(node, ast.Global) for node in ast.walk(tree))
    }
    assert rebinders <= GLOBAL_OWNERS


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def test_quantized_layers_reach_the_kernels_through_the_platform_only():
    """layers/quantization names no backend's modules: the platform's `QuantOps` (from the build
    context) packs and multiplies, on the kernel table chosen at start-up."""
    reaching = {
        (module, target)
        for module, path in MODULES.items()
        if module.startswith("pytgi.layers.quantization")
        for target in imported_modules(module, path.read_text(), path.name == "__init__.py")
        if target.startswith(("pytgi.backends.cpu", "pytgi.backends.cuda"))
    }
    assert reaching == set()
