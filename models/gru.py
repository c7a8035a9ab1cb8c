"""GRU trajectory predictor: a Flax module over :func:`ivhl_jax.nn.gru.recurrence` with a bounded delta head.

``TrajectoryGRU(hidden, layers)`` maps a sequence of 2-D positions ``p [T, B, 2]`` to predicted next positions
``p_t + 0.5 tanh(W h_t + b) * step_scale`` (a bounded delta head: each step moves at most ``0.5 step_scale`` per
axis). Stacked layers feed each layer's hidden sequence to the next; every layer uses the torch/Flax GRU convention
(or Cho-2014 with ``variant="cho"``).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from ivhl_jax.nn import gru
from ivhl_jax.numerics.rollout import trajectory


class TrajectoryGRU(nn.Module):
    hidden: int = 64
    layers: int = 2
    step_scale: float = 0.2
    variant: str = "torch"

    @nn.compact
    def __call__(self, p: jax.Array) -> jax.Array:
        """``p [T, B, 2]`` -> predicted ``p_{t+1}`` for every t, ``[T, B, 2]``."""
        hs = p
        b = 1.0 / math.sqrt(self.hidden)  # PyTorch's GRU initialisation
        u = lambda k, shape: jax.random.uniform(k, shape, jnp.float32, -b, b)
        for i in range(self.layers):
            d = hs.shape[-1]
            params = {
                "W_i": self.param(f"W_i{i}", u, (d, 3 * self.hidden)),
                "b_i": self.param(f"b_i{i}", u, (3 * self.hidden,)),
                "W_h": self.param(f"W_h{i}", u, (self.hidden, 3 * self.hidden)),
                "b_h": self.param(f"b_h{i}", u, (3 * self.hidden,)),
            }
            h0 = jnp.zeros(hs.shape[1:-1] + (self.hidden,), hs.dtype)
            st = gru.recurrence(params, hs, variant=self.variant)
            _, hs = trajectory(st, st.init(h0), hs.shape[0], observe=gru.observe)
        delta = 0.5 * jnp.tanh(nn.Dense(2, name="head")(hs)) * self.step_scale
        return p + delta
