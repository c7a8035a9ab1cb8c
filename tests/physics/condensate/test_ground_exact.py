"""The Riemannian conjugate-gradient ground state (``ground_state(..., method="cg")``) is the exact discrete ground
state of the library's energy functional, for every condensate system.

Reference (none from the library's solvers): a float64 self-consistent-field iteration that takes the lowest
eigenvector of the discretised Hamiltonian H[ρ] = T + V + U[ρ] (T = F⁻¹ ½k² F, the same spectral kinetic operator,
built here with NumPy's FFT; a dense ``numpy.linalg.eigh`` up to 1024 points, ``scipy.sparse.linalg.eigsh`` on a
matrix-free H above), with linear density mixing until the density is settled to 1e-13. Its fixed point satisfies
Hψ = μψ on the grid, so it is the discrete ground state the solver must reach: the energies agree to 1e-11
(relative) and the states to 1e-7 of the peak, the solver's residual ‖Hψ − μψ‖/‖Hψ‖ is < 1e-10, and the
imaginary-time flow at a small dt lies above it by its O(dt) bias. Spin-1 references are exact reductions: with
c₂ < 0 and no Zeeman terms the ground state is a fully polarised scalar condensate of coupling c₀ + c₂; with
c₂ > 0, q = 0 and M held it is the two-component (m = ±1) mixture of couplings c₀ ± c₂ with N± = (N ± M)/2. The
dipolar reference uses the library's Fourier kernel Ṽ_dd(k) (validated against Gaussian clouds in
``test_dipolar.py``) for Φ_dd = F⁻¹[Ṽ_dd F ρ].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse.linalg as sla

from ivhl_jax import condensate as C


def _half_k2(shape, length):
    ks = [2 * np.pi * np.fft.fftfreq(n, L / n) for n, L in zip(shape, length)]
    mesh = np.meshgrid(*ks, indexing="ij")
    return 0.5 * sum(k * k for k in mesh)


def _kin(v, hk2):
    return np.fft.ifftn(hk2 * np.fft.fftn(v)).real


def _lowest(u, hk2, v0):
    """(μ, φ) the lowest eigenpair of T + diag(u) (φ unit 2-norm, positive sum)."""
    n = u.size
    if n <= 1024:
        eye = np.eye(n).reshape((n,) + u.shape)
        t = np.fft.ifftn(hk2 * np.fft.fftn(eye, axes=tuple(range(1, u.ndim + 1))), axes=tuple(range(1, u.ndim + 1)))
        h = t.real.reshape(n, n) + np.diag(u.reshape(-1))
        w, v = np.linalg.eigh(0.5 * (h + h.T))
        mu, phi = w[0], v[:, 0]
    else:
        op = sla.LinearOperator(
            (n, n), matvec=lambda x: (_kin(x.reshape(u.shape), hk2) + u * x.reshape(u.shape)).ravel()
        )
        w, v = sla.eigsh(op, k=1, which="SA", v0=v0.ravel(), tol=1e-14, ncv=20)
        mu, phi = w[0], v[:, 0]
    phi = phi.reshape(u.shape)
    return mu, phi * np.sign(phi.sum())


def _dense(op, shape):
    """The dense matrix of a linear operator on grid functions (its columns the images of the unit vectors)."""
    n = int(np.prod(shape))
    return np.stack([op(e.reshape(shape)).ravel() for e in np.eye(n)], axis=1)


def scf(potential, couplings, norms, shape, length, phi_dd=None, tol=1e-12, start=3e-2, sweeps=2000):
    """The discrete ground state of Σ_i [T + V_i + Σ_j g_ij ρ_j (+ Φ_dd[ρ])] (float64 NumPy): the self-consistent
    field with the optimal damping of Cancès & Le Bris (each step t ∈ [0, 1] minimises the relaxed, mixed-state
    energy, convex in the densities for repulsive couplings) until the density changes by < ``start`` of its peak,
    then Newton's method from √ρ on the discrete equations H_i ψ_i = μ_i ψ_i, dV Σψ_i² = N_i with the dense Jacobian
    until ‖Hψ − μψ‖ < ``tol``·‖Hψ‖; the result is
    checked to be the lowest eigenvector of its own H (the ground state, not an excited branch). Returns
    (ψ of shape (C, *grid), E)."""
    hk2 = _half_k2(shape, length)
    dv = float(np.prod([L / n for n, L in zip(shape, length)]))
    c = len(norms)
    g = np.asarray(couplings, float).reshape(c, c)
    v = np.broadcast_to(potential, (c,) + tuple(shape))
    axes = tuple(range(1, v.ndim))
    zero = np.zeros(shape)

    def quad(a, b):  # the interaction energy's bilinear form
        out = 0.5 * np.sum(g * np.tensordot(a, b, axes=(axes, axes))) * dv
        return out + (0.5 * np.sum(phi_dd(a.sum(0)) * b.sum(0)) * dv if phi_dd is not None else 0.0)

    def field(rho):  # U_i = V_i + Σ_j g_ij ρ_j + Φ_dd[Σρ]
        return v + np.tensordot(g, rho, axes=1) + (phi_dd(rho.sum(0)) if phi_dd is not None else zero)

    def orbitals(rho, psi):
        u = field(rho)
        return np.stack([_lowest(u[i], hk2, psi[i])[1] * np.sqrt(norms[i] / dv) for i in range(c)])

    def linear(psi):  # Σ_i ⟨ψ_i, (T + V_i) ψ_i⟩
        return sum(np.sum(psi[i] * _kin(psi[i], hk2)) for i in range(c)) * dv + np.sum(v * psi**2) * dv

    psi = orbitals(np.zeros_like(v), np.ones_like(v))
    rho, lin = psi**2, linear(psi)
    for _ in range(sweeps):
        new = orbitals(rho, psi)
        drho, dlin = new**2 - rho, linear(new) - lin
        a, b = quad(drho, drho), dlin + 2 * quad(rho, drho)
        t = 1.0 if a <= 0 else float(np.clip(-b / (2 * a), 0.0, 1.0))
        rho, lin, psi = rho + t * drho, lin + t * dlin, new
        if t * np.max(np.abs(drho)) < start * np.max(rho):
            break
    psi = _newton(np.sqrt(rho), field, g, hk2, dv, norms, phi_dd, tol)
    u = field(psi**2)
    for i in range(c):  # the lowest eigenvector of its own H: the ground state
        mu, phi = _lowest(u[i], hk2, psi[i])
        np.testing.assert_allclose(np.abs(phi) * np.sqrt(norms[i] / dv), np.abs(psi[i]), atol=1e-7 * np.abs(psi).max())
    return psi, _energy(psi, v, g, hk2, dv, phi_dd)


def _newton(psi, field, g, hk2, dv, norms, phi_dd, tol, max_iter=30):
    """Newton's method on F_i = (T + U_i[ρ] − μ_i)ψ_i = 0, dV Σψ_i² = N_i (unknowns ψ, μ; dense Jacobian)."""
    c, shape = psi.shape[0], psi.shape[1:]
    n = int(np.prod(shape))
    t = _dense(lambda e: _kin(e, hk2), shape)
    k = _dense(phi_dd, shape) if phi_dd is not None else np.zeros((n, n))
    for _ in range(max_iter):
        u = field(psi**2)
        h_psi = np.stack([_kin(psi[i], hk2) + u[i] * psi[i] for i in range(c)])
        mu = np.array([np.sum(psi[i] * h_psi[i]) / np.sum(psi[i] ** 2) for i in range(c)])
        res = (h_psi - mu.reshape((c,) + (1,) * len(shape)) * psi).reshape(c, n)
        if np.linalg.norm(res) < tol * np.linalg.norm(h_psi):
            return psi
        f = psi.reshape(c, n)
        jac = np.zeros((c * (n + 1), c * (n + 1)))
        for i in range(c):
            for j in range(c):
                block = np.diag(2 * g[i, j] * f[i] * f[j]) + 2 * f[i][:, None] * k * f[j][None, :]
                if i == j:
                    block += t + np.diag(u[i].ravel() - mu[i])
                jac[i * n : (i + 1) * n, j * n : (j + 1) * n] = block
            jac[i * n : (i + 1) * n, c * n + i] = -f[i]
            jac[c * n + i, i * n : (i + 1) * n] = 2 * dv * f[i]
        rhs = np.concatenate([res.ravel(), [dv * np.sum(f[i] ** 2) - norms[i] for i in range(c)]])
        step = np.linalg.solve(jac, -rhs)
        psi = psi + step[: c * n].reshape(psi.shape)
    raise AssertionError("Newton did not converge")


