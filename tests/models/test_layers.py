"""Layers vs independent float64 NumPy/SciPy references; XLA fusion from compiled HLO; RoPE."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf as sp_erf

from ivhl_jax.models import layers as L

X = np.linspace(-6.0, 6.0, 241)


def np_ref(name, x):
    x = np.asarray(x, np.float64)
    sig = 1.0 / (1.0 + np.exp(-x))
    softplus = np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)
    gelu = 0.5 * x * (1 + sp_erf(x / np.sqrt(2)))
    if name in ("swiglu", "geglu"):
        a, b = np.split(x, 2, axis=-1)
        act = a / (1 + np.exp(-a)) if name == "swiglu" else 0.5 * a * (1 + sp_erf(a / np.sqrt(2)))
        return act * b
    return {
        "gelu": gelu,
        "gelu_tanh": 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
        "silu": x * sig,
        "mish": x * np.tanh(softplus),
        "relu": np.maximum(x, 0),
    }[name]


@pytest.mark.parametrize("name", sorted(L.ACTIVATIONS))
def test_activations_match_float64_reference(name):
    x = np.stack([X, X[::-1]], 0)[:, :240]
    with jax.enable_x64(True):
        out64 = L.get_activation(name)(jnp.asarray(x, jnp.float64))
        np.testing.assert_allclose(out64, np_ref(name, x), atol=1e-12, rtol=1e-12)
    out32 = L.get_activation(name)(jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(out32, np_ref(name, x), atol=5e-6, rtol=2e-6)


def test_exact_and_tanh_gelu_differ_by_the_known_amount():
    """jax.nn.gelu defaults to tanh; the exact (erf) one differs by up to ~4.7e-4 (anchors B5)."""
    diff = np.max(np.abs(np_ref("gelu", X) - np_ref("gelu_tanh", X)))
    assert 4e-4 < diff < 5e-4
    np.testing.assert_allclose(L.gelu_exact(jnp.asarray(X, jnp.float32)), jax.nn.gelu(X, approximate=False), atol=1e-6)


def _init_apply(module, x, **kw):
    variables = module.init(jax.random.key(0), x, **kw)
    return nn.meta.unbox(variables)


def test_rmsnorm_and_layernorm_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 7, 16)) * 3 + 1
    with jax.enable_x64(True):
        for mod, ref in (
            (L.RMSNorm(eps=1e-6), x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)),
            (L.LayerNorm(eps=1e-5), (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
        ):
            v = _init_apply(mod, jnp.asarray(x))
            v = jax.tree_util.tree_map(lambda p: p * 1.5 if p.ndim else p, v)  # non-trivial scale
            out = mod.apply(v, jnp.asarray(x))
            bias = v["params"].get("bias", 0.0)
            np.testing.assert_allclose(out, ref * 1.5 + np.asarray(bias), atol=1e-12)
            assert mod.apply(v, jnp.asarray(x, jnp.float32)).dtype == jnp.float32


def test_rope_preserves_norms_and_depends_on_relative_position():
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)

    @jax.jit
    def _score(p, pk):
        return jnp.sum(L.apply_rope(q, p[None]) * L.apply_rope(k, pk[None]))

    def score(p, pk):
        return float(_score(jnp.float32(p), jnp.float32(pk)))

    for p, pk in ((0, 3), (10, 13), (100, 103)):
        np.testing.assert_allclose(score(p, pk), score(0, 3), rtol=1e-4, atol=1e-4)
    assert abs(score(0, 3) - score(0, 7)) > 1e-3
    x = jnp.asarray(rng.standard_normal((2, 50, 3, 8)), jnp.float32)
    r = jax.jit(L.apply_rope)(x)
    np.testing.assert_allclose(jnp.linalg.norm(r, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(r[:, 0], x[:, 0], atol=0)  # position 0 is the identity
    with pytest.raises(ValueError, match="even head_dim"):
        L.apply_rope(jnp.zeros((1, 2, 1, 5)))


def test_rope_default_positions_use_host_tables_equal_to_the_traced_angles():
    """``apply_rope(x)`` (positions 0..T-1 from :func:`rope_tables`) equals the rotation written out in
    float64 NumPy and the traced-positions path, and its compiled form evaluates no sin/cos."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 300, 3, 16))
    theta = 10000.0 ** (-np.arange(8) * 2.0 / 16)
    ang = np.arange(300)[:, None] * theta  # [T, H/2]
    c, s = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
    ref = np.concatenate([x[..., :8] * c - x[..., 8:] * s, x[..., 8:] * c + x[..., :8] * s], axis=-1)
    xf = jnp.asarray(x, jnp.float32)
    default = jax.jit(L.apply_rope)
    np.testing.assert_allclose(default(xf), ref, atol=2e-6)
    np.testing.assert_allclose(default(xf), jax.jit(L.apply_rope)(xf, jnp.arange(300)), atol=5e-5)
    text = default.lower(xf).compile().as_text()
    assert " sine(" not in text and " cosine(" not in text
    traced = jax.jit(L.apply_rope).lower(xf, jnp.arange(300)).compile().as_text()
    assert " sine(" in traced  # the control: traced positions do evaluate sin
    with pytest.raises(ValueError, match="seq_len"):
        L.rope_tables(0, 16)


