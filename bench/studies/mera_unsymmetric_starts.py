"""Cold starts of the chains that keep the unsymmetric start (xx, potts): the energy error per site at a few sweeps
from keys 0-3, the one-site scaling dimensions at the end and :class:`~ivhl_jax.physics.tensornet.mera.StuckCheck`'s
verdict, for the settings the docs show (xx: chi/chi_mid 6/4, one layer, 500 sweeps; potts: the notebook's 9/3, one
layer, 200 sweeps).

    python -m bench.studies.mera_unsymmetric_starts --out bench/results/mera_unsymmetric_starts.json
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import jax
import numpy as np

CASES = {"xx": ((6, 4, 1), 500), "potts": ((9, 3, 1), 200)}


def run(name: str, keys: int = 4) -> dict:
    from ivhl_jax import mera as M
    from ivhl_jax import trajectory

    (chi, mid, layers), steps = CASES[name]
    model = getattr(M, name)()
    with jax.enable_x64(True):
        st = M.evenbly_vidal(model, M.MERAConfig(chi=chi, chi_mid=mid, layers=layers))
        rows = []
        for key in range(keys):
            s, e = trajectory(st, st.init(jax.random.key(key)), steps, observe=M.observe)
            err = np.asarray(e) - model.e0
            rows.append(
                {
                    "key": key,
                    "energy_error_at": {str(n): float(err[n - 1]) for n in range(100, steps + 1, 100)},
                    "scaling_dimensions": [float(x) for x in M.scaling_dimensions(s.mera, 4)],
                    "stuck_check": M.ladder.stuck_warning(err, name),
                }
            )
            print(name, rows[-1], flush=True)
    return {"model": model.name, "chi": chi, "chi_mid": mid, "layers": layers, "sweeps": steps, "keys": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from ivhl_jax.bench.harness import write_results

    doc: dict[str, Any] = {"what": __doc__.split("\n\n")[0], "load_average": list(os.getloadavg())}
    for name in CASES:
        doc[name] = run(name)
    write_results(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
