"""Megatron tensor parallelism in explicit form, for use inside ``shard_map``."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.flatten_util
import jax.numpy as jnp

__all__ = ["tp_mlp", "attention_core", "tp_attention", "TP_BLOCK_NAMES"]


def tp_mlp(
    x: jax.Array,
    w_in: jax.Array,
    b_in: jax.Array,
    w_out: jax.Array,
    b_out: jax.Array,
    *,
    axis: str = "tensor",
    activation: Callable = jax.nn.gelu,
) -> jax.Array:
    """Megatron MLP on one tensor shard: ``y = Σ_shards act(x W_in[:, shard] + b_in[shard]) W_out[shard, :] + b_out``.

    Call inside ``shard_map`` with ``w_in`` column-split (``P(None, axis)``), ``b_in`` split
    (``P(axis)``), ``w_out`` row-split (``P(axis, None)``), ``x`` and ``b_out`` replicated over ``axis``.
    One all-reduce (``psum``) per MLP in the forward pass. Shapes: x (..., E), w_in (E, F/T), w_out (F/T, E).
    """
    h = activation(x @ w_in + b_in)
    return jax.lax.psum(h @ w_out, axis) + b_out


def attention_core(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool = True) -> jax.Array:
    """Softmax attention per head, ``softmax(q kᵀ/√D + causal mask) v``. q, k, v: (B, T, H, D) → (B, T, H, D).

    The default of :func:`tp_attention`. The train layer may not import :mod:`ivhl_jax.nn` (layering: train
    builds on core and numerics only), so this plain reference form lives here; a model passes the library's
    fused attention (``ivhl_jax.nn.attention``) as ``tp_attention(..., attention=...)`` instead.
    """
    logits = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    if causal:
        t = q.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, axis=-1), v)


def tp_attention(
    x: jax.Array,
    wq: jax.Array,
    wk: jax.Array,
    wv: jax.Array,
    wo: jax.Array,
    *,
    axis: str = "tensor",
    causal: bool = True,
    attention: Callable[[jax.Array, jax.Array, jax.Array, bool], jax.Array] | None = None,
) -> jax.Array:
    """Megatron attention on one tensor shard: heads split across ``axis``, one ``psum`` at the output.

    Shapes (local): x (B, T, E); wq/wk/wv (E, H/T, D) (``P(None, axis, None)``); wo (H/T, D, E)
    (``P(axis, None, None)``). Returns (B, T, E), replicated over ``axis``. ``attention(q, k, v, causal)``
    computes the heads of this shard ((B, T, H/T, D) each; default :func:`attention_core`).
    """
    if attention is None:
        attention = attention_core
    elif not callable(attention):
        raise TypeError(f"attention must be a function attention(q, k, v, causal) -> o, got {attention!r}")
    q = jnp.einsum("bte,ehd->bthd", x, wq)
    k = jnp.einsum("bte,ehd->bthd", x, wk)
    v = jnp.einsum("bte,ehd->bthd", x, wv)
    o = attention(q, k, v, causal)
    return jax.lax.psum(jnp.einsum("bthd,hde->bte", o, wo), axis)


#: Logical names of the tensor-parallel block parameters used by :func:`tp_attention` / :func:`tp_mlp`.
TP_BLOCK_NAMES = {
    "wq": ("embed", "heads", "kv"),
    "wk": ("embed", "heads", "kv"),
    "wv": ("embed", "heads", "kv"),
    "wo": ("heads", "kv", "embed"),
    "w_in": ("embed", "mlp"),
    "b_in": ("mlp",),
    "w_out": ("mlp", "embed"),
    "b_out": ("embed",),
}
