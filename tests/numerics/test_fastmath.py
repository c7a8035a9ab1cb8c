"""Fast sincos and the point-source kernel against float64 NumPy and the plain jnp.sin/cos formulation."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ivhl_jax import fastmath as fm


def numpy_sum64(p, s, a, k, th, eps):
    """Independent float64 reference: the direct double sum, and the scale Σ|A|/(r+ε) per point."""
    p, s, a, k, th = (np.asarray(x, np.float64) for x in (p, s, a, k, th))
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    return (a * np.exp(1j * (k * r + th)) / (r + eps)).sum(1), (np.abs(a) / (r + eps)).sum(1)


def plain_jnp_sum(p, s, a, k, th, eps):
    """The straightforward formulation (XLA's own cos/sin), same dtype as the inputs."""
    r = fm.safe_norm(p[:, None, :] - s[None, :, :])
    w = a / (r + eps)
    ph = k * r + th
    return jnp.sum(w * jnp.cos(ph), axis=1), jnp.sum(w * jnp.sin(ph), axis=1)


def problem(seed, n, m, d=3, kmax=8.0, thmax=np.pi):
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, d)).astype(np.float32)
    s = (0.6 * rng.normal(size=(m, d))).astype(np.float32)
    a = rng.uniform(-2, 2, m).astype(np.float32)
    k = rng.uniform(0.5, kmax, m).astype(np.float32)
    th = rng.uniform(-thmax, thmax, m).astype(np.float32)
    return p, s, a, k, th


# ------------------------------------------------------------------------------------------ sincos


def test_sincos_float32_accuracy_with_range_reduction():
    x = np.concatenate(
        [
            np.linspace(-1e4, 1e4, 400_001),
            np.random.default_rng(0).uniform(-500, 500, 200_000),
            np.arange(-200, 201) * (np.pi / 2),
        ]
    ).astype(np.float32)  # quadrant boundaries
    s, c = jax.jit(fm.sincos)(x)
    assert s.dtype == c.dtype == jnp.float32
    x64 = x.astype(np.float64)
    # a few float32 ulps of 1 (ulp = 1.2e-7 at 1, 6e-8 below): measured max 9.3e-8
    assert np.abs(np.asarray(s, np.float64) - np.sin(x64)).max() <= 2e-7
    assert np.abs(np.asarray(c, np.float64) - np.cos(x64)).max() <= 2e-7


def test_sincos_other_dtypes_and_derivative():
    x = np.linspace(-30, 30, 1001)
    with jax.enable_x64(True):
        s, c = fm.sincos(jnp.asarray(x))
        assert s.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(s), np.sin(x), atol=1e-14)
    s, c = jax.jit(fm.sincos)(jnp.asarray(x, jnp.bfloat16))
    assert s.dtype == jnp.bfloat16
    xb = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
    np.testing.assert_allclose(np.asarray(c, np.float64), np.cos(xb), atol=1e-2)
    with pytest.raises(TypeError, match="floating"):
        fm.sincos(jnp.arange(3))
    # exact derivative: d sin = cos, d cos = −sin (custom JVP), also under vmap and second order
    xf = jnp.asarray(x, jnp.float32)
    x32 = np.asarray(xf, np.float64)
    ds, dc, d2 = jax.jit(
        lambda v: (
            jax.vmap(jax.grad(lambda t: fm.sincos(t)[0]))(v),
            jax.vmap(jax.grad(lambda t: fm.sincos(t)[1]))(v),
            jax.vmap(jax.grad(jax.grad(lambda t: fm.sincos(t)[0])))(v),
        )
    )(xf)
    np.testing.assert_allclose(np.asarray(ds), np.cos(x32), atol=2e-7)
    np.testing.assert_allclose(np.asarray(dc), -np.sin(x32), atol=2e-7)
    np.testing.assert_allclose(np.asarray(d2), -np.sin(x32), atol=2e-7)


