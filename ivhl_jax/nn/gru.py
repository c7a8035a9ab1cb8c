"""Pure gated-recurrent-unit (GRU) steps and sequence scans.

``cell(params, h, x)`` with parameters ``W_i [D, 3H]``, ``b_i [3H]``, ``W_h [H, 3H]``,
``b_h [3H]`` (gate blocks in the order r, z, n, kernels laid out ``[in, out]``):

  r  = sigma(x W_ir + b_ir + h W_hr + b_hr)
  z  = sigma(x W_iz + b_iz + h W_hz + b_hz)
  n  = tanh(x W_in + b_in + r * (h W_hn + b_hn))          variant "torch" (PyTorch, flax.nnx.GRUCell)
  n  = tanh(x W_in + b_in + (r * h) W_hn + b_hn)          variant "cho"   (Cho et al. 2014)
  h' = (1 - z) * n + z * h

With ``b_h = 0`` the "torch" variant is exactly ``flax.nnx.GRUCell`` (which has no recurrent bias):
:func:`params_from_nnx` converts such a cell. Batch axes in front of ``h``/``x`` are allowed (the same
for both: a state and an input of different batch shapes, or an integer ``h``, is an error naming it).

One door: :func:`recurrence` builds the stepper (it validates the weights and the input sequence), its
``init(h0)`` validates the start state, and ``trajectory(stepper, stepper.init(h0), T, observe=observe)`` runs
it (at most T steps: ``max_steps`` of the stepper is T, and a longer run is a ValueError). :func:`cell` is the
step itself; :func:`init_params` draws PyTorch's initial weights.

Precision: every function takes a :class:`~ivhl_jax.core.precision.Policy` / preset name; ``policy=None`` (the
default) is :func:`~ivhl_jax.core.precision.default_policy` of the inputs: every dtype the inputs' own (float32 for
float32 weights and inputs). The weights are rounded to ``param_dtype`` (their storage), the whole step (matmuls,
sigmoid, tanh, the blend) runs in ``compute_dtype``, and h' is returned (and carried by the scans) in
``output_dtype``. ``"bf16"`` is bf16 compute with float32 weights and state; ``"f64"`` needs ``jax.enable_x64``.
Measured errors against a float64 run: docs/guide/precision.md.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ivhl_jax.core.precision import Policy, physics_policy
from ivhl_jax.core.validation import check_array, check_choice, check_key, check_scalar
from ivhl_jax.numerics.rollout import Stepper

__all__ = [
    "recurrence",
    "observe",
    "GRUState",
    "RecurrenceParams",
    "init_params",
    "cell",
    "params_from_nnx",
]

VARIANTS = ("torch", "cho")


def init_params(
    key: jax.Array, input_dim: int, hidden_dim: int, *, policy: str | Policy | None = None
) -> dict[str, jax.Array]:
    """PyTorch's GRU initialisation: every weight and bias uniform in ``±1/sqrt(H)``, drawn in the policy's
    ``param_dtype`` (None: float32). Shapes ``W_i [D, 3H]``, ``b_i [3H]``, ``W_h [H, 3H]``, ``b_h [3H]``."""
    check_key(key, "key")
    dtype = physics_policy(policy, like=()).param_dtype
    check_scalar(input_dim, "input_dim", integer=True, minimum=1)
    check_scalar(hidden_dim, "hidden_dim", integer=True, minimum=1)
    b = 1.0 / math.sqrt(hidden_dim)
    k = jax.random.split(key, 4)
    u = lambda kk, shape: jax.random.uniform(kk, shape, dtype, -b, b)
    return {
        "W_i": u(k[0], (input_dim, 3 * hidden_dim)),
        "b_i": u(k[1], (3 * hidden_dim,)),
        "W_h": u(k[2], (hidden_dim, 3 * hidden_dim)),
        "b_h": u(k[3], (3 * hidden_dim,)),
    }


def _real(x: Any, name: str, policy: Policy) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"{name} has dtype {x.dtype}, but the policy computes in the real dtype "
            f"{jnp.dtype(policy.compute_dtype)}; a GRU state/input must be real floating"
        )
    return x


def _policy_inputs(params: dict, h: Any, x: Any, policy: str | Policy | None) -> tuple[dict, Any, Any, Any]:
    """(params, h, x) in the compute dtype (weights rounded to their storage dtype first) and the output dtype;
    None is the default policy of (params, h, x)."""
    pol = physics_policy(policy, like=(params, h, x))
    h, x = _real(h, "h", pol), _real(x, "x", pol)
    params = pol.cast_to_compute(pol.cast_to_param(params))
    return params, h.astype(pol.compute_dtype), x.astype(pol.compute_dtype), jnp.dtype(pol.output_dtype)


def _check_h_x(h: Any, x: Any, h_name: str, x_name: str, x_batch_from: int = 0) -> tuple[jax.Array, jax.Array]:
    """Eager shape/dtype checks of a GRU state and input (shapes and dtypes only: free under jit).

    ``x_batch_from`` is the first batch axis of ``x`` (1 for a sequence ``xs [T, ..., D]``)."""
    h = check_array(h, h_name, kind="floating")
    x = check_array(x, x_name, kind="floating")
    if h.ndim < 1:
        raise ValueError(f"{h_name} must have shape [..., H], got a scalar")
    if x.ndim < 1 + x_batch_from:
        want = "[T, ..., D]" if x_batch_from else "[..., D]"
        raise ValueError(f"{x_name} must have shape {want}, got {tuple(x.shape)}")
    if tuple(x.shape[x_batch_from:-1]) != tuple(h.shape[:-1]):
        lead = "[T, " if x_batch_from else "["
        raise ValueError(
            f"{h_name} and {x_name} must have the same batch axes ({h_name} [..., H], {x_name} "
            f"{lead}..., D]): {h_name} has shape {tuple(h.shape)}, {x_name} has shape {tuple(x.shape)}"
        )
    return h, x


def cell(
    params: dict,
    h: Float[ArrayLike, "*batch H"],
    x: Float[ArrayLike, "*batch D"],
    *,
    variant: str = "torch",
    policy: str | Policy | None = None,
) -> Float[Array, "*batch H"]:
    """One GRU step: ``h [..., H]``, ``x [..., D]`` -> ``h' [..., H]`` (equations in the module docstring).

    ``policy``: a precision policy / preset, None for the inputs' own dtype (module docstring); h' is in its
    ``output_dtype``. A complex or non-floating ``h`` or ``x`` is a TypeError naming it, ``h``/``x`` with
    different batch axes a ValueError.
    """
    check_choice(variant, "variant", VARIANTS)
    params, h, x, out_dtype = _policy_inputs(params, h, x, policy)
    h, x = _check_h_x(h, x, "h", "x")
    hd = h.shape[-1]
    if params["W_h"].shape != (hd, 3 * hd):
        raise ValueError(
            f"params['W_h'] must have shape ({hd}, {3 * hd}) for h of width {hd}, got {params['W_h'].shape}"
        )
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
    h_new = (1.0 - z) * n + z * h
    return h_new.astype(out_dtype)


def params_from_nnx(cell: Any) -> dict:
    """Parameters of a ``flax.nnx.GRUCell`` in this module's layout (recurrent bias = 0)."""
    if not (hasattr(cell, "dense_h") and hasattr(cell, "dense_i")):
        raise TypeError(f"cell must be a flax.nnx.GRUCell (with dense_i and dense_h), got {type(cell).__name__}")
    w_h = jnp.asarray(cell.dense_h.kernel[...])
    return {
        "W_i": jnp.asarray(cell.dense_i.kernel[...]),
        "b_i": jnp.asarray(cell.dense_i.bias[...]),
        "W_h": w_h,
        "b_h": jnp.zeros((w_h.shape[1],), w_h.dtype),
    }


