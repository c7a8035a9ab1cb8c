"""Transformer building blocks (Flax linen): activations, norms, fused blocks, RoPE.

Every parameter carries logical axis names (``nn.with_logical_partitioning``) so a mesh rule set
can shard it: ``"embed"`` (model width), ``"mlp"`` (feed-forward width), ``"heads"``, ``"kv"``
(head dim) and ``"vocab"``. Initialise with ``model.init`` and strip the metadata with
``flax.linen.meta.unbox`` (or keep it to read the partition specs with ``nn.get_partition_spec``).

"Fused" blocks need no special kernels in JAX: under ``jit`` XLA fuses the element-wise epilogue
(bias + activation) of a matmul into one loop that reads the matmul result once, and the
normalisation prologue of LayerNorm + Dense likewise (tested from the compiled HLO in
``tests/models/test_layers.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_array, check_choice, check_scalar

Dtype = Any


# --------------------------------------------------------------------------- activations


def gelu_exact(x: jax.Array) -> jax.Array:
    """GELU with the exact Gaussian CDF: ``x·Φ(x) = x/2·(1 + erf(x/√2))`` (PyTorch's default)."""
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU, tanh approximation: ``x/2·(1 + tanh(√(2/π)(x + 0.044715 x³)))`` (jax.nn.gelu's default)."""
    return jax.nn.gelu(x, approximate=True)


def silu(x: jax.Array) -> jax.Array:
    """SiLU / swish: ``x·σ(x)``."""
    return jax.nn.silu(x)


def mish(x: jax.Array) -> jax.Array:
    """Mish: ``x·tanh(softplus(x))``."""
    return x * jnp.tanh(jax.nn.softplus(x))


def relu(x: jax.Array) -> jax.Array:
    return jax.nn.relu(x)


def swiglu(x: jax.Array) -> jax.Array:
    """SwiGLU on a last axis split in halves ``[a, b]``: ``silu(a)·b`` (Shazeer 2020). Halves the width."""
    a, b = _split_gate(x)
    return jax.nn.silu(a) * b


def geglu(x: jax.Array) -> jax.Array:
    """GeGLU: ``gelu_exact(a)·b`` with ``[a, b]`` the halves of the last axis."""
    a, b = _split_gate(x)
    return gelu_exact(a) * b


def _split_gate(x):
    if x.shape[-1] % 2:
        raise ValueError(f"gated activations need an even last dimension, got shape {x.shape}")
    return jnp.split(x, 2, axis=-1)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": gelu_exact,
    "gelu_tanh": gelu_tanh,
    "silu": silu,
    "mish": mish,
    "relu": relu,
    "swiglu": swiglu,
    "geglu": geglu,
}
GATED = ("swiglu", "geglu")


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """Activation by name: gelu (exact erf), gelu_tanh, silu, mish, relu, swiglu, geglu."""
    check_choice(name, "activation", tuple(ACTIVATIONS))
    return ACTIVATIONS[name]


# --------------------------------------------------------------------------- parameters


def partitioned_param(
    module: nn.Module,
    name: str,
    init: Callable[..., Any],
    shape: tuple[int, ...],
    axes: tuple[str | None, ...],
    dtype: Dtype,
) -> jax.Array:
    """The parameter ``name`` of ``module``, ``init(key, shape, dtype)``, its dimensions named by the logical
    ``axes`` (a mesh rule set shards it by them); the array itself, the annotation unboxed."""
    # Flax types `param` as returning what the initialiser returns (the LogicallyPartitioned box), but with its
    # default unbox=True it returns the array inside the box.
    return cast(jax.Array, module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype))


# --------------------------------------------------------------------------- norms


