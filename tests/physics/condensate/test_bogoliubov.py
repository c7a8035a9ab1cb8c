"""The BdG door for every condensate system: the energy-Hessian operators, the roton of a homogeneous dipolar gas,
the two branches of a homogeneous mixture, and the modes of a vortex (complex ψ₀, dense solve).

References nobody here wrote: the analytic scalar operators A = H − μ, B = H − μ + 2gn (the energy-Hessian
operators must equal them to round-off); the dipolar Bogoliubov dispersion
ω(k) = √(ε_k(ε_k + 2n[g + g_dd(3cos²θ_k − 1)F(R_c k)])) (Santos, Shlyapnikov & Lewenstein, PRL 90, 250403 (2003);
F the spherical-cutoff factor of Ronen, Bortolotti & Bohn, PRA 74, 013623 (2006), 1 without a cutoff); the
two-component dispersion ω±² = ε_k(ε_k + 2λ±), λ± the eigenvalues of G_ij = g_ij √(n_i n_j) (Pethick & Smith,
Bose–Einstein Condensation in Dilute Gases, 2nd ed., §12.1); Kohn's theorem (the dipole modes at the trap
frequency for any stationary state); and, for a vortex, an independent float64 SciPy solution of the radial BdG
equations on a staggered finite-difference grid (its own ground state and discretisation), with the anomalous
mode's negative frequency of Pu, Law, Eberly & Bigelow, PRA 59, 1533 (1999) and Fetter & Svidzinsky,
J. Phys.: Condens. Matter 13, R135 (2001).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C


def _grid_dispersion(grid, shift):
    """Sorted ω(k) = √(ε_k(ε_k + shift(k, cos²θ_k))) over the grid's k ≠ 0 (each k once: cos and sin of ±k)."""
    ks = np.meshgrid(*grid.wavenumbers, indexing="ij")
    k2 = sum(k * k for k in ks).reshape(-1)
    kz2 = (ks[-1] ** 2).reshape(-1)
    k2, kz2 = k2[k2 > 0], kz2[k2 > 0]
    eps = 0.5 * k2
    return np.sort(np.sqrt(eps * (eps + shift(np.sqrt(k2), kz2 / k2))))


