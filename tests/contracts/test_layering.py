"""The package layout is a rule, not a convention: each layer imports only the layers below it, every
library module declares ``__all__``, and ``import ivhl_jax`` exposes the documented flat namespace."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil

import pytest

import ivhl_jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# layer -> the ivhl_jax layers it may import (itself included). models/sims/bench are applications above all.
ALLOWED = {
    "core": {"core"},
    "numerics": {"core", "numerics"},
    "physics": {"core", "numerics", "physics"},
    "nn": {"core", "numerics", "nn"},
    "train": {"core", "numerics", "train"},
    "run": {"core", "numerics", "train", "run"},
}
LAYERS = sorted(ALLOWED)


def _imports(path: str) -> list[tuple[str, int]]:
    """Every module ``path`` imports, at any depth (inside functions too), with its line: ``import a.b``,
    ``from a import b`` (as ``a`` and, for ``ivhl_jax``, ``ivhl_jax.b``) and ``importlib.import_module("a.b")``
    with a literal name."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            if node.module == "ivhl_jax":
                out += [(f"ivhl_jax.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.args[0].value, node.lineno))
    return out


def _layer_modules(layer: str) -> list[str]:
    # family packages (physics/cdt/, ...) are walked too: their modules obey their layer's rule
    folder = os.path.join(ROOT, "ivhl_jax", layer)
    return sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.endswith(".py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_imports_only_layers_below(layer):
    bad = []
    for path in _layer_modules(layer):
        for mod, line in _imports(path):
            parts = mod.split(".")
            if parts[0] != "ivhl_jax" or len(parts) < 2:
                continue
            target = parts[1]
            if target in {"models", "sims", "bench"} or (target in ALLOWED and target not in ALLOWED[layer]):
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {mod}")
            elif target not in ALLOWED:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {mod} (not a layer: use ivhl_jax.<layer>.*)")
    assert not bad, "layering violated:\n" + "\n".join(bad)


def test_no_flat_modules_left_in_the_package_root():
    # the root holds only the namespace (__init__) and the CLI entry point
    assert sorted(f for f in os.listdir(os.path.join(ROOT, "ivhl_jax")) if f.endswith(".py")) == [
        "__init__.py",
        "cli.py",
    ]


@pytest.mark.parametrize("layer", LAYERS)
def test_every_library_module_declares_all(layer):
    pkg = importlib.import_module(f"ivhl_jax.{layer}")
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"ivhl_jax.{layer}.{info.name}")
        assert hasattr(mod, "__all__"), f"ivhl_jax.{layer}.{info.name} has no __all__"
        missing = [n for n in mod.__all__ if not hasattr(mod, n)]
        assert not missing, f"ivhl_jax.{layer}.{info.name}.__all__ names missing objects: {missing}"


def test_flat_namespace_exposes_the_documented_api():
    for name in ivhl_jax.__all__:
        assert hasattr(ivhl_jax, name), name
    # and nothing else public: no helper, no `annotations` from a __future__ import (the application folders
    # and the CLI appear as attributes once something imports them)
    public = {n for n in vars(ivhl_jax) if not n.startswith("_")} | {n for n in dir(ivhl_jax) if not n.startswith("_")}
    extra = public - set(ivhl_jax.__all__) - {"models", "sims", "bench", "cli"}
    assert not extra, sorted(extra)
    assert ivhl_jax.condensate is importlib.import_module("ivhl_jax.physics.condensate")
    assert ivhl_jax.trajectory is importlib.import_module("ivhl_jax.numerics.rollout").trajectory


def test_import_ivhl_jax_stays_light():
    """A kernel user's `import ivhl_jax` loads no plotting, no checkpointing and no CLI (they load on first use)."""
    import subprocess
    import sys

    code = (
        "import sys, ivhl_jax; heavy = ('matplotlib', 'orbax', 'optax', 'ivhl_jax.cli', 'ivhl_jax.run', "
        "'ivhl_jax.train'); print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import ivhl_jax loaded {out.stdout.strip()}"
    # ... and they are there when asked for
    code = (
        "import ivhl_jax; print(ivhl_jax.Checkpointer.__name__, ivhl_jax.run_chunked.__name__, ivhl_jax.train.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["Checkpointer", "run_chunked", "ivhl_jax.train"], out.stderr


def _library_modules() -> dict[str, str]:
    """``{dotted name: path}`` of every module of the package folder (the layers, the root and the CLI)."""
    out = {}
    for d, _, files in os.walk(os.path.join(ROOT, "ivhl_jax")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                out[name] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the library modules it imports (at any depth; ``from pkg import mod`` is an edge to ``pkg.mod``
    when that is a module, else to ``pkg``)."""
    mods = _library_modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        targets = [name for name, _ in _imports(path)]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import mod` imports pkg.mod (pkg's __init__ runs first, as for any submodule: not an edge)
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                if subs and len(subs) == len(node.names):
                    targets.remove(node.module)
                targets += subs
        for target in targets:
            found = resolve(target) if target.startswith("ivhl_jax") else None
            if found and found != mod:
                graph[mod].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that reach themselves, grouped by mutual reachability (a hundred modules: plain search)."""
    reach: dict[str, set[str]] = {}
    for v in graph:
        seen: set[str] = set()
        todo = list(graph[v])
        while todo:
            w = todo.pop()
            if w not in seen:
                seen.add(w)
                todo.extend(graph.get(w, ()))
        reach[v] = seen
    groups = {frozenset(w for w in reach[v] if v in reach[w]) for v in graph if v in reach[v]}
    return sorted(sorted(g) for g in groups)


def test_no_import_cycles_inside_a_layer_or_across():
    """No module reaches itself through imports, counting imports done inside functions (a cycle that only a
    function-level import keeps working is still a cycle: each side needs the other)."""
    found = _cycles(_import_graph())
    assert found == [], found


def test_the_cycle_finder_finds_a_function_level_cycle(tmp_path):
    a = tmp_path / "a.py"
    a.write_text(
        "import importlib\n\n\ndef f():\n    from ivhl_jax.core import backend\n"
        "    importlib.import_module('ivhl_jax.bench.x')\n"
    )
    assert [m for m, _ in _imports(str(a))] == ["importlib", "ivhl_jax.core", "ivhl_jax.bench.x"]
    assert _cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert _cycles({"x": {"y"}, "y": set()}) == []


def test_the_library_never_imports_the_application_folders():
    """The layers and the package root never import ``ivhl_jax.bench``, ``.models`` or ``.sims`` (inside functions
    and through ``importlib.import_module`` included): ``ivhl tune`` and everything ``import ivhl_jax`` wires live in
    the library. Only the CLI dispatches to the application folders (``ivhl sim``, ``ivhl bench``, the transformer
    area of ``ivhl tune``)."""
    bad = []
    for name, path in sorted(_library_modules().items()):
        if name == "ivhl_jax.cli":
            continue
        for mod, line in _imports(path):
            if mod.split(".")[:2] in (["ivhl_jax", "bench"], ["ivhl_jax", "models"], ["ivhl_jax", "sims"]):
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_host_is_read_in_one_place():
    """The CPU's model and flags come from one function, ``ivhl_jax.core.host.facts`` (the cores too: see
    test_module_boundaries): no other file of the library, the simulations, the models or the benchmarks opens
    ``/proc/cpuinfo``."""
    readers = []
    for folder in ("ivhl_jax", "sims", "models", "bench"):
        for d, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                path = os.path.join(d, f)
                if f.endswith(".py") and "/proc/cpuinfo" in open(path, encoding="utf-8").read():
                    readers.append(os.path.relpath(path, ROOT).replace(os.sep, "/"))
    assert readers == ["ivhl_jax/core/host.py"], readers