ELEMENTWISE = {
    "add",
    "multiply",
    "subtract",
    "divide",
    "erf",
    "exponential",
    "tanh",
    "rsqrt",
    "maximum",
    "logistic",
    "sqrt",
    "negate",
    "select",
    "compare",
    "convert",
}


def _entry_ops(hlo_text):
    entry = hlo_text[hlo_text.index("ENTRY") :]
    entry = entry[: entry.index("\n}")]
    ops = re.findall(r"=\s*\S+\s+([a-z\-]+)\(", entry)
    kinds = re.findall(r"kind=(k\w+)", entry)
    return ops, kinds


def test_fused_dense_blocks_keep_their_parameter_trees():
    """DenseAct holds one Dense ``dense`` (twice as wide for a gated activation), LayerNormDense a norm ``norm``
    and a Dense ``dense``: the trees checkpoints and the transformer's sharding rules name."""
    x = jnp.zeros((4, 16))

    def shapes(mod):
        return jax.tree_util.tree_map(jnp.shape, nn.meta.unbox(jax.eval_shape(mod.init, jax.random.key(0), x)))

    dense = {"kernel": (16, 64), "bias": (64,)}
    assert shapes(L.DenseAct(32, activation="swiglu")) == {"params": {"dense": dense}}
    assert shapes(L.DenseAct(64, use_bias=False)) == {"params": {"dense": {"kernel": (16, 64)}}}
    assert shapes(L.LayerNormDense(64, norm="rmsnorm")) == {"params": {"norm": {"scale": (16,)}, "dense": dense}}


@pytest.mark.parametrize("block", ["dense_gelu", "layernorm_dense"])
def test_xla_fuses_the_elementwise_work_around_the_matmul(block):
    """Compiled HLO: no element-wise op runs unfused at the top level, so no intermediate activation
    buffer (pre-activation, normalised input pieces) is materialised besides the matmul output; the
    compiled temp memory is at most one activation-sized buffer."""
    M, K, N = 128, 256, 512
    x = jax.ShapeDtypeStruct((M, K), jnp.float32)
    if block == "dense_gelu":
        mod = L.DenseAct(N, activation="gelu")
    else:
        mod = L.LayerNormDense(N)
    params = jax.eval_shape(lambda: nn.meta.unbox(mod.init(jax.random.key(0), jnp.zeros((M, K)))))
    compiled = jax.jit(mod.apply).lower(params, x).compile()
    ops, kinds = _entry_ops(compiled.as_text())
    assert not (set(ops) & ELEMENTWISE), ops
    if jax.default_backend() == "cpu":
        assert "fusion" in ops and any(k in ("kLoop", "kInput", "kOutput") for k in kinds), (ops, kinds)
    else:  # XLA:GPU fuses the element-wise work into the GEMM itself (Triton/cuBLAS epilogues, kCustom)
        assert "kCustom" in kinds, (ops, kinds)
    temp = compiled.memory_analysis().temp_size_in_bytes
    # On GPU the temp buffer also holds cuBLAS's fixed 1 MiB GEMM workspace (measured on an H100: exactly 1 MiB).
    workspace = 0 if jax.default_backend() == "cpu" else 1 << 20
    assert temp <= M * max(K, N) * 4 + 4096 + workspace, temp