def _normalised_input(norm: RMSNorm | LayerNorm, x: jax.Array) -> tuple[jax.Array, Dtype, jax.Array]:
    """A norm's scale γ (over the last axis of ``x``), its output dtype, and ``x`` in its float32-or-wider
    statistics dtype."""
    scale = partitioned_param(norm, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",), norm.param_dtype)
    return scale, norm.dtype or x.dtype, x.astype(jnp.promote_types(x.dtype, jnp.float32))


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x², -1) + eps) · γ`` (statistics in float32)."""

    eps: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale, dtype, xf = _normalised_input(self, x)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(y.dtype)).astype(dtype)


class LayerNorm(nn.Module):
    """``y = (x − mean) / sqrt(var + eps) · γ + β`` over the last axis (statistics in float32)."""

    eps: float = 1e-5
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale, dtype, xf = _normalised_input(self, x)
        mu = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
        y = (xf - mu) * jax.lax.rsqrt(var + self.eps) * scale.astype(xf.dtype)
        if self.use_bias:
            bias = partitioned_param(self, "bias", nn.initializers.zeros, (x.shape[-1],), ("embed",), self.param_dtype)
            y = y + bias.astype(xf.dtype)
        return y.astype(dtype)


def get_norm(kind: str, **kwargs) -> nn.Module:
    """``RMSNorm(**kwargs)`` for ``"rmsnorm"``, ``LayerNorm(**kwargs)`` for ``"layernorm"``."""
    check_choice(kind, "norm", ("rmsnorm", "layernorm"))
    return RMSNorm(**kwargs) if kind == "rmsnorm" else LayerNorm(**kwargs)


# --------------------------------------------------------------------------- fused blocks


def matmul_saving_transposed_input(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` (``x [..., n_in]``, ``w [n_in, n_out]`` -> ``[..., n_out]``) whose reverse mode saves ``x``
    transposed, as ``[n_in, ...]``, so that the weight gradient ``dW = xᵀ·dy`` is a plain row-major matmul.

    Values and derivatives (forward and reverse mode, any order) are those of ``jnp.dot``; only the layout of
    the saved input differs. Why: XLA:CPU runs a matmul that contracts the token axis of both operands (the
    weight gradient) with Eigen, or first copies one operand transposed, and keeps its faster plain-matmul
    kernel (YNNPACK) for row-major ones. A transpose next to the matmul would be folded back into it by XLA,
    but one written into the residuals of a layer ``scan`` is not: the forward pass writes ``xᵀ`` once and the
    backward reads it as is. The model layers use it where the backend table sets ``transposed_save_matmul``
    (the CPU row; ``bench/results/transformer_cpu_vs_torch.json``): for the expanding MLP projection only (on
    the contracting one XLA would recompute the activation inside the transposing write), and in the unrolled
    layer loop for the attention output projection (see ``transformer.Block``).
    """
    x = check_array(x, "x", kind="floating")
    w = check_array(w, "w", ndim=2, kind="floating")
    if x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"x's last axis must match w's first (n_in): x has shape {x.shape}, w {w.shape}")
    return _matmul_saving_transposed_input(x, w)


@jax.custom_jvp
def _matmul_saving_transposed_input(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x, w)


@_matmul_saving_transposed_input.defjvp
def _matmul_saving_transposed_input_jvp(primals, tangents):
    x, w = primals
    x_dot, w_dot = tangents
    y = jnp.dot(x, w)
    x_t = x.reshape(-1, x.shape[-1]).T  # [n_in, tokens]: what reverse mode keeps for the w_dot term
    w_term = jax.lax.dot_general(x_t, w_dot, (((0,), (0,)), ((), ()))).reshape(y.shape)
    return y, jnp.dot(x_dot, w) + w_term


class Dense(nn.Module):
    """``y = x W + b`` with logical axes ``axes`` (input, output) on W.

    Where the backend table sets ``transposed_save_matmul`` (the CPU row), an expanding projection
    (``features`` > input width) multiplies through :func:`matmul_saving_transposed_input` (same values
    and gradients; its weight gradient runs as a plain matmul when the layer sits in a ``scan``).
    """

    features: int
    axes: tuple[str, str] = ("embed", "mlp")
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x):
        w = partitioned_param(
            self, "kernel", self.kernel_init, (x.shape[-1], self.features), self.axes, self.param_dtype
        )
        dtype = self.dtype or x.dtype
        save_transposed = self.features > x.shape[-1] and backend.defaults().transposed_save_matmul
        matmul = matmul_saving_transposed_input if save_transposed else jnp.dot
        y = matmul(x.astype(dtype), w.astype(dtype))
        if self.use_bias:
            y = y + partitioned_param(
                self, "bias", nn.initializers.zeros, (self.features,), self.axes[1:], self.param_dtype
            ).astype(dtype)
        return y


