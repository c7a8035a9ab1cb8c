"""The scalar GP BdG solve against another revision's, interleaved: ``condensate.bogoliubov`` of this checkout and
the ``bogoliubov.py`` of ``--against`` (read with ``git show``, loaded beside it), on the same inputs, alternating
call by call, so both see the same host load. Reports the medians of wall and of process CPU time (the latter
less sensitive to other jobs on a shared host), their ratios new/old and the largest difference of ω.

    python -m bench.bdg_gp_speed --against main --rounds 15 --export bench/results/bdg_gp_speed_cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time

import numpy as np


def _load_old(rev: str):
    src = subprocess.run(
        ["git", "show", f"{rev}:ivhl_jax/physics/condensate/bogoliubov.py"], check=True, capture_output=True, text=True
    ).stdout
    path = tempfile.NamedTemporaryFile("w", suffix="_bogoliubov_old.py", delete=False)
    path.write(src)
    path.close()
    spec = importlib.util.spec_from_file_location("bogoliubov_old", path.name)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path.name}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bogoliubov_old"] = mod
    spec.loader.exec_module(mod)
    return mod


def _cases():
    import jax
    import jax.numpy as jnp

    from ivhl_jax import condensate as C

    out = {}
    grid = C.Grid.uniform((128, 128), 20.0)
    out["homogeneous_128x128_f32"] = (
        C.GPSystem.create(grid, jnp.zeros(grid.shape, jnp.float32), 2.0),
        jnp.ones(grid.shape, jnp.complex64),
        8,
    )
    trap = C.Grid.uniform((96, 96), 12.0)
    system = C.GPSystem.create(trap, C.harmonic(trap), 50.0)
    psi, _ = C.ground_state(system, 1.0, method="cg", max_steps=2000)
    out["trap_96x96_g50_f32"] = (system, psi, 6)
    del jax
    return out


def main(argv: list[str] | None = None) -> dict:
    import jax

    from ivhl_jax import condensate as C
    from ivhl_jax.run.provenance import write_results

    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default="main")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--export", default=None)
    args = ap.parse_args(argv)
    old = _load_old(args.against)
    doc: dict = {
        "against": args.against,
        "rounds": args.rounds,
        "note": "host shared with other jobs (wall times noisy); ratios only, of wall and process CPU time",
        "cases": {},
    }
    for name, (system, psi, n) in _cases().items():
        calls = {
            "new": lambda s=system, p=psi, n=n: jax.block_until_ready(C.bogoliubov(jax.random.key(0), s, p, n).omega),
            "old": lambda s=system, p=psi, n=n: jax.block_until_ready(old.bogoliubov(jax.random.key(0), s, p, n).omega),
        }
        om = {k: np.asarray(f()) for k, f in calls.items()}  # compile both
        times: dict = {"new": [], "old": []}
        cpu: dict = {"new": [], "old": []}
        for r in range(args.rounds):
            for k in ("new", "old") if r % 2 == 0 else ("old", "new"):
                t0, c0 = time.perf_counter(), time.process_time()
                calls[k]()
                times[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
        med = {k: float(np.median(v)) for k, v in times.items()}
        med_cpu = {k: float(np.median(v)) for k, v in cpu.items()}
        doc["cases"][name] = {
            "median_s": med,
            "times_s": times,
            "ratio_new_over_old": med["new"] / med["old"],
            "median_of_round_ratios": float(np.median(np.array(times["new"]) / np.array(times["old"]))),
            "process_cpu_median_s": med_cpu,
            "cpu_ratio_new_over_old": med_cpu["new"] / med_cpu["old"],
            "max_abs_omega_diff": float(np.max(np.abs(om["new"] - om["old"]))),
            "omega_new": om["new"].tolist(),
        }
        print(
            name,
            doc["cases"][name]["ratio_new_over_old"],
            doc["cases"][name]["cpu_ratio_new_over_old"],
            doc["cases"][name]["max_abs_omega_diff"],
        )
    if args.export:
        write_results(args.export, doc)
    return doc


if __name__ == "__main__":
    main()
