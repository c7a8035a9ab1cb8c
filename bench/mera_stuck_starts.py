"""Cold starts of the MERA across seeds: energy error every 50 sweeps, scaling dimensions at the end, and what
:class:`ivhl_jax.physics.mera.StuckCheck` says about each (the data its defaults were chosen from).

    .venv/bin/python -m ivhl_jax.bench.mera_stuck_starts --config 4/4/2/10/1000/8 --config 6/6/2/10/400/6 \\
        --config 8/8/3/10/300/4 --config 4/4/1/3/600/8 --config 6/4/1/10/1000/3 \\
        --out bench/results/mera_stuck_starts.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax

from ivhl_jax.physics import mera as M


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", required=True, help="chi/chi_mid/layers/u_delay/steps/seeds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    check = M.StuckCheck()
    rows = []
    for text in args.config:
        chi, mid, layers, u_delay, steps, seeds = (int(x) for x in text.split("/"))
        cfg = M.MERAConfig(chi=chi, chi_mid=mid, layers=layers, u_delay=u_delay)
        for seed in range(seeds):
            mera, e, _ = M.optimize(cfg, steps, key=jax.random.key(seed), steps_per_chunk=50, stuck=None)
            err = e - M.E0_CRITICAL_ISING
            with jax.enable_x64(True):
                dims = M.scaling_dimensions(mera, 3)
            row = {"chi": chi, "chi_mid": mid, "layers": layers, "u_delay": u_delay, "seed": seed,
                   "error_every_50": [float(x) for x in err[49::50]], "scaling_dims_end": [float(x) for x in dims],
                   "stuck_check": check.reason(err)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    doc = {"what": "MERA cold starts (critical Ising, refsym, power_iters=4), stuck-start check off",
           "command": "python -m ivhl_jax.bench.mera_stuck_starts " + " ".join(argv if argv is not None
                                                                              else sys.argv[1:]),
           "check": vars(check) if hasattr(check, "__dict__") else str(check),
           "host": f"{os.cpu_count()}-CPU host", "jax_version": jax.__version__, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return doc


if __name__ == "__main__":
    main()
