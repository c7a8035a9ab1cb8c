"""The documentation sources: the build fetches nothing (MathJax comes from an installed package, docs/hooks.py),
and the pages that list the notebooks list every one."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "hooks.py"


def _load_hooks():
    spec = importlib.util.spec_from_file_location("ivhl_docs_hooks", HOOKS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_hooks_reach_no_network():
    tree = ast.parse(HOOKS.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"urllib", "http", "socket", "subprocess", "requests"}, imported
    assert "django-static-mathjax" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_mathjax_is_copied_from_the_installed_package(tmp_path):
    if importlib.util.find_spec("mathjax") is None:
        pytest.skip("docs extra not installed: pip install -e '.[docs]'")
    hooks = _load_hooks()
    hooks.on_post_build({"site_dir": str(tmp_path)})
    vendor = tmp_path / "javascripts" / "vendor" / "mathjax"
    assert (vendor / "tex-svg.js").stat().st_size > 1_000_000
    assert any((vendor / "input" / "tex" / "extensions").iterdir())


def test_a_missing_mathjax_is_a_clear_error(monkeypatch):
    hooks = _load_hooks()
    monkeypatch.setattr(hooks, "MATHJAX_PACKAGE", "no_such_package_ivhl")
    with pytest.raises(RuntimeError, match="docs extra"):
        hooks._mathjax_es5()


def test_readme_and_the_landing_page_list_every_notebook():
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 8
    for page in ("README.md", "docs/index.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        missing = [n for n in notebooks if f"notebooks/{n}" not in text]
        assert not missing, f"{page} does not list {missing}"


def test_every_api_page_is_in_the_nav_and_the_api_index():
    pages = sorted(p.name for p in (ROOT / "docs" / "api").glob("*.md") if p.name != "index.md")
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    assert not [p for p in pages if f"api/{p}" not in nav], "API pages missing from mkdocs.yml's nav"
    assert not [p for p in pages if f"({p})" not in index], "API pages missing from docs/api/index.md"


def _python_blocks(text: str) -> list[str]:
    import re
    import textwrap

    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


def test_the_readme_and_design_stepper_example_is_one_example():
    """The example every reader copies first shows the same lines in README and docs/design.md (each runs as
    printed in tests/contracts/test_guide_examples.py)."""
    blocks = [
        b
        for page in ("README.md", "docs/design.md")
        for b in _python_blocks((ROOT / page).read_text(encoding="utf-8"))
        if "ivhl.trajectory(st, chain" in b
    ]
    assert len(blocks) == 2 and blocks[0] == blocks[1], "README and docs/design.md should show the same example"


def test_the_docs_build_targets_turn_the_end_of_life_banner_off():
    """Material for MkDocs prints an end-of-life banner on every build unless NO_MKDOCS_2_WARNING=1: `make docs` and
    `make docs-serve` set it (so does the site test's build)."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    env = next(ln for ln in make.splitlines() if ln.startswith("DOCS_ENV ="))
    assert "NO_MKDOCS_2_WARNING=1" in env
    for target in ("docs:", "docs-serve:"):
        recipe = make.split(f"\n{target}", 1)[1].splitlines()[1]
        assert recipe.startswith("\t$(DOCS_ENV) $(BIN)/mkdocs "), (target, recipe)


def test_the_notebook_kernels_of_the_build_use_ipc_transport(monkeypatch):
    """on_config puts a Jupyter config folder first on JUPYTER_CONFIG_PATH whose nbconvert config makes the
    kernels talk over Unix sockets in that private folder (no "running over TCP without encryption" warning per
    notebook), keeping the user's own config path after it; a second build of the process reuses it."""
    import json
    import os

    if os.name != "posix":
        pytest.skip("IPC transport is POSIX-only; elsewhere the kernels keep TCP")
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "/user/jupyter")
    hooks = _load_hooks()
    assert hooks.on_config({"x": 1}) == {"x": 1}
    first, rest = os.environ["JUPYTER_CONFIG_PATH"].split(os.pathsep, 1)
    assert rest == "/user/jupyter"
    settings = json.loads((Path(first) / "jupyter_nbconvert_config.json").read_text())
    assert settings["KernelManager"]["transport"] == "ipc"
    assert os.path.dirname(settings["KernelManager"]["ip"]) == first
    hooks.on_config({})
    assert os.environ["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [first, "/user/jupyter"]


@pytest.mark.slow  # starts a Jupyter kernel
def test_a_notebook_executes_through_the_build_without_the_tcp_warning(tmp_path, monkeypatch, capfd):
    pytest.importorskip("mkdocs_jupyter", reason="docs extra not installed: pip install -e '.[docs]'")
    import nbformat
    from mkdocs_jupyter.nbconvert2 import nb2html

    monkeypatch.delenv("JUPYTER_CONFIG_PATH", raising=False)
    _load_hooks().on_config({})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, tmp_path / "t.ipynb")
    assert "42" in nb2html(str(tmp_path / "t.ipynb"), execute=True, kernel_name="python3")
    assert "without encryption" not in capfd.readouterr().err
