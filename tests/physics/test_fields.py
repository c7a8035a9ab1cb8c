"""ivhl_jax.physics.fields: wave-field superposition, vortices and winding numbers against independent NumPy/analytic
answers, the wave-field stepper, and every precision policy against the float64 NumPy double sum."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ivhl_jax import fields as F
from ivhl_jax.numerics.rollout import trajectory


def numpy_superpose(p, s, a, k, w, ph, t, eps):
    """Independent float64 reference: the direct double sum."""
    p, s, a, k, w, ph = (np.asarray(x, np.float64) for x in (p, s, a, k, w, ph))
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    return (a * np.exp(1j * (k * r - w * t + ph)) / (r + eps)).sum(1), (np.abs(a) / (r + eps)).sum(1)


def random_problem(seed, n, m, d):
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, d)).astype(np.float32)
    s = (0.6 * rng.normal(size=(m, d))).astype(np.float32)
    a = rng.uniform(-2, 2, m).astype(np.float32)
    k = rng.uniform(0.5, 8, m).astype(np.float32)
    w = rng.uniform(0, 5, m).astype(np.float32)
    ph = rng.uniform(-np.pi, np.pi, m).astype(np.float32)
    return p, s, a, k, w, ph


# ----------------------------------------------------------------------------------------- superpose


def test_superpose_at_late_times_is_the_field_of_its_float32_phase_and_bounded():
    # t = 1e8: φ − ωt is ~1e8 rad; the field is the exact one of the float32 phase θ = fl(φ − ωt), and never
    # beyond the analytic bound Σ|A_j|/(r + ε) (it was 1e30 where the bound is ~760).
    p, s, a, k, _, ph = random_problem(11, 333, 21, 3)
    w = np.arange(21, dtype=np.float32) % 5  # integer ω: ω·t is exact in float32 (no FMA-dependent rounding)
    times = (0.3, 1e8, 2.0**31)
    psi = jax.jit(jax.vmap(lambda t: F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=t)))(
        jnp.asarray(times, jnp.float32)
    )
    for i, t in enumerate(times):
        theta = (ph - w * np.float32(t)).astype(np.float64)  # the kernel's float32 phase, then exact
        ref, scale = numpy_superpose(p, s, a, k, np.zeros_like(w), theta, 0.0, 0.1)
        assert np.max(np.abs(np.asarray(psi[i], np.complex128) - ref) / scale) <= 1e-5
        assert np.all(np.abs(np.asarray(psi[i])) <= scale * (1 + 1e-5))
    g = jax.grad(lambda t: jnp.sum(F.intensity(F.superpose(p, s, amplitudes=a, wavenumbers=k, t=t))))(1e8)
    assert np.isfinite(float(g))


@pytest.mark.parametrize("seed,d,chunk", [(0, 3, None), (1, 2, None), (2, 3, 37), (3, 2, 1000)])
def test_superpose_matches_float64_numpy(seed, d, chunk):
    p, s, a, k, w, ph = random_problem(seed, 777, 53, d)
    t, eps = 0.37, 0.05
    psi = F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=t, softening=eps, chunk=chunk)
    ref, scale = numpy_superpose(p, s, a, k, w, ph, t, eps)
    assert psi.dtype == jnp.complex64 and psi.shape == (777,)
    err = np.abs(np.asarray(psi, np.complex128) - ref)
    # fp32: norm-wise relative error <= 1e-5, and pointwise error small against the sum of |terms|
    # (pointwise relative error is meaningless at interference nodes where ψ ≈ 0).
    assert np.linalg.norm(err) / np.linalg.norm(ref) <= 1e-5
    assert np.max(err / scale) <= 1e-5


def test_superpose_float64_inputs_give_complex128():
    with jax.enable_x64(True):
        p, s, a, k, w, ph = random_problem(4, 200, 20, 3)
        p, s = p.astype(np.float64), s.astype(np.float64)
        psi = F.superpose(
            p,
            s,
            amplitudes=a.astype(np.float64),
            wavenumbers=k.astype(np.float64),
            frequencies=w.astype(np.float64),
            phases=ph.astype(np.float64),
            t=1.3,
            softening=0.1,
        )
        ref, _ = numpy_superpose(p, s, a, k, w, ph, 1.3, 0.1)
        assert psi.dtype == jnp.complex128
        np.testing.assert_allclose(np.asarray(psi), ref, rtol=1e-11, atol=1e-11)


def test_superpose_scalar_broadcast_and_default_dispersion():
    p, s, *_ = random_problem(5, 100, 9, 3)
    psi = F.superpose(p, s, amplitudes=2.0, wavenumbers=3.0, phases=0.5, t=0.2)
    m = s.shape[0]
    ref, _ = numpy_superpose(p, s, np.full(m, 2.0), np.full(m, 3.0), np.full(m, 3.0), np.full(m, 0.5), 0.2, 0.1)
    np.testing.assert_allclose(np.asarray(psi), ref, rtol=2e-5, atol=2e-5)


def test_waves_are_outgoing():
    """A phase front at radius r at time t sits at r + (ω/k)·dt at t + dt (exp(−iωt) convention)."""
    src = np.zeros((1, 3), np.float32)
    k, w, eps, dt = 4.0, 2.0, 0.1, 0.3
    r = np.linspace(1.0, 2.0, 11, dtype=np.float32)
    pts0 = np.stack([r, 0 * r, 0 * r], -1)
    pts1 = np.stack([r + w / k * dt, 0 * r, 0 * r], -1)
    f0 = F.superpose(pts0, src, wavenumbers=k, frequencies=w, t=0.0, softening=eps)
    f1 = F.superpose(pts1, src, wavenumbers=k, frequencies=w, t=dt, softening=eps)
    np.testing.assert_allclose(np.angle(f1 / f0), 0.0, atol=1e-5)


def test_superpose_jit_vmap_over_time_and_source_sets():
    p, s, a, k, w, ph = random_problem(6, 300, 16, 3)
    ts = jnp.linspace(0.0, 2.0, 5)
    f = lambda t: F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=t)
    batched = jax.jit(jax.vmap(f))(ts)
    for i, t in enumerate(np.asarray(ts)):
        ref, _ = numpy_superpose(p, s, a, k, w, ph, t, 0.1)
        np.testing.assert_allclose(np.asarray(batched[i]), ref, rtol=1e-4, atol=1e-4)
    sets = jnp.stack([s, s + 0.1, s - 0.2])
    g = jax.vmap(lambda ss: F.superpose(p, ss, amplitudes=a, wavenumbers=k, chunk=64))
    out = jax.jit(g)(sets)
    for i in range(3):
        ref, _ = numpy_superpose(p, np.asarray(sets[i]), a, k, k, 0 * a, 0.0, 0.1)
        np.testing.assert_allclose(np.asarray(out[i]), ref, rtol=1e-4, atol=1e-4)


def _fd_check_all(loss, args, rng, h=1e-5, rtol=1e-6):
    """jax.grad of a real scalar loss(*args) vs central finite differences (float64), one random
    direction per argument; one compile for the gradient, one for the loss."""
    # NumPy arithmetic outside the two jitted functions: eager jnp ops would each compile.
    args = [np.asarray(a, np.float64) for a in args]
    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
    for i, (x, g) in enumerate(zip(args, grads)):
        g = np.asarray(g)
        assert np.all(np.isfinite(g)), f"non-finite gradient for argument {i}"
        d = rng.normal(size=np.shape(x))
        plus = [a + h * d if j == i else a for j, a in enumerate(args)]
        minus = [a - h * d if j == i else a for j, a in enumerate(args)]
        ad = float(np.sum(g * d))
        fd = (float(loss(*plus)) - float(loss(*minus))) / (2 * h)
        assert abs(ad - fd) <= rtol * max(1.0, abs(fd)), (i, ad, fd)
    return grads


@pytest.mark.slow  # ~8 s of CPU, mostly compiling the reverse pass in float64; fp32 grads run in the focus test
def test_superpose_gradients_match_finite_differences():
    with jax.enable_x64(True):
        p, s, a, k, w, ph = (np.asarray(x, np.float64) for x in random_problem(7, 40, 6, 3))
        weights = np.linspace(0.5, 1.5, p.shape[0])

        @jax.jit
        def loss(src, amp, phi, pts):
            psi = F.superpose(pts, src, amplitudes=amp, wavenumbers=k, frequencies=w, phases=phi, t=0.4, softening=0.2)
            return jnp.sum(F.intensity(psi) * weights)

        _fd_check_all(loss, (s, a, ph, p), np.random.default_rng(0))
        # A point exactly on a source (|r| has a kink there, so FD converges only as O(h)): the
        # gradient must still be finite.
        p[0] = s[2]
        g = jax.jit(jax.grad(loss, argnums=(0, 3)))(s, a, ph, p)
        assert all(np.all(np.isfinite(np.asarray(x))) for x in g)


def test_superpose_rejects_bad_input():
    p, s, a, *_ = random_problem(8, 10, 4, 3)
    with pytest.raises(ValueError, match="points"):
        F.superpose(np.zeros((10, 4)), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="sources"):
        F.superpose(p, np.zeros((4, 2)))
    with pytest.raises(ValueError, match="amplitudes"):
        F.superpose(p, s, amplitudes=np.ones(5))
    with pytest.raises(ValueError, match="softening"):
        F.superpose(p, s, softening=-0.1)
    with pytest.raises(ValueError, match="points contains NaN"):
        F.superpose(np.full((3, 3), np.nan), s)
    with pytest.raises(ValueError, match="phases contains NaN"):
        F.superpose(p, s, phases=np.array([0.0, np.nan, 0.0, 0.0]))
    with pytest.raises(TypeError, match="amplitudes"):
        F.superpose(p, s, amplitudes=np.ones(4, np.complex64))
    with pytest.raises(ValueError, match="points"):
        F.superpose(np.zeros(3), s)
    with pytest.raises(ValueError, match="sources must hold at least one source"):
        F.superpose(p, np.zeros((0, 3), np.float32))


def test_memory_rule_gives_one_fused_reduction_with_the_accelerator_row():
    """With the GPU/TPU row's chunking forced on CPU: the default block covers all N points when the pairs'
    residuals fit the memory budget, and the compiled program is one fusion (no loop over blocks or sources)
    with no N × M temporary; the values equal the float64 sum as tightly as the CPU kernels'."""
    from ivhl_jax.core import backend

    n, m = 1 << 16, 256
    pts, src = jax.ShapeDtypeStruct((n, 3), jnp.float32), jax.ShapeDtypeStruct((m, 3), jnp.float32)
    with backend.override(fields_chunking="memory", fields_method=backend.TABLE["gpu"].fields_method):
        assert F.default_chunk(m) >= n  # 8 GiB fallback x 0.25 / (32 B x 256) = 262144 points
        c = jax.jit(lambda p, s: F.superpose(p, s, wavenumbers=3.0)).lower(pts, src).compile()
        hlo = c.as_text()
        # The pair sum is a conditional on the phase bound (fast sine reduction or XLA's sin/cos); each branch is
        # ONE fusion over all pairs, and nothing loops.
        branches = [
            comp
            for comp in re.split(r"\n(?=\S.*\{\n)", hlo)
            if "arg_tuple" in comp.splitlines()[0] and f"f32[{n}]" in comp.splitlines()[0].split("->")[-1]
        ]
        assert "while" not in hlo and "conditional" in hlo[hlo.index("ENTRY") :], hlo
        assert len(branches) == 2 and all(b.count(" fusion(") == 1 for b in branches), hlo
        assert c.memory_analysis().temp_size_in_bytes < n * m * 4 / 64
        p, s, a, k, w, ph = random_problem(5, 777, 53, 3)
        psi = F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=0.3)
        psi_blocks = F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=0.3, chunk=100)
    ref, scale = numpy_superpose(p, s, a, k, w, ph, 0.3, 0.1)
    for field in (psi, psi_blocks):
        assert np.max(np.abs(np.asarray(field, np.complex128) - ref) / scale) <= 1e-6
    with backend.override(fields_chunking="memory", fields_memory_fraction=0.01):
        assert F.default_chunk(m) < n  # a smaller budget gives blocks
    with backend.override(fields_chunking="pair_budget", fields_pair_budget=1 << 20):
        assert F.default_chunk(m) == (1 << 20) // m


