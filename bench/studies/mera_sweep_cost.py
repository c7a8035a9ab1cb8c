"""The compiled cost of one MERA sweep (XLA's ``cost_analysis``: flops and bytes accessed) in this tree and in
another tree of the library, dense and Z2-symmetric: a comparison that the load of a shared host cannot blur
(interleaved timings on it scatter by 2x and more).

    python -m bench.studies.mera_sweep_cost --old-root /tmp/ivhl_compare_75b8637 --against 75b8637 \\
        --out bench/results/mera_sweep_cost_vs_75b8637.json

(``--old-root``: a checkout of the other revision, e.g. the one ``bench/studies/compare_revisions.py`` makes.) Each
tree is imported in its own process (the editable install's finder is removed so that ``--old-root`` wins).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = ((8, 6), (16, 12))


def _worker(root: str, symmetric: bool) -> dict[str, Any]:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, root)
    import jax

    import ivhl_jax
    from ivhl_jax import mera as M

    if not ivhl_jax.__file__.startswith(root):
        raise RuntimeError(f"imported {ivhl_jax.__file__}, not the tree {root}")
    out = {}
    with jax.enable_x64(True):
        for chi, mid in CASES:
            sym = None
            if symmetric:
                sym = M.Symmetry(
                    "Z2", sectors={0: chi // 2, 1: chi // 2}, mid_sectors=[{0: 2, 1: 2}, {0: mid // 2, 1: mid // 2}]
                )
            cfg = M.MERAConfig(chi=chi, chi_mid=(4, mid), layers=1, symmetry=sym)
            st = M.evenbly_vidal(M.ising(), cfg)
            state = st.init(jax.random.key(0))
            cost = jax.jit(st.step_fn).lower(state, st.params).compile().cost_analysis()
            cost = (cost[0] if isinstance(cost, list) else cost) or {}
            out[str(chi)] = {"mflops": cost["flops"] / 1e6, "mbytes_accessed": cost.get("bytes accessed", 0.0) / 1e6}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-root", required=True, help="a checkout of the other revision")
    ap.add_argument("--against", required=True, help="the other revision's name (recorded)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--symmetric", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.symmetric)))
        return 0
    res: dict[str, Any] = {}
    for kind, flag in (("dense", []), ("z2_symmetric", ["--symmetric"])):
        for name, root in (("old", os.path.abspath(args.old_root)), ("new", REPO)):
            cmd = [sys.executable, os.path.abspath(__file__), "--old-root", ".", "--against", ".", "--worker", root]
            done = subprocess.run(cmd + flag, check=True, capture_output=True, text=True, cwd="/")
            res.setdefault(kind, {})[name] = json.loads(done.stdout.strip().splitlines()[-1])
        for chi in res[kind]["new"]:
            new, old = res[kind]["new"][chi], res[kind]["old"][chi]
            res[kind].setdefault("new_over_old", {})[chi] = {k: new[k] / old[k] for k in new}
        print(kind, res[kind]["new_over_old"], flush=True)
    if args.out:
        from ivhl_jax.bench.harness import write_results

        write_results(
            args.out,
            {
                "against": args.against,
                "what": "XLA cost_analysis of one compiled Evenbly-Vidal sweep (Ising, float64, 1 transitional "
                "layer, chi_mid (4, mid)), dense and Z2-symmetric (sectors split evenly), this tree and --against",
                "cases": [{"chi": c, "chi_mid": m} for c, m in CASES],
                "results": res,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
