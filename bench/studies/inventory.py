"""Module inventory and import-dependency graph of this repository (``python -m bench.studies.inventory``).

For every ``.py`` file under the package folders (``ivhl_jax``, ``models``, ``sims``, ``bench``,
``tests``) it counts total, blank, comment (``#``-lines) and code lines (docstrings count as code),
and parses the imports with ``ast``: absolute imports of ``ivhl_jax...``
and relative imports (``from . import x``) are both resolved to modules of this repository. Imports inside
functions are recorded as *lazy* edges. Cycles are the strongly connected components (Tarjan) of
the module graph with more than one member, reported separately for top-level-only and all edges.

Outputs: JSON (``modules``, ``packages``, ``edges``, ``cycles``, ``summary``) and Markdown with the
per-package table, the most depended-on modules and a Mermaid ``graph TD`` of package dependencies.
"""

from __future__ import annotations

import ast
import datetime
import os
import sys
from collections import defaultdict
from typing import Any

# Folder on disk -> import prefix (pyproject installs models/sims/bench under ivhl_jax.*).
PACKAGES = {
    "ivhl_jax": "ivhl_jax",
    "models": "ivhl_jax.models",
    "sims": "ivhl_jax.sims",
    "bench": "ivhl_jax.bench",
    "tests": "tests",
}


def count_lines(text: str) -> dict[str, int]:
    lines = text.splitlines()
    blank = sum(1 for ln in lines if not ln.strip())
    comment = sum(1 for ln in lines if ln.strip().startswith("#"))
    return {
        "total_lines": len(lines),
        "blank_lines": blank,
        "comment_lines": comment,
        "code_lines": len(lines) - blank - comment,
    }


def module_name(folder: str, rel_path: str) -> str:
    parts = rel_path[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGES[folder], *parts]) if parts else PACKAGES[folder]