# -------------------------------------------------------------------------------------------- vortex


@pytest.mark.parametrize("q", [-3, -2, -1, 0, 1, 2, 3])
def test_vortex_map_recovers_imprinted_charge_exactly(q):
    shape = (48, 40)
    pts = F.grid_points(shape, -1.0, 1.0)
    center = np.array([[0.137, -0.251]], np.float32)
    chi = F.vortex(pts, center, np.array([q]), core_size=0.1).reshape(shape)
    vm = np.asarray(F.vortex_map(chi))
    assert vm.shape == (47, 39) and vm.dtype == np.int32
    assert vm.sum() == q
    xs, ys = np.linspace(-1, 1, shape[0]), np.linspace(-1, 1, shape[1])
    i0 = np.searchsorted(xs, center[0, 0]) - 1
    j0 = np.searchsorted(ys, center[0, 1]) - 1
    assert xs[i0] <= center[0, 0] <= xs[i0 + 1] and ys[j0] <= center[0, 1] <= ys[j0 + 1]
    if abs(q) <= 1:
        # A unit vortex is exactly one plaquette: the one that contains its centre.
        expected = np.zeros_like(vm)
        expected[i0, j0] = q
        np.testing.assert_array_equal(vm, expected)
    else:
        # A plaquette (four wrapped steps) resolves at most one unit of charge generically: a charge-q
        # vortex appears as unit charges in the plaquettes around its centre, summing to q.
        window = vm[i0 - 2 : i0 + 3, j0 - 2 : j0 + 3]
        assert window.sum() == q and np.abs(vm).sum() == np.abs(window).sum()
    # Counter-clockwise loop of radius 0.5 around the centre: winding = q, coarse sampling (8 points) too.
    for n in (8, 64):
        th = np.linspace(0, 2 * np.pi, n, endpoint=False)
        loop = center + 0.5 * np.stack([np.cos(th), np.sin(th)], -1)
        assert int(F.winding_number(F.vortex(loop, center, np.array([q])))) == q