# Tolerance of float32 sincos against float64 NumPy of the same float32 value, at EVERY finite x: the float32
# round-off of the reduced argument r = x − nπ ∈ [−π/2, π/2] (ulp(r) ≤ ulp(π/2) = ulp(1)) plus that of the
# polynomial result (≤ ulp(1)). Measured max 1.45e-7 = 1.2 ulp(1) over random bit patterns.
TOL_F32 = 2 * float(np.spacing(np.float32(1.0)))
TOL_F64 = 2 * float(np.spacing(1.0))  # float64: XLA's sin/cos of the same value, correctly reduced


def _finite_bits(dtype, n, seed):
    """n finite values of ``dtype`` from uniformly random bit patterns: every exponent equally likely, so
    the sample spans the whole finite range (tiny, subnormal, up to the largest finite value), both signs."""
    rng = np.random.default_rng(seed)
    utype = np.uint32 if dtype == np.float32 else np.uint64
    x = rng.integers(0, np.iinfo(utype).max, n, dtype=utype, endpoint=True).view(dtype)
    return x[np.isfinite(x)]


def _check_f32(x):
    x = np.asarray(x, np.float32)
    s, c = jax.jit(fm.sincos)(x)
    x64 = x.astype(np.float64)
    err = max(
        np.abs(np.asarray(s, np.float64) - np.sin(x64)).max(), np.abs(np.asarray(c, np.float64) - np.cos(x64)).max()
    )
    assert err <= TOL_F32, err
    assert np.all(np.abs(np.asarray(s)) <= 1) and np.all(np.abs(np.asarray(c)) <= 1)


@pytest.mark.parametrize("seed", [0, 1])
def test_sincos_float32_every_finite_argument_matches_numpy(seed):
    f32 = np.finfo(np.float32)
    edges = np.array(
        [
            f32.max,
            -f32.max,
            f32.tiny,
            f32.smallest_subnormal,
            2.0**14,
            np.nextafter(np.float32(2.0**14), 1e9),
            2.0**24,
            1e8,
            1e9,
            1e10,
            1e20,
            3e38,
            -1e9,
            0.0,
        ],
        np.float32,
    )
    near_pi = (np.random.default_rng(seed).integers(1, 2**60, 20_000).astype(np.float64) * np.pi).astype(np.float32)
    _check_f32(np.concatenate([_finite_bits(np.float32, 300_000, seed), edges, near_pi]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=64))
def test_sincos_float32_property_whole_range(xs):
    _check_f32(np.resize(np.asarray(xs, np.float32), 64))  # one shape: one compilation


def test_sincos_float64_every_finite_argument_matches_numpy():
    x = np.concatenate([_finite_bits(np.float64, 100_000, 3), [np.finfo(np.float64).max, 1e300, 1e22, 1e9]])
    with jax.enable_x64(True):
        s, c = jax.jit(fm.sincos)(jnp.asarray(x))
        assert s.dtype == jnp.float64
        assert np.abs(np.asarray(s) - np.sin(x)).max() <= TOL_F64
        assert np.abs(np.asarray(c) - np.cos(x)).max() <= TOL_F64


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64])
def test_sincos_non_finite_inputs_give_nan(dtype):
    with jax.enable_x64(dtype == jnp.float64):
        s, c = fm.sincos(jnp.asarray([np.inf, -np.inf, np.nan, 1e30 if dtype != jnp.float64 else 1e300], dtype))
        assert np.all(np.isnan(np.asarray(s[:3], np.float64))) and np.all(np.isnan(np.asarray(c[:3], np.float64)))
        assert np.all(np.isfinite(np.asarray(s[3:], np.float64)))