def _resolve_relative(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def parse_imports(text: str, module: str, is_pkg: bool) -> list[dict[str, Any]]:
    """Every import as {target, kind: absolute|relative, lazy: bool, line}."""
    tree = ast.parse(text)
    out = []

    def visit(node: ast.AST, lazy: bool):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for a in child.names:
                    out.append({"target": a.name, "kind": "absolute", "lazy": lazy, "line": child.lineno})
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = _resolve_relative(module, is_pkg, child.level, child.module)
                    kind = "relative"
                else:
                    base, kind = child.module or "", "absolute"
                for a in child.names:
                    out.append(
                        {
                            "target": f"{base}.{a.name}" if a.name != "*" else base,
                            "base": base,
                            "kind": kind,
                            "lazy": lazy,
                            "line": child.lineno,
                        }
                    )
            visit(child, inner)

    visit(tree, False)
    return out


def _internal_target(target: str, base: str | None, modules: set[str]) -> str | None:
    """Longest repository module that ``target`` (or ``base`` of a from-import) names."""
    for cand in (target, base):
        if not cand:
            continue
        parts = cand.split(".")
        for i in range(len(parts), 0, -1):
            name = ".".join(parts[:i])
            if name in modules:
                return name
    return None


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components with >1 member or a self-loop, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, comps = set(), [], []
    counter = [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    comps.append(sorted(comp))
    return sorted(comps)


def _read_modules(root: str) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, bool]]]:
    """Every ``.py`` file of :data:`PACKAGES` under ``root``: its record (path, package, line counts) and its
    text with whether it is a package's ``__init__``, by module name."""
    files = []
    for folder in PACKAGES:
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, fn), top)
                    files.append((folder, rel))
    modules: dict[str, dict[str, Any]] = {}
    texts = {}
    for folder, rel in files:
        path = os.path.join(root, folder, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        name = module_name(folder, rel)
        texts[name] = (text, rel.endswith("__init__.py"))
        modules[name] = {"path": os.path.join(folder, rel), "package": folder, **count_lines(text)}
    return modules, texts


def _import_edges(modules: dict[str, dict[str, Any]], texts: dict[str, tuple[str, bool]]) -> list[dict[str, Any]]:
    """The internal import edges, one per (source, target), an eager import kept over a lazy one; each module's
    external imports (and any syntax error) go into its record."""
    names = set(modules)
    edges = []
    for name, (text, is_pkg) in texts.items():
        try:
            imports = parse_imports(text, name, is_pkg)
        except SyntaxError as err:
            modules[name]["syntax_error"] = str(err)
            continue
        ext = set()
        for imp in imports:
            tgt = _internal_target(imp["target"], imp.get("base"), names)
            if tgt is None:
                ext.add(imp["target"].split(".")[0] if imp["kind"] == "absolute" else imp["target"])
                continue
            if tgt != name:
                edges.append(
                    {"source": name, "target": tgt, "kind": imp["kind"], "lazy": imp["lazy"], "line": imp["line"]}
                )
        modules[name]["external_imports"] = sorted(x for x in ext if x)
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for edge in edges:
        k = (edge["source"], edge["target"])
        if k not in best or (best[k]["lazy"] and not edge["lazy"]):
            best[k] = edge
    return sorted(best.values(), key=lambda edge: (edge["source"], edge["target"]))


def _packages(modules: dict[str, dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, Any]:
    """Per package of :data:`PACKAGES`: file and line counts and the packages it imports."""
    pk = lambda m: modules[m]["package"]
    pkg_edges: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        if pk(edge["source"]) != pk(edge["target"]):
            pkg_edges[pk(edge["source"])].add(pk(edge["target"]))
    packages = {}
    for p in PACKAGES:
        ms = [m for m in modules if modules[m]["package"] == p]
        packages[p] = {
            "file_count": len(ms),
            **{
                k: sum(modules[m][k] for m in ms) for k in ("total_lines", "code_lines", "comment_lines", "blank_lines")
            },
            "depends_on": sorted(pkg_edges.get(p, ())),
        }
    return packages


def build_inventory(root: str) -> dict[str, Any]:
    root = os.path.abspath(root)
    modules, texts = _read_modules(root)
    edges = _import_edges(modules, texts)
    g_all: dict[str, set[str]] = defaultdict(set)
    g_eager: dict[str, set[str]] = defaultdict(set)
    indeg: dict[str, int] = defaultdict(int)
    for edge in edges:
        g_all[edge["source"]].add(edge["target"])
        if not edge["lazy"]:
            g_eager[edge["source"]].add(edge["target"])
        indeg[edge["target"]] += 1
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "root_path": root,
        "modules": modules,
        "packages": _packages(modules, edges),
        "edges": edges,
        "cycles": {"eager_imports": strongly_connected(g_eager), "all_imports": strongly_connected(g_all)},
        "most_depended_on": sorted(indeg.items(), key=lambda kv: (-kv[1], kv[0]))[:10],
        "summary": {
            "total_files": len(modules),
            "total_lines": sum(m["total_lines"] for m in modules.values()),
            "total_code_lines": sum(m["code_lines"] for m in modules.values()),
            "total_comment_lines": sum(m["comment_lines"] for m in modules.values()),
            "internal_edges": len(edges),
            "lazy_edges": sum(edge["lazy"] for edge in edges),
            "relative_import_edges": sum(edge["kind"] == "relative" for edge in edges),
        },
    }


def to_markdown(inv: dict[str, Any]) -> str:
    s = inv["summary"]
    out = [
        "# Module inventory and dependency graph",
        "",
        f"Generated {inv['timestamp']} by `python -m bench.studies.inventory`.",
        "",
        f"{s['total_files']} files, {s['total_lines']} lines ({s['total_code_lines']} code, "
        f"{s['total_comment_lines']} comment); {s['internal_edges']} internal import edges "
        f"({s['lazy_edges']} lazy, {s['relative_import_edges']} relative).",
        "",
        "| package | files | code lines | comment lines | depends on |",
        "|---|---:|---:|---:|---|",
    ]
    for p, v in sorted(inv["packages"].items(), key=lambda kv: -kv[1]["code_lines"]):
        out.append(
            f"| {p} | {v['file_count']} | {v['code_lines']} | {v['comment_lines']} | "
            f"{', '.join(v['depends_on']) or '-'} |"
        )
    out += ["", "## Largest files", "", "| module | code lines |", "|---|---:|"]
    for m, v in sorted(inv["modules"].items(), key=lambda kv: -kv[1]["code_lines"])[:10]:
        out.append(f"| `{m}` | {v['code_lines']} |")
    out += ["", "## Most depended-on modules", ""]
    out += [f"- `{m}`: {n}" for m, n in inv["most_depended_on"]]
    out += ["", "## Cycles", ""]
    for kind, cyc in inv["cycles"].items():
        out.append(f"- {kind.replace('_', ' ')}: " + ("; ".join(" <-> ".join(c) for c in cyc) if cyc else "none"))
    out += ["", "## Package graph", "", "```mermaid", "graph TD"]
    for p, v in inv["packages"].items():
        for q in v["depends_on"]:
            out.append(f"    {p} --> {q}")
    out += ["```", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ivhl_jax.run.io import write_json

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=here)
    p.add_argument("--json", help="also write the inventory as JSON here (a snapshot of the code, not a result)")
    p.add_argument("--md", help="write the Markdown summary here instead of printing it")
    a = p.parse_args(argv)
    inv = build_inventory(a.root)
    if a.json:
        write_json(a.json, inv)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(to_markdown(inv))
    else:
        print(to_markdown(inv))
    c = inv["cycles"]["eager_imports"]
    print(
        f"{inv['summary']['total_files']} files, {inv['summary']['internal_edges']} edges, "
        f"{len(c)} eager import cycle(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