def test_vortex_profile_and_several_vortices():
    pts = F.grid_points((61, 61), -3.0, 3.0)
    centers = np.array([[-1.5, 0.0], [1.5, 0.0], [0.0, 1.55]], np.float32)
    charges = np.array([2, -1, 1])
    chi = F.vortex(pts, centers, charges, core_size=0.2)
    assert float(jnp.max(jnp.abs(chi))) <= 1.0 + 1e-6
    vm = np.asarray(F.vortex_map(chi.reshape(61, 61)))
    # The charge-2 vortex resolves into two unit charges (see vortex_map's docstring).
    assert vm.sum() == 2 and (vm == -1).sum() == 1 and (vm == 1).sum() == 3 and np.abs(vm).sum() == 4
    # Profile f_n(ρ) = (ρ/√(ρ²+ξ²))^n of a single vortex (documented core).
    rho = np.array([0.0, 0.05, 0.2, 1.0, 10.0], np.float32)
    p = np.stack([rho, 0 * rho], -1)
    for q in (1, 2, 3):
        amp = np.abs(np.asarray(F.vortex(p, np.zeros((1, 2)), np.array([q]), core_size=0.2)))
        np.testing.assert_allclose(amp, (rho / np.sqrt(rho**2 + 0.04)) ** q, rtol=1e-6, atol=1e-7)