@pytest.mark.slow  # a CG ground state and two BdG compiles: ~1 minute on 2 shared cores
def test_energy_hessian_operators_equal_the_analytic_gp_ones():
    """On a trapped GP ground state the generic operators (Hessian-vector products of condensate.energy) give the
    analytic operators' spectrum to round-off (both solves converge to tol = 1e-9 relative residual)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((64,), 16.0)
        system = C.GPSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 10.0)
        psi, _ = C.ground_state(system, 1.0, method="cg", tol=1e-12, max_steps=2000)
        a = C.bogoliubov(jax.random.key(0), system, psi, 5)
        e = C.bogoliubov(jax.random.key(0), system, psi, 5, operators="energy")
        np.testing.assert_allclose(np.asarray(e.omega), np.asarray(a.omega), rtol=1e-9)
        np.testing.assert_allclose(float(e.mu), float(a.mu), rtol=1e-12)
        assert float(a.omega[0]) == pytest.approx(1.0, abs=1e-6)  # Kohn


@pytest.mark.slow  # two compiles of the energy-Hessian LOBPCG on 8³: ~1 minute on 2 shared cores
@pytest.mark.parametrize(("cutoff", "metric"), [(None, "B"), (3.0, "B"), (3.0, "A")])
def test_roton_dispersion_of_a_homogeneous_dipolar_gas_is_exact_to_the_grid(cutoff, metric):
    """Uniform ψ₀ on a periodic box, dipoles along z: ω(k) = √(ε_k(ε_k + 2n(g + Ṽ_dd(k)))) for the grid's k
    (Ṽ_dd(0) = 0: the uniform state's Φ_dd vanishes), with the kernel's cutoff factor when R_c is set. The
    energy is the discrete one, so the agreement is to round-off (rtol 1e-9, float64), in either inner product of
    the iteration (``metric``)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((8, 8, 8), (8.0, 8.0, 12.0))
        g, dens, edd = 1.5, 1.0, 0.8
        dip = C.Dipolar.create(eps_dd=edd, axis=(0.0, 0.0, 1.0), cutoff=cutoff)
        system = C.DipolarSystem.create(grid, jnp.zeros(grid.shape, jnp.float64), g, dip)
        psi0 = jnp.full(grid.shape, np.sqrt(dens), jnp.float64)
        modes = C.bogoliubov(jax.random.key(0), system, psi0, 12, metric=metric)

        def shift(k, cos2):
            x = (cutoff or 1.0) * k
            cut = 1.0 if cutoff is None else 1 + 3 * np.cos(x) / x**2 - 3 * np.sin(x) / x**3
            return 2 * dens * (g + edd * g * (3 * cos2 - 1) * cut)

        np.testing.assert_allclose(np.asarray(modes.omega), _grid_dispersion(grid, shift)[:12], rtol=1e-9)
        assert float(modes.mu) == pytest.approx(g * dens, rel=1e-12)
        np.testing.assert_allclose(np.asarray(modes.norm), 1.0, rtol=1e-9)


@pytest.mark.slow  # one compile of the energy-Hessian LOBPCG for a two-component block: ~30 s on 2 shared cores
def test_mixture_density_and_spin_branches_of_a_homogeneous_mixture():
    """Two uniform components on a periodic 2-D box: ω±² = ε_k(ε_k + 2λ±), λ± the eigenvalues of
    G_ij = g_ij√(n_i n_j); both Goldstone modes (one per component norm) are removed and μ_i = Σ_j g_ij n_j."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((12, 12), 10.0)
        gm = np.array([[2.0, 1.2], [1.2, 1.5]])
        dens = np.array([1.0, 0.6])
        system = C.MixtureSystem.create(grid, jnp.zeros(grid.shape, jnp.float64), gm)
        psi0 = jnp.asarray(np.sqrt(dens)[:, None, None] * np.ones((2,) + grid.shape), jnp.float64)
        modes = C.bogoliubov(jax.random.key(0), system, psi0, 10)
        lam = np.linalg.eigvalsh(gm * np.sqrt(np.outer(dens, dens)))
        both = np.sort(np.concatenate([_grid_dispersion(grid, lambda k, c, lv=lv: 2 * lv + 0 * k) for lv in lam]))
        np.testing.assert_allclose(np.asarray(modes.omega), both[:10], rtol=1e-9)
        np.testing.assert_allclose(np.asarray(modes.mu), gm @ dens, rtol=1e-12)
        assert modes.u.shape == (10, 2) + grid.shape


@pytest.mark.slow  # three ground states and BdG solves on 12×12×16: ~1 minute on 2 shared cores
def test_roton_of_a_dipolar_slab_softens_as_the_contact_coupling_is_lowered():
    """A flattened geometry: harmonic along the dipole axis z (ω_z = 1), periodic in the plane (a quasi-2-D slab
    of 2.5 atoms per unit area, g_dd = 10; the spherical cutoff R_c = 5, half the z box, decouples the slab from
    its periodic images). Lowering g at fixed g_dd (ε_dd = 0.83 → 1.11) softens the roton (Santos, Shlyapnikov &
    Lewenstein, PRL 90, 250403 (2003); Chomaz et al., Nat. Phys. 14, 442 (2018)): the frequency of the in-plane
    shell |k| = 2·2π/L falls monotonically and drops below the phonons of the smallest |k|, so the lowest mode
    moves from |k|_min to the roton's finite |k| (a minimum of ω(k), not a phonon instability). The ground state
    is uniform in the plane (a 2×2×16 CG solve broadcast), so every mode has one in-plane |k|."""
    with jax.enable_x64(True):
        length, n_xy = 12.0, 12
        line = C.Grid.uniform((2, 2, 16), (length, length, 10.0))
        grid = C.Grid.uniform((n_xy, n_xy, 16), (length, length, 10.0))
        dip = C.Dipolar.create(g_dd=10.0, axis=(0.0, 0.0, 1.0), cutoff=5.0)
        guess = jnp.asarray(np.broadcast_to(np.exp(-(line.coords[2] ** 2) / 4), line.shape), jnp.complex128)
        ks = np.meshgrid(*grid.wavenumbers[:2], indexing="ij")
        kk = np.sqrt(ks[0] ** 2 + ks[1] ** 2)
        k_min, k_rot = 2 * np.pi / length, 2 * 2 * np.pi / length
        roton, lowest_k = [], []
        for g in (12.0, 10.0, 9.0):
            s1 = C.DipolarSystem.create(line, C.harmonic(line, (0.0, 0.0, 1.0), dtype=jnp.float64), g, dip)
            psi1, info = C.ground_state(s1, 2.5 * length**2, psi0=guess, method="cg", tol=1e-12, max_steps=3000)
            assert bool(info["converged"])
            s3 = C.DipolarSystem.create(grid, C.harmonic(grid, (0.0, 0.0, 1.0), dtype=jnp.float64), g, dip)
            modes = C.bogoliubov(jax.random.key(0), s3, jnp.broadcast_to(psi1[:1, :1], grid.shape), 12, extra=8)
            assert int(modes.iterations) < 1000 and float(jnp.max(modes.growth_rate)) == 0.0
            spectra = np.abs(np.fft.fftn(np.asarray(modes.u), axes=(1, 2))).sum(axis=3).reshape(12, -1)
            k_of = kk.reshape(-1)[np.argmax(spectra, axis=1)]
            om = np.asarray(modes.omega)
            roton.append(om[np.isclose(k_of, k_rot)].min())
            lowest_k.append(k_of[0])
        assert roton[0] > roton[1] > roton[2] > 0, roton
        assert lowest_k[0] == pytest.approx(k_min) and lowest_k[-1] == pytest.approx(k_rot), lowest_k


@pytest.mark.slow  # a CG mixture ground state and a block LOBPCG compile: ~30 s on 2 shared cores
def test_trapped_mixture_keeps_the_kohn_mode_at_the_trap_frequency():
    """Two components in one 1-D harmonic trap, unequal g_ij and norms: the in-phase dipole (Kohn) mode stays at
    the trap frequency for any interaction (the centre of mass decouples; Kohn's theorem), and the two Goldstone
    modes are removed (no frequency near 0)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((96,), 16.0)
        system = C.MixtureSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), [[10.0, 4.0], [4.0, 7.0]])
        psi, _ = C.ground_state(system, [1.0, 0.7], method="cg", tol=1e-12, max_steps=3000)
        modes = C.bogoliubov(jax.random.key(0), system, psi, 4)
        om = np.asarray(modes.omega)
        assert np.min(np.abs(om - 1.0)) < 1e-6, om
        assert om[0] > 0.1 and modes.mu.shape == (2,)