# ----------------------------------------------------------------------------------------------
# the stepper protocol: the input sequence is a parameter, the state carries h and the time index


class RecurrenceParams(flax.struct.PyTreeNode):
    """Weights (the layout above) and the input sequence ``xs [T, ..., D]``; ``variant`` is static."""

    weights: dict
    xs: jax.Array
    variant: str = flax.struct.field(pytree_node=False, default="torch")
    policy: Policy = flax.struct.field(pytree_node=False, default_factory=Policy)


class GRUState(flax.struct.PyTreeNode):
    """Hidden state ``h [..., H]`` and the index ``t`` of the next input."""

    h: jax.Array
    t: jax.Array


def _gru_step(state: GRUState, params: RecurrenceParams) -> GRUState:
    x = jax.lax.dynamic_index_in_dim(params.xs, state.t, axis=0, keepdims=False)
    return GRUState(h=cell(params.weights, state.h, x, variant=params.variant, policy=params.policy), t=state.t + 1)


def _gru_init(params: RecurrenceParams, h0: Any) -> GRUState:
    """Validate ``h0`` against the sequence (batch axes of ``xs[t]``, width H) and cast it to the policy."""
    pol = params.policy
    h0 = _real(h0, "h0", pol)
    xs = params.xs
    h, _ = _check_h_x(h0, xs, "h0", "xs", x_batch_from=1)
    hd = params.weights["W_h"].shape[0]
    if h.shape[-1] != hd:
        raise ValueError(
            f"h0 has width {h.shape[-1]} but weights['W_h'] has shape {params.weights['W_h'].shape} "
            f"(H = {hd}); start from an h0 of shape [..., {hd}]"
        )
    h = h.astype(pol.output_dtype)
    return GRUState(h=h, t=jnp.zeros((), jnp.int32))