def test_vortex_tilted_axis_in_3d():
    axis = np.array([1.0, 2.0, 2.0]) / 3.0
    c = np.array([[0.2, -0.1, 0.3]])
    # Orthonormal (a, b) with a × b = axis: a counter-clockwise loop about the axis.
    a = np.cross(axis, [0.0, 0.0, 1.0])
    a /= np.linalg.norm(a)
    b = np.cross(axis, a)
    th = np.linspace(0, 2 * np.pi, 32, endpoint=False)
    for shift in (-2.0, 0.0, 1.5):  # the singularity is a whole line, not a point
        loop = c + shift * axis + 0.4 * (np.cos(th)[:, None] * a + np.sin(th)[:, None] * b)
        for q in (-2, 1, 3):
            chi = F.vortex(loop.astype(np.float32), c.astype(np.float32), np.array([q]), axes=axis * 3)
            assert int(F.winding_number(chi)) == q
        on_axis = F.vortex((c + shift * axis).astype(np.float32), c.astype(np.float32), np.array([1]), axes=axis)
        assert abs(complex(on_axis[0])) < 1e-6
    # Default axis is +z: a loop in the (x, y) plane at any height.
    loop = np.stack([0.3 * np.cos(th), 0.3 * np.sin(th), np.full_like(th, 5.0)], -1).astype(np.float32)
    assert int(F.winding_number(F.vortex(loop, np.zeros((1, 3), np.float32), np.array([-2])))) == -2


def test_vortex_gradient_finite_on_axis_and_matches_fd():
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        pts = rng.normal(size=(30, 3))
        centers = np.concatenate([pts[:1], rng.normal(size=(2, 3))])  # point 0 sits on the first axis
        charges = np.array([1, -2, 3])
        axes = rng.normal(size=(3, 3))
        w = rng.normal(size=30)

        @jax.jit
        def loss(c, x, xi):
            chi = F.vortex(x, c, charges, core_size=xi, axes=axes)
            return jnp.sum(w * (chi.real + 0.5 * chi.imag))

        _fd_check_all(loss, (centers, pts, 0.3), rng)
        # d/du of u/√(u²+ξ²) at the axis is 1/ξ: the gradient on the axis is the analytic one.
        g = jax.grad(lambda x: F.vortex(x, jnp.zeros((1, 2)), np.array([1]), core_size=0.25)[0].real)(jnp.zeros((1, 2)))
        np.testing.assert_allclose(np.asarray(g), [[4.0, 0.0]], atol=1e-12)