def test_sincos_full_range_under_vmap_and_grad():
    # the check of the range is over the whole batch (the cond stays a cond), values stay exact per lane
    x = np.array([[0.5, 1e9], [2.0, 3.0]], np.float32)
    s, c = jax.jit(jax.vmap(fm.sincos))(x)
    np.testing.assert_allclose(np.asarray(s, np.float64), np.sin(x.astype(np.float64)), atol=TOL_F32)
    ds = jax.grad(lambda v: fm.sincos(v)[0])(jnp.float32(1e9))
    np.testing.assert_allclose(float(ds), np.cos(1e9), atol=TOL_F32)
    # the static fast and full-range variants both match NumPy where the fast one is valid
    y = np.linspace(-fm.FAST_LIMIT, fm.FAST_LIMIT, 100_001).astype(np.float32)
    for full in (False, True):
        s, c = fm.sincos_static(y, full)
        np.testing.assert_allclose(np.asarray(s, np.float64), np.sin(y.astype(np.float64)), rtol=0, atol=TOL_F32)
        np.testing.assert_allclose(np.asarray(c, np.float64), np.cos(y.astype(np.float64)), rtol=0, atol=TOL_F32)


def test_point_source_sum_bounded_at_any_phase():
    p, s, a, k, th = problem(7, 257, 11)
    re0, im0 = fm.point_source_sum(p, s, a, k, th, 0.1)
    for shift in (1e8, -1e12, 3e38):  # a huge source phase θ (e.g. −ωt at late times)
        re, im = fm.point_source_sum(p, s, a, k, (th.astype(np.float64) + shift).astype(np.float32), 0.1)
        big = (th.astype(np.float64) + shift).astype(np.float32).astype(np.float64)
        # reference: e^{i(kr + θ)} = e^{ikr}·e^{iθ} in float64 (kr + θ in one float64 would round kr away)
        ref_k, scale = numpy_sum64(p, s, a * np.cos(big), k, np.zeros_like(th), 0.1)
        ref_k2, _ = numpy_sum64(p, s, a * np.sin(big), k, np.zeros_like(th), 0.1)
        ref = ref_k + 1j * ref_k2
        scale = numpy_sum64(p, s, a, k, th, 0.1)[1]
        psi = np.asarray(re, np.float64) + 1j * np.asarray(im, np.float64)
        assert np.max(np.abs(psi - ref) / scale) <= 1e-5
    for kk in (1e5, 1e9, 1e30):  # huge per-pair phases k·r take the full-range kernel: bounded by Σ|A|/(r + ε)
        re, im = fm.point_source_sum(p, s, a, np.full_like(k, kk), th, 0.1)
        _, scale = numpy_sum64(p, s, a, k, th, 0.1)
        assert np.all(np.hypot(np.asarray(re, np.float64), np.asarray(im, np.float64)) <= scale * (1 + 1e-5))
    assert np.isfinite(np.asarray(re0)).all()


# -------------------------------------------------------------------------------- point_source_sum


@pytest.mark.parametrize(
    "n,m,d,chunk,unroll",
    [(777, 53, 3, 2048, 4), (777, 53, 3, 100, 4), (500, 7, 2, 64, 1), (300, 1, 3, 128, 4), (10, 0, 3, 4, 4)],
)
def test_point_source_sum_matches_float64(n, m, d, chunk, unroll):
    p, s, a, k, th = problem(n + m, n, m, d)
    re, im = jax.jit(lambda *x: fm.point_source_sum(*x, 0.05, chunk=chunk, unroll=unroll))(p, s, a, k, th)
    assert re.shape == im.shape == (n,) and re.dtype == jnp.float32
    ref, scale = numpy_sum64(p, s, a, k, th, 0.05)
    err = np.abs(np.asarray(re, np.float64) + 1j * np.asarray(im, np.float64) - ref)
    if m:
        assert np.linalg.norm(err) / np.linalg.norm(ref) <= 1e-5
        assert np.max(err / scale) <= 1e-5
    else:
        assert np.all(err == 0)


