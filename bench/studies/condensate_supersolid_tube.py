"""The roton of a dipolar tube softening to zero where the ground state turns modulated (the condensates guide's
supersolid section and tests/physics/condensate/test_supersolid.py).

¹⁶⁴Dy (a_dd = 130.8 a₀, m = 164 u) in an infinite tube: harmonic transverse trap f_x = f_y = 150 Hz, dipoles
along the transverse x axis, free along z, with the Lima–Pelster LHY term — the geometry of the tube studies of
Blakie, Baillie, Chomaz & Ferlaino (PRR 2, 043318 (2020)), whose transition is continuous in a window of linear
densities. One period of length L along z (:func:`ivhl_jax.physics.condensate.supersolid.tube_system`: periodic,
N = n₁ L atoms, the dipolar kernel cut to a sphere of radius R_c = the transverse half-side), so the uniform tube's
excitations sit at k_z = 2πj/L and the first, k = 2π/L, is the roton when L is a roton wavelength.

For each a_s:

- the ground state (``ground_state``: the Riemannian CG, float64) from a uniform tube seeded with a 10 % modulation
  ψ ∝ e^{−ρ²/2}(1 + 0.1 cos kz), which relaxes to the uniform tube where that is the ground state; its contrast
  C = (n_max − n_min)/(n_max + n_min) of the line density n(z) over the period (one maximum per period, so this is
  :func:`~ivhl_jax.physics.condensate.supersolid.density_contrast`'s C of the periodic line);
- the hysteresis check: the same CG started from the modulated state of the next lower a_s (``--hysteresis``:
  the list is walked upwards, each start the previous a_s's carried state) — a second, modulated branch above the
  onset would mark a discontinuous transition;
- on the uniform side, the two lowest Bogoliubov modes (``bogoliubov``, the energy-Hessian LOBPCG, in the
  A-inner product: ``metric="A"``, which resolves the pair as ω² → 0) about the uniform tube (the CG from the
  unseeded guess, which stays z-independent): the roton pair cos kz, sin kz, ω², residuals and iterations.

Then two fits: ω² linear in a_s over the uniform points nearest the onset (ω² → 0 at a_ω) and C² linear in a_s
over the modulated points next to the onset (C ∝ √(a_C − a_s) → 0 at a_C); a continuous transition has a_ω = a_C.

``python -m bench.studies.condensate_supersolid_tube --out bench/results/condensate_supersolid_tube_cpu.json``;
the grid, L, n₁ and the a_s lists are options.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

A_DD, MASS, TRAP_HZ = 130.8, 164.0, (150.0, 150.0)
#: The largest relative BdG residual of a mode that enters the ω² fit.
RESIDUAL_OK = 1e-4


def tube(a_s: float, shape, half_um, length_um: float):
    """(system, units) of the ¹⁶⁴Dy tube at a_s (a₀), float64."""
    from ivhl_jax.physics.condensate.supersolid import tube_system

    return tube_system(shape, half_um, length_um, a_s, A_DD, MASS, TRAP_HZ)


def seeded(system, atoms: float, seed: float) -> np.ndarray:
    """The start ψ ∝ exp(−(x² + y²)/2)(1 + seed · cos 2πz/L) (trap units), normalised to ``atoms``."""
    grid = system.grid
    x, y, z = (np.asarray(c, np.float64) for c in grid.coords)
    psi = np.exp(-(x[:, None, None] ** 2 + y[None, :, None] ** 2) / 2) * (
        1 + seed * np.cos(2 * np.pi * z[None, None, :] / grid.length[2])
    )
    return (psi * np.sqrt(atoms / (np.sum(psi**2) * grid.cell_volume))).astype(np.complex128)


def period_contrast(psi, grid) -> float:
    """C = (max n − min n)/(max n + min n) of the line density n(z) over one period."""
    from ivhl_jax.physics.condensate.supersolid import line_density

    n = line_density(psi, grid)
    return float((n.max() - n.min()) / (n.max() + n.min()))


def ground(system, atoms: float, guess) -> tuple[Any, dict]:
    from ivhl_jax.physics import condensate as C

    t = time.perf_counter()
    psi, info = C.ground_state(system, atoms, psi0=guess, max_steps=20000)
    psi.block_until_ready()
    return psi, {
        "contrast": period_contrast(psi, system.grid),
        "energy_per_atom": float(info["energy"]) / atoms,
        "iterations": int(info["steps"]),
        "residual": float(info["residual"]),
        "converged": bool(info["converged"]),
        "wall_s": time.perf_counter() - t,
    }


def roton_modes(system, atoms: float, tol: float, max_iterations: int, metric: str = "A") -> dict:
    """The two lowest BdG modes about the uniform tube (the unseeded CG) and their axial wave numbers; ``metric``
    that of ``bogoliubov`` ("A": resolves the pair as ω² → 0)."""
    from ivhl_jax.physics import condensate as C

    psi, info = C.ground_state(system, atoms, psi0=seeded(system, atoms, 0.0), max_steps=20000)
    t = time.perf_counter()
    modes = C.bogoliubov(jax.random.key(0), system, psi, 2, tol=tol, max_iterations=max_iterations, metric=metric)
    dn = (np.asarray(modes.u) + np.asarray(modes.v)) * np.asarray(psi).real[None]
    spec = np.sum(np.abs(np.fft.rfft(dn, axis=-1)) ** 2, axis=(1, 2))
    return {
        "uniform_contrast": period_contrast(psi, system.grid),
        "omega_squared": np.asarray(modes.omega_squared).tolist(),
        "residual": np.asarray(modes.residual).tolist(),
        "iterations": int(modes.iterations),
        "k_index": [int(np.argmax(s)) for s in spec],
        "wall_s": time.perf_counter() - t,
    }


def fits(rows: list[dict], onset_points: int) -> dict:
    """a_ω (ω² linear in a_s over the ``onset_points`` uniform points nearest the onset whose modes converged,
    residual ≤ :data:`RESIDUAL_OK`) and a_C (C² linear in a_s over the ``onset_points`` modulated points nearest
    the onset), each with the standard error of the root from the fit's covariance."""
    out: dict = {}
    uni = sorted(
        (r["a_s"], float(np.mean(r["modes"]["omega_squared"])))
        for r in rows
        if "modes" in r and max(r["modes"]["residual"]) <= RESIDUAL_OK
    )[:onset_points]
    mod = sorted(
        [(r["a_s"], r["ground"]["contrast"] ** 2) for r in rows if r["ground"]["contrast"] > 1e-6], reverse=True
    )[:onset_points]
    for name, pts in (("omega_squared", uni), ("contrast_squared", mod)):
        if len(pts) < 2:
            continue
        a, y = np.array(pts).T
        err = None
        if len(pts) > 2:  # δroot from the covariance of (slope, intercept)
            (slope, icpt), cov = np.polyfit(a, y, 1, cov=True)
            jac = np.array([icpt / slope**2, -1 / slope])
            err = float(np.sqrt(jac @ cov @ jac))
        else:
            slope, icpt = np.polyfit(a, y, 1)
        root = -icpt / slope
        out[name] = {"points": pts, "slope": float(slope), "zero_at": float(root), "zero_at_err": err}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16,16,16")
    ap.add_argument("--half-um", default="4,4", help="transverse half-sides of the box in µm (x, y)")
    ap.add_argument("--length-um", type=float, default=2.5, help="the period L along z in µm")
    ap.add_argument("--density", type=float, default=2500.0, help="linear density n₁ in atoms per µm")
    ap.add_argument("--scan", default="93,92.6,92.4,92.3,92.2,92.1,92,91.9,91.8,91.7,91.6")
    ap.add_argument("--hysteresis", default="", help="a_s list walked upwards from the modulated state")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--max-iterations", type=int, default=3000)
    ap.add_argument("--onset-points", type=int, default=3)
    ap.add_argument("--metric", default="A", choices=("A", "B"), help="the BdG iteration's inner product")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    shape = tuple(int(s) for s in a.shape.split(","))
    half = tuple(float(s) for s in a.half_um.split(","))
    atoms = a.density * a.length_um
    doc: dict = {
        "what": "164Dy in an infinite tube (one period along z) with LHY: the ground-state contrast C(a_s) and the "
        "roton pair's omega^2 about the uniform tube, and the a_s where each reaches zero",
        "species": {"a_dd": A_DD, "mass": MASS, "trap_hz": TRAP_HZ, "dipole_axis": "x"},
        "grid": {"shape": shape, "half_sides_um": half, "length_um": a.length_um, "cutoff_um": min(half)},
        "linear_density_per_um": a.density,
        "atoms_per_period": atoms,
        "bdg": {"tol": a.tol, "max_iterations": a.max_iterations, "modes": 2, "metric": a.metric},
        "note": "shared 2-core host, other jobs running: wall times are upper bounds",
    }

    def write() -> None:
        if a.out:
            from ivhl_jax.bench.harness import write_results

            write_results(a.out, doc)

    rows: list[dict] = []
    doc["scan"] = rows
    with jax.enable_x64(True):
        for a_s in (float(x) for x in a.scan.split(",")):
            system, _ = tube(a_s, shape, half, a.length_um)
            row: dict = {"a_s": a_s}
            _, row["ground"] = ground(system, atoms, seeded(system, atoms, 0.1))
            if row["ground"]["contrast"] < 1e-6:
                row["modes"] = roton_modes(system, atoms, a.tol, a.max_iterations, a.metric)
            rows.append(row)
            doc["fits"] = fits(rows, a.onset_points)
            print(row, flush=True)
            write()
        if a.hysteresis:
            walk: list[dict] = []
            doc["hysteresis"] = walk
            previous = None
            for a_s in (float(x) for x in a.hysteresis.split(",")):
                system, _ = tube(a_s, shape, half, a.length_um)
                start = seeded(system, atoms, 0.5) if previous is None else previous
                previous, rec = ground(system, atoms, start)
                walk.append({"a_s": a_s, "carried": rec})
                print(walk[-1], flush=True)
                write()
    write()


if __name__ == "__main__":
    main()
