"""Attention implementations vs an independent float64 NumPy reference (forward and gradients).

Tolerances: float32 implementations vs the float64 reference: 2e-5 absolute on outputs and
gradients (inputs O(1), T <= 40); float64 chunked/Pallas: 1e-12.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.nn.attention import attention, attention_flops


def np_attention(q, k, v, mask=None, causal=False, g=None):
    """float64 NumPy forward, and with cotangent g the gradients (dq, dk, dv) of sum(O * g)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, Tq, N, H = q.shape
    Tk = k.shape[1]
    scale = 1.0 / np.sqrt(H)
    s = np.einsum("bqnh,bknh->bnqk", q, k) * scale
    allowed = np.ones((B, N, Tq, Tk), bool)
    if mask is not None:
        allowed &= np.broadcast_to(np.asarray(mask), allowed.shape)
    if causal:
        allowed &= np.tril(np.ones((Tq, Tk), bool))
    s = np.where(allowed, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bnqk,bknh->bqnh", p, v)
    if g is None:
        return o
    g = np.asarray(g, np.float64)
    dv = np.einsum("bnqk,bqnh->bknh", p, g)
    dp = np.einsum("bqnh,bknh->bnqk", g, v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bnqk,bknh->bqnh", ds, k)
    dk = np.einsum("bnqk,bqnh->bknh", ds, q)
    return o, (dq, dk, dv)


def _inputs(B=2, T=21, N=2, H=8, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((B, T, N, H)).astype(dtype) for _ in range(4))
    valid = rng.random((B, T)) > 0.3
    valid[:, 0] = True  # no fully-masked query rows (those output 0: tests/contracts/test_bad_inputs.py)
    return q, k, v, g, valid[:, None, None, :]


def _fwd_and_grads(impl, mask, causal, block=8):
    def f(q, k, v, g):
        o, vjp = jax.vjp(
            lambda q, k, v: attention(
                q, k, v, mask=mask, causal=causal, implementation=impl, block_q=block, block_k=block
            ),
            q,
            k,
            v,
        )
        return o, vjp(g)

    return jax.jit(f)


@pytest.mark.parametrize("impl", ["xla", "chunked"])
def test_matches_float64_reference_causal_and_padding_mask(impl):
    q, k, v, g, mask = _inputs()
    o, grads = _fwd_and_grads(impl, jnp.asarray(mask), True)(q, k, v, g)
    o_ref, grads_ref = np_attention(q, k, v, mask, True, g)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, rtol=0)
    for a, b in zip(grads, grads_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)


@pytest.mark.parametrize("impl", ["chunked"])
def test_float64_exact_to_roundoff(impl):
    with jax.enable_x64(True):
        q, k, v, g, _ = _inputs(T=19, dtype=np.float64)
        o_ref, grads_ref = np_attention(q, k, v, None, False, g)
        o, grads = _fwd_and_grads(impl, None, False, block=4)(q, k, v, g)
        assert o.dtype == jnp.float64
        np.testing.assert_allclose(o, o_ref, atol=1e-12, rtol=0)
        for a, b in zip(grads, grads_ref):
            np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_pallas_runs_the_kernel_jax_ships_and_matches_float64(causal):
    """implementation="pallas" is jax.experimental.pallas.ops.gpu.attention.mha (here in the Pallas interpreter,
    the same kernel code the GPU compiles): forward and its fused backward against the float64 reference, with T
    not a multiple of the tile (padded keys excluded by causality or by segment ids)."""
    q, k, v, g, _ = _inputs(B=1, T=21, N=2, H=8)
    f = _fwd_and_grads("pallas", None, causal, block=16)
    o, grads = f(q, k, v, g)
    o_ref, grads_ref = np_attention(q, k, v, None, causal, g)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, rtol=0)
    for a, b in zip(grads, grads_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    jaxpr = str(jax.make_jaxpr(f)(q, k, v, g))
    assert "mha_forward" in jaxpr and "mha_backward" in jaxpr
    assert "ivhl_flash" not in jaxpr


@pytest.mark.parametrize("causal", [True, False])
def test_pallas_on_tpu_adapts_layout_padding_and_scale_for_jax_tpu_flash_attention(monkeypatch, causal):
    """On TPU "pallas" calls jax.experimental.pallas.ops.tpu.flash_attention ([B, N, T, H], T padded to the
    128-tiles, padded keys masked by causality or segment ids). Its kernel needs a TPU, so here the module's own
    reference implementation (same signature and semantics) stands in for it: the adapter's values and gradients
    must equal the float64 reference."""
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_fa

    from ivhl_jax.core import backend

    calls = []

    def stand_in(q, k, v, ab=None, segment_ids=None, *, causal=False, sm_scale=1.0, block_sizes=None):
        calls.append((q.shape, segment_ids is not None, block_sizes.block_q))
        # the reference's backward takes sm_scale = 1 only: fold the scale into q (same logits)
        return tpu_fa.mha_reference(q * sm_scale, k, v, ab, segment_ids, causal=causal)

    monkeypatch.setattr(tpu_fa, "flash_attention", stand_in)
    monkeypatch.setattr(backend, "platform", lambda: "tpu")
    q, k, v, g, _ = _inputs(B=2, T=21, N=2, H=8)
    o, grads = _fwd_and_grads("pallas", None, causal, block=None)(q, k, v, g)
    o_ref, grads_ref = np_attention(q, k, v, None, causal, g)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, rtol=0)
    for a, b in zip(grads, grads_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    assert calls and all(c == ((2, 2, 128, 8), not causal, 128) for c in calls)


def test_pallas_with_a_mask_or_float64_runs_chunked_with_a_warning():
    q, k, v, _, mask = _inputs(T=12)
    with pytest.warns(RuntimeWarning, match="no boolean mask.*chunked"):
        out = attention(q, k, v, mask=jnp.asarray(mask), implementation="pallas", block_k=8)
    ref = attention(q, k, v, mask=jnp.asarray(mask), implementation="chunked", block_k=8)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    with jax.enable_x64(True):
        q64 = jnp.asarray(q, jnp.float64)
        with pytest.warns(RuntimeWarning, match="float32/bfloat16/float16"):
            out = attention(q64, q64, q64, implementation="pallas")
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(out, np_attention(q, q, q), atol=1e-12)


@pytest.mark.parametrize("T,blocks", [(128, 2), (256, 4), (448, 4), (512, 8), (96, 1)])
def test_causal_xla_on_cpu_multiplies_each_query_block_by_its_key_prefix_only(T, blocks):
    """Causal attention takes the dense kernel by query blocks, each against its key prefix: values and gradients
    equal the float64 reference (to float32 roundoff, with and without a padding mask, and to float64 roundoff in
    float64)."""
    from ivhl_jax.nn import attention as A

    assert A._causal_blocks(T) == blocks
    q, k, v, g, pad = _inputs(B=2, T=T, N=2, H=8)
    for mask in (None, pad):
        o, grads = _fwd_and_grads("xla", None if mask is None else jnp.asarray(mask), True)(q, k, v, g)
        o_ref, grads_ref = np_attention(q, k, v, mask, True, g)
        np.testing.assert_allclose(o, o_ref, atol=2e-5, rtol=0)
        for a, b in zip(grads, grads_ref):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    with jax.enable_x64(True):
        q, k, v, g, _ = _inputs(B=1, T=T, N=1, H=4, dtype=np.float64, seed=1)
        o, grads = _fwd_and_grads("xla", None, True)(q, k, v, g)
        o_ref, grads_ref = np_attention(q, k, v, None, True, g)
        assert o.dtype == jnp.float64
        np.testing.assert_allclose(o, o_ref, atol=1e-12, rtol=0)
        for a, b in zip(grads, grads_ref):
            np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)
    hlo = jax.jit(lambda q, k, v: attention(q, k, v, causal=True, implementation="xla")).lower(q, k, v).as_text()
    assert hlo.count("dot_general") == blocks * 2  # (QK^T, PV) per query block, each against its prefix