@pytest.mark.parametrize("serial_pairs", [0, 1 << 40], ids=["split_fusions", "serial"])
@pytest.mark.parametrize("n,m", [pytest.param(513, 37, marks=pytest.mark.slow), (64, 16), (7, 3)])
def test_both_kernel_paths_match_float64_and_plain_gradients(monkeypatch, serial_pairs, n, m):
    """The thread-split kernel (`_block_sum`) and the single-thread one (`_serial_sum`, odd N, M not a
    multiple of its 16-source group) give the float64 field and the plain formulation's gradients."""
    monkeypatch.setattr(fm, "_SERIAL_PAIRS", serial_pairs)
    p, s, a, k, th = problem(n * m, n, m)
    re, im = jax.jit(lambda *x: fm.point_source_sum(*x, 0.1))(p, s, a, k, th)
    ref, scale = numpy_sum64(p, s, a, k, th, 0.1)
    err = np.abs(np.asarray(re, np.float64) + 1j * np.asarray(im, np.float64) - ref)
    assert np.max(err / scale) <= 1e-5
    _assert_gradients_match_plain(lambda *x: fm.point_source_sum(*x), (p, s, a, k, th))


@pytest.mark.parametrize("n,m,chunk", [(64, 16, 64), (77, 21, 20), (7, 3, 7)])
def test_reduce_kernel_matches_float64_and_plain_gradients(n, m, chunk):
    """The accelerator kernel (one fused reduction over sources per block; several blocks when chunk < N)
    gives the float64 field to the same bound as the loop kernels and the plain formulation's gradients."""
    p, s, a, k, th = problem(n * m + 1, n, m)
    re, im = jax.jit(lambda *x: fm.point_source_sum(*x, 0.1, chunk=chunk, method="reduce"))(p, s, a, k, th)
    ref, scale = numpy_sum64(p, s, a, k, th, 0.1)
    err = np.abs(np.asarray(re, np.float64) + 1j * np.asarray(im, np.float64) - ref)
    assert np.max(err / scale) <= 1e-5
    _assert_gradients_match_plain(lambda *x: fm.point_source_sum(*x, chunk=chunk, method="reduce"), (p, s, a, k, th))
    with pytest.raises(ValueError, match="method"):
        fm.point_source_sum(p, s, a, k, th, 0.1, method="fused")


def test_reduce_kernel_compiles_to_one_fusion_without_an_n_by_m_temporary():
    """N × M = 2**24 pairs (64 MiB as float32): each of the two kernels (the fast phase reduction and the
    full-range one, a ``conditional`` on the phase bound) is a single fusion with no loop, and there is no
    temporary buffer beyond the outputs (the bound and the per-source reduction are O(N + M))."""
    n, m = 1 << 16, 256
    pts, src, vec = (jax.ShapeDtypeStruct(sh, jnp.float32) for sh in ((n, 3), (m, 3), (m,)))
    c = (
        jax.jit(lambda p, s, a, k, th: fm.point_source_sum(p, s, a, k, th, 0.1, chunk=n, method="reduce"))
        .lower(pts, src, vec, vec, vec)
        .compile()
    )
    assert c.memory_analysis().temp_size_in_bytes < n * m * 4 / 64
    hlo = c.as_text()
    assert "while" not in hlo
    comps = re.split(r"\n(?=\S.*\{\n)", hlo)
    # the two branches of the conditional: computations taking the operand tuple and returning (re, im)
    pair_kernels = [
        c for c in comps if "arg_tuple" in c.splitlines()[0] and f"f32[{n}]" in c.splitlines()[0].split("->")[-1]
    ]
    assert len(pair_kernels) == 2 and all(c.count(" fusion(") == 1 for c in pair_kernels), hlo
    assert "conditional" in hlo[hlo.index("ENTRY") :]


def test_serial_kernel_point_on_source_and_vmap(monkeypatch):
    """Single-thread path: r = 0 on a source keeps value and gradient finite; vmap over θ works."""
    monkeypatch.setattr(fm, "_SERIAL_PAIRS", 1 << 40)
    s = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], jnp.float32)
    p = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.2, 0.0]], jnp.float32)
    a, k, th = jnp.ones(2), jnp.full(2, 3.0), jnp.zeros(2)
    gp = jax.jit(jax.grad(lambda q: jnp.sum(fm.point_source_sum(q, s, a, k, th, 0.1)[0])))(p)
    assert np.all(np.isfinite(np.asarray(gp)))
    ths = jnp.stack([th, th + 1.0])
    re, im = jax.jit(jax.vmap(lambda t: fm.point_source_sum(p, s, a, k, t, 0.1)))(ths)
    for i in range(2):
        ref, _ = numpy_sum64(p, s, a, k, np.asarray(ths[i]), 0.1)
        np.testing.assert_allclose(np.asarray(re[i]) + 1j * np.asarray(im[i]), ref, rtol=1e-6, atol=1e-6)


