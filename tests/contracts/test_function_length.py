"""Functions a reader can hold in their head: no function of the library, the models, the benchmarks and studies or
the tests is longer than 80 lines (docstring and nested functions included). The simulations of ``sims/``, whose
``run`` functions read top to bottom as one script of a run, are exempt."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ("ivhl_jax", "models", "bench", "tests")
LIMIT = 80


def _long_functions(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > LIMIT:
                out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_over_80_lines_outside_sims():
    found = []
    for top in SCANNED:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            found += [p for f in sorted(files) if f.endswith(".py") for p in _long_functions(os.path.join(d, f))]
    assert not found, f"functions over {LIMIT} lines (split them where they do several jobs): {found}"


def test_the_check_sees_a_long_function(tmp_path):
    """The rule's own negative control: a 81-line function is reported, an 80-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(78))
    src = f"def f():\n{body}\n    return 0\n\n\ndef g():\n{body}\n    x = 1\n    return x\n"
    (tmp_path / "long.py").write_text(src)
    got = _long_functions(str(tmp_path / "long.py"))
    assert len(got) == 1 and " g (81 lines)" in got[0], got