def test_vortex_under_jit_with_traced_charges_and_vmap():
    pts = F.grid_points((24, 24), -1.0, 1.0)
    f = jax.jit(lambda c, q: F.vortex_map(F.vortex(pts, c, q).reshape(24, 24)))
    centers = jnp.array([[0.31, 0.02], [-0.4, -0.43]])
    out = f(centers, jnp.array([3, -2]))
    assert int(out.sum()) == 1 and int(jnp.abs(out).sum()) == 5
    moving = jax.vmap(lambda s: F.vortex(pts, centers + s, jnp.array([1, -1])))(jnp.linspace(0.0, 0.3, 4))
    maps = F.vortex_map(moving.reshape(4, 24, 24))
    assert maps.shape == (4, 23, 23)
    np.testing.assert_array_equal(np.asarray(maps.sum((1, 2))), 0)
    np.testing.assert_array_equal(np.asarray(jnp.abs(maps).sum((1, 2))), 2)


def test_vortex_rejects_bad_input():
    pts = np.zeros((5, 2), np.float32)
    with pytest.raises(TypeError, match="charges"):
        F.vortex(pts, np.zeros((1, 2)), np.array([1.0]))
    with pytest.raises(ValueError, match="charges"):
        F.vortex(pts, np.zeros((2, 2)), np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="axes"):
        F.vortex(pts, np.zeros((1, 2)), np.array([1]), axes=np.array([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="axes"):
        F.vortex(np.zeros((5, 3)), np.zeros((1, 3)), np.array([1]), axes=np.zeros(3))
    with pytest.raises(ValueError, match="core_size"):
        F.vortex(pts, np.zeros((1, 2)), np.array([1]), core_size=0.0)


# ---------------------------------------------------------------------------------- winding / maps


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(2, 2), (2, 5), (7, 9)]))
def test_vortex_map_obeys_discrete_stokes(seed, shape):
    """Σ plaquette charges = winding of the grid's boundary loop, for any field (exact integers)."""
    h, w = shape
    rng = np.random.default_rng(seed)
    f = (rng.normal(size=(h, w)) + 1j * rng.normal(size=(h, w))).astype(np.complex64)
    vm = np.asarray(F.vortex_map(f))
    boundary = np.concatenate([f[:, 0], f[-1, 1:], f[-2::-1, -1], f[0, -2:0:-1]])  # counter-clockwise
    assert vm.sum() == int(F.winding_number(boundary))
    assert np.all(np.abs(vm) <= 2)  # four wrapped steps of < π each


def test_winding_number_batches_and_phase_input():
    th = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    loops = np.stack([np.exp(1j * q * th) for q in range(-3, 4)])
    np.testing.assert_array_equal(np.asarray(F.winding_number(loops)), np.arange(-3, 4))
    np.testing.assert_array_equal(np.asarray(F.winding_number(np.angle(loops))), np.arange(-3, 4))
    with pytest.raises(ValueError, match="values_on_closed_loop"):
        F.winding_number(np.ones(1, np.complex64))
    with pytest.raises(ValueError, match="field_2d"):
        F.vortex_map(np.ones(5, np.complex64))


def test_intensity_and_phase():
    psi = jnp.array([3 + 4j, -1j, 0j])
    np.testing.assert_allclose(np.asarray(F.intensity(psi)), [25.0, 1.0, 0.0])
    np.testing.assert_allclose(np.asarray(F.phase(psi)), [np.arctan2(4, 3), -np.pi / 2, 0.0], rtol=1e-6)
    g = jax.grad(lambda z: F.intensity(jax.lax.complex(z, 0.0 * z)).sum())(jnp.zeros(3))
    assert np.all(np.asarray(g) == 0.0)


# -------------------------------------------------------------------------------- grids, helix, focus