def test_large_phases_as_accurate_as_plain_formulation():
    """k·r + θ up to ~500 rad: the error is float32 rounding of the phase, same as jnp.cos/sin."""
    p, s, a, k, th = problem(7, 600, 31, kmax=150.0, thmax=100.0)
    ref, scale = numpy_sum64(p, s, a, k, th, 0.1)
    re, im = fm.point_source_sum(*map(jnp.asarray, (p, s, a, k, th)), 0.1, chunk=256)
    rp, ip = plain_jnp_sum(*map(jnp.asarray, (p, s, a, k, th)), 0.1)
    fast = np.abs(np.asarray(re) + 1j * np.asarray(im) - ref) / scale
    plain = np.abs(np.asarray(rp) + 1j * np.asarray(ip) - ref) / scale
    assert fast.max() <= 1e-5
    assert fast.max() <= 1.5 * plain.max() + 1e-6


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 300),
    m=st.integers(1, 40),
    chunk=st.integers(1, 400),
    unroll=st.integers(1, 6),
)
def test_point_source_sum_property(seed, n, m, chunk, unroll):
    p, s, a, k, th = problem(seed, n, m)
    re, im = fm.point_source_sum(*map(jnp.asarray, (p, s, a, k, th)), 0.1, chunk=chunk, unroll=unroll)
    ref, scale = numpy_sum64(p, s, a, k, th, 0.1)
    assert np.max(np.abs(np.asarray(re) + 1j * np.asarray(im) - ref) / scale) <= 1e-5


def _loss(fn, p):
    def loss(s, a, th, pts):
        re, im = fn(pts, s, a, jnp.asarray(p[3]), th, 0.1)
        return jnp.sum(re * re + im * im) + jnp.sum(jnp.sin(3.0 * re) * im)

    return loss


def _assert_gradients_match_plain(kernel, problem_args):
    """Gradients of ``kernel`` (w.r.t. sources, amplitudes, θ, points) equal the plain jnp.sin/cos formulation's."""
    p, s, a, k, th = problem_args
    args = tuple(map(jnp.asarray, (s, a, th, p)))
    fast = _loss(kernel, problem_args)
    plain = _loss(plain_jnp_sum, problem_args)
    gf = jax.jit(jax.grad(fast, argnums=(0, 1, 2, 3)))(*args)
    gp = jax.jit(jax.grad(plain, argnums=(0, 1, 2, 3)))(*args)
    for x, y, name in zip(gf, gp, ("sources", "amplitudes", "theta", "points"), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-4 * np.abs(y).max(), err_msg=name)


def test_gradients_match_plain_formulation():
    p, s, a, k, th = problem(11, 70, 9)
    _assert_gradients_match_plain(lambda *x: fm.point_source_sum(*x, chunk=16), (p, s, a, k, th))


@pytest.mark.slow
def test_gradients_match_float64_finite_differences():
    p, s, a, k, th = problem(12, 257, 23, kmax=40.0, thmax=30.0)
    fast = _loss(lambda *x: fm.point_source_sum(*x, chunk=64), (p, s, a, k, th))
    gf = jax.jit(jax.grad(fast, argnums=(0, 1, 2)))(*map(jnp.asarray, (s, a, th, p)))
    # float64 central differences of the float64 loss along random directions in (s, a, θ)
    with jax.enable_x64(True):
        args64 = tuple(jnp.asarray(x, jnp.float64) for x in (s, a, th, p))
        f64 = jax.jit(_loss(lambda *x: fm.point_source_sum(*x, chunk=64), (p, s, a, k.astype(np.float64), th)))
        rng = np.random.default_rng(0)
        h = 1e-6
        for _ in range(3):
            dirs = [rng.normal(size=x.shape) for x in args64[:3]]
            plus = f64(*(x + h * v for x, v in zip(args64[:3], dirs, strict=True)), args64[3])
            minus = f64(*(x - h * v for x, v in zip(args64[:3], dirs, strict=True)), args64[3])
            fd = float(plus - minus) / (2 * h)
            directional = sum(float(np.sum(np.asarray(g, np.float64) * v)) for g, v in zip(gf, dirs, strict=True))
            assert abs(directional - fd) <= 1e-4 * max(abs(fd), 1.0), (directional, fd)


