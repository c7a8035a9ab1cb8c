"""The droplet figures of the condensates guide's LHY section, measured: Petrov's symmetric mixture droplet (PRL 115,
155302 (2015)) in his reduced units, run as the dipolar system's LHY form with no dipoles (g = −3, ε_dd = 0, γ_QF =
5/2, free space), ground states by the Riemannian CG in float64:

- the large droplet: the central density, μ and E/N at Ñ = 1000 and 3000 (48³ over 32³) and their 1/R extrapolation
  (Petrov's bulk: n = 1, μ = E/N = −1/2);
- the critical number: bisection of the smallest Ñ whose search from a Gaussian (width 2) ends bound (peak density
  > 0.1) on 40³ over 32³ (Petrov: Ñ_c ≈ 18.65);
- a trapped dipolar cloud past collapse (N = 1, g = 100, ε_dd = 1.5, γ_QF = 30, 40³ over 20³, R_c = 8): the Gaussian
  variational minimum (SciPy) and the library's ground-state energy below it.

``python -m bench.studies.condensate_lhy_droplets --out bench/results/condensate_lhy_droplets.json`` (minutes).
"""

from __future__ import annotations

import argparse

import jax
import numpy as np


def _reduced(n: int, side: float):
    from ivhl_jax.physics import condensate as C
    from ivhl_jax.physics.condensate.dipolar import Dipolar, DipolarSystem

    grid = C.Grid.uniform((n, n, n), side)
    return DipolarSystem.create(grid, np.zeros(grid.shape), -3.0, Dipolar.create(eps_dd=0.0), gamma_qf=2.5)


def _radius(grid) -> np.ndarray:
    return np.sqrt(sum(grid._bcast(x * x, a) for a, x in enumerate(grid.coords)))


def flat_top() -> dict:
    from ivhl_jax.physics import condensate as C

    s = _reduced(48, 32.0)
    r = _radius(s.grid)
    out: dict = {}
    for n_atoms in (1000.0, 3000.0):
        big_r = (3 * n_atoms / (4 * np.pi)) ** (1 / 3)
        guess = np.sqrt(0.5 * (1 - np.tanh((r - big_r) / 1.5))).astype(np.complex128)
        psi, info = C.ground_state(s, n_atoms, psi0=guess, method="cg", max_steps=400)
        d = np.abs(np.asarray(psi)) ** 2
        core = d[r < big_r / 2]
        out[f"N={n_atoms:g}"] = {
            "central_density": float(d.max()),
            "core_flatness": float(np.ptp(core) / core.max()),
            "mu": float(info["mu"]),
            "energy_per_atom": float(info["energy"]) / n_atoms,
            "residual": float(info["residual"]),
        }
    scale = 3 ** (1 / 3) - 1
    a, b = out["N=1000"], out["N=3000"]
    out["extrapolated_1_over_R"] = {
        k: b[k] - (a[k] - b[k]) / scale for k in ("central_density", "mu", "energy_per_atom")
    }
    return out


def critical_number(lo: float = 18.0, hi: float = 19.5, tol: float = 0.02) -> dict:
    from ivhl_jax.physics import condensate as C

    s = _reduced(40, 32.0)
    r = _radius(s.grid)
    guess = np.exp(-(r**2) / 8).astype(np.complex128)

    def bound(n_atoms: float) -> bool:
        psi, _ = C.ground_state(s, n_atoms, psi0=guess, method="cg", max_steps=2000)
        return float(np.max(np.abs(np.asarray(psi)) ** 2)) > 0.1

    assert bound(hi) and not bound(lo)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if bound(mid) else (mid, hi)
    return {"bracket": [lo, hi], "grid": "40^3 over 32^3", "petrov": 18.65}


def dipolar_variational() -> dict:
    from scipy.optimize import minimize

    from ivhl_jax.physics import condensate as C
    from ivhl_jax.physics.condensate.dipolar import Dipolar, DipolarSystem, gaussian_energy_parts

    n_atoms, g, eps, gam = 1.0, 100.0, 1.5, 30.0
    best = minimize(
        lambda p: gaussian_energy_parts(float(np.exp(p[0])), float(np.exp(p[1])), n_atoms, g, eps, gamma_qf=gam)[
            "total"
        ],
        [0.0, 0.5],
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-14},
    )
    sr, sz = np.exp(best.x)
    grid = C.Grid.uniform((40, 40, 40), 20.0)
    pot = C.harmonic(grid, dtype=np.float64)
    s = DipolarSystem.create(grid, pot, g, Dipolar.create(eps_dd=eps, cutoff=8.0), gamma_qf=gam)
    x, y, z = np.meshgrid(*grid.coords, indexing="ij")
    trial = np.exp(-(x * x + y * y) / (2 * sr * sr) - z * z / (2 * sz * sz)).astype(np.complex128)
    trial = C.normalize(jax.numpy.asarray(trial), grid, n_atoms)
    got = {k: float(v) for k, v in C.energy(trial, s).items()}
    want = gaussian_energy_parts(sr, sz, n_atoms, g, eps, gamma_qf=gam)
    want.pop("total")
    psi, info = C.ground_state(s, n_atoms, psi0=trial, method="cg", max_steps=1000)
    d = np.abs(np.asarray(psi)) ** 2
    return {
        "gaussian_widths": [float(sr), float(sz)],
        "variational_energy": float(best.fun),
        "library_energy_of_the_gaussian_rel_error": {k: abs(got[k] - v) / abs(v) for k, v in want.items()},
        "ground_state_energy": float(info["energy"]),
        "ground_state_residual": float(info["residual"]),
        "ground_state_rho_rms": float(np.sqrt(np.sum(d * (x * x + y * y)) / np.sum(d))),
        "ground_state_z_rms": float(np.sqrt(np.sum(d * z * z) / np.sum(d))),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    with jax.enable_x64(True):
        doc = {
            "what": "LHY droplet figures (float64, CG ground states)",
            "note": "shared 2-core host",
            "petrov_flat_top": flat_top(),
            "petrov_critical_number": critical_number(),
            "dipolar_variational": dipolar_variational(),
        }
    print(doc)
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