def test_grid_points_ij_order_and_slice():
    g = np.asarray(F.grid_points((3, 4), [-1.0, 0.0], [1.0, 3.0]))
    assert g.shape == (12, 2)
    x, y = g[:, 0].reshape(3, 4), g[:, 1].reshape(3, 4)
    np.testing.assert_allclose(x[:, 0], [-1, 0, 1])
    np.testing.assert_allclose(y[0], [0, 1, 2, 3])
    s = np.asarray(F.grid_points((3, 3), z=0.5))
    assert s.shape == (9, 3) and np.all(s[:, 2] == 0.5)
    assert F.grid_points((2, 3, 4)).shape == (24, 3)
    with pytest.raises(ValueError, match="shape"):
        F.grid_points((1, 3))


def test_helix_sources_geometry():
    h = np.asarray(F.helix_sources(60, radius=1.5, pitch=0.4, turns=3.0), np.float64)
    assert h.shape == (60, 3)
    np.testing.assert_allclose(np.hypot(h[:, 0], h[:, 1]), 1.5, rtol=1e-6)
    np.testing.assert_allclose(np.diff(h[:, 2]), 0.4 * 3.0 / 60, rtol=1e-4)
    assert abs(h[0, 2] + h[-1, 2]) < 1e-6
    # One full turn (20 sources) later the source is back above its start, one pitch higher.
    np.testing.assert_allclose(h[20, :2], h[0, :2], atol=1e-5)
    np.testing.assert_allclose(h[20, 2] - h[0, 2], 0.4, rtol=1e-5)


def test_focus_phases_reaches_phase_conjugation_optimum():
    src = F.helix_sources(24, radius=1.0, pitch=0.5, turns=2.0)
    target = jnp.array([0.3, -0.2, 0.1])
    k = 6.0
    phi, hist = F.focus_phases(src, target, wavenumbers=k, steps=300, learning_rate=0.05)
    # hist is I/I_max with I_max = (Σ 1/(r+ε))², reached by φ_j = −k r_j (up to a global phase).
    assert hist.shape == (300,)
    assert float(hist[-1]) > 0.999
    assert float(hist[-1]) / float(hist[0]) > 10.0  # focus gain over the all-zero start
    r = np.linalg.norm(np.asarray(src) - np.asarray(target), axis=-1)
    rel = np.angle(np.exp(1j * (np.asarray(phi) + k * r)))
    assert np.std(np.angle(np.exp(1j * (rel - rel[0])))) < 0.05


def test_focus_phases_compiles_once():
    """A second call with new values of the same shapes (sources, target, wavenumbers, softening, learning rate)
    reuses the compiled loop: the jitted loop is a module-level function, not one built per call."""
    import logging

    src = F.helix_sources(6, radius=1.0, pitch=0.5, turns=1.0)
    F.focus_phases(src, jnp.array([0.3, -0.2, 0.1]), wavenumbers=6.0, steps=5)
    src2, target2 = src + 0.1, jnp.array([0.1, 0.2, 0.0])
    messages: list[str] = []

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Compiling "):
                messages.append(record.getMessage())

    handler, logger = Counter(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            F.focus_phases(src2, target2, wavenumbers=5.0, softening=0.2, steps=5, learning_rate=0.1)
    finally:
        logger.removeHandler(handler)
    assert messages == []


@pytest.mark.slow
def test_superpose_large_chunked_matches_numpy():
    """Many point blocks (chunked path) at a size where an N×M array would be 60 MB: still ≤ 1e-5."""
    p, s, a, k, w, ph = random_problem(11, 50_000, 300, 3)
    psi = np.asarray(F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=2.5), np.complex128)
    ref = np.empty(p.shape[0], np.complex128)
    scale = np.empty(p.shape[0])
    for i in range(0, p.shape[0], 5000):
        ref[i : i + 5000], scale[i : i + 5000] = numpy_superpose(p[i : i + 5000], s, a, k, w, ph, 2.5, 0.1)
    assert np.linalg.norm(psi - ref) / np.linalg.norm(ref) <= 1e-5
    assert np.max(np.abs(psi - ref) / scale) <= 1e-5


# --- precision policies -------------------------------------------------------------------------------------
def _rel(a, ref) -> float:
    a, ref = np.asarray(a, np.complex128), np.asarray(ref, np.complex128)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def _numpy_superpose(p, s, a, k, w, ph, t, eps):
    """Independent float64 reference: the direct double sum, and Σ|A_j|/(r + ε) per point."""
    p, s, a, k, w, ph = (np.asarray(x, np.float64) for x in (p, s, a, k, w, ph))
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    return (a * np.exp(1j * (k * r - w * t + ph)) / (r + eps)).sum(1), (np.abs(a) / (r + eps)).sum(1)