def _energy(psi, v, g, hk2, dv, phi_dd=None):
    rho = psi**2
    kin = sum(np.sum(psi[i] * _kin(psi[i], hk2)) for i in range(len(psi))) * dv
    e = (
        kin
        + np.sum(v * rho) * dv
        + 0.5 * np.sum(g * np.tensordot(rho, rho, axes=(tuple(range(1, rho.ndim)),) * 2)) * dv
    )
    if phi_dd is not None:
        n = rho.sum(0)
        e += 0.5 * np.sum(phi_dd(n) * n) * dv
    return float(e)


def _check(psi, info, ref_psi, ref_e, system, energy_rtol=1e-11, state_atol=1e-7):
    psi = np.asarray(psi)
    assert bool(info["converged"]) and float(info["residual"]) < 1e-10, info
    e = float(C.energy(jnp.asarray(psi), system)["total"])
    assert abs(e - ref_e) <= energy_rtol * abs(ref_e), (e, ref_e)
    np.testing.assert_allclose(float(info["energy"]), e, rtol=1e-13)
    if ref_psi is not None:
        assert np.max(np.abs(psi.imag)) == 0.0  # a real problem stays real
        np.testing.assert_allclose(psi.real, ref_psi.reshape(psi.shape), atol=state_atol * np.max(np.abs(ref_psi)))
    return e


