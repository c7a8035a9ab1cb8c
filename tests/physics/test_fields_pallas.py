"""ivhl_jax.physics.fields_pallas (the Pallas field kernel) in Pallas's interpreter on the CPU: equal to the XLA
"reduce" kernel within its stated error and to the float64 double sum, through ``fields.superpose`` at float32
and bf16 storage, with the XLA kernel's gradient; the program holds no N x M temporary; ``ivhl tune`` races it on
GPUs only and no table row chooses it; lowered for a CUDA GPU from the CPU it is one Triton call. (Compiled and
timed on a GPU by ``ivhl tune`` and gpu_checks there.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import fields as F
from ivhl_jax.core import backend
from ivhl_jax.numerics import fastmath
from ivhl_jax.physics import fields_pallas as FP
from ivhl_jax.physics import tunables


def _problem(seed, n, m, d, theta_range=np.pi):
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, d)).astype(np.float32)
    s = (0.6 * rng.normal(size=(m, d))).astype(np.float32)
    a = rng.uniform(-2, 2, m).astype(np.float32)
    k = rng.uniform(0.5, 8, m).astype(np.float32)
    th = rng.uniform(-theta_range, theta_range, m).astype(np.float32)
    return p, s, a, k, th


def _reference(p, s, a, k, th, eps):
    """float64 double sum and its scale Σ_j |A_j| / (r + ε) per point."""
    p, s, a, k, th = (np.asarray(x, np.float64) for x in (p, s, a, k, th))
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    return (a * np.exp(1j * (k * r + th)) / (r + eps)).sum(1), (np.abs(a) / (r + eps)).sum(1)


@pytest.mark.slow  # Pallas's interpreter: ~15 s per shape on 2 shared cores
@pytest.mark.parametrize(("n", "m", "d", "theta_range"), [(200, 45, 3, np.pi), (70, 9, 2, 3e3)])
def test_kernel_equals_the_xla_kernel_within_its_stated_error(n, m, d, theta_range):
    """Points and sources not multiples of the tile (padding adds exactly 0), D = 2 and 3, phases θ up to 3e3 rad
    (reduced mod π before the kernel): within STATED_ERROR x Σ|A|/(r + ε) of the XLA "reduce" kernel per point,
    and as close to the float64 sum as the XLA kernel is (5e-7 of the scale, the float32 rounding)."""
    p, s, a, k, th = _problem(1, n, m, d, theta_range)
    re, im = FP.point_source_sum(p, s, np.stack([a, k, th]), 0.1, block_points=64, block_sources=16)
    re_x, im_x = fastmath.point_source_sum(p, s, a, k, th, 0.1, method="reduce")
    ref, scale = _reference(p, s, a, k, th, 0.1)
    got, xla = np.asarray(re) + 1j * np.asarray(im), np.asarray(re_x) + 1j * np.asarray(im_x)
    assert np.max(np.abs(got - xla) / scale) <= FP.STATED_ERROR
    err, err_xla = np.max(np.abs(got - ref) / scale), np.max(np.abs(xla - ref) / scale)
    assert err <= max(5e-7, 2 * err_xla), (err, err_xla)


@pytest.mark.slow  # Pallas's interpreter under superpose (f32, bf16), grad and vmap: ~100 s on 2 shared cores
def test_superpose_with_the_pallas_kernel_at_f32_and_bf16_storage_and_its_gradient():
    """``fields_method="pallas"`` (forced on the CPU, where it runs interpreted): ``superpose`` equals the table's
    kernel within the stated error at float32 and at bf16 storage (the same rounded inputs), its gradient is the
    XLA kernel's, and vmap over t works; float64 work keeps the XLA kernel."""
    p, s, a, k, th = _problem(2, 150, 20, 3)
    kw = dict(amplitudes=a, wavenumbers=k, phases=th, t=0.7)
    _, scale = _reference(p, s, a, k, th, 0.1)
    for policy in (None, "pure_bf16"):
        want = F.superpose(p, s, policy=policy, **kw)
        with backend.override(fields_method="pallas"):
            got = F.superpose(p, s, policy=policy, **kw)
        # bf16 storage rounds Re/Im to bf16 (8 bits): both kernels' outputs round alike but for values within
        # the kernels' difference of a rounding boundary, one bf16 ulp of |ψ|
        tol = FP.STATED_ERROR * scale + (0 if policy is None else np.abs(np.asarray(want)) * 2.0**-7)
        assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= tol), policy

    def loss(points):
        return jnp.sum(jnp.abs(F.superpose(points, s, **kw)) ** 2)

    g_xla = jax.grad(loss)(jnp.asarray(p))
    with backend.override(fields_method="pallas"):
        g = jax.grad(loss)(jnp.asarray(p))
        ts = jnp.asarray([0.0, 0.7])
        batch = jax.vmap(lambda t: F.superpose(p, s, amplitudes=a, wavenumbers=k, phases=th, t=t))(ts)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_xla), rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(g_xla))))
    assert np.max(np.abs(np.asarray(batch[1]) - np.asarray(F.superpose(p, s, **kw))) / scale) <= FP.STATED_ERROR
    with jax.enable_x64(True), backend.override(fields_method="pallas"):  # float64: the XLA kernel, exact sum
        psi64 = F.superpose(p.astype(np.float64), s.astype(np.float64), **kw)
    ref, _ = _reference(p, s, a, k, th.astype(np.float64) - k.astype(np.float64) * 0.7, 0.1)
    assert np.max(np.abs(np.asarray(psi64) - ref) / scale) < 1e-12