def _field_problem(seed=0, n=777, m=53, kmax=8.0, bf16_exact=False):
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, 3)).astype(np.float32)
    s = (0.6 * rng.normal(size=(m, 3))).astype(np.float32)
    a = rng.uniform(-2, 2, m).astype(np.float32)
    k = rng.uniform(0.5, kmax, m).astype(np.float32)
    w = rng.uniform(0, 5, m).astype(np.float32)
    ph = rng.uniform(-np.pi, np.pi, m).astype(np.float32)
    out = [p, s, a, k, w, ph]
    if bf16_exact:  # inputs exactly representable in bf16: only the kernel's own rounding is measured
        out = [np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for x in out]
    return out


# policy -> (tolerance, measured) of the norm-wise relative error against the float64 sum.
FIELD_TOL = {"f64": (1e-12, 6.8e-16), "f32": (1e-5, 3.4e-7), "bf16": (1e-5, 3.4e-7), "pure_bf16": (5e-2, 1.6e-2)}


@pytest.mark.parametrize("policy", list(FIELD_TOL))
def test_superpose_error_per_policy(policy):
    p, s, a, k, w, ph = _field_problem()
    t, eps = 0.37, 0.05
    ref, scale = _numpy_superpose(p, s, a, k, w, ph, t, eps)
    kw = dict(amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, t=t, softening=eps)
    if policy == "f64":
        with jax.enable_x64(True):
            psi = F.superpose(p, s, **kw, policy=policy)
        assert psi.dtype == jnp.complex128
    else:
        psi = F.superpose(p, s, **kw, policy=policy)
        assert psi.dtype == jnp.complex64
    tol, _measured = FIELD_TOL[policy]
    assert _rel(psi, ref) <= tol
    assert np.max(np.abs(np.asarray(psi, np.complex128) - ref) / scale) <= tol
    if policy in ("f32", "bf16"):
        # Default (policy=None) is the float32 path bit for bit; "bf16" compute is raised to float32
        # for the phase, so it gives the same numbers.
        np.testing.assert_array_equal(np.asarray(psi), np.asarray(F.superpose(p, s, **kw)))


@pytest.mark.parametrize("kmax", [8.0, 50.0])
def test_superpose_bf16_storage_keeps_phase_in_float32(kmax):
    """bf16 storage + float32 phase: only the bf16 rounding of Re ψ, Im ψ remains (≤ 2⁻⁸; measured
    1.6e-3 for k ≤ 8 and k ≤ 50), while bf16 arithmetic loses the phase (measured 2.0e-2 and 0.11)."""
    p, s, a, k, w, ph = _field_problem(kmax=kmax, bf16_exact=True)
    ref, _ = _numpy_superpose(p, s, a, k, w, ph, 0.0, 0.05)
    psi = F.superpose(p, s, amplitudes=a, wavenumbers=k, frequencies=w, phases=ph, softening=0.05, policy="pure_bf16")
    assert _rel(psi, ref) <= 4e-3
    # The rejected design, for the record: the same sum evaluated in bf16 arithmetic.
    b = lambda x: jnp.asarray(x, jnp.bfloat16)
    d = b(p)[:, None] - b(s)[None]
    r = jnp.sqrt(jnp.sum(d * d, -1))
    th = b(k) * r + b(ph)
    amp = b(a) / (r + b(0.05))
    naive = jnp.sum(amp * jnp.cos(th), 1).astype(jnp.float32) + 1j * jnp.sum(amp * jnp.sin(th), 1).astype(jnp.float32)
    assert _rel(naive, ref) >= 5 * _rel(psi, ref)


def _numpy_vortex_2d(p, c, q, xi):
    p, c = np.asarray(p, np.float64), np.asarray(c, np.float64)
    u = p[:, None, 0] - c[None, :, 0]
    w = p[:, None, 1] - c[None, :, 1]
    z = (u + 1j * np.sign(q) * w) / np.sqrt(u * u + w * w + xi * xi)
    return np.prod(z ** np.abs(q), axis=1)


# policy -> (tolerance, measured) of the max abs error of χ (|χ| ≤ 1) against float64 NumPy. bf16 storage
# moves a point by up to 2⁻⁹|x| ≈ 4e-3, and near a core of size ξ = 0.2 the factor of charge q turns
# by |q|·δx/ξ, up to ~0.06 rad here: hence the 0.1.
VORTEX_TOL = {"f64": (1e-12, 1.2e-15), "f32": (1e-5, 6.2e-7), "bf16": (1e-5, 6.2e-7), "pure_bf16": (1e-1, 3.1e-2)}