@pytest.mark.slow
def test_gp_1d_is_the_dense_scf_ground_state_and_below_the_flow():
    """1D, gN = 50, 64 points, float64: E to 1e-11, ψ to 1e-7 of the peak; the flow at dt = 1e-3 lies above."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform(64, 16.0)
        system = C.GPSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 50.0)
        ref_psi, ref_e = scf(np.asarray(system.potential), [[50.0]], [1.0], grid.shape, grid.length)
        psi, info = C.ground_state(system, 1.0, method="cg")
        e = _check(psi, info, ref_psi, ref_e, system)
        np.testing.assert_allclose(float(C.residual(psi, system)), float(info["residual"]), rtol=1e-6)
        _, flow = C.ground_state(system, 1.0, 1e-3, tol=1e-13)
        assert e <= float(flow["energy"]) and float(flow["energy"]) - e < 1e-5 * abs(e)


@pytest.mark.slow
def test_gp_2d_is_the_dense_scf_ground_state():
    """2D, g = 20, 24 × 24 points, float64 (an anisotropic trap)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((24, 24), (10.0, 10.0))
        system = C.GPSystem.create(grid, C.harmonic(grid, (1.0, 1.3), dtype=jnp.float64), 20.0)
        ref_psi, ref_e = scf(np.asarray(system.potential), [[20.0]], [1.0], grid.shape, grid.length)
        psi, info = C.ground_state(system, 1.0, method="cg")
        _check(psi, info, ref_psi, ref_e, system)


