"""Wall time of one MERA sweep in float32 against float64 (interleaved rounds, one process), and the energy
error float32 sweeps reach (its floor).

    .venv/bin/python -m ivhl_jax.bench.mera_precision_sweep --out bench/results/mera_precision_sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from ivhl_jax.physics import mera as M
from ivhl_jax.run.io import write_json


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="6/4/1,8/6/2,8/8/3", help="chi/chi_mid/layers,...")
    ap.add_argument("--sweeps", type=int, default=10, help="sweeps per timed call (one lax.scan)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    with jax.enable_x64(True):
        for text in args.shapes.split(","):
            chi, mid, layers = (int(x) for x in text.split("/"))
            cfg = M.MERAConfig(chi=chi, chi_mid=mid, layers=layers)
            base = M.init_mera(jax.random.key(0), cfg)
            progs = {}
            for name in ("f64", "f32"):
                dt = M.precision_dtype(name)
                h = M.ising_two_site_hamiltonian(1.0, dt)
                adv = M.make_advance(h, args.sweeps, cfg.power_iters, 0, cfg.refsym, cfg.si_scales)
                m = M.cast_mera(base, dt)
                t0 = time.perf_counter()
                jax.block_until_ready(adv(m))
                progs[name] = (adv, m, time.perf_counter() - t0)
            times: dict[str, list[float]] = {k: [] for k in progs}
            for _ in range(args.rounds):
                for name, (adv, m, _c) in progs.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(adv(m))
                    times[name].append(1e3 * (time.perf_counter() - t0) / args.sweeps)
            row: dict = {"chi": chi, "chi_mid": mid, "layers": layers}
            for name in progs:
                row[name] = {"first_call_s_incl_compile": round(progs[name][2], 2),
                             "ms_per_sweep_median": round(float(np.median(times[name])), 3),
                             "ms_per_sweep_min": round(float(np.min(times[name])), 3)}
            row["f32_over_f64_median"] = row["f32"]["ms_per_sweep_median"] / row["f64"]["ms_per_sweep_median"]
            row["f32_over_f64_min"] = row["f32"]["ms_per_sweep_min"] / row["f64"]["ms_per_sweep_min"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    doc = {"what": "one MERA sweep (refsym, power_iters=4), float32 vs float64, interleaved rounds in one process",
           "command": "python -m ivhl_jax.bench.mera_precision_sweep "
                      + " ".join(argv if argv is not None else sys.argv[1:]),
           "host": f"{os.cpu_count()}-CPU host shared with other jobs (compare within a row)",
           "jax_version": jax.__version__, "rows": rows}
    if args.out:
        write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