class _FusedDense(nn.Module):
    """The settings of a :class:`Dense` (its submodule ``dense``) with element-wise work fused around it."""

    features: int
    axes: tuple[str, str] = ("embed", "mlp")
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    def dense(self, width: int) -> Dense:
        return Dense(width, self.axes, self.use_bias, self.dtype, self.param_dtype, name="dense")


class DenseAct(_FusedDense):
    """Dense + activation (``act(xW + b)``): one matmul, the epilogue fused by XLA under jit.

    Gated activations (swiglu/geglu) produce ``features`` outputs from a ``2·features`` matmul.
    Settings after ``features`` are keywords: ``DenseAct(features, activation="gelu")``.
    """

    activation: str = "gelu"

    @nn.compact
    def __call__(self, x):
        act = get_activation(self.activation)
        return act(self.dense(2 * self.features if self.activation in GATED else self.features)(x))


class LayerNormDense(_FusedDense):
    """LayerNorm (or RMSNorm) followed by Dense: the normalisation is fused into the matmul's input.

    Settings after ``features`` are keywords: ``LayerNormDense(features, norm="rmsnorm")``."""

    norm: str = "layernorm"

    @nn.compact
    def __call__(self, x):
        h = get_norm(self.norm, dtype=self.dtype, param_dtype=self.param_dtype, name="norm")(x)
        return self.dense(self.features)(h)


# --------------------------------------------------------------------------- rotary embeddings


def _rope_frequencies_f64(head_dim: int, base: float) -> np.ndarray:
    check_scalar(head_dim, "head_dim", integer=True, minimum=2)
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return base ** (-np.arange(0, head_dim // 2, dtype=np.float64) * 2.0 / head_dim)


def rope_frequencies(head_dim: int, base: float = 10000.0) -> jax.Array:
    """``θ_i = base^(−2i/H)``, i = 0..H/2−1 (float32, rounded from float64)."""
    return jnp.asarray(_rope_frequencies_f64(head_dim, base), jnp.float32)


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """``cos(p·θ_i)``, ``sin(p·θ_i)`` for positions ``p = 0..seq_len−1``: two float64 NumPy arrays ``[T, H/2]``.

    Computed on the host because the positions of a plain sequence are static. Why it matters: inside
    ``jit``, angles built from ``iota`` are fused into every consumer, so XLA:CPU re-evaluated sin and cos (slow
    on CPU) once per element of ``[B, T, N, H/2]``, in each of the RoPE fusions of the forward and backward
    pass; as constants they are read from a 2-D table. With the layer scan XLA hoisted them anyway; in the
    unrolled layer loop (``TransformerConfig.layer_loop``) it did not, and that cost the loop its advantage.
    """
    check_scalar(seq_len, "seq_len", integer=True, minimum=1)
    ang = np.arange(seq_len, dtype=np.float64)[:, None] * _rope_frequencies_f64(head_dim, base)
    return np.cos(ang), np.sin(ang)


def apply_rope(x: jax.Array, positions: jax.Array | None = None, *, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding (Su et al. 2021), rotate-half convention.

    Pairs ``(x_i, x_{i+H/2})`` of each head are rotated by angle ``p·θ_i``; so
    ``<R(p)q, R(p')k> = <R(0)q, R(p'−p)k>`` (attention scores depend only on relative position)
    and norms are preserved.

    Args:
      x: ``[B, T, N, H]``.
      positions: integer/float positions ``[T]`` or ``[B, T]`` (default ``arange(T)``, whose angles come
        from :func:`rope_tables` as constants).
    """
    x = check_array(x, "x", ndim=4, kind="floating")
    B, T, N, H = x.shape
    calc = jnp.promote_types(x.dtype, jnp.float32)
    cos: np.ndarray | jax.Array
    sin: np.ndarray | jax.Array
    if positions is None:
        cos_t, sin_t = rope_tables(T, H, base)
        cos, sin = (t[None, :, None, :].astype(calc) for t in (cos_t, sin_t))  # constants in the trace
    else:
        inv = rope_frequencies(H, base)
        pos = jnp.asarray(positions, jnp.float32)
        if pos.ndim == 1:
            pos = pos[None]
        ang = pos[..., None].astype(calc) * inv.astype(calc)  # [B|1, T, H/2]
        cos = jnp.cos(ang)[:, :, None, :]
        sin = jnp.sin(ang)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(calc), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
