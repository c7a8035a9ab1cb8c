"""The compiled programs of the condensate steps in this tree and in another tree (an older revision): the count of
each HLO opcode (fft, fusion, reduce, ...) of every bench op of ``bench/ops_condensate_systems.py`` and of
``gp_step``/``gft_step``, at the ``small`` size. Equal counts mean the same kernels over the field, so the step time
is the same by construction (timings on a loaded host are noisier than that: ``compare_revisions``).

``python -m bench.studies.condensate_engine_hlo --old-root DIR --out bench/results/condensate_engine_hlo.json``
(each tree in its own process; DIR a tree of the older revision with this tree's ``bench/ops_condensate_systems.py``).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _load(root: str, name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}", os.path.join(root, "bench", f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load bench/{name}.py from {root}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def opcodes(root: str) -> dict:
    """{op: {opcode: count}} of the optimized HLO of each op of ``root``'s bench files (run in a process whose
    ``ivhl_jax`` is ``root``'s)."""
    import jax

    systems, gp = _load(root, "ops_condensate_systems"), _load(root, "ops_condensate")
    cases = {k: f("small") for k, f in systems.OPS.items()}
    cases.update(gp_step=gp.gp_step("small"), gft_step=gp.gft_step("small"))
    out = {}
    for name, case in cases.items():
        text = jax.jit(case.fn).lower(*case.args).compile().as_text() or ""
        out[name] = dict(sorted(collections.Counter(re.findall(r"= [a-z0-9\[\]{},: ]*? ([a-z\-]+)\(", text)).items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-root", help="the other tree")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(opcodes(a.worker)))
        return
    runs = {}
    for label, root in (("new", REPO), ("old", os.path.abspath(a.old_root))):
        env = dict(os.environ, PYTHONPATH=root)
        res = subprocess.run(
            [sys.executable, "-m", "bench.studies.condensate_engine_hlo", "--worker", root],
            cwd=REPO if label == "new" else root,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        runs[label] = json.loads(res.stdout.strip().splitlines()[-1])
    same = {k: runs["new"][k] == runs["old"].get(k) for k in runs["new"]}
    doc = {
        "what": "HLO opcode counts of the compiled condensate step programs (small sizes), this tree vs --old-root",
        "old_root": a.old_root,
        "same_opcode_counts": same,
        "opcodes": runs,
    }
    print(json.dumps(same))
    if a.out:
        sys.path.insert(0, REPO)
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
