"""Validation figures of the mixture, spin-1 and dipolar condensate systems, measured against references nobody
here wrote (conservation laws, the miscibility condition, the spin-1 mean-field phases, free-space dipolar energies
by quadrature, the Eberlein–Giovanazzi–O'Dell Thomas–Fermi aspect ratio), and the float32 vs float64 accuracy.

``python -m bench.studies.condensate_mixture_dipolar --out bench/results/condensate_mixture_dipolar.json``
(a few minutes on 2 CPU cores; ``--quick`` skips the 48³ aspect-ratio solves).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import quad

from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate import Grid, harmonic
from ivhl_jax.physics.condensate import dipolar as D
from ivhl_jax.physics.condensate import mixture as M


def _none(s, p):
    del s, p
    return None


def _run(st, psi, steps):
    return trajectory(st, st.init(psi), steps, save_every=steps, observe=_none)[0]


def _spinor(grid):
    mesh = np.meshgrid(*grid.coords, indexing="ij")
    zeta = np.array([0.6, 0.5 + 0.4j, 0.3])
    zeta = zeta / np.linalg.norm(zeta)
    psi = zeta.reshape((3,) + (1,) * grid.ndim) * (np.exp(-sum(m * m for m in mesh) / 2) * np.exp(0.3j * mesh[0]))[None]
    return psi


def _norms_energy(s, p):
    return M.component_norms(s, p.system.grid), M.mixture_energy(s, p.system)["total"]


def _spin_nm(s, p):
    return jnp.sum(M.component_norms(s, p.system.grid)), M.magnetization(s, p.system.grid)


def mixture_figures() -> dict:
    out: dict = {}
    grid = Grid.uniform(128, 20.0)
    x = grid.coords[0]
    psi = np.stack([np.exp(-((x - 1) ** 2) / 2) * np.exp(0.7j * x), np.exp(-((x + 1.5) ** 2) / 3)])
    for policy, dt in (("f64", jnp.float64), ("f32", jnp.float32)):
        system = M.MixtureSystem.create(grid, harmonic(grid, dtype=dt), [[3.0, 1.5], [1.5, 2.0]])
        st = C.strang(system, 1e-3)
        p0 = st.init(psi)
        _, (n, e) = trajectory(st, p0, 10_000, save_every=100, observe=_norms_energy)
        n0 = np.asarray(M.component_norms(p0, grid), np.float64)
        out[f"norm_drift_{policy}_10000_steps"] = (np.max(np.abs(np.asarray(n, np.float64) - n0), axis=0) / n0).tolist()
    # the homogeneous box: overlap of the ground state against g12 (g11 = 200, g22 = 100; √(g11 g22) = 141.42)
    box = Grid.uniform(128, 32.0)
    xb = box.coords[0]
    s = 0.5 * (1 + np.tanh(4 * np.cos(2 * np.pi * xb / 32)))
    psi0 = np.stack([np.sqrt(s + 0.05), np.sqrt(1.05 - s)])
    sweep = {}
    for g12 in (120.0, 135.0, 138.0, 141.0, 142.0, 145.0, 150.0, 160.0):
        system = M.MixtureSystem.create(box, jnp.zeros(box.shape, jnp.float64), [[200.0, g12], [g12, 100.0]])
        gs, info = C.ground_state(system, 1.0, dt=1e-2, max_steps=100_000, psi0=psi0, method="flow")
        sweep[str(g12)] = {"overlap": float(M.overlap(gs, box)), "converged": bool(info["converged"])}
    out["box_overlap_vs_g12 (g11=200, g22=100, threshold 141.42)"] = sweep
    return out


def spin1_figures() -> dict:
    out: dict = {}
    grid = Grid.uniform(128, 20.0)
    psi = _spinor(grid)
    for policy, dt in (("f64", jnp.float64), ("f32", jnp.float32)):
        system = M.Spin1System.create(grid, harmonic(grid, dtype=dt), 20.0, -2.0, q=0.4)
        st = C.strang(system, 1e-3)
        p0 = st.init(psi)
        _, (n, m) = trajectory(st, p0, 10_000, save_every=100, observe=_spin_nm)
        n0, m0 = float(jnp.sum(M.component_norms(p0, grid))), float(M.magnetization(p0, grid))
        out[f"N_drift_{policy}_10000_steps"] = float(np.max(np.abs(np.asarray(n, np.float64) - n0)) / n0)
        out[f"M_drift_{policy}_10000_steps (relative to N)"] = float(
            np.max(np.abs(np.asarray(m, np.float64) - m0)) / n0
        )
    system = M.Spin1System.create(grid, harmonic(grid, dtype=jnp.float64), 10.0, -3.0, p=0.2, q=0.5)
    ref = np.asarray(_run(C.strang(system, 1e-4), psi, 2500))
    errs = [
        float(np.max(np.abs(np.asarray(_run(C.strang(system, d), psi, int(round(0.25 / d)))) - ref)))
        for d in (5e-3, 2.5e-3, 1.25e-3)
    ]
    out["state_error_vs_dt (5e-3, 2.5e-3, 1.25e-3; T = 0.25)"] = errs
    out["observed_order"] = np.log2(np.array(errs[:-1]) / np.array(errs[1:])).tolist()
    # policy accuracy: the float32 state against the float64 one after T = 0.25 (dt = 1.25e-3)
    s32 = M.Spin1System.create(grid, harmonic(grid), 10.0, -3.0, p=0.2, q=0.5)
    a32 = np.asarray(_run(C.strang(s32, 1.25e-3), psi.astype(np.complex64), 200), np.complex128)
    a64 = np.asarray(_run(C.strang(system, 1.25e-3), psi, 200))
    out["f32_vs_f64_state_max_abs_error_200_steps"] = float(np.max(np.abs(a32 - a64)))
    big = Grid.uniform(256, 32.0)
    phases = {}
    for c2 in (-5.0, 5.0):
        system = M.Spin1System.create(big, harmonic(big, dtype=jnp.float64), 100.0, c2)
        gs, info = C.ground_state(system, 1.0, dt=5e-3, max_steps=20_000, method="flow")
        f = [np.asarray(c) for c in M.spin_density(gs)]
        phases[str(c2)] = {
            "|<F>|/N": float(np.linalg.norm([c.sum() * big.cell_volume for c in f])),
            "int|F|/N": float(np.sqrt(sum(c * c for c in f)).sum() * big.cell_volume),
            "steps": int(info["steps"]),
        }
    out["ground_state_spin_c0=100 (c2<0 ferro, c2>0 polar)"] = phases
    return out


def _angular_mean(w_rho, w_z):
    def weight(u):
        return (w_rho**2 * (1 - u * u) + w_z**2 * u * u) ** -1.5

    num = quad(lambda u: (3 * u * u - 1) * weight(u), 0, 1, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
    return num / quad(weight, 0, 1, epsabs=1e-14, epsrel=1e-12, limit=200)[0]


def dipolar_figures(quick: bool) -> dict:
    out: dict = {}
    energies = {}
    for n, length in ((32, 16.0), (48, 24.0)):
        grid = Grid.uniform((n,) * 3, length)
        X, Y, Z = np.meshgrid(*grid.coords, indexing="ij")
        for cut in (None, length / 2):
            system = D.DipolarSystem.create(
                grid, jnp.zeros(grid.shape, jnp.float64), 1.0, D.Dipolar.create(g_dd=1.0, cutoff=cut)
            )
            for wr, wz in ((1.0, 1.5), (1.5, 1.0), (1.0, 1.0)):
                psi = np.exp(-((X**2 + Y**2) / wr**2 + Z**2 / wz**2) / 2)
                psi = psi / np.sqrt(np.sum(psi**2) * grid.cell_volume)
                e = float(D.dipolar_energy(psi, system))
                ref = 0.5 / ((2 * np.pi) ** 1.5 * wr**2 * wz) * _angular_mean(wr, wz)
                energies[f"{n}^3 L={length} cutoff={cut} w=({wr},{wz})"] = {"E_dd": e, "free_space": ref}
    out["gaussian_dipolar_energy (g_dd = N = 1, float64)"] = energies
    cases = [(32, 16.0, 1000.0, 1.0, 8.0)]
    if not quick:
        cases += [(48, 20.0, 5000.0, 1.0, 10.0), (48, 20.0, 5000.0, 2.0, 10.0), (48, 24.0, 5000.0, 0.5, 12.0)]
    tf = {}
    for n, length, gn, gam, rc in cases:
        for eps in (0.0, 0.5):
            grid = Grid.uniform((n,) * 3, length)
            system = D.DipolarSystem.create(
                grid, harmonic(grid, (1.0, 1.0, gam)), gn, D.Dipolar.create(eps_dd=eps, cutoff=rc)
            )
            t = time.perf_counter()
            gs, info = C.ground_state(system, 1.0, dt=2e-3, max_steps=8000, check_every=50, method="flow")
            rho = np.abs(np.asarray(gs, np.complex128)) ** 2
            X, Y, Z = np.meshgrid(*grid.coords, indexing="ij")
            kappa = float(np.sqrt(0.5 * np.sum(rho * (X**2 + Y**2)) / np.sum(rho * Z**2)))
            tf[f"{n}^3 L={length} gN={gn} gamma={gam} eps_dd={eps}"] = {
                "kappa_ground_state": kappa,
                "kappa_thomas_fermi": D.thomas_fermi_aspect_ratio(eps, gam),
                "relative_difference": kappa / D.thomas_fermi_aspect_ratio(eps, gam) - 1,
                "steps": int(info["steps"]),
                "converged": bool(info["converged"]),
                "seconds": time.perf_counter() - t,
            }
    out["thomas_fermi_aspect_ratio (float32 ground state, cutoff R_c)"] = tf
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    with jax.enable_x64(True):
        doc = {"mixture": mixture_figures(), "spin1": spin1_figures(), "dipolar": dipolar_figures(a.quick)}
    print(doc)
    if a.out:
        from ivhl_jax.bench.harness import write_results

        write_results(a.out, doc)


if __name__ == "__main__":
    main()
