"""The wheel against the source tree it was built from, and every module of it imported from a fresh install.

    python .ci/wheel_check.py SOURCE_ROOT WHEEL            # run by the fresh venv's python, cwd outside SOURCE_ROOT

1. Every module of the source tree that the wheel must carry (every ``.py`` file under a folder with an
   ``__init__.py`` in ``ivhl_jax/``, ``models/``, ``sims/`` and ``bench/``, mapped as pyproject's package-dir maps
   them, ``bench/studies/`` excepted) is in the wheel, and nothing of ``bench/studies/`` is; each file of the
   package-data is in it.
2. Each of those modules imports from the installed package (not from SOURCE_ROOT). A module that needs a
   package of a user-facing optional extra (``cpu-kernels``: numba, ...) and finds it missing is reported as
   skipped, not failed; any other missing package (a runtime import of a dev-only tool) fails.

A failure prints one line per module naming it (``missing from the wheel: ivhl_jax.physics.cdt.moves``) and exits 1.
Only the standard library is used here: the fresh venv holds the wheel and its dependencies, nothing else.
``tests/contracts/test_packaging.py`` uses :func:`expected_packages` to check pyproject's package list.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
import traceback
import zipfile

# Folders of the source tree that are never installed (scripts run from a checkout).
NOT_INSTALLED = ("bench/studies",)


def package_dirs(root: str) -> dict[str, str]:
    """pyproject's package-dir mapping: installed package name -> source folder (relative to ``root``)."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def expected_packages(root: str) -> dict[str, str]:
    """Installed package name -> source folder (relative to ``root``), for every folder holding Python files
    (with an ``__init__.py`` or without: a namespace package is reported too) under the mapped folders,
    ``NOT_INSTALLED`` excepted."""
    mapping = package_dirs(root)
    folders = {os.path.normpath(os.path.join(root, f)) for f in mapping.values()}
    out: dict[str, str] = {}
    for name, folder in mapping.items():
        base = os.path.normpath(os.path.join(root, folder))
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            if any(rel == x or rel.startswith(x + "/") for x in NOT_INSTALLED) or (
                    dirpath != base and os.path.normpath(dirpath) in folders):  # another mapping's folder
                dirnames[:] = []
                continue
            if not any(f.endswith(".py") for f in filenames):
                continue
            sub = os.path.relpath(dirpath, base).replace(os.sep, "/")
            out[name if sub == "." else name + "." + sub.replace("/", ".")] = rel
    return dict(sorted(out.items()))


def expected_modules(root: str) -> dict[str, str]:
    """Module name -> path in the wheel, for every ``.py`` file of :func:`expected_packages`."""
    out: dict[str, str] = {}
    for pkg, rel in expected_packages(root).items():
        for fname in sorted(os.listdir(os.path.join(root, rel))):
            if fname.endswith(".py"):
                stem = fname[:-3]
                mod = pkg if stem == "__init__" else f"{pkg}.{stem}"
                out[mod] = pkg.replace(".", "/") + "/" + fname
    return out


def package_data(root: str) -> list[str]:
    """Paths in the wheel of pyproject's package-data files (patterns are file names here)."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"].get("package-data", {})
    return [pkg.replace(".", "/") + "/" + name for pkg, names in data.items() for name in names]


def optional_imports(root: str) -> dict[str, str]:
    """Import name -> extra, for the packages of pyproject's optional extras other than ``dev`` and ``docs``."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]

    def name(req: str) -> str:
        out = req.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            out = out.split(sep)[0]
        return out.strip().lower().replace("-", "_")

    required = {name(r) for r in project.get("dependencies", [])}  # jax of the gpu extra is no optional import
    out: dict[str, str] = {}
    for extra, reqs in project.get("optional-dependencies", {}).items():
        if extra not in ("dev", "docs"):
            for req in reqs:
                if name(req) not in required:
                    out.setdefault(name(req), extra)
    return out


def main(argv: list[str]) -> int:
    root, wheel = (os.path.abspath(a) for a in argv)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    expected = expected_modules(root)
    failures = [f"missing from the wheel: {mod} ({path})" for mod, path in expected.items() if path not in names]
    failures += [f"missing from the wheel: package data {path}" for path in package_data(root) if path not in names]
    failures += [f"not installed but in the wheel: {n}" for n in sorted(names)
                 if n.startswith("ivhl_jax/bench/studies/") or n.startswith(("tests/", "bench/", "models/", "sims/"))]
    optional = optional_imports(root)
    skipped = []
    for mod in expected:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top in optional:
                skipped.append(f"{mod} (needs the extra {optional[top]}: {top})")
            else:
                failures.append(f"cannot import {mod} from the installed wheel: {type(e).__name__}: {e}")
                print(traceback.format_exc(), file=sys.stderr)
            continue
        except BaseException as e:  # noqa: BLE001 - every failure is reported, the walk goes on
            failures.append(f"cannot import {mod} from the installed wheel: {type(e).__name__}: {e}")
            print(traceback.format_exc(), file=sys.stderr)
            continue
        if os.path.abspath(m.__file__ or "").startswith(root + os.sep):
            failures.append(f"{mod} was imported from the source tree ({m.__file__}), not from the wheel")
    for line in skipped:
        print(f"skipped: {line}")
    for line in failures:
        print(line)
    print(f"wheel check: {len(expected)} modules, {len(skipped)} skipped (optional extras), {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