def observe(state: GRUState, params: RecurrenceParams) -> Float[Array, "*batch H"]:
    """The hidden state ``h [..., H]`` after each step (``trajectory(..., observe=observe)`` gives ``hs``)."""
    del params
    return state.h


def _check_weights(weights: Any, d: int) -> tuple[int, int]:
    """Shapes of the GRU weights: ``W_i [D, 3H]``, ``b_i [3H]``, ``W_h [H, 3H]``, ``b_h [3H]``; returns (D, H)."""
    if not isinstance(weights, dict) or any(k not in weights for k in ("W_i", "b_i", "W_h", "b_h")):
        raise TypeError("weights must be a dict with 'W_i', 'b_i', 'W_h', 'b_h' (see init_params)")
    shapes = {k: tuple(np.shape(weights[k])) for k in ("W_i", "b_i", "W_h", "b_h")}
    if len(shapes["W_h"]) != 2 or shapes["W_h"][1] != 3 * shapes["W_h"][0]:
        raise ValueError(f"weights['W_h'] must have shape (H, 3H), got {shapes['W_h']}")
    hd = shapes["W_h"][0]
    want = {"W_i": (d, 3 * hd), "b_i": (3 * hd,), "b_h": (3 * hd,)}
    for k, w in want.items():
        if shapes[k] != w:
            if k == "W_i" and len(shapes[k]) == 2 and shapes[k][1] == 3 * hd:
                raise ValueError(f"xs has width {d} but weights['W_i'] expects {shapes[k][0]}")
            raise ValueError(
                f"weights['{k}'] must have shape {w} for H = {hd} and inputs of width {d}, got {shapes[k]}"
            )
    return d, hd


def recurrence(
    weights: dict, xs: Float[ArrayLike, "T *batch D"], *, variant: str = "torch", policy: str | Policy | None = None
) -> Stepper[GRUState, RecurrenceParams]:
    """Stepper over the input sequence ``xs [T, ..., D]``: ``step`` consumes ``xs[t]``; ``init(h0)`` validates
    ``h0 [..., H]`` (the batch axes of ``xs[t]``, width H). ``trajectory(st, st.init(h0), T, observe=observe)``
    returns (final state, hs [T, ..., H]). The stepper's ``max_steps`` is T: ``trajectory``/``chunked`` refuse
    a run of more steps than ``xs`` has (a ValueError naming both). The weights' shapes (``W_i [D, 3H]``,
    ``b_i [3H]``, ``W_h [H, 3H]``, ``b_h [3H]``, finite) and ``xs`` (finite, real floating) are checked here.
    ``policy``: weights stored in its ``param_dtype``, steps computed in ``compute_dtype``, h carried
    in ``output_dtype`` (module docstring); None is the default policy of ``weights`` and ``xs``."""
    check_choice(variant, "variant", VARIANTS)
    pol = physics_policy(policy, like=(weights, xs))
    xs = _real(xs, "xs", pol)
    xs = check_array(xs, "xs", kind="floating", finite=True)
    if xs.ndim < 2:
        raise ValueError(f"xs must have shape [T, ..., D] (time first); got {xs.shape}")
    _check_weights(weights, xs.shape[-1])
    for k in ("W_i", "b_i", "W_h", "b_h"):  # NaN or inf weights are refused like NaN inputs (concrete ones)
        check_array(weights[k], f"weights['{k}']", finite=True)
    weights = pol.cast_to_param(weights)
    return Stepper.create(
        _gru_step,
        RecurrenceParams(weights=weights, xs=xs, variant=variant, policy=pol),
        init_fn=_gru_init,
        name="gru.recurrence",
        max_steps=int(xs.shape[0]),
    )
