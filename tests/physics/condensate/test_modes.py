"""Vortex tracking (2-D points, 3-D lines) and the Bogoliubov–de Gennes spectrum of the condensate family.

References nobody here wrote: analytic vortex fields (imprinted windings with known positions, a ring of
radius R, a straight line), the analytic Bogoliubov dispersion ω(k) = √(ε_k(ε_k + 2gn)), Kohn's theorem (the
dipole mode at the trap frequency for any g), the exact 2-D breathing mode 2ω (Pitaevskii–Rosch), the 3-D
Thomas–Fermi quadrupole √2ω (Stringari 1996), and a dense float64 NumPy diagonalisation of the full 2n×2n
BdG matrix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C

# ------------------------------------------------------------------------------------------ 2-D vortices
CENTERS = np.array([[1.03, 2.27], [-3.41, 0.58], [2.71, -2.93], [-1.17, -3.66], [0.07, 0.11]])
CHARGES = np.array([1, -1, 1, -1, 1])


def _imprinted(grid, centers=CENTERS, charges=CHARGES, core=0.5):
    psi = C.gaussian(grid, 1.0, 4.0)  # |ψ|² ~ 2e-3 of the peak at the box edge: no wrap-around phase jump
    return C.imprint_vortices(psi, grid, centers, charges, core_size=core)


def _match(v, centers, charges):
    """Max distance (in grid spacings) from each true vortex to the found one of the same charge."""
    m = np.asarray(v.mask)
    pos, q = np.asarray(v.positions)[m], np.asarray(v.charges)[m]
    errs = []
    for c, qq in zip(centers, charges):
        d = np.linalg.norm(pos - c, axis=1)
        i = int(np.argmin(d))
        assert q[i] == qq
        errs.append(d[i])
    return np.array(errs)


def test_vortices_recovers_imprinted_positions_to_a_tenth_of_dx():
    grid = C.Grid.uniform((128, 128), 20.0)
    dx = grid.dx[0]
    v = C.vortices(_imprinted(grid), grid)
    assert int(v.count) == len(CENTERS)
    assert int(np.sum(np.asarray(v.mask))) == len(CENTERS)
    err = _match(v, CENTERS, CHARGES) / dx
    assert err.max() < 0.1, err
    # the padding is zero
    assert np.all(np.asarray(v.charges)[~np.asarray(v.mask)] == 0)


def test_vortices_batched_over_time_equals_frame_by_frame_and_jits():
    grid = C.Grid.uniform((64, 64), 16.0)
    frames = jnp.stack([_imprinted(grid, CENTERS[:3] + 0.13 * t, CHARGES[:3]) for t in range(4)])
    batched = jax.jit(lambda p: C.vortices(p, grid, max_vortices=8))(frames)
    assert batched.positions.shape == (4, 8, 2) and batched.count.shape == (4,)
    for t in range(4):
        one = C.vortices(frames[t], grid, max_vortices=8)
        np.testing.assert_array_equal(np.asarray(one.charges), np.asarray(batched.charges[t]))
        np.testing.assert_allclose(np.asarray(one.positions), np.asarray(batched.positions[t]), atol=1e-5)
        err = _match(one, CENTERS[:3] + 0.13 * t, CHARGES[:3]) / grid.dx[0]
        assert err.max() < 0.1
    # vmap gives the same as the built-in batch
    vm = jax.vmap(lambda p: C.vortices(p, grid, max_vortices=8))(frames)
    np.testing.assert_allclose(np.asarray(vm.positions), np.asarray(batched.positions), atol=1e-6)


def test_vortices_overflow_is_counted_and_ghosts_outside_the_cloud_are_ignored():
    grid = C.Grid.uniform((96, 96), 20.0)
    psi = _imprinted(grid)
    v = C.vortices(psi, grid, max_vortices=2)
    assert int(v.count) == 5 and int(np.sum(np.asarray(v.mask))) == 2
    # without the density mask, the empty corners (|ψ|² ~ 1e-10 of the peak) have many phase singularities
    assert int(C.vortices(psi, grid, min_density=0.0, max_vortices=512).count) >= 5


def test_vortices_bad_input_one_line_naming_the_argument():
    g2 = C.Grid.uniform((32, 32), 10.0)
    g3 = C.Grid.uniform((8, 8, 8), 10.0)
    psi = jnp.ones((32, 32), jnp.complex64)
    for call, word in [
        (lambda: C.vortices(jnp.ones((8, 8, 8), jnp.complex64), g3), "2-D grid"),
        (lambda: C.vortices(jnp.ones((32, 30), jnp.complex64), g2), "psi"),
        (lambda: C.vortices(psi, g2, max_vortices=0), "max_vortices"),
        (lambda: C.vortices(psi, g2, min_density=2.0), "min_density"),
        (lambda: C.vortices(psi, "grid"), "grid"),
        (lambda: C.vortex_lines(psi, g2), "3-D grid"),
        (lambda: C.vortex_lines(jnp.ones((8, 8, 9), jnp.complex64), g3), "psi"),
        (lambda: C.vortex_lines(jnp.ones((8, 8, 8), jnp.complex64), g3, max_lines=0), "max_lines"),
        (lambda: C.vortices(psi.at[0, 0].set(jnp.nan), g2), "psi"),
    ]:
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        msg = str(e.value)
        assert word in msg and "\n" not in msg, msg


def test_vortex_charges_checks_its_grid():
    grid = C.Grid.uniform((32, 32), 10.0)
    psi = _imprinted(grid, CENTERS[:1] * 0.3, CHARGES[:1])
    assert int(jnp.sum(jnp.abs(C.vortex_charges(psi, grid)))) == 1
    with pytest.raises(ValueError, match="grid"):
        C.vortex_charges(psi, C.Grid.uniform((16, 16), 10.0))
    with pytest.raises(ValueError, match="grid"):
        C.vortex_charges(psi, C.Grid.uniform((32,), 10.0))
    assert C.vortex_charges(psi, C.Grid.uniform((32, 32, 4), 10.0)).shape == (31, 31)  # a z-slice of a 3-D grid


# ------------------------------------------------------------------------------------------ 3-D lines
def _ring(grid, radius, xi=0.4, width=3.0, center=(0.0, 0.0, 0.0)):
    x, y, z = (np.asarray(m, np.float64) - c for m, c in zip(grid.mesh(), center))
    s = np.sqrt(x**2 + y**2)
    env = np.exp(-(x**2 + y**2 + z**2) / (2 * width**2))
    return jnp.asarray(((s - radius) + 1j * z) / np.sqrt((s - radius) ** 2 + z**2 + xi**2) * env, jnp.complex64)


def _straight(grid, x0, y0, xi=0.4, width=3.0):
    x, y, _ = (np.asarray(m, np.float64) for m in grid.mesh())
    env = np.exp(-(x**2 + y**2) / (2 * width**2))
    f = ((x - x0) + 1j * (y - y0)) / np.sqrt((x - x0) ** 2 + (y - y0) ** 2 + xi**2)
    return jnp.asarray(f * env, jnp.complex64)


def test_vortex_ring_has_length_two_pi_r():
    grid = C.Grid.uniform((64, 64, 64), 12.0)
    radius = 3.0
    lines = C.vortex_lines(_ring(grid, radius, center=(0.11, -0.07, 0.05)), grid, max_points=1024, max_lines=8)
    assert int(lines.n_lines) == 1
    assert bool(lines.closed[0]) and bool(lines.mask[0]) and not bool(np.any(np.asarray(lines.mask)[1:]))
    length = float(lines.length[0])
    assert abs(length / (2 * np.pi * radius) - 1) < 0.02, length
    np.testing.assert_allclose(float(lines.circulation[0]), 2 * np.pi, rtol=1e-6)
    (pts,) = lines.polylines()
    r = np.hypot(pts[:, 0] - 0.11, pts[:, 1] + 0.07)
    assert np.abs(r - radius).max() < 0.1 * grid.dx[0]
    assert np.abs(pts[:, 2] - 0.05).max() < 0.1 * grid.dx[0]
    # ordered along the line: consecutive points are neighbours (no jumps across the ring)
    steps = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    assert steps.max() < 1.5 * grid.dx[0]


def test_straight_line_through_the_box_is_one_line_of_the_box_length():
    grid = C.Grid.uniform((32, 32, 24), (12.0, 12.0, 9.0))
    x0, y0 = 0.37, -0.81
    lines = C.vortex_lines(_straight(grid, x0, y0), grid, max_points=256, max_lines=4)
    assert int(lines.n_lines) == 1 and bool(lines.closed[0])
    np.testing.assert_allclose(float(lines.length[0]), 9.0, rtol=1e-4)
    assert int(lines.size[0]) == 24
    (pts,) = lines.polylines()
    assert np.abs(pts[:, 0] - x0).max() < 0.1 * grid.dx[0] and np.abs(pts[:, 1] - y0).max() < 0.1 * grid.dx[0]
    # direction: the polyline runs along the vorticity (+z for a counter-clockwise winding about z)
    dz = np.diff(pts[:, 2])
    dz = dz - 9.0 * np.round(dz / 9.0)
    assert np.all(dz > 0)


def test_vortex_lines_batched_over_time_and_two_lines():
    grid = C.Grid.uniform((24, 24, 16), (12.0, 12.0, 8.0))
    a = _straight(grid, -2.1, 0.3)
    b = jnp.conj(_straight(grid, 2.3, -0.4))  # an antivortex line: runs along −z
    frames = jnp.stack([a, a * b])
    out = jax.jit(lambda p: C.vortex_lines(p, grid, max_points=128, max_lines=4))(frames)
    assert out.points.shape == (2, 128, 3)
    np.testing.assert_array_equal(np.asarray(out.n_lines), [1, 2])
    np.testing.assert_allclose(np.asarray(out.length)[1, :2], [8.0, 8.0], rtol=1e-4)
    one = C.vortex_lines(frames[1], grid, max_points=128, max_lines=4)
    np.testing.assert_allclose(np.asarray(one.points), np.asarray(out.points[1]), atol=1e-5)
    dz = [np.diff(p[:, 2]) for p in one.polylines()]
    dirs = sorted(float(np.sign(np.median(d - 8.0 * np.round(d / 8.0)))) for d in dz)
    assert dirs == [-1.0, 1.0]


# ------------------------------------------------------------------------------------------ BdG
def _dense_bdg(grid, potential, g, psi0):
    """Lowest positive eigenvalues of the full 2n×2n BdG matrix [[L + gn, gψ²], [−gψ², −(L + gn)]] (float64)."""
    n = grid.size
    eye = np.eye(n).reshape((n,) + grid.shape)
    k2 = grid.k_squared()
    axes = tuple(range(1, grid.ndim + 1))
    t = np.fft.ifftn(0.5 * k2 * np.fft.fftn(eye, axes=axes), axes=axes).real.reshape(n, n)
    psi = np.asarray(psi0, np.complex128).reshape(-1)
    psi = (psi * np.conj(psi[np.argmax(np.abs(psi))]) / np.abs(psi).max()).real  # real up to a global phase
    dens = psi**2
    h = t + np.diag(np.asarray(potential, np.float64).reshape(-1) + g * dens)
    mu = psi @ h @ psi / (psi @ psi)
    lpp = h - mu * np.eye(n) + np.diag(g * dens)
    m = np.block([[lpp, np.diag(g * dens)], [-np.diag(g * dens), -lpp]])
    ev = np.linalg.eigvals(m)
    ev = np.sort(ev.real[ev.real > 1e-6])
    return ev


def test_bogoliubov_homogeneous_dispersion():
    with jax.enable_x64(True):
        n, length, g, dens = 64, 20.0, 2.0, 1.0
        grid = C.Grid.uniform((n,), length)
        system = C.GPSystem.create(grid, jnp.zeros((n,), jnp.float64), g)
        psi0 = jnp.full((n,), np.sqrt(dens), jnp.complex128)
        modes = C.bogoliubov(jax.random.key(0), system, psi0, 6)
        k = np.sort(np.abs(2 * np.pi * np.fft.fftfreq(n, length / n)))[1:7]
        eps = 0.5 * k**2
        np.testing.assert_allclose(np.asarray(modes.omega), np.sqrt(eps * (eps + 2 * g * dens)), rtol=1e-8)
        # normalisation ∫(u² − v²) dx = 1
        dx = grid.dx[0]
        np.testing.assert_allclose(
            np.sum(np.asarray(modes.u) ** 2 - np.asarray(modes.v) ** 2, axis=1) * dx, 1.0, rtol=1e-8
        )


def _ground(grid, g, omega=1.0, dt=(1e-2, 1e-3)):
    system = C.GPSystem.create(grid, C.harmonic(grid, omega, dtype=jnp.float64), g)
    psi, _ = C.ground_state(system, 1.0, dt=dt[0], tol=1e-13, max_steps=20000)
    psi, _ = C.ground_state(system, 1.0, dt=dt[1], tol=1e-14, max_steps=40000, psi0=psi)
    return system, psi


def test_bogoliubov_matches_a_dense_float64_bdg_diagonalisation():
    with jax.enable_x64(True):
        grid = C.Grid.uniform((64,), 16.0)
        system, psi = _ground(grid, 10.0)
        modes = C.bogoliubov(jax.random.key(0), system, psi, 6)
        ref = _dense_bdg(grid, system.potential, 10.0, psi)
        ref = ref[ref > 0.05][:6]  # the Goldstone pair sits at ~0 (to the accuracy of ψ₀)
        np.testing.assert_allclose(np.asarray(modes.omega), ref, rtol=1e-7)
        assert float(modes.omega[0]) == pytest.approx(1.0, abs=1e-4)  # Kohn in 1-D


def test_kohn_mode_is_the_trap_frequency_for_any_g_and_vmaps_over_g():
    with jax.enable_x64(True):
        grid = C.Grid.uniform((32, 32), 12.0)
        gs = jnp.array([0.0, 20.0, 200.0])
        pot = C.harmonic(grid, 1.0, dtype=jnp.float64)

        def ground(g):
            s = C.GPSystem.create(grid, pot, g)
            p, _ = C.ground_state(s, 1.0, dt=1e-2, tol=1e-13, max_steps=20000)
            p, _ = C.ground_state(s, 1.0, dt=1e-3, tol=1e-14, max_steps=40000, psi0=p)
            return p

        psis = jax.vmap(ground)(gs)
        omegas = jax.vmap(lambda g, p: C.bogoliubov(jax.random.key(0), C.GPSystem.create(grid, pot, g), p, 4).omega)(
            gs, psis
        )
        omegas = np.asarray(omegas)
        np.testing.assert_allclose(omegas[:, :2], 1.0, atol=1e-3)  # the dipole pair, any g
        np.testing.assert_allclose(omegas[0], [1, 1, 2, 2], atol=1e-3)  # g = 0: the oscillator levels
        assert np.all(omegas[1:, 2] > 1.3) and np.all(omegas[1:, 2] < 2.0)  # quadrupole: between √2 and 2


def test_breathing_mode_of_the_2d_condensate_is_twice_the_trap_frequency():
    with jax.enable_x64(True):
        grid = C.Grid.uniform((40, 40), 14.0)
        system, psi = _ground(grid, 100.0)
        # Kohn ×2, quadrupole ×2, m = 3 ×2 lie below it at this g
        modes = C.bogoliubov(jax.random.key(0), system, psi, 8)
        om = np.asarray(modes.omega)
        i = int(np.argmin(np.abs(om - 2.0)))
        assert abs(om[i] - 2.0) < 1e-3, om
        # it is the rotationally symmetric (m = 0) mode: invariant under a 90° rotation about the centre
        u = np.asarray(modes.u[i])
        rot = np.roll(np.rot90(u), 1, axis=0)  # x_j = −L/2 + j dx: rot90 maps index j to n − 1 − j
        assert np.max(np.abs(rot - u)) < 1e-3 * np.max(np.abs(u))
        np.testing.assert_allclose(om[:2], 1.0, atol=1e-3)


def test_bogoliubov_frequency_gradient_matches_analytic_and_finite_difference():
    with jax.enable_x64(True):
        n, length, dens = 32, 10.0, 1.5
        grid = C.Grid.uniform((n,), length)
        pot = jnp.zeros((n,), jnp.float64)
        psi0 = jnp.full((n,), np.sqrt(dens), jnp.float64)

        def lowest(g):
            return C.bogoliubov(jax.random.key(0), C.GPSystem.create(grid, pot, g), psi0, 2).omega[0]

        g0 = 3.0
        eps = 0.5 * (2 * np.pi / length) ** 2
        w = np.sqrt(eps * (eps + 2 * g0 * dens))
        d = float(jax.grad(lowest)(g0))
        assert d == pytest.approx(eps * dens / w, rel=1e-7)
        h = 1e-4
        fd = (float(lowest(g0 + h)) - float(lowest(g0 - h))) / (2 * h)
        assert d == pytest.approx(fd, rel=1e-6)


@pytest.mark.slow  # forward mode through two imaginary-time ground-state solves and the BdG solve: ~25 s
def test_kohn_frequency_derivative_along_the_trap_frequency():
    """d ω_Kohn / d ω_trap = 1: forward mode through the ground state (imaginary-time loop) and the BdG solve,
    against a central finite difference."""
    with jax.enable_x64(True):
        grid = C.Grid.uniform((24, 24), 12.0)

        def kohn(w):
            s = C.GPSystem.create(grid, C.harmonic(grid, w, dtype=jnp.float64), 20.0)
            p, _ = C.ground_state(s, 1.0, dt=1e-2, tol=1e-13, max_steps=20000)
            p, _ = C.ground_state(s, 1.0, dt=1e-3, tol=1e-14, max_steps=40000, psi0=p)
            return C.bogoliubov(jax.random.key(0), s, p, 2).omega[0]

        w0 = jnp.asarray(1.0, jnp.float64)
        val, tangent = jax.jvp(kohn, (w0,), (jnp.ones_like(w0),))
        h = 1e-3
        fd = (float(kohn(w0 + h)) - float(kohn(w0 - h))) / (2 * h)
        assert float(val) == pytest.approx(1.0, abs=1e-3)
        assert float(tangent) == pytest.approx(fd, abs=2e-3)
        assert float(tangent) == pytest.approx(1.0, abs=5e-3)


def test_bogoliubov_on_a_sharded_field_equals_one_device_and_gathers_nothing():
    """ψ₀ on a slab over 8 devices (the system's layout): the matrix-free operator applies the distributed FFT, so
    the spectrum is the single-device one to round-off (and the analytic homogeneous dispersion), the modes stay in
    the layout's blocks, and the compiled solve moves no field whole: its only all-gathers are one number per
    device (the location of max |ψ₀|), its all-reduces the solver's small Gram matrices."""
    from jax.sharding import PartitionSpec as P

    from ivhl_jax.core.hlo import collectives
    from ivhl_jax.core.mesh import device_mesh
    from ivhl_jax.numerics import distributed_fft

    if jax.device_count() < 8:
        pytest.skip("needs 8 (emulated) devices")
    with jax.enable_x64(True):
        n, length, g, dens, n_modes = 16, 10.0, 2.0, 1.0, 4
        grid = C.Grid.uniform((n, n), length)
        single = C.GPSystem.create(grid, jnp.zeros((n, n), jnp.float64), g)
        layout = distributed_fft.fft_layout(device_mesh((8,), ("x",)), P("x"), grid.shape)
        sharded = C.GPSystem.create(grid, single.potential, g, layout=layout)
        psi0 = jnp.full((n, n), np.sqrt(dens), jnp.complex128)
        one = C.bogoliubov(jax.random.key(0), single, psi0, n_modes)
        psi_s = layout.place(psi0)
        compiled = jax.jit(lambda p: C.bogoliubov(jax.random.key(0), sharded, p, n_modes)).lower(psi_s).compile()
        split = compiled(psi_s)
        np.testing.assert_allclose(np.asarray(split.omega), np.asarray(one.omega), rtol=1e-12)
        k = 2 * np.pi * np.fft.fftfreq(n, length / n)
        eps = np.sort(0.5 * (k[:, None] ** 2 + k[None, :] ** 2).reshape(-1))[1 : n_modes + 1]
        np.testing.assert_allclose(np.asarray(split.omega), np.sqrt(eps * (eps + 2 * g * dens)), rtol=1e-8)
        assert split.u.sharding.is_equivalent_to(layout.sharding(3), 3)
        assert split.v.sharding.is_equivalent_to(layout.sharding(3), 3)
        kinds = collectives(compiled)
        block = 3 * (n_modes + 4)  # the solver's block: 3 (n_modes + extra) fields
        assert all(nbytes <= 8 * 8 for kind, nbytes in kinds if kind == "all-gather"), kinds
        assert all(nbytes <= 2 * block * block * 8 for kind, nbytes in kinds if kind == "all-reduce"), kinds
        assert any(kind == "all-to-all" for kind, _ in kinds)  # the distributed FFT's transposes


def test_bogoliubov_bad_input_one_line_naming_the_argument():
    grid = C.Grid.uniform((16, 16), 8.0)
    system = C.GPSystem.create(grid, C.harmonic(grid), 10.0)
    psi = C.gaussian(grid)
    for call, word in [
        (lambda: C.bogoliubov(jax.random.key(0), system, psi, 200), "n_modes"),
        (lambda: C.bogoliubov(jax.random.key(0), system, psi, 0), "n_modes"),
        (lambda: C.bogoliubov(jax.random.key(0), system, psi[:8], 2), "psi0"),
        (lambda: C.bogoliubov(jax.random.key(0), system.replace(g=-1.0), psi, 2), "g"),
        (
            lambda: C.bogoliubov(
                jax.random.key(0),
                system,
                C.imprint_vortices(psi, grid, np.zeros((1, 2)), np.array([1])),
                2,
                max_dense_points=100,
            ),
            "max_dense_points",
        ),
        (
            lambda: C.bogoliubov(
                jax.random.key(0),
                system,
                C.imprint_vortices(psi, grid, np.zeros((1, 2)), np.array([1])),
                2,
                zero_tol=-1.0,
            ),
            "zero_tol",
        ),
        (lambda: C.bogoliubov(jax.random.key(0), system, psi, 2, operators="exact"), "operators"),
        (lambda: C.bogoliubov(jax.random.key(0), grid, psi, 2), "system"),
        (lambda: C.bogoliubov(jax.random.key(0), system, psi, 2, tol=-1.0), "tol"),
    ]:
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        msg = str(e.value)
        assert word in msg and "\n" not in msg, msg


@pytest.mark.slow  # a 3-D ground state and a 733-iteration BdG solve at 40³: ~3-4 minutes on 2 cores
def test_thomas_fermi_quadrupole_in_3d_is_sqrt2_omega():
    with jax.enable_x64(True):
        grid = C.Grid.uniform((40, 40, 40), 16.0)
        system, psi = _ground(grid, 3000.0, dt=(5e-3, 1e-3))
        modes = C.bogoliubov(jax.random.key(0), system, psi, 8)
        om = np.asarray(modes.omega)
        np.testing.assert_allclose(om[:3], 1.0, atol=2e-3)  # the three Kohn modes
        np.testing.assert_allclose(om[3:8], np.sqrt(2.0), rtol=0.04)  # the five l = 2 surface modes


def test_gpu_check_quick_runs_on_cpu():
    """bench.ops_condensate_modes.gpu_check (the gp_modes section of bench/gpu_checks.py) in its CPU-sized form."""
    from ivhl_jax.bench import ops_condensate_modes

    doc = ops_condensate_modes.gpu_check(quick=True)
    res = doc["results"]
    assert not any("error" in r for r in res.values()), res
    assert res["vortices"]["counts_ok"] and res["vortices"]["max_position_error_dx"] < 0.1
    assert abs(res["vortex_lines"]["length_rel_error"]) < 0.05 and res["vortex_lines"]["n_lines"] == 1
    assert res["bogoliubov"]["homogeneous_max_rel_error"] < 1e-3
    assert res["bogoliubov"]["kohn_abs_error"] < 1e-3  # float32
    assert len(doc["summary"]) == 3


def _compiles(fn):
    """The "Compiling ..." log records that ``fn()`` emits."""
    import logging

    messages: list[str] = []

    class Counter(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Compiling "):
                messages.append(record.getMessage())

    handler = Counter(level=logging.DEBUG)
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            jax.block_until_ready(fn())
    finally:
        logger.removeHandler(handler)
    return messages


def test_second_calls_with_new_values_compile_nothing():
    grid = C.Grid.uniform((32, 32), 12.0)
    a = jnp.stack([_imprinted(grid, CENTERS[:2] * 0.5, CHARGES[:2])] * 3)
    b = jnp.stack([_imprinted(grid, CENTERS[2:4] * 0.5, CHARGES[2:4])] * 3)
    assert _compiles(lambda: C.vortices(a, grid, max_vortices=8).positions)
    assert _compiles(lambda: C.vortices(b, grid, max_vortices=8, min_density=0.1).positions) == []
    g3 = C.Grid.uniform((12, 12, 8), (12.0, 12.0, 8.0))
    assert _compiles(lambda: C.vortex_lines(_straight(g3, 0.3, 0.2), g3, max_points=64).length)
    assert _compiles(lambda: C.vortex_lines(_straight(g3, -0.4, 0.1), g3, max_points=64).length) == []
    line = C.Grid.uniform((32,), 10.0)
    pot = jnp.zeros((32,), jnp.float32)
    psi_a, psi_b = jnp.ones(32), 1.3 * jnp.ones(32)
    assert _compiles(lambda: C.bogoliubov(jax.random.key(0), C.GPSystem.create(line, pot, 1.0), psi_a, 2).omega)
    assert _compiles(lambda: C.bogoliubov(jax.random.key(0), C.GPSystem.create(line, pot, 2.5), psi_b, 2).omega) == []
