"""The ¹⁶⁴Dy supersolid of an elongated trap, measured (the condensates guide's supersolid section and
tests/physics/condensate/test_supersolid.py): a_dd = 132 a₀, N = 40000, m = 164 u, f = (110, 90, 30) Hz, dipoles
along the tight x axis, the long axis z (the parameters of UltraCold's supersolid example, examples/example-4),
with the Lima–Pelster LHY term, converted by :func:`ivhl_jax.physics.condensate.supersolid.species_units`.

- the scan: for each a_s, the ground state by the library's defaults (``ground_state``: the Riemannian CG from its
  Gaussian guess, float64) and, as a check on the modulated side where several stationary states compete, the
  CG started from the default ground state of the previous (larger) a_s; for each: E/N (ħω̄), the number of maxima
  and the contrast of the line density n(z), the iterations, the residual and the wall time;
- the roton: the lowest Bogoliubov modes (``bogoliubov``, the energy-Hessian LOBPCG, in the A-inner product by
  default: ``--metric A`` resolves a mode whose ω² → 0) about the default ground states on the superfluid side, or
  (``--carry``) about the superfluid branch followed down the a_s list (each CG started from the state at the
  previous a_s), with the axial parity of each mode's density fluctuation (u + v)ψ₀ (even: +1, odd: −1).

``python -m bench.studies.condensate_supersolid --roton "" --out bench/results/condensate_supersolid_cpu.json`` (the
scan) and ``python -m bench.studies.condensate_supersolid --scan "" --out
bench/results/condensate_supersolid_roton_cpu.json`` (the modes); minutes each, the grids and a_s lists are options.
``--hysteresis`` follows one branch through an a_s list (each CG started from the state at the previous a_s) beside
the default ground states: two stationary states at one a_s, the modulated one lower, mark a discontinuous
transition.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

A_DD, MASS, TRAP_HZ, ATOMS = 132.0, 164.0, (110.0, 90.0, 30.0), 40000
SPECIES = {"a_dd": A_DD, "mass": MASS, "trap_hz": TRAP_HZ, "atoms": ATOMS}


def dysprosium(a_s: float, shape: tuple[int, int, int], half_um: tuple[float, float, float], *, lhy: bool = True):
    """(system, units) of the elongated ¹⁶⁴Dy trap at a_s (a₀) on a box of half-sides ``half_um`` (µm), float64."""
    from ivhl_jax.physics.condensate.supersolid import species_system

    return species_system(shape, half_um, a_s, A_DD, MASS, TRAP_HZ, lhy=lhy)


def axial_parity(modes, psi0) -> list[float]:
    """⟨δn, P δn⟩/⟨δn, δn⟩ of each mode's density fluctuation δn = (u + v)ψ₀ under z → −z (the grid's z = 0 is
    index n/2: the reflection is a roll by one after the flip)."""
    dn = (np.asarray(modes.u) + np.asarray(modes.v)) * np.asarray(psi0).real[None]
    flipped = np.roll(dn[..., ::-1], 1, axis=-1)
    return [float(np.sum(a * b) / np.sum(a * a)) for a, b in zip(dn, flipped)]


def solve(system, guess: Any) -> tuple[Any, dict]:
    """(ψ, record) of ``ground_state(system, N, psi0=guess)``: E/N, the maxima and contrast of n(z), the iterations,
    the residual, convergence and the wall time."""
    from ivhl_jax.physics import condensate as C
    from ivhl_jax.physics.condensate.supersolid import density_contrast, line_density

    t = time.perf_counter()
    psi, info = C.ground_state(system, ATOMS, psi0=guess)
    psi.block_until_ready()
    wall = time.perf_counter() - t
    count, contrast = density_contrast(line_density(psi, system.grid))
    return psi, {
        "energy_per_atom": float(info["energy"]) / ATOMS,
        "maxima": count,
        "contrast": contrast,
        "iterations": int(info["steps"]),
        "residual": float(info["residual"]),
        "converged": bool(info["converged"]),
        "wall_s": wall,
    }


def follow(a_values, shape, half_um, carry: bool) -> list[dict]:
    """Each a_s from the default guess, and (below the first) the CG started from a state of the previous a_s:
    its default ground state (``carry=False``: the scan) or the state carried from the first a_s through the
    list (``carry=True``: the hysteresis check, two branches where both exist)."""
    rows: list[dict] = []
    previous: Any = None
    for a_s in a_values:
        system, _ = dysprosium(a_s, shape, half_um)
        row: dict = {"a_s": a_s}
        psi, row["default"] = solve(system, None)
        if previous is not None:
            followed, row["carried" if carry else "previous"] = solve(system, previous)
            psi = followed if carry else psi
        previous = psi
        print(row, flush=True)
        rows.append(row)
    return rows


def roton(
    a_values,
    shape,
    half_um,
    n_modes: int,
    tol: float,
    max_iterations: int,
    metric: str = "A",
    carry: bool = False,
    rows: list[dict] | None = None,
    write: Any = None,
) -> list[dict]:
    """The ``n_modes`` lowest BdG modes (``bogoliubov`` with ``metric``; "A" resolves a mode whose ω² → 0) about
    the default ground state at each a_s, or (``carry=True``) about the state carried down the list (each CG
    started from the state at the previous a_s: the superfluid branch as long as it is a local minimum); with
    ``carry`` the default ground state is recorded beside it, and no modes are computed about a modulated state.
    Each row is appended to ``rows`` (a new list if None) and ``write()`` (if given) is called after it."""
    from ivhl_jax.physics import condensate as C
    from ivhl_jax.physics.condensate.supersolid import density_contrast, line_density

    rows = [] if rows is None else rows
    previous: Any = None
    for a_s in a_values:
        system, u = dysprosium(a_s, shape, half_um)
        row: dict = {"a_s": a_s}
        psi, row["ground_state"] = solve(system, None)
        if carry and previous is not None:
            psi, row["carried"] = solve(system, previous)
        previous = psi
        count, _ = density_contrast(line_density(psi, system.grid))
        if count == 1 or not carry:
            t = time.perf_counter()
            modes = C.bogoliubov(
                jax.random.key(0), system, psi, n_modes, tol=tol, max_iterations=max_iterations, metric=metric
            )
            row.update(
                {
                    "omega": np.asarray(modes.omega).tolist(),
                    "omega_squared": np.asarray(modes.omega_squared).tolist(),
                    "residual": np.asarray(modes.residual).tolist(),
                    "axial_parity": axial_parity(modes, psi),
                    "kohn_z": u["trap"][2],
                    "iterations": int(modes.iterations),
                    "wall_s": time.perf_counter() - t,
                }
            )
        rows.append(row)
        print(row, flush=True)
        if write is not None:
            write()
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="32,32,128")
    ap.add_argument("--half-um", default="6,6,20", help="half-sides of the box in µm (x, y, z)")
    ap.add_argument("--scan", default="110,100,98,97,96,95,94,93,92,90")
    ap.add_argument("--roton", default="110,100,97,96.5")
    ap.add_argument("--roton-shape", default="16,16,64")
    ap.add_argument("--modes", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--max-iterations", type=int, default=600)
    ap.add_argument("--metric", default="A", choices=("A", "B"), help="the BdG iteration's inner product")
    ap.add_argument("--carry", action="store_true", help="modes about the state carried down the --roton list")
    ap.add_argument("--hysteresis", default="", help="a_s list to follow one branch through (e.g. upwards)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    shape = tuple(int(s) for s in a.shape.split(","))
    half = tuple(float(s) for s in a.half_um.split(","))
    doc: dict = {}

    def write() -> None:
        if a.out:
            from ivhl_jax.bench.harness import write_results

            write_results(a.out, doc)

    with jax.enable_x64(True):
        doc |= {
            "what": "164Dy in an elongated trap with LHY: ground states across the superfluid-supersolid transition "
            "(maxima and contrast of the line density n(z)) and the lowest Bogoliubov modes on the superfluid side",
            "species": SPECIES,
            "grid": {"shape": shape, "half_sides_um": half},
            "note": "shared 2-core host, other jobs running: wall times are upper bounds, not quiet-host figures",
        }
        if a.scan:
            doc["scan"] = follow([float(x) for x in a.scan.split(",")], shape, half, carry=False)
        if a.hysteresis:
            doc["hysteresis"] = follow([float(x) for x in a.hysteresis.split(",")], shape, half, carry=True)
        if a.roton:
            rshape = tuple(int(s) for s in a.roton_shape.split(","))
            doc["roton_grid"] = {
                "shape": rshape,
                "half_sides_um": half,
                "tol": a.tol,
                "max_iterations": a.max_iterations,
                "metric": a.metric,
                "carry": a.carry,
            }
            doc["roton"] = []
            roton(
                [float(x) for x in a.roton.split(",")],
                rshape,
                half,
                a.modes,
                a.tol,
                a.max_iterations,
                a.metric,
                a.carry,
                doc["roton"],
                write,
            )
    write()


if __name__ == "__main__":
    main()
