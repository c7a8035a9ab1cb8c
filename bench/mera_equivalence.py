"""Energies of this tree's MERA sweep against a git revision's, from identical tensors, over a whole χ ladder.

The cold first stage starts from the same ``init_mera``; at each later stage both continue from the tensors grown
by this tree's ``grow(..., refsym=True)`` (the old ``grow`` completes u and v at random, which changes the
trajectory, not the sweep). Prints and stores the largest energy difference per stage and the scaling dimensions.

    .venv/bin/python -m ivhl_jax.bench.mera_equivalence --rev HEAD --out bench/results/mera_equivalence.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys

import jax
import numpy as np

from ivhl_jax.bench.mera_sweep_cost import load_revision
from ivhl_jax.physics import mera as N
from ivhl_jax.run.io import write_json


def ladder(mod, chis=(4, 6, 8), steps=(500, 1000, 500), layers=(2, 2, 3)):
    mera = None
    energies = []
    for k, (chi, n, lay) in enumerate(zip(chis, steps, layers)):
        cfg = mod.MERAConfig(chi=chi, layers=lay)
        if mera is not None:
            with jax.enable_x64(True):
                g = N.grow(N.MERA(mera.u, mera.w, mera.v, mera.rho_ab, mera.rho_ba, mera.sweeps), jax.random.key(k),
                           chi, layers=lay, refsym=True)
                mera = mod.MERA(g.u, g.w, g.v, g.rho_ab, g.rho_ba, g.sweeps)
        kw = {"stuck": None} if mod is N else {}
        # revisions before the issue-12 vocabulary call the chunk size sweeps_per_chunk
        chunk = "steps_per_chunk" if "steps_per_chunk" in inspect.signature(mod.optimize).parameters else \
            "sweeps_per_chunk"
        mera, e, _ = mod.optimize(cfg, n, mera=mera, **{chunk: 100}, **kw)
        energies.append(np.asarray(e))
    with jax.enable_x64(True):
        dims = mod.scaling_dimensions(mera, 4)
    return energies, dims


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    old = load_revision(args.rev)
    e_new, d_new = ladder(N)
    e_old, d_old = ladder(old)
    doc = {"what": "4 -> 6 -> 8 ladder (500/1000/500 sweeps, 2/2/3 layers, refsym) from identical tensors: this tree "
                   f"against git revision {args.rev} "
                   f"({subprocess.run(['git', 'rev-parse', args.rev], capture_output=True, text=True).stdout.strip()})",
           "command": "python -m ivhl_jax.bench.mera_equivalence " + " ".join(argv if argv is not None
                                                                              else sys.argv[1:]),
           "max_abs_energy_difference_per_stage": [float(np.max(np.abs(a - b))) for a, b in zip(e_new, e_old)],
           "final_energy_error": {"after": float(e_new[-1][-1] - N.E0_CRITICAL_ISING),
                                  "before": float(e_old[-1][-1] - N.E0_CRITICAL_ISING)},
           "scaling_dimensions": {"after": [float(x) for x in d_new], "before": [float(x) for x in d_old]},
           "jax_version": jax.__version__}
    print(json.dumps(doc, indent=1))
    if args.out:
        write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
