"""Pure gated-recurrent-unit (GRU) steps and sequence scans.

``gru_step(params, h, x)`` with parameters ``W_i [D, 3H]``, ``b_i [3H]``, ``W_h [H, 3H]``,
``b_h [3H]`` (gate blocks in the order r, z, n, kernels laid out ``[in, out]``):

  r  = sigma(x W_ir + b_ir + h W_hr + b_hr)
  z  = sigma(x W_iz + b_iz + h W_hz + b_hz)
  n  = tanh(x W_in + b_in + r * (h W_hn + b_hn))          variant "torch" (PyTorch, flax.nnx.GRUCell)
  n  = tanh(x W_in + b_in + (r * h) W_hn + b_hn)          variant "cho"   (Cho et al. 2014)
  h' = (1 - z) * n + z * h

With ``b_h = 0`` the "torch" variant is exactly ``flax.nnx.GRUCell`` (which has no recurrent bias):
:func:`params_from_nnx` converts such a cell. Batch axes in front of ``h``/``x`` are allowed.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ivhl_jax.core.validation import check_array, check_choice, check_scalar
from ivhl_jax.numerics.rollout import Stepper

__all__ = ["VARIANTS", "init_gru_params", "gru_step", "gru_scan", "params_from_nnx", "GRUState", "GRUInputs",
           "recurrence", "observe_hidden"]

VARIANTS = ("torch", "cho")


def init_gru_params(key: jax.Array, input_dim: int, hidden_dim: int, dtype: Any = jnp.float32) -> dict:
    """PyTorch's GRU initialisation: every weight and bias uniform in ``±1/sqrt(H)``."""
    check_scalar(input_dim, "input_dim", integer=True, minimum=1)
    check_scalar(hidden_dim, "hidden_dim", integer=True, minimum=1)
    b = 1.0 / math.sqrt(hidden_dim)
    k = jax.random.split(key, 4)
    u = lambda kk, shape: jax.random.uniform(kk, shape, dtype, -b, b)
    return {"W_i": u(k[0], (input_dim, 3 * hidden_dim)), "b_i": u(k[1], (3 * hidden_dim,)),
            "W_h": u(k[2], (hidden_dim, 3 * hidden_dim)), "b_h": u(k[3], (3 * hidden_dim,))}


def gru_step(params: dict, h: Float[Array, "*batch H"], x: Float[Array, "*batch D"], *,
             variant: str = "torch") -> Float[Array, "*batch H"]:
    """One GRU step: ``h [..., H]``, ``x [..., D]`` -> ``h' [..., H]`` (equations in the module docstring)."""
    check_choice(variant, "variant", VARIANTS)
    hd = h.shape[-1]
    if params["W_h"].shape != (hd, 3 * hd):
        raise ValueError(f"params['W_h'] must have shape ({hd}, {3 * hd}) for h of width {hd}, "
                         f"got {params['W_h'].shape}")
    if params["W_i"].shape[0] != x.shape[-1]:
        raise ValueError(f"x has width {x.shape[-1]} but params['W_i'] expects {params['W_i'].shape[0]}")
    gi = x @ params["W_i"] + params["b_i"]
    i_r, i_z, i_n = jnp.split(gi, 3, axis=-1)
    w_hr, w_hz, w_hn = jnp.split(params["W_h"], 3, axis=-1)
    b_hr, b_hz, b_hn = jnp.split(params["b_h"], 3, axis=-1)
    if variant == "torch":
        gh = h @ params["W_h"] + params["b_h"]
        h_r, h_z, h_n = jnp.split(gh, 3, axis=-1)
        r = jax.nn.sigmoid(i_r + h_r)
        z = jax.nn.sigmoid(i_z + h_z)
        n = jnp.tanh(i_n + r * h_n)
    else:
        r = jax.nn.sigmoid(i_r + h @ w_hr + b_hr)
        z = jax.nn.sigmoid(i_z + h @ w_hz + b_hz)
        n = jnp.tanh(i_n + (r * h) @ w_hn + b_hn)
    return (1.0 - z) * n + z * h


def gru_scan(params: dict, h0: Float[Array, "*batch H"], xs: Float[Array, "T *batch D"], *, variant: str = "torch"
             ) -> tuple[Float[Array, "*batch H"], Float[Array, "T *batch H"]]:
    """Run ``xs [T, ..., D]`` from ``h0 [..., H]`` under ``lax.scan``; returns (h_T, hs [T, ..., H])."""

    def body(h, x):
        h = gru_step(params, h, x, variant=variant)
        return h, h

    return jax.lax.scan(body, h0, xs)


def params_from_nnx(cell: Any) -> dict:
    """Parameters of a ``flax.nnx.GRUCell`` in this module's layout (recurrent bias = 0)."""
    w_h = jnp.asarray(cell.dense_h.kernel[...])
    return {"W_i": jnp.asarray(cell.dense_i.kernel[...]), "b_i": jnp.asarray(cell.dense_i.bias[...]),
            "W_h": w_h, "b_h": jnp.zeros((w_h.shape[1],), w_h.dtype)}


# ----------------------------------------------------------------------------------------------
# the stepper protocol: the input sequence is a parameter, the state carries h and the time index


class GRUInputs(flax.struct.PyTreeNode):
    """Weights (the layout above) and the input sequence ``xs [T, ..., D]``; ``variant`` is static."""

    weights: dict
    xs: jax.Array
    variant: str = flax.struct.field(pytree_node=False, default="torch")


class GRUState(flax.struct.PyTreeNode):
    """Hidden state ``h [..., H]`` and the index ``t`` of the next input."""

    h: jax.Array
    t: jax.Array


def _gru_step(state: GRUState, params: GRUInputs) -> GRUState:
    x = jax.lax.dynamic_index_in_dim(params.xs, state.t, axis=0, keepdims=False)
    return GRUState(h=gru_step(params.weights, state.h, x, variant=params.variant), t=state.t + 1)


def _gru_init(params: GRUInputs, h0: jax.Array) -> GRUState:
    return GRUState(h=jnp.asarray(h0), t=jnp.zeros((), jnp.int32))


def observe_hidden(state: GRUState, params: GRUInputs) -> jax.Array:
    """The hidden state (the ``observe`` that reproduces :func:`gru_scan`'s ``hs``)."""
    del params
    return state.h


def recurrence(weights: dict, xs: jax.Array, *, variant: str = "torch") -> Stepper[GRUState, GRUInputs]:
    """Stepper over the input sequence ``xs [T, ..., D]``: ``step`` consumes ``xs[t]``; ``init(h0)``.
    ``trajectory(recurrence(w, xs), st.init(h0), T, observe=observe_hidden)`` equals :func:`gru_scan`.
    Running more than T steps reads past the end (clamped to the last input): run exactly T."""
    check_choice(variant, "variant", VARIANTS)
    xs = check_array(xs, "xs", kind="floating")
    if xs.ndim < 2:
        raise ValueError(f"xs must have shape [T, ..., D] (time first); got {xs.shape}")
    return Stepper(step_fn=_gru_step, params=GRUInputs(weights=weights, xs=xs, variant=variant), init_fn=_gru_init,
                   name="gru.recurrence")