def test_chunked_backward_memory_is_linear_while_xla_is_quadratic():
    """Compiled temp memory of value_and_grad: doubling T doubles chunked, quadruples xla."""

    def temp(impl, T):
        x = jax.ShapeDtypeStruct((1, T, 1, 16), jnp.float32)
        loss = lambda q, k, v: jnp.sum(attention(q, k, v, causal=True, implementation=impl, block_k=128))
        c = jax.jit(jax.grad(loss, (0, 1, 2))).lower(x, x, x).compile()
        return c.memory_analysis().temp_size_in_bytes

    ch = [temp("chunked", T) for T in (512, 1024)]
    xl = [temp("xla", T) for T in (512, 1024)]
    assert ch[1] / ch[0] < 2.6, ch
    assert xl[1] / xl[0] > 3.2, xl
    # The dense path keeps T x T buffers (P, dP, dS; causal: the 9/16 of them below the block diagonal, 8 query
    # blocks) at T = 1024; the chunked one a few T x block.
    assert xl[1] > 2 * ch[1], (xl, ch)


def test_vmap_and_cross_attention_lengths():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 2, 9, 2, 8)).astype(np.float32)
    kv = rng.standard_normal((3, 2, 13, 2, 8)).astype(np.float32)
    f = jax.jit(jax.vmap(lambda q, kv: attention(q, kv, kv, implementation="chunked", block_k=4)))
    out = f(q, kv)
    ref = np.stack([np_attention(q[i], kv[i], kv[i]) for i in range(3)])
    np.testing.assert_allclose(out, ref, atol=2e-5)


