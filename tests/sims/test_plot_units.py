"""Every axis label of the plots of `ivhl sim gft`, `ivhl sim holography` and `ivhl train *` states its unit in
parentheses, or is a count of steps: read from the source, each literal x/y label and colour-bar label."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SIMS = Path(__file__).resolve().parents[2] / "sims"
FILES = ["gft.py", "holography.py", "train_adaptive.py", "train_lm.py", "train_vortex_gru.py"]


def _labels(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every x/y-label argument and ``label=`` of a colour bar, where it is written out."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        args = []
        if node.func.attr in ("set_xlabel", "set_ylabel") and node.args:
            args.append(node.args[0])
        if node.func.attr in ("set", "set_xlabel", "set_ylabel"):
            args += [k.value for k in node.keywords if k.arg in ("xlabel", "ylabel")]
        if node.func.attr == "colorbar":
            args += [k.value for k in node.keywords if k.arg == "label"]
        for a in args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                out.append((a.lineno, a.value))
            elif isinstance(a, ast.JoinedStr):
                out.append((a.lineno, "".join(v.value for v in a.values if isinstance(v, ast.Constant))))
    return out


@pytest.mark.parametrize("name", FILES)
def test_every_axis_label_states_its_unit(name):
    labels = _labels(ast.parse((SIMS / name).read_text(encoding="utf-8")))
    missing = [
        f"{name}:{line}: {text!r}"
        for line, text in labels
        if not ("(" in text and ")" in text) and not re.search(r"\b(step|sweep)s?$", text)
    ]
    assert not missing, "axis labels without a unit in parentheses:\n" + "\n".join(missing)