@pytest.mark.slow
def test_mixture_1d_is_the_dense_scf_ground_state():
    """Two miscible components, N = (1, 0.7), g = [[40, 20], [20, 50]], different traps, float64."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform(64, 16.0)
        v = np.stack([np.asarray(C.harmonic(grid, w, dtype=jnp.float64)) for w in (1.0, 1.2)])
        g = [[40.0, 20.0], [20.0, 50.0]]
        system = C.MixtureSystem.create(grid, jnp.asarray(v), g)
        ref_psi, ref_e = scf(v, g, [1.0, 0.7], grid.shape, grid.length)
        psi, info = C.ground_state(system, jnp.asarray([1.0, 0.7]), method="cg")
        _check(psi, info, ref_psi, ref_e, system)
        np.testing.assert_allclose(np.asarray(C.component_norms(psi, grid)), [1.0, 0.7], rtol=1e-13)


@pytest.mark.slow
def test_spin1_ferromagnetic_is_the_polarised_scalar_ground_state():
    """c₀ = 40, c₂ = −5, p = q = 0, M free: E = the scalar ground state of g = c₀ + c₂ (float64)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform(64, 16.0)
        v = C.harmonic(grid, 1.0, dtype=jnp.float64)
        system = C.Spin1System.create(grid, v, 40.0, -5.0)
        _, ref_e = scf(np.asarray(v), [[35.0]], [1.0], grid.shape, grid.length)
        psi, info = C.ground_state(system, 1.0, method="cg")
        _check(psi, info, None, ref_e, system)
        fx, fy, fz = (np.asarray(f) for f in C.spin_density(psi))
        n = np.sum(np.abs(np.asarray(psi)) ** 2, axis=0)
        np.testing.assert_allclose(np.sqrt(fx**2 + fy**2 + fz**2), n, atol=1e-8 * n.max())  # |F| = n


@pytest.mark.slow
def test_spin1_antiferromagnetic_with_magnetization_is_the_two_component_mixture():
    """c₀ = 40, c₂ = +5, q = 0, N = 1, M = 0.4 held: E = the (m = ±1) mixture of g = [[c₀+c₂, c₀−c₂], ...] with
    N± = (0.7, 0.3); the m = 0 component empties (float64)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform(64, 16.0)
        v = C.harmonic(grid, 1.0, dtype=jnp.float64)
        system = C.Spin1System.create(grid, v, 40.0, 5.0)
        g = [[45.0, 35.0], [35.0, 45.0]]
        _, ref_e = scf(np.asarray(v), g, [0.7, 0.3], grid.shape, grid.length)
        psi, info = C.ground_state(system, 1.0, method="cg", magnetization=0.4)
        _check(psi, info, None, ref_e, system)
        np.testing.assert_allclose(float(C.magnetization(psi, grid)), 0.4, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(C.component_norms(psi, grid)), [0.7, 0.0, 0.3], atol=1e-9)


@pytest.mark.slow
def test_dipolar_3d_is_the_scf_ground_state():
    """12³ points, g = 10, ε_dd = 0.4 along z, float64: E to 1e-11 against SCF with Φ_dd from the kernel."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((12, 12, 12), 9.0)
        v = C.harmonic(grid, (1.0, 1.0, 1.5), dtype=jnp.float64)
        system = C.DipolarSystem.create(grid, v, 10.0, C.Dipolar.create(eps_dd=0.4))
        kern = np.asarray(C.dipolar_kernel(system, half=True))

        def phi_dd(n):
            return np.fft.irfftn(kern * np.fft.rfftn(n), s=n.shape, axes=(0, 1, 2))

        ref_psi, ref_e = scf(np.asarray(v), [[10.0]], [1.0], grid.shape, grid.length, phi_dd=phi_dd)
        psi, info = C.ground_state(system, 1.0, method="cg")
        _check(psi, info, ref_psi, ref_e, system)


