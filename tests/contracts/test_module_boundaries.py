"""One home per concept, and modules that keep their private names to themselves.

* No module of the library, the models, the simulations or the benchmarks uses another project module's private
  name (``from X import _name``, or ``X._name`` with X an imported project module): a helper two modules share is
  public in its one home.
* The platform and the machine's core count are read only by :mod:`ivhl_jax.core.backend` (what runs here, how
  many cores, which plugins are installed); everything else asks it.
"""

from __future__ import annotations

import ast
import importlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ("ivhl_jax", "models", "sims", "bench")  # the project's packages (tests may look inside modules)


def _files() -> list[str]:
    """The project's modules (test files, which may look inside the modules they test, are not scanned)."""
    out = []
    for top in SCANNED:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            if "tests" in os.path.relpath(d, ROOT).split(os.sep):
                continue
            out += [os.path.join(d, f) for f in files if f.endswith(".py") and not f.startswith("test_")]
    return sorted(out)


def _module_of(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_project_module(dotted: str) -> bool:
    """Whether ``dotted`` names a project module (a file or package, or a module of ``ivhl_jax``'s flat namespace)."""
    parts = dotted.split(".")
    if parts[0] not in SCANNED:
        return False
    base = os.path.join(ROOT, *parts)
    if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")):
        return True
    if parts[0] == "ivhl_jax":  # `from ivhl_jax import mera`: the flat namespace re-exports family packages
        try:
            obj = importlib.import_module(".".join(parts[:-1]))
        except ImportError:
            return False
        return type(getattr(obj, parts[-1], None)).__name__ == "module"
    return False


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    pkg = module.split(".") if is_package else module.split(".")[:-1]
    base = pkg[: len(pkg) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def private_uses(source: str, rel: str) -> list[str]:
    """``file:line uses NAME of MODULE`` for every private name of another project module used in ``source``, the
    text of the file ``rel`` (relative to the repository root)."""
    module = _module_of(os.path.join(ROOT, rel))
    tree = ast.parse(source)
    bad: list[str] = []
    aliases: dict[str, str] = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in SCANNED:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(node, module, rel.endswith("__init__.py"))
            if src.split(".")[0] not in SCANNED:
                continue
            package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
            for a in node.names:
                # a package's private submodule (train/_digits_data.py) is its own modules' to import
                own_submodule = src == package and _is_project_module(f"{src}.{a.name}")
                if _is_private(a.name) and src != module and not own_submodule:
                    bad.append(f"{rel}:{node.lineno} imports {a.name} from {src}")
                elif _is_project_module(f"{src}.{a.name}"):
                    aliases[a.asname or a.name] = f"{src}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            chain = _dotted(node.value)
            if chain is None:
                continue
            head, _, rest = chain.partition(".")
            if head not in aliases:
                continue
            target = aliases[head] + (f".{rest}" if rest else "")
            if target != module and _is_project_module(target):
                bad.append(f"{rel}:{node.lineno} uses {node.attr} of {target}")
    return bad


def _scan(check, skip=frozenset()) -> list[str]:
    """Every line ``check(path, rel)`` reports over the project's modules (``rel``: the path from the root, with
    ``/``; ``skip``: such paths left out)."""
    found = []
    for path in _files():
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if rel not in skip:
            found += check(path, rel)
    return found


def test_no_private_names_used_across_modules():
    bad = _scan(lambda path, rel: private_uses(open(path, encoding="utf-8").read(), rel))
    assert not bad, (
        "private names used across modules (make the name public in its one home, or move the "
        "helper there):\n" + "\n".join(bad)
    )


def test_the_checker_sees_both_forms():
    # the contract above must be able to fail: both forms of reaching into another module are reported, a
    # module's own private names and dunders are not
    src = (
        "from ivhl_jax.core.validation import _fmt_shape\nfrom ivhl_jax.core import backend as B\n"
        "import ivhl_jax.core.precision\nx = B._table\ny = ivhl_jax.core.precision._policy\n"
        "from sims.probe import _mine\nz = B.__name__\nfrom ivhl_jax.train import _digits_data\n"
    )
    found = private_uses(src, os.path.join("sims", "probe.py"))
    assert private_uses("from ivhl_jax.train import _digits_data\n", os.path.join("ivhl_jax", "train", "x.py")) == []
    assert [f.split(" ", 1)[1] for f in found] == [
        "imports _fmt_shape from ivhl_jax.core.validation",
        "imports _digits_data from ivhl_jax.train",
        "uses _table of ivhl_jax.core.backend",
        "uses _policy of ivhl_jax.core.precision",
    ], found


# ------------------------------------------------------------------------------------------------ platform
# What reads the platform or the machine: the process's CPU set and count, the default backend's name, the first
# device's platform, the installed PJRT plugins. core.backend owns them with core.host (the one reader of the
# host's cores and CPU); core.tuning_cache fingerprints the machine through core.host.
PLATFORM_CALLS = (
    "sched_getaffinity",
    "cpu_count",
    "default_backend",
    "process_cpu_count",
    "entry_points",
    "jax_plugins",
)
PLATFORM_HOME = {"ivhl_jax/core/backend.py", "ivhl_jax/core/host.py"}
PLUGIN = re.compile(r"^(jax_(cuda|rocm)[0-9]*_plugin|libtpu|jax_plugins)$")  # a JAX platform plugin's module


def _platform_reads(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    rel = os.path.relpath(path, ROOT)
    out = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
            # jax.devices()[0].platform / jax.devices()[i].platform: the default platform by another door
            if (
                name == "platform"
                and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.value, ast.Call)
                and (_dotted(node.value.value.func) or "").endswith("devices")
            ):
                out.append(f"{rel}:{node.lineno} reads jax.devices()[...].platform")
                continue
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and PLUGIN.match(node.value):
            out.append(f"{rel}:{node.lineno} probes the plugin {node.value}")
            continue
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names] + [node.module or ""]
            name = next((n for n in names if n in PLATFORM_CALLS), None)
        elif isinstance(node, ast.Import):
            name = next((a.name for a in node.names if a.name in PLATFORM_CALLS), None)
        if name in PLATFORM_CALLS:
            out.append(f"{rel}:{node.lineno} reads {name}")
    return out


def test_platform_and_core_count_are_read_only_by_core_backend():
    bad = _scan(lambda path, rel: _platform_reads(path), skip=PLATFORM_HOME)
    assert not bad, (
        "the platform and core count have one home, ivhl_jax.core.backend (ask it: "
        "backend.platform(), backend.host_cores(), ...):\n" + "\n".join(bad)
    )