# ------------------------------------------------------------------------------------------ the vortex
def _radial(h, radius, ell):
    """−½[(1/r)(rφ')' − ℓ²/r²] + ½r² for φ = √r f on r_j = (j − ½)h (staggered, no point at r = 0), symmetrised:
    its (diagonal, off-diagonal)."""
    r = (np.arange(1, int(round(radius / h)) + 1) - 0.5) * h
    rp, rm = r + 0.5 * h, r - 0.5 * h
    diag = 0.5 * (rp + rm) / (r * h * h) + 0.5 * ell**2 / r**2 + 0.5 * r**2
    return r, diag, -0.5 * rp[:-1] / (h * h * np.sqrt(r[:-1] * r[1:]))


def _radial_vortex_modes(g, h, radius=8.0):
    """Positive-norm BdG frequencies of the q = −1 sector (u ∝ e^{0iθ}, v ∝ e^{−2iθ}) about ψ₀ = f(r)e^{iθ} in a
    2-D isotropic trap: its own self-consistent f (∫|ψ₀|² = 1) and a sparse shift-invert eigensolve (SciPy)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl
    from scipy.linalg import eigh_tridiagonal

    r, d1, off1 = _radial(h, radius, 1)
    phi = np.sqrt(r) * r * np.exp(-(r**2) / 2)
    phi /= np.sqrt(2 * np.pi * np.sum(phi**2) * h)
    for _ in range(3000):
        w, v = eigh_tridiagonal(d1 + g * phi**2 / r, off1, select="i", select_range=(0, 0))
        new = np.abs(v[:, 0]) / np.sqrt(2 * np.pi * h)
        done = np.max(np.abs(new - phi)) < 1e-13
        phi = new if done else 0.6 * phi + 0.4 * new
        if done:
            break
    n, mu = phi**2 / r, w[0]
    blocks = []
    for ell in (0, 2):
        _, d, off = _radial(h, radius, ell)
        blocks.append(sp.diags([d + 2 * g * n - mu, off, off], [0, 1, -1]))
    gn = sp.diags(g * n)
    vals, vecs = spl.eigs(sp.bmat([[blocks[0], gn], [-gn, -blocks[1]]]).tocsc(), k=6, sigma=-0.3)
    m = r.size
    norms = np.sum(np.abs(vecs[:m]) ** 2 - np.abs(vecs[m:]) ** 2, axis=0)
    return np.sort(vals.real[(norms > 0) & (np.abs(vals.imag) < 1e-9)])


def _lab_frame_vortex(n, length, g, rotating_guess=True):
    """A centred singly quantised vortex, stationary in the non-rotating trap: the rotating-frame ground state
    (Ω = 0.8, exact by Riemannian CG; else the oscillator's m = 1 state (x + iy)e^{−r²/2}/√π, close for a weak g)
    polished by quasi-Newton steps on ∇(E − μN) = 0 in the lab frame."""
    grid = C.Grid.uniform((n, n), length)
    pot = C.harmonic(grid, 1.0, dtype=jnp.float64)
    x, y = grid.mesh(jnp.float64)
    psi = jax.lax.complex(x, y) * jnp.exp(-(x * x + y * y) / 2) / np.sqrt(np.pi)
    if rotating_guess:
        rot = C.GPSystem.create(grid, pot, g, omega_rot=0.8)
        psi, _ = C.ground_state(rot, 1.0, psi0=psi, method="cg", tol=1e-12)
    lab = C.GPSystem.create(grid, pot, g)
    m, dv = grid.size, grid.cell_volume

    def e_of(z):
        return C.energy(jax.lax.complex(z[:m], z[m:]).reshape(grid.shape), lab)["total"]

    grad, hess = jax.jit(jax.grad(e_of)), jax.jit(jax.hessian(e_of))
    z = np.concatenate([np.asarray(psi.real).ravel(), np.asarray(psi.imag).ravel()])
    for _ in range(6):
        gz = np.asarray(grad(z))
        mu = z @ gz / (2 * dv * z @ z)
        z = z - np.linalg.lstsq(np.asarray(hess(z)) - 2 * dv * mu * np.eye(2 * m), gz - 2 * dv * mu * z, rcond=1e-12)[0]
        z = z / np.sqrt(z @ z * dv)
    return lab, jax.lax.complex(z[:m], z[m:]).reshape(grid.shape)


@pytest.mark.slow  # a CG ground state, a LOBPCG compile and a dense 288² solve: ~30 s on 2 shared cores
def test_dense_solve_of_a_real_ground_state_equals_the_matrix_free_one():
    """The dense path (taken for a rotating system, here with Ω = 0 held as rotating) on a real 2-D ground state
    returns the matrix-free spectrum: the positive-norm branch is ω > 0 with ∫(|u|² − |v|²) dV = 1 and u, v equal
    to the real modes up to a phase (checked on the non-degenerate breathing-type level through |⟨u, u_ref⟩|)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((12, 12), 8.0)
        pot = C.harmonic(grid, 1.0, dtype=jnp.float64)
        system = C.GPSystem.create(grid, pot, 5.0)
        psi, _ = C.ground_state(system, 1.0, method="cg", tol=1e-12, max_steps=2000)
        ref = C.bogoliubov(jax.random.key(0), system, psi, 6)
        dense = C.bogoliubov(jax.random.key(0), C.GPSystem.create(grid, pot, 5.0, omega_rot=0.0, rotating=True), psi, 6)
        np.testing.assert_allclose(np.asarray(dense.omega), np.asarray(ref.omega), rtol=1e-7)
        np.testing.assert_allclose(np.asarray(dense.norm), 1.0, rtol=1e-8)
        assert np.all(np.asarray(dense.growth_rate) == 0.0) and int(dense.iterations) == 0
        om = np.asarray(ref.omega)
        i = int(np.argmin(np.abs(om - 2.0)))  # the 2-D breathing mode (2ω, Pitaevskii–Rosch), a single level
        assert abs(om[i] - 2.0) < 1e-2 and np.min(np.abs(np.delete(om, i) - om[i])) > 1e-3
        dv = grid.cell_volume
        overlap = abs(np.sum(np.conj(np.asarray(dense.u[i])) * np.asarray(ref.u[i]))) * dv
        assert overlap == pytest.approx(np.sum(np.asarray(ref.u[i]) ** 2) * dv, rel=1e-6)


def test_radial_reference_meets_kohn():
    """The radial reference itself: its q = −1 Kohn mode is at 1 to its O(h²) error, Richardson-extrapolated to
    1e-6."""
    coarse, fine = _radial_vortex_modes(10.0, 0.02), _radial_vortex_modes(10.0, 0.01)
    kohn = (4 * fine[1] - coarse[1]) / 3
    assert kohn == pytest.approx(1.0, abs=1e-6)


@pytest.mark.slow  # a vortex state (CG + 4 dense Newton steps) and a dense 1152² BdG eigensolve: ~2-3 min
def test_vortex_anomalous_mode_is_negative_and_kohn_modes_stay_at_the_trap_frequency():
    """Complex ψ₀ (a centred vortex, g = 10, 24² points over 8²): the lowest positive-norm mode has ω < 0 (the
    anomalous mode: a negative-energy excitation in the non-rotating frame, Pu et al. 1999, Fetter & Svidzinsky
    2001), at the radial float64 reference's ω_a (Richardson-extrapolated, h = 0.01/0.005) to 2e-3 relative; the
    two Kohn modes (q = ±1) sit at ω = 1 to 2e-3. Both tolerances are the 2-D grid's own discretisation error
    (dx = 0.33 against a healing length ~0.4): its Kohn modes are off by 9e-4."""
    with jax.enable_x64(True):
        lab, psi = _lab_frame_vortex(24, 8.0, 10.0)
        assert float(C.angular_momentum(psi, lab)) == pytest.approx(1.0, abs=1e-4)
        modes = C.bogoliubov(jax.random.key(0), lab, psi, 6)
        om = np.asarray(modes.omega)
        np.testing.assert_allclose(np.asarray(modes.norm), 1.0, rtol=1e-8)
        np.testing.assert_allclose(np.asarray(modes.growth_rate), 0.0)  # a stable state
        coarse, fine = _radial_vortex_modes(10.0, 0.01), _radial_vortex_modes(10.0, 0.005)
        anomalous = (4 * fine[0] - coarse[0]) / 3
        assert anomalous < -0.5
        assert om[0] == pytest.approx(anomalous, rel=2e-3)
        kohn = om[np.abs(om - 1.0) < 0.01]
        assert kohn.size == 2
        np.testing.assert_allclose(kohn, 1.0, atol=2e-3)


@pytest.mark.slow  # 6 dense Newton steps and a dense 1152² BdG eigensolve: ~2 min on 2 shared cores
def test_weakly_interacting_vortex_matches_degenerate_perturbation_theory():
    """A vortex of a weakly interacting gas (g = 0.1; 24² over 10², stationary in the lab frame): the analytic
    first order in g. ψ₀ → φ₁ = (x + iy)e^{−r²/2}/√π, μ = 2 + g/(4π). The anomalous mode couples u ∝ φ₀ (E = 1) to
    v ∝ φ₋₂ = (x − iy)²e^{−r²/2}/√(2π) (E = 3), degenerate at ω = −1: with a = −1 + g/(4π), c = 1 + g/(8π) (the
    diagonal elements, from ∫|φ₀φ₁|² = ∫|φ₁|⁴ = 1/(4π), ∫|φ₁φ₋₂|² = 3/(16π)) and the coupling gb,
    b = ∫φ₀φ₁²φ₋₂ = 1/(4√2π), the 2×2 problem [[a, gb], [−gb, −c]] has ω = −1 (the negative-norm Kohn partner) and
    ω_a = −1 + g/(8π) with positive norm: the anomalous mode (Linn & Fetter, PRA 60, 4910 (1999): two rigid dipole
    modes and one anomalous mode of negative frequency in the laboratory frame). Likewise v ∝ φ₁ (q = 2) gives a
    negative-norm mode at −g/(4π), i.e. a positive-norm one at +g/(4π). Tolerance 1.5 % of the O(g) shifts: the
    next order, measured as a 0.5 % change of (ω_a + 1)/g between g = 0.05 and 0.1 on a 16² grid; the Kohn modes
    at 1 to 1e-6 (the grid resolves the oscillator states to ~1e-7)."""
    with jax.enable_x64(True):
        g = 0.1
        lab, psi = _lab_frame_vortex(24, 10.0, g, rotating_guess=False)
        modes = C.bogoliubov(jax.random.key(0), lab, psi, 4)
        om = np.asarray(modes.omega)
        np.testing.assert_allclose(np.asarray(modes.norm), 1.0, rtol=1e-8)
        assert (om[0] + 1) / g == pytest.approx(1 / (8 * np.pi), rel=0.015)
        assert om[1] == pytest.approx(g / (4 * np.pi), rel=0.015)
        np.testing.assert_allclose(om[2:], 1.0, atol=1e-6)


def test_bdg_door_refuses_what_does_not_apply_in_one_line():
    grid = C.Grid.uniform((8, 8), 8.0)
    pot = C.harmonic(grid)
    spin = C.Spin1System.create(grid, pot, 1.0, 0.1)
    psi3 = jnp.ones((3,) + grid.shape, jnp.complex64)
    mix = C.MixtureSystem.create(grid, pot, [[1.0, 0.5], [0.5, 1.0]])
    psi2 = jnp.ones((2,) + grid.shape, jnp.float32)
    for call, word in [
        (lambda: C.bogoliubov(jax.random.key(0), spin, psi3, 2), "Spin1System"),
        (lambda: C.bogoliubov(jax.random.key(0), mix, psi2, 2, operators="analytic"), "operators"),
        (lambda: C.bogoliubov(jax.random.key(0), mix, psi2[0], 2), "psi0"),
        (lambda: C.bogoliubov(jax.random.key(0), mix, psi2, 2, metric="C"), "metric"),
    ]:
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        msg = str(e.value)
        assert word in msg and "\n" not in msg, msg
