"""Why the float32 energy records of a damped GP run stop falling monotonically near equilibrium.

The same damped rotating run (2-D, 64², L = 16, Ω = 0.8, gN = 500, γ = 0.03, dt = 2e-3, the atom number held) in
float32 and float64, the energy recorded every 1000 steps to t = 300. In float64 the energy falls at every record;
the float32 records fall until the true decrease per record (the float64 one) drops to the size of a float32
energy evaluation's round-off, then fluctuate by a few 1e-6 of E. The trajectories themselves part early (vortex
entry is chaotic), so the comparison is of the records' steps, not of the two energies.

``python -m bench.studies.condensate_damped_tail --out bench/results/condensate_damped_tail.json`` (a few minutes on
2 CPU cores).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C

EVERY, RECORDS, DT = 1000, 150, 2e-3


def _energy(psi, params):
    return C.energy(psi, params.system)["total"]


def records(dtype) -> np.ndarray:
    """The energy every EVERY steps of the damped run in ``dtype`` (float32 or float64), float64 NumPy."""
    grid = C.Grid.uniform((64, 64), 16.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0, dtype=dtype), 500.0, 0.8, gamma=0.03)
    x, y = np.meshgrid(*grid.coords, indexing="ij")
    r2 = x * x + y * y
    start = np.sqrt(np.maximum(0.0, 30.0 - r2)) * (1 + 0.01 * np.random.default_rng(0).standard_normal(r2.shape))
    psi = C.normalize(jnp.asarray(start, jnp.result_type(dtype, jnp.complex64)), grid, 1.0)
    st = C.strang(system, DT, norm=1.0)
    _, e = trajectory(st, st.init(psi), EVERY * RECORDS, save_every=EVERY, observe=_energy)
    return np.asarray(e, np.float64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    e32 = records(jnp.float32)
    with jax.enable_x64(True):
        e64 = records(jnp.float64)
    d32, d64 = np.diff(e32), np.diff(e64)
    first_up = int(np.flatnonzero(d32 > 0)[0]) if np.any(d32 > 0) else None
    doc = {
        "what": "damped rotating GP run (2-D 64², L = 16, Ω = 0.8, gN = 500, γ = 0.03, dt = 2e-3), energy every "
        f"{EVERY} steps, float32 and float64",
        "float64_monotone": bool(np.all(d64 < 0)),
        "float32_increases": int(np.sum(d32 > 0)),
        "float32_first_increase_t": None if first_up is None else (first_up + 1) * EVERY * DT,
        "float64_decrease_per_record_there": None if first_up is None else float(d64[first_up]),
        "float32_largest_increase": float(d32.max()),
        "float32_largest_increase_relative": float(d32.max() / abs(e32[-1])),
        "float32_ulp_of_E": float(np.spacing(np.float32(e32[-1]))),
        "energy_float32": e32.tolist(),
        "energy_float64": e64.tolist(),
    }
    for k, v in doc.items():
        if not k.startswith("energy_"):
            print(k, v)
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
