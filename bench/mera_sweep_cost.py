"""FLOPs (XLA cost analysis) and wall time of one Evenbly–Vidal MERA sweep: this tree against a git revision.

Both versions are imported into one process (the baseline from ``git show REV:ivhl_jax/physics/mera.py``) and
timed in interleaved rounds, so a busy host slows both alike; the ratio is the figure to read.

    .venv/bin/python -m ivhl_jax.bench.mera_sweep_cost --rev HEAD --chis 4,8 --out bench/results/mera_sweep_cost.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from ivhl_jax.run.io import write_json


def load_revision(rev: str):
    """The module ivhl_jax.physics.mera as it was at git revision ``rev`` (a throwaway module object)."""
    src = subprocess.run(["git", "show", f"{rev}:ivhl_jax/physics/mera.py"], check=True, capture_output=True,
                         text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), f"mera_{rev.replace('/', '_')}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"mera_{abs(hash(rev))}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--chis", default="4,8")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--sweeps", type=int, default=10, help="sweeps per timed call (one lax.scan)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from ivhl_jax.physics import mera as new

    old = load_revision(args.rev)
    rev_hash = subprocess.run(["git", "rev-parse", args.rev], capture_output=True, text=True).stdout.strip()
    rows = []
    with jax.enable_x64(True):
        for chi in (int(c) for c in args.chis.split(",")):
            progs = {}
            for name, mod in (("before", old), ("after", new)):
                cfg = mod.MERAConfig(chi=chi, layers=args.layers)
                m = mod.init_mera(jax.random.key(0), cfg)
                h = mod.ising_two_site_hamiltonian(1.0, np.float64)
                one = jax.jit(lambda s, mod=mod, h=h: mod.sweep(s, h, 4, 0, True, 1))
                t0 = time.perf_counter()
                comp = one.lower(m).compile()
                compile_s = time.perf_counter() - t0
                ca = comp.cost_analysis()
                ca = ca[0] if isinstance(ca, list) else ca
                assert ca is not None
                def body(c, _, mod=mod, h=h):
                    return mod.sweep(c, h, 4, 0, True, 1)

                many = jax.jit(lambda s, body=body: jax.lax.scan(body, s, None, length=args.sweeps))
                jax.block_until_ready(many(m))
                progs[name] = (many, m, float(ca["flops"]), compile_s, comp(m)[1])
            times: dict[str, list[float]] = {k: [] for k in progs}
            for _ in range(args.rounds):
                for name, (many, m, *_rest) in progs.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(many(m))
                    times[name].append((time.perf_counter() - t0) / args.sweeps)
            row = {"chi": chi, "layers": args.layers}
            for name, (_, _, flops, compile_s, e) in progs.items():
                row[name] = {"flops_per_sweep": flops, "compile_s_one_sweep": round(compile_s, 2),
                             "ms_per_sweep_median": round(1e3 * float(np.median(times[name])), 3),
                             "ms_per_sweep_all": [round(1e3 * t, 3) for t in times[name]],
                             "first_sweep_energy": float(e)}
            row["flops_ratio_after_over_before"] = row["after"]["flops_per_sweep"] / row["before"]["flops_per_sweep"]
            row["time_ratio_after_over_before"] = (row["after"]["ms_per_sweep_median"]
                                                   / row["before"]["ms_per_sweep_median"])
            print(json.dumps({k: row[k] for k in ("chi", "flops_ratio_after_over_before",
                                                    "time_ratio_after_over_before")}), flush=True)
            rows.append(row)
    doc = {"what": "one Evenbly-Vidal sweep (refsym, power_iters=4, u updated), float64; before = git revision "
                   f"{args.rev} ({rev_hash}), after = this tree; interleaved timing rounds in one process",
           "command": "python -m ivhl_jax.bench.mera_sweep_cost "
                      + " ".join(argv if argv is not None else sys.argv[1:]),
           "host": f"{os.cpu_count()}-CPU host shared with other jobs (compare within a row)",
           "jax_version": jax.__version__, "rows": rows}
    if args.out:
        write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