@pytest.mark.slow
def test_rotating_below_nucleation_is_the_non_rotating_ground_state():
    """2D, g = 50, Ω = 0.3 (below vortex nucleation): the complex (rotating-frame) solve reaches the real
    non-rotating ground state, ⟨L_z⟩ = 0 and the same energy to 1e-11 (float64)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((32, 32), 12.0)
        v = C.harmonic(grid, 1.0, dtype=jnp.float64)
        psi0 = C.gaussian(grid, 1.2, dtype=jnp.complex128) * jnp.exp(0.3j * jnp.asarray(grid.mesh(jnp.float64)[0]))
        psi, info = C.ground_state(C.GPSystem.create(grid, v, 50.0, 0.3), 1.0, method="cg", psi0=psi0)
        _, ref = C.ground_state(C.GPSystem.create(grid, v, 50.0), 1.0, method="cg")
        assert bool(info["converged"]) and float(info["residual"]) < 1e-10
        np.testing.assert_allclose(float(info["energy"]), float(ref["energy"]), rtol=1e-11)
        assert abs(float(C.angular_momentum(psi, grid))) < 1e-9


@pytest.mark.slow
def test_gp_1d_float32_default_reaches_its_round_off():
    """The default float32, 1D gN = 50: the solve stops at its round-off floor, E within 2 ulps of the float64
    exact ground state, ψ real and positive."""
    grid = C.Grid.uniform(64, 16.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 50.0)
    psi, info = C.ground_state(system, 1.0, method="cg")
    assert psi.dtype == jnp.complex64 and bool(info["finite"])
    assert float(info["residual"]) < 1e-4
    ref_psi, ref_e = scf(np.asarray(system.potential, np.float64), [[50.0]], [1.0], grid.shape, grid.length)
    e = float(C.energy(jnp.asarray(psi), system)["total"])
    assert abs(e - ref_e) <= 3e-7 * abs(ref_e), (e, ref_e)
    p = np.asarray(psi)
    assert np.max(np.abs(p.imag)) == 0.0 and np.min(p.real) >= -1e-6 * np.max(p.real)
    np.testing.assert_allclose(p.real, ref_psi[0], atol=2e-3 * ref_psi.max())


@pytest.mark.slow
def test_implicit_gradient_matches_finite_differences():
    """Reverse mode through the solve (implicit function theorem): d⟨x²⟩/dg of a 1D GP ground state and dE/dN₂ of
    a mixture's against central differences of float64 solves (h = 1e-3: error ~h² ≈ 1e-7 relative)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform(64, 16.0)
        v = C.harmonic(grid, 1.0, dtype=jnp.float64)
        x2 = jnp.asarray(grid.coords[0] ** 2)

        def width(g):
            psi, _ = C.ground_state(C.GPSystem.create(grid, v, g), 1.0, method="cg")
            return jnp.sum(x2 * jnp.abs(psi) ** 2) * grid.cell_volume

        h = 1e-3
        fd = (width(50.0 + h) - width(50.0 - h)) / (2 * h)
        np.testing.assert_allclose(float(jax.grad(width)(50.0)), float(fd), rtol=1e-6)

        system = C.MixtureSystem.create(grid, v, [[40.0, 20.0], [20.0, 50.0]])

        def overlap_n2(n2):
            psi, _ = C.ground_state(system, jnp.stack([jnp.asarray(1.0), n2]), method="cg")
            return jnp.sum(jnp.abs(psi[0]) ** 2 * jnp.abs(psi[1]) ** 2) * grid.cell_volume

        fd = (overlap_n2(0.7 + h) - overlap_n2(0.7 - h)) / (2 * h)
        np.testing.assert_allclose(float(jax.grad(overlap_n2)(jnp.asarray(0.7))), float(fd), rtol=1e-6)


