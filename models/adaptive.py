"""Flax module and losses for the adaptive-node classifier (equations in :mod:`ivhl_jax.nn.adaptive`).

``AdaptiveModel(config)`` owns the parameters (PyTorch's ``nn.Linear`` initialisation)
and is a thin shell over the pure functions: ``model.apply(variables, x, state, key)`` returns
``(logits, new_state, outputs)``. The node state is never stored on the module; the caller passes
an explicit initial state (:func:`ivhl_jax.nn.adaptive.init_state`) for each sequence.

Default parameter count (D=784, H=64, N=100, C=10): 55,482.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from ivhl_jax.core.precision import default_policy
from ivhl_jax.nn import adaptive
from ivhl_jax.nn.adaptive import AdaptiveConfig, NodeState
from ivhl_jax.numerics.rollout import trajectory


class AdaptiveModel(nn.Module):
    """Adaptive-node classifier; ``__call__(x [B,D], state, key) -> (logits [B,C], state', outputs)``."""

    config: AdaptiveConfig

    @nn.compact
    def __call__(self, x: jax.Array, state: NodeState, key: jax.Array):
        params = {
            name: self.param(name, adaptive.init_param, shape, fan)
            for name, (shape, fan) in adaptive.param_specs(self.config).items()
        }
        # the config's inner_steps on this input; the phase fractions averaged over them
        st = adaptive.dynamics(params, x, self.config)
        final, fractions = trajectory(
            st, st.init(key, state), self.config.inner_steps, observe=adaptive.observe_phase_fractions
        )
        out = {**final.outputs, "phase_fractions": jnp.mean(fractions, axis=0)}
        return out["logits"], final.nodes, out

    def init_variables(self, key: jax.Array, batch: int = 1) -> Mapping[str, Any]:
        """Parameters without running a step: ``{"params": {...}}``."""
        x = jnp.zeros((batch, self.config.input_dim), jnp.float32)
        return self.init(key, x, adaptive.init_state(self.config, batch), key)


def apply_model(
    model: AdaptiveModel, params: Any, x: jax.Array, init: NodeState, key: jax.Array
) -> tuple[jax.Array, NodeState, dict[str, jax.Array]]:
    """``model`` with ``params`` on ``x [B,D]`` from the node state ``init``: ``(logits [B,C], state', outputs)``."""
    # Flax types `apply` as `output | (output, variables)`; the pair comes only with mutable collections.
    return cast(tuple[jax.Array, NodeState, dict[str, jax.Array]], model.apply({"params": params}, x, init, key))


def make_classification_loss(model: AdaptiveModel, *, carry_state: bool) -> Callable:
    """A ``loss_fn(params, batch, key, extra)`` for :func:`ivhl_jax.train.training.make_train_step`.

    ``batch = (x [B,D], y [B] int)``; the loss is mean softmax cross-entropy on integer labels.
    ``extra`` is a :class:`NodeState` of batch B. With ``carry_state`` (the reference model's semantics,
    whose time axis is the sequence of batches) it is the initial state of this batch, detached from the
    previous one; otherwise every batch starts from :func:`ivhl_jax.nn.adaptive.init_state` (an
    explicit initial state per sample) and ``extra`` only records the last state for monitoring.
    The returned ``new_extra`` is the final node state, detached.
    """
    cfg = model.config

    def loss_fn(params, batch, key, extra):
        x, y = batch
        init = adaptive.detach(extra) if carry_state else adaptive.init_state(cfg, x.shape[0], policy=default_policy(x))
        logits, state, out = apply_model(model, params, x, init, key)
        loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
        metrics = {"accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}
        metrics.update(adaptive.node_metrics(state, out))
        return loss, (metrics, adaptive.detach(state))

    return loss_fn


def predict(model: AdaptiveModel, params, x: jax.Array, init: NodeState, key: jax.Array) -> jax.Array:
    """Logits for ``x [M, B, D]`` (M batches of B), every batch starting from the same ``init``."""

    def body(_, xb):
        logits, _, _ = apply_model(model, params, xb, init, key)
        return None, logits

    _, logits = jax.lax.scan(body, None, x)
    return logits