@pytest.mark.parametrize("policy", list(VORTEX_TOL))
def test_vortex_error_per_policy(policy):
    pts = np.asarray(F.grid_points((41, 41), -2.0, 2.0))
    ctr = np.array([[0.3, -0.2], [-0.9, 0.7], [1.1, 1.0]], np.float32)
    q = np.array([1, -2, 3])
    ref = _numpy_vortex_2d(pts, ctr, q, 0.2)
    if policy == "f64":
        with jax.enable_x64(True):
            chi = F.vortex(pts, ctr, q, core_size=0.2, policy=policy)
    else:
        chi = F.vortex(pts, ctr, q, core_size=0.2, policy=policy)
    err = float(np.max(np.abs(np.asarray(chi, np.complex128) - ref)))
    assert err <= VORTEX_TOL[policy][0], err


def test_superposition_validates_settings_and_observe_records_frames():
    """(Compile-once with fields.observe: tests/contracts/test_steppers.py.)"""
    rng = np.random.default_rng(4)
    pts, src = rng.normal(size=(40, 3)), rng.normal(size=(6, 3))
    kw = dict(amplitudes=1.0, wavenumbers=3.0, phases=0.0, dt=0.1)
    st = F.superposition(pts, src, **kw)
    p = st.params
    final, obs = trajectory(st, st.init(), 4, observe=F.observe)
    psi = F.field_at(p, 0.4)  # the state after k steps is at k·dt (as in every family)
    np.testing.assert_allclose(np.asarray(obs["t"]), [0.1, 0.2, 0.3, 0.4], atol=1e-6)
    np.testing.assert_allclose(float(obs["max_intensity"][-1]), float(jnp.max(F.intensity(psi))), rtol=1e-6)
    np.testing.assert_allclose(float(obs["mean_intensity"][-1]), float(jnp.mean(F.intensity(psi))), rtol=1e-6)
    with pytest.raises(ValueError, match="dt must be > 0"):
        F.superposition(pts, src, **{**kw, "dt": -0.1})
    with pytest.raises(ValueError, match="amplitudes"):
        F.superposition(pts, src, **{**kw, "amplitudes": np.ones(5)})
    with pytest.raises(ValueError, match="imprint"):
        F.superposition(pts, src, **kw, imprint=np.ones(3, np.complex64))
    with pytest.raises(ValueError, match="imprint must be finite|imprint.*NaN|imprint.*finite"):
        F.superposition(pts, src, **kw, imprint=np.full(40, np.nan, np.complex64))
    with pytest.raises(ValueError, match="sources must hold at least one source"):
        F.superposition(pts, np.zeros((0, 3)), **kw)
    with pytest.raises(ValueError, match="t0 must be finite"):
        st.init(float("nan"))


def test_wave_evolution_stepper_under_policies():
    rng = np.random.default_rng(3)
    pts, src = rng.normal(size=(300, 3)), 0.5 * rng.normal(size=(8, 3))
    kw = dict(amplitudes=1.0, wavenumbers=3.0, phases=0.0, dt=0.1, softening=0.05)

    def run(policy):
        st = F.superposition(pts, src, **kw, policy=policy)
        final, _ = trajectory(st, st.init(), 5)
        return final

    base = run(None)
    f32 = run("f32")
    np.testing.assert_array_equal(np.asarray(f32.field), np.asarray(base.field))
    lo = run("pure_bf16")
    assert lo.field.dtype == jnp.complex64 and lo.intensity_sum.dtype == jnp.float32  # no complex bf16
    assert _rel(lo.field, base.field) <= 5e-2  # bf16 positions and outputs (measured 6.2e-3)


def test_gpu_check_quick_runs_on_cpu():
    """bench.ops_fields.gpu_check (the accelerator check of bench/gpu_checks.py) in its CPU-sized form."""
    from ivhl_jax.bench import ops_fields

    doc = ops_fields.gpu_check(quick=True)
    assert len(doc["summary"]) == len(doc["results"]) == len(ops_fields.QUICK_SIZES)
    for rec in doc["results"]:
        assert rec["f32_err_vs_f64"] <= 1e-6
        assert rec["best_ms"] <= rec["default_ms"] and rec["default_chunk"] >= 1
        assert str(rec["best_chunk"]) in rec["chunks_ms"]