def test_cudnn_request_falls_back_off_gpu_with_a_warning():
    q, k, v, _, _ = _inputs(T=8)
    qb, kb, vb = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
    if jax.default_backend() == "gpu":
        pytest.skip("fallback path is exercised off-GPU")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = attention(qb, kb, vb, causal=True, implementation="cudnn")
    assert any("falls back" in str(x.message) or "using the XLA path" in str(x.message) for x in w)
    ref = attention(qb, kb, vb, causal=True, implementation="xla")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))


def test_bad_inputs_raise_clear_errors():
    q = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(ValueError, match="q"):
        attention(q[0], q, q)
    with pytest.raises(ValueError, match="k must have shape"):
        attention(q, jnp.zeros((1, 4, 3, 8)), q)
    with pytest.raises(TypeError, match="mask must be boolean"):
        attention(q, q, q, mask=jnp.ones((4, 4)))
    with pytest.raises(ValueError, match="broadcastable"):
        attention(q, q, q, mask=jnp.ones((3, 4), bool))
    with pytest.raises(ValueError, match="implementation"):
        attention(q, q, q, implementation="flash")
    with pytest.raises(ValueError, match="causal"):
        attention(q, jnp.zeros((1, 5, 2, 8)), jnp.zeros((1, 5, 2, 8)), causal=True)


def test_attention_flops_formula():
    assert attention_flops(1, 10, 10, 1, 4) == 4 * 10 * 10 * 4
    assert attention_flops(1, 10, 10, 1, 4, causal=True, backward=True) == 4 * 100 * 4 * 3.5 / 2


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "chunked", "pallas"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("T,block", [(40, 16), (33, 32)])
def test_full_matrix_against_float64_reference(impl, causal, masked, T, block):
    q, k, v, g, mask = _inputs(T=T, seed=T)
    m = jnp.asarray(mask) if masked else None
    o, grads = _fwd_and_grads(impl, m, causal, block)(q, k, v, g)
    o_ref, grads_ref = np_attention(q, k, v, mask if masked else None, causal, g)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, rtol=0)
    for a, b in zip(grads, grads_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)


@pytest.mark.slow
def test_full_head_mask_and_bf16_paths():
    """A per-(batch, head, query, key) random mask, and bf16 inputs (looser tolerance)."""
    rng = np.random.default_rng(7)
    q, k, v, g, _ = _inputs(T=24, seed=7)
    mask = rng.random((2, 2, 24, 24)) > 0.4
    mask[..., 0] = True
    o_ref, grads_ref = np_attention(q, k, v, mask, False, g)
    for impl in ("xla", "chunked", "pallas"):
        o, grads = _fwd_and_grads(impl, jnp.asarray(mask), False)(q, k, v, g)
        np.testing.assert_allclose(o, o_ref, atol=2e-5)
        for a, b in zip(grads, grads_ref):
            np.testing.assert_allclose(a, b, atol=2e-5)
        qb, kb, vb = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
        ob = attention(qb, kb, vb, mask=jnp.asarray(mask), implementation=impl, block_q=8, block_k=8)
        assert ob.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(ob, np.float32), o_ref, atol=3e-2)
