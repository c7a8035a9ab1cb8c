"""Repository inventory: line counts, absolute + relative import resolution, lazy edges, cycle detection."""

from __future__ import annotations

import os

from bench.studies import inventory


def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_counts_imports_and_cycles(tmp_path):
    r = str(tmp_path)
    _write(r, "ivhl_jax/__init__.py", "")
    _write(r, "ivhl_jax/a.py", '"""doc"""\n# comment\n\nimport numpy as np\nfrom ivhl_jax import b\n')
    _write(r, "ivhl_jax/b.py", "from . import c\n")
    _write(r, "ivhl_jax/c.py", "import ivhl_jax.a\n")
    _write(r, "ivhl_jax/d.py", "def f():\n    from ivhl_jax.models import m\n")
    _write(r, "models/__init__.py", "")
    _write(r, "models/m.py", "from ivhl_jax.d import f\nfrom .. import a\n")
    inv = inventory.build_inventory(r)
    a = inv["modules"]["ivhl_jax.a"]
    assert (a["total_lines"], a["comment_lines"], a["blank_lines"], a["code_lines"]) == (5, 1, 1, 3)
    assert a["external_imports"] == ["numpy"]
    edges = {(e["source"], e["target"]): e for e in inv["edges"]}
    assert edges[("ivhl_jax.b", "ivhl_jax.c")]["kind"] == "relative"
    assert edges[("ivhl_jax.c", "ivhl_jax.a")]["kind"] == "absolute"
    assert edges[("ivhl_jax.d", "ivhl_jax.models.m")]["lazy"]
    assert ("ivhl_jax.models.m", "ivhl_jax.d") in edges
    assert inv["cycles"]["eager_imports"] == [["ivhl_jax.a", "ivhl_jax.b", "ivhl_jax.c"]]
    assert ["ivhl_jax.d", "ivhl_jax.models.m"] in inv["cycles"]["all_imports"]
    assert inv["packages"]["models"]["depends_on"] == ["ivhl_jax"]
    md = inventory.to_markdown(inv)
    assert "```mermaid" in md and "models --> ivhl_jax" in md


def test_this_repository_has_no_eager_import_cycles():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    inv = inventory.build_inventory(root)
    assert inv["summary"]["total_files"] > 10
    assert inv["cycles"]["eager_imports"] == []
