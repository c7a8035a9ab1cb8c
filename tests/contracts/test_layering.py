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
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            if node.module == "ivhl_jax":
                out += [(f"ivhl_jax.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
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