@pytest.mark.slow  # compiling the interpreted kernel: ~10 s
def test_the_pallas_program_holds_no_n_by_m_temporary():
    """The program reads the points and sources once and keeps one tile of pair terms: ``memory_analysis`` of the
    compiled call (the interpreter's program on the CPU) has no N x M temporary."""
    n, m = 4096, 512
    pts, src = jax.ShapeDtypeStruct((n, 3), jnp.float32), jax.ShapeDtypeStruct((m, 3), jnp.float32)
    with backend.override(fields_method="pallas"):
        c = jax.jit(lambda p, s: F.superpose(p, s, wavenumbers=3.0)).lower(pts, src).compile()
    assert c.memory_analysis().temp_size_in_bytes < n * m * 4 / 16


@pytest.mark.slow  # three lowerings through Pallas's Triton path: ~15 s on 2 shared cores
def test_the_kernel_lowers_to_one_triton_call_for_a_cuda_gpu():
    """Lowered for CUDA from this CPU (the Pallas-to-Triton lowering runs here; only PTX needs the GPU): the
    forward at float32 and at bf16 storage, and the gradient, are each ONE Triton kernel call, never the
    interpreter; an operation Triton cannot lower (a boolean reduce_or, a non-power-of-two tile) fails here."""
    pts, src = jax.ShapeDtypeStruct((1000, 3), jnp.float32), jax.ShapeDtypeStruct((77, 3), jnp.float32)
    with backend.override(fields_method="pallas"):
        for policy in (None, "pure_bf16"):
            f = jax.jit(lambda p, s, policy=policy: F.superpose(p, s, wavenumbers=3.0, policy=policy))
            hlo = f.trace(pts, src).lower(lowering_platforms=("cuda",)).as_text()
            assert hlo.count("xla.gpu.triton") == 1, policy
        g = jax.jit(jax.grad(lambda p, s: jnp.sum(jnp.abs(F.superpose(p, s, wavenumbers=3.0)) ** 2)))
        assert g.trace(pts, src).lower(lowering_platforms=("cuda",)).as_text().count("xla.gpu.triton") == 1


def test_bad_inputs_are_one_line_errors():
    """A tile that is not a power of two, float64 points and no sources are refused before any tracing."""
    p, s, a, k, th = _problem(3, 8, 4, 3)
    with pytest.raises(ValueError, match="block_sources must be a power of two"):
        FP.point_source_sum(p, s, np.stack([a, k, th]), 0.1, block_sources=24)
    with jax.enable_x64(True), pytest.raises(TypeError, match="points must be float32"):
        FP.point_source_sum(p.astype(np.float64), s, np.stack([a, k, th]), 0.1)
    with pytest.raises(ValueError, match="at least one source"):
        FP.point_source_sum(p, s[:0], np.zeros((3, 0), np.float32), 0.1)


def test_tune_races_the_pallas_kernel_on_gpus_only_and_no_row_chooses_it():
    """``ivhl tune``'s fields area adds the Pallas candidate on GPUs only; the GPU row keeps the XLA reduction,
    'unmeasured' until a GPU measures it, and an unknown kernel name is refused."""
    assert tunables.pallas_candidate("gpu") and not tunables.pallas_candidate("cpu")
    assert not tunables.pallas_candidate("tpu")
    assert all(row.fields_method != "pallas" for row in backend.TABLE.values())
    assert backend.TABLE["gpu"].fields_method == "reduce"
    assert backend.EVIDENCE["fields_method"]["gpu"].startswith("unmeasured")
    with pytest.raises(ValueError, match="fields_method must be"):
        with backend.override(fields_method="triton"):
            pass
