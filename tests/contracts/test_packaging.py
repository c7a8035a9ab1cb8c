"""What the wheel ships: pyproject's package list against the tree, no path tricks, one version, no studies.

``.ci/run`` builds the wheel and imports every module of it outside the repository; these checks catch the same
mistakes in the default suite, from the checkout.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import pathlib
import tomllib

import pytest

import ivhl_jax

REPO = pathlib.Path(__file__).resolve().parents[2]


def _wheel_check():
    spec = importlib.util.spec_from_file_location("wheel_check", REPO / ".ci" / "wheel_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setuptools() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_package_folder_of_the_tree_is_listed_for_the_wheel():
    expected = _wheel_check().expected_packages(str(REPO))
    listed = set(_setuptools()["packages"])
    missing = sorted(set(expected) - listed)
    extra = sorted(listed - set(expected))
    assert not missing, (
        f"pyproject.toml [tool.setuptools] packages misses {missing} (folders {[expected[m] for m in missing]})"
    )
    assert not extra, f"pyproject.toml [tool.setuptools] packages lists {extra}, which the tree does not hold"
    assert "ivhl_jax.physics.cdt" in expected and "ivhl_jax.train.parallel" in expected  # nested packages are seen
    assert not any(".studies" in p for p in expected)  # bench/studies/ is not installed


def test_every_installed_folder_is_a_regular_package():
    # a folder without __init__.py would install as a namespace package only by accident
    missing = [
        rel
        for rel in _wheel_check().expected_packages(str(REPO)).values()
        if not (REPO / rel / "__init__.py").is_file()
    ]
    assert not missing, f"no __init__.py in {missing}"


def test_package_data_exists_and_every_data_file_is_declared():
    wc = _wheel_check()
    declared = set(wc.package_data(str(REPO)))
    for path in declared:
        pkg, _, name = path.rpartition("/")
        folder = wc.expected_packages(str(REPO))[pkg.replace("/", ".")]
        assert (REPO / folder / name).is_file(), f"package-data {path}: no file {folder}/{name}"
    for pkg, folder in wc.expected_packages(str(REPO)).items():
        for f in (REPO / folder).iterdir():
            if f.is_file() and f.suffix not in (".py", ".pyc"):
                assert f"{pkg.replace('.', '/')}/{f.name}" in declared, (
                    f"{folder}/{f.name} is not in [tool.setuptools.package-data] and would be left out of the wheel"
                )


def test_checkout_imports_only_the_package():
    # ivhl_jax's own folder is its whole __path__: the repository root is not (tests/, docs/, a second
    # ivhl_jax/ would otherwise be importable below ivhl_jax)
    assert [pathlib.Path(p).resolve() for p in ivhl_jax.__path__] == [REPO / "ivhl_jax"]
    for name in ("ivhl_jax.tests", "ivhl_jax.docs", "ivhl_jax.ivhl_jax", "ivhl_jax.notebooks"):
        assert importlib.util.find_spec(name) is None, f"{name} is importable from the checkout"
    # the editable install maps the repository folders as the wheel installs them
    for name, folder in (("ivhl_jax.models", "models"), ("ivhl_jax.sims", "sims"), ("ivhl_jax.bench", "bench")):
        module = importlib.import_module(name)
        assert pathlib.Path(module.__file__).resolve() == REPO / folder / "__init__.py"


def test_version_has_one_source():
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ivhl_jax.__version__"}
    installed = importlib.metadata.version("ivhl_jax")
    if installed != ivhl_jax.__version__:
        pytest.skip(f"the editable install's metadata ({installed}) predates a version change: reinstall")
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## {ivhl_jax.__version__}" in changelog, f"CHANGELOG.md has no section for {ivhl_jax.__version__}"


def _imports(path: pathlib.Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _is_study(name: str) -> bool:
    return name == "bench" or name.startswith(("bench.", "ivhl_jax.bench.studies"))


def test_library_tests_do_not_import_the_studies():
    offenders = [
        f"{path.relative_to(REPO)}: {n}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for n in _imports(path)
        if _is_study(n)
    ]
    assert not offenders, f"library tests import the studies (their tests live in bench/studies/tests): {offenders}"


def test_installed_modules_do_not_import_the_studies():
    offenders = [
        f"{path.relative_to(REPO)}: {n}"
        for folder in ("ivhl_jax", "models", "sims", "bench")
        for path in sorted((REPO / folder).rglob("*.py"))
        if "studies" not in path.relative_to(REPO).parts
        for n in _imports(path)
        if _is_study(n)
    ]
    assert not offenders, f"installed modules import a study (not in the wheel): {offenders}"