def test_matmul_saving_transposed_input_has_the_values_and_derivatives_of_dot():
    """Forward value, forward mode, reverse mode, second order and vmap all agree with ``jnp.dot`` (float64
    NumPy for the value): only the layout of what reverse mode saves differs."""
    kx, kw, kt, kc = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(kx, (3, 5, 8))
    w = jax.random.normal(kw, (8, 16)) / 3.0
    f = L.matmul_saving_transposed_input
    np.testing.assert_allclose(f(x, w), np.asarray(x, np.float64) @ np.asarray(w, np.float64), rtol=1e-5, atol=1e-5)
    tx, tw = jax.random.normal(kt, x.shape), jax.random.normal(kt, w.shape)
    _, jvp_ours = jax.jvp(f, (x, w), (tx, tw))
    _, jvp_ref = jax.jvp(jnp.dot, (x, w), (tx, tw))
    np.testing.assert_allclose(jvp_ours, jvp_ref, rtol=1e-5, atol=1e-5)
    c = jax.random.normal(kc, (3, 5, 16))

    def loss(fn):
        return lambda x, w, c: jnp.sum(jnp.tanh(fn(x, w)) * c)

    for g_ours, g_ref in zip(
        jax.grad(loss(f), argnums=(0, 1))(x, w, c), jax.grad(loss(jnp.dot), argnums=(0, 1))(x, w, c)
    ):
        np.testing.assert_allclose(g_ours, g_ref, rtol=1e-5, atol=1e-5)
    hess = lambda fn: jax.hessian(lambda w: loss(fn)(x[:1, :2], w, c[:1, :2]))(w)  # second order, both modes
    np.testing.assert_allclose(hess(f), hess(jnp.dot), rtol=1e-4, atol=1e-5)
    per_example = lambda fn: jax.vmap(jax.grad(loss(fn), argnums=1), in_axes=(0, None, 0))(x, w, c)
    np.testing.assert_allclose(per_example(f), per_example(jnp.dot), rtol=1e-5, atol=1e-5)


def test_matmul_saving_transposed_input_rejects_bad_input_naming_the_argument():
    with pytest.raises(ValueError, match="x's last axis must match w's first"):
        L.matmul_saving_transposed_input(jnp.ones((3, 4)), jnp.ones((5, 2)))
    with pytest.raises(ValueError, match="w"):
        L.matmul_saving_transposed_input(jnp.ones((3, 4)), jnp.ones((4,)))
    with pytest.raises(TypeError, match="x"):
        L.matmul_saving_transposed_input(jnp.ones((3, 4), jnp.int32), jnp.ones((4, 2)))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU matmul-library choice")
def test_expanding_projection_weight_gradient_is_a_plain_matmul_in_the_layer_scan(monkeypatch):
    """In the compiled gradient of a layer-scanned transformer, the expanding MLP projection's weight gradient
    ``[d_model, d_ff]`` is no longer an Eigen ``dot`` contracting its left operand's leading (token) axis,
    which it is with a plain ``jnp.dot`` (the control, so the test can fail)."""
    from ivhl_jax.models import transformer as tm

    cfg = tm.preset("tiny", max_len=32, activation="gelu", norm="layernorm", attention="xla", layer_loop="scan")
    params = tm.init_params(cfg, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (2, 33), 0, cfg.vocab_size)
    loss = tm.lm_loss_fn(cfg)
    eigen_dw = re.compile(rf"= f32\[{cfg.d_model},{cfg.d_ff}\]\S* dot\([^\n]*lhs_contracting_dims=\{{0\}}")

    def compiled_grad():
        grad = jax.jit(jax.grad(lambda p, b: loss(p, b, None, None)[0]))
        return grad, grad.lower(params, batch).compile().as_text()

    grad, ours = compiled_grad()
    assert not eigen_dw.search(ours)
    monkeypatch.setattr(L, "matmul_saving_transposed_input", jnp.dot)
    plain_grad, plain = compiled_grad()
    assert eigen_dw.search(plain)
    for a, b in zip(jax.tree.leaves(grad(params, batch)), jax.tree.leaves(plain_grad(params, batch))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