def test_point_on_source_value_and_gradient_finite():
    s = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], jnp.float32)
    p = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.2, 0.0]], jnp.float32)
    a, k, th = jnp.ones(2), jnp.full(2, 3.0), jnp.zeros(2)
    re, im = jax.jit(lambda q: fm.point_source_sum(q, s, a, k, th, 0.1))(p)
    ref, _ = numpy_sum64(p, s, a, k, th, 0.1)
    np.testing.assert_allclose(np.asarray(re) + 1j * np.asarray(im), ref, rtol=1e-6)

    def f(pts, src):
        re, im = fm.point_source_sum(pts, src, a, k, th, 0.1, chunk=2)
        return jnp.sum(re**2 + im)

    gp, gs = jax.jit(jax.grad(f, argnums=(0, 1)))(p, s)
    assert np.all(np.isfinite(np.asarray(gp))) and np.all(np.isfinite(np.asarray(gs)))


def test_vmap_and_low_precision_inputs():
    p, s, a, k, th = problem(3, 129, 9)
    ths = jnp.stack([jnp.asarray(th), jnp.asarray(th) + 1.0, jnp.asarray(th) - 2.0])
    re, im = jax.jit(
        jax.vmap(
            lambda t: fm.point_source_sum(
                jnp.asarray(p), jnp.asarray(s), jnp.asarray(a), jnp.asarray(k), t, 0.1, chunk=50
            )
        )
    )(ths)
    assert re.shape == (3, 129)
    for i in range(3):
        ref, scale = numpy_sum64(p, s, a, k, np.asarray(ths[i]), 0.1)
        assert np.max(np.abs(np.asarray(re[i]) + 1j * np.asarray(im[i]) - ref) / scale) <= 1e-5
    # vmap over point sets too
    pp = jnp.stack([jnp.asarray(p), jnp.asarray(p) * 0.5])
    re2, _ = jax.jit(
        jax.vmap(
            lambda q: fm.point_source_sum(
                q, jnp.asarray(s), jnp.asarray(a), jnp.asarray(k), jnp.asarray(th), 0.1, chunk=64
            )
        )
    )(pp)
    np.testing.assert_allclose(np.asarray(re2[0]), np.asarray(re[0]), rtol=1e-6, atol=1e-6)
    rb, _ = jax.jit(fm.point_source_sum)(jnp.asarray(p, jnp.bfloat16), jnp.asarray(s, jnp.bfloat16), a, k, th, 0.1)
    assert rb.dtype == jnp.bfloat16


def test_chunked_path_keeps_memory_bounded():
    """No N×M temporary: compiled temporaries are O(N) and do not grow with M."""
    n = 65536

    def temp_bytes(m):
        f = jax.jit(lambda p, s, a, k, th: fm.point_source_sum(p, s, a, k, th, 0.1, chunk=4096))
        args = (jnp.zeros((n, 3)), jnp.zeros((m, 3)), jnp.ones(m), jnp.ones(m), jnp.zeros(m))
        mem = f.lower(*args).compile().memory_analysis()
        return None if mem is None else mem.temp_size_in_bytes

    small, large = temp_bytes(8), temp_bytes(512)
    if small is None:
        pytest.skip("memory analysis unavailable on this backend")
    assert large <= small + 64 * 1024  # independent of M (up to the (M,) source arrays)
    assert large < 16 * n * 4  # a few (N,) arrays: padded/transposed points and the complex result