@pytest.mark.slow
def test_complex_problem_has_no_reverse_derivative():
    """A complex ground state (spin-1) has a free global phase, a zero mode of the Hessian: no implicit derivative
    is defined, and reverse mode stops at the solver's loop with JAX's error (as it does through the flow)."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform(32, 12.0)
        v = C.harmonic(grid, 1.0, dtype=jnp.float64)

        def e(c0):
            return C.ground_state(C.Spin1System.create(grid, v, c0, -1.0), 1.0, method="cg")[1]["energy"]

        with pytest.raises(Exception, match="[Rr]everse-mode differentiation"):
            jax.grad(e)(10.0)


def test_method_is_checked():
    grid = C.Grid.uniform(16, 8.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 1.0)
    with pytest.raises(ValueError, match="method must be 'flow'"):
        C.ground_state(system, method="newton")
    with pytest.raises(ValueError, match="magnetization applies to a Spin1System"):
        C.ground_state(system, method="cg", magnetization=0.1)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        C.ground_state(system, method="cg", noise=0.1)


def test_default_method_is_the_conjugate_gradient_unless_a_step_is_given():
    """The documented rule (ground.default_method): cg by default for every system and precision but spin-1 in
    float32; the flow when the call gives its step dt or check_every, or the system has a layout; cg refuses the
    flow's parameters."""
    from ivhl_jax.physics.condensate.ground import default_method

    grid = C.Grid.uniform(16, 8.0)
    plane = C.Grid.uniform((8, 8), 8.0)
    systems = [
        C.GPSystem.create(grid, C.harmonic(grid, 1.0), 1.0),
        C.GPSystem.create(plane, C.harmonic(plane, 1.0), 1.0, 0.5),
        C.MixtureSystem.create(grid, C.harmonic(grid, 1.0), [[1.0, 0.5], [0.5, 1.0]]),
    ]
    for system in systems:
        assert default_method(system) == "cg"
        assert default_method(system, dt=1e-2) == "flow" and default_method(system, check_every=10) == "flow"
    spin1 = C.Spin1System.create(grid, C.harmonic(grid, 1.0), 1.0, 0.1)
    assert default_method(spin1) == "flow"  # float32: the complex solve can stall above its tolerance
    with jax.enable_x64(True):
        assert default_method(C.Spin1System.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 1.0, 0.1)) == "cg"
        assert default_method(spin1, policy="f64") == "cg"
    with pytest.raises(ValueError, match="pass method='flow' to use them"):
        C.ground_state(systems[0], dt=1e-2, method="cg")


@pytest.mark.slow
def test_default_method_is_differentiable():
    """Reverse mode through ``ground_state`` with every default (the conjugate gradient, implicit function theorem):
    d⟨x²⟩/dg of a 1D GP ground state against central differences of float64 solves (h = 1e-3: error ~h² ≈ 1e-7
    relative), in float64 and in the default float32 (rtol 1e-3: float32 solves at residual ~1e-5)."""
    grid = C.Grid.uniform(64, 16.0)
    x2 = jnp.asarray(grid.coords[0] ** 2)

    def width(g, dtype):
        psi, _ = C.ground_state(C.GPSystem.create(grid, C.harmonic(grid, 1.0, dtype=dtype), g))
        return jnp.sum(x2.astype(dtype) * jnp.abs(psi) ** 2) * grid.cell_volume

    h = 1e-3
    with jax.enable_x64(True):
        fd = float((width(50.0 + h, jnp.float64) - width(50.0 - h, jnp.float64)) / (2 * h))
        np.testing.assert_allclose(float(jax.grad(width)(50.0, jnp.float64)), fd, rtol=1e-6)
    np.testing.assert_allclose(float(jax.grad(width)(50.0, jnp.float32)), fd, rtol=1e-3)


@pytest.mark.slow
def test_float32_tolerance_below_the_floor_stops_on_stagnation():
    """float32 asked for a residual below its round-off floor (~1e-6): the solve stops MAX_STAGNANT iterations after
    its last new low, not at the iteration cap, and reports converged False at the floor."""
    from ivhl_jax.physics.condensate.riemannian import MAX_STAGNANT

    grid = C.Grid.uniform((32, 32), 12.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0), 100.0)
    _, info = C.ground_state(system, tol=1e-10, max_steps=20_000)
    assert not bool(info["converged"]) and float(info["residual"]) < 1e-5
    assert MAX_STAGNANT <= int(info["steps"]) < 5_000
