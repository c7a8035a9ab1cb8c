"""Norm and energy drift of the default ``ivhl sim bec`` GP run over a long real-time evolution, float32.

``python -m bench.studies.gp_default_drift --steps 400000 --out bench/results/gp_default_norm_drift.json``: the sim's
default configuration (``BECConfig()``: 2D 128², L = 20, g = 200, dt = 2e-3, observed every 50 steps), its
ground state, then ``steps`` real-time steps twice: with the raw scheme (``project_norm=False``, the former
default) and with the default (norm restored per block of 50 steps, pinned to 1 as the sim passes it).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ivhl_jax import condensate as C
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.sims import bec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400_000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cfg = bec.BECConfig()
    system = bec.gp_system(cfg)
    psi0, gs = bec.gp_initial_state(cfg, system)
    e0, n0 = float(C.energy(psi0, system)["total"]), float(C.norm(psi0, system.grid))
    res = {"ground_state": gs}
    for name, kw in (
        ("raw (project_norm=False, the former default)", {"project_norm": False}),
        ("default (norm restored per block, pinned to 1)", {"norm": 1.0}),
    ):
        st = C.strang(system, cfg.dt, **kw)
        t = time.perf_counter()
        _, obs = trajectory(st, st.init(psi0), a.steps, save_every=cfg.save_every, observe=C.observe)
        n, e = np.asarray(obs["norm"]), np.asarray(obs["energy_total"])
        res[name] = {
            "norm_start": n0,
            "norm_end": float(n[-1]),
            "max_abs_norm_dev": float(np.abs(n - n0).max()),
            "energy_start": e0,
            "energy_end": float(e[-1]),
            "max_rel_energy_dev": float(np.abs(e / e0 - 1).max()),
            "wall_s": time.perf_counter() - t,
        }
        print(name, res[name], flush=True)
    from ivhl_jax.bench.harness import write_results

    doc = {
        "steps": a.steps,
        "config": "BECConfig() defaults: dims=2, grid=128, length=20, g=200, dt=2e-3, float32",
        "results": res,
    }
    if a.out:
        write_results(a.out, doc)


if __name__ == "__main__":
    main()
