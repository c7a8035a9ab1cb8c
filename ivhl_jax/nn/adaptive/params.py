"""The weights of the adaptive-node model: their shapes and initialisation (:func:`param_specs`,
:func:`init_param`, :func:`init_params`) and the check of a weight dict against a config (:func:`check_weights`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ivhl_jax.core.precision import Policy, physics_policy
from ivhl_jax.core.validation import check_scalar
from ivhl_jax.nn.adaptive.config import AdaptiveConfig

__all__ = ["param_specs", "init_param", "init_params", "count_params", "check_weights"]


def param_specs(cfg: AdaptiveConfig) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """name -> (shape, fan_in) for every parameter; fan_in None means a constant init (phase scales = 1).

    Layout: kernels are ``[in, out]`` (x @ W). Initialisation is PyTorch's ``nn.Linear`` default,
    uniform in ``±1/sqrt(fan_in)`` for weights and biases.
    """
    n, h, d, c = cfg.num_nodes, cfg.hidden_dim, cfg.input_dim, cfg.output_dim
    in_shape = (n, d, h) if cfg.per_node_input else (d, h)
    in_bias = (n, h) if cfg.per_node_input else (h,)
    return {
        "W_in": (in_shape, d),
        "b_in": (in_bias, d),
        "W_s": ((h, h), h),
        "b_s": ((h,), h),
        "phase_scales": ((4,), None),
        "w_e": ((h,), h),
        "b_e": ((), h),
        "alpha": ((2,), 2),
        "beta": ((), 2),
        "W_out": ((cfg.num_features, c), cfg.num_features),
        "b_out": ((c,), cfg.num_features),
    }


def init_param(
    key: jax.Array, shape: tuple[int, ...], fan_in: int | None, *, policy: str | Policy | None = None
) -> Float[Array, " ..."]:
    """One parameter of ``shape``: uniform in ``±1/sqrt(fan_in)``, or ones when ``fan_in`` is None; in the
    policy's ``param_dtype`` (None: float32)."""
    dtype = physics_policy(policy, like=()).param_dtype
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"shape must be a tuple of sizes, got {shape!r}")
    for i, d in enumerate(shape):
        check_scalar(d, f"shape[{i}]", integer=True, nonnegative=True)
    shape = tuple(int(d) for d in shape)
    if fan_in is not None:
        check_scalar(fan_in, "fan_in", integer=True, minimum=1)
    if fan_in is None:
        return jnp.ones(shape, dtype)
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def init_params(key: jax.Array, cfg: AdaptiveConfig, *, policy: str | Policy | None = None) -> dict[str, jax.Array]:
    """All parameters as a flat dict (see :func:`param_specs`), in the policy's ``param_dtype`` (None: float32)."""
    specs = param_specs(cfg)
    keys = jax.random.split(key, len(specs))
    return {name: init_param(k, shape, fan, policy=policy) for k, (name, (shape, fan)) in zip(keys, specs.items())}


def count_params(params: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


def check_weights(weights: Any, cfg: AdaptiveConfig) -> None:
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be the dict of init_params(key, cfg), got {type(weights).__name__}")
    for name, (shape, _) in param_specs(cfg).items():
        if name not in weights:
            raise ValueError(f"weights has no '{name}'; build them with init_params(key, cfg)")
        if tuple(np.shape(weights[name])) != tuple(shape):
            raise ValueError(
                f"weights['{name}'] has shape {tuple(np.shape(weights[name]))}, expected {tuple(shape)} "
                "for this config; build them with init_params(key, cfg)"
            )
