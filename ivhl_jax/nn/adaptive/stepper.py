"""The stepper protocol of the adaptive nodes: :func:`dynamics` (K-free dynamics on a fixed input, the PRNG key in
the state), its observables, and :func:`apply_sequence` (the classifier's scan over a sequence of inputs)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ivhl_jax.core.precision import Policy, physics_policy
from ivhl_jax.core.validation import check_array, check_key
from ivhl_jax.nn.adaptive.config import AdaptiveConfig, NodeState, init_state
from ivhl_jax.nn.adaptive.node import check_real_tree, step
from ivhl_jax.nn.adaptive.params import check_weights
from ivhl_jax.nn.adaptive.scheduler import phase_fractions
from ivhl_jax.numerics.rollout import Stepper, trajectory

__all__ = ["DynamicsParams", "DynamicsState", "dynamics", "observe", "observe_phase_fractions", "apply_sequence"]


class DynamicsParams(flax.struct.PyTreeNode):
    """Weights (:func:`init_params`), the input batch ``x [B, D]`` and the static :class:`AdaptiveConfig`."""

    weights: dict
    x: jax.Array
    cfg: AdaptiveConfig = flax.struct.field(pytree_node=False)
    policy: Policy = flax.struct.field(pytree_node=False, default_factory=Policy)


class DynamicsState(flax.struct.PyTreeNode):
    """Node/scheduler state, the PRNG key, and the outputs of the last step (``logits [B,C]`` ...)."""

    nodes: NodeState
    key: jax.Array
    outputs: dict


def _dynamics_step(state: DynamicsState, params: DynamicsParams) -> DynamicsState:
    key, sub = jax.random.split(state.key)
    nodes, out = step(params.weights, state.nodes, params.x, sub, params.cfg, params.policy)
    return DynamicsState(nodes=nodes, key=key, outputs=out)


def _check_nodes(cfg: AdaptiveConfig, nodes: Any, batch: int) -> None:
    """Shapes of a start :class:`NodeState` for ``batch`` samples (as :func:`init_state` makes them)."""
    if not isinstance(nodes, NodeState):
        raise TypeError(f"nodes must be a NodeState (adaptive.init_state(cfg, batch)), got {type(nodes).__name__}")
    want = init_state(cfg, batch)
    for field in ("h", "energy", "activity", "phase", "anxiety_ema", "restorative", "sleep_quality", "t"):
        got = tuple(np.shape(getattr(nodes, field)))
        if got != getattr(want, field).shape:
            raise ValueError(
                f"nodes.{field} has shape {got}, expected {getattr(want, field).shape} for x of batch "
                f"{batch} and this config; create it with init_state(cfg, batch={batch})"
            )


def _dynamics_init(params: DynamicsParams, key: jax.Array, nodes: NodeState | None = None) -> DynamicsState:
    """The start state: ``nodes`` (validated against the config and x) or :func:`init_state`, and ``key``."""
    check_key(key, "key")
    if nodes is None:
        nodes = init_state(params.cfg, params.x.shape[0], policy=params.policy)
    else:
        _check_nodes(params.cfg, nodes, params.x.shape[0])
        check_real_tree(nodes, "state", params.policy)
        nodes = params.policy.cast_to_output(nodes)
    _, out = jax.eval_shape(lambda: step(params.weights, nodes, params.x, key, params.cfg, params.policy))
    zeros = jax.tree_util.tree_map(lambda o: jnp.zeros(o.shape, o.dtype), out)
    return DynamicsState(nodes=nodes, key=key, outputs=zeros)


def observe(state: DynamicsState, params: DynamicsParams) -> dict:
    """The last step's outputs (``logits [B,C]``, ``phase``, ``anxiety``, ``energy``, ``activity`` ``[B,N]``)
    plus its phase fractions ``[4]``."""
    del params
    return {**state.outputs, "phase_fractions": phase_fractions(state.outputs["phase"])}


def observe_phase_fractions(state: DynamicsState, params: DynamicsParams) -> Float[Array, " 4"]:
    """The fraction of (sample, node) slots in each phase after the step, ``[4]`` (the classifier averages it
    over its ``inner_steps``)."""
    del params
    return phase_fractions(state.outputs["phase"])


def dynamics(
    weights: dict, x: Float[ArrayLike, "B D"], cfg: AdaptiveConfig, *, policy: str | Policy | None = None
) -> Stepper[DynamicsState, DynamicsParams]:
    """Stepper of the adaptive-node dynamics on a fixed input ``x [B, D]``: ``step`` is one :func:`step`
    with a subkey split from the state's key; ``init(key, nodes=None)`` starts from ``nodes`` (shapes checked
    against the config and ``x``) or from :func:`init_state`. The weights (shapes of :func:`init_params` for
    ``cfg``) and ``x`` (finite, real) are checked here.
    ``policy``: weights stored in its ``param_dtype`` (cast here), each step in ``compute_dtype``, the
    state carried in ``output_dtype`` (module docstring); None is the default policy of ``weights`` and ``x``."""
    if not isinstance(cfg, AdaptiveConfig):
        raise TypeError(f"cfg must be an AdaptiveConfig; got {type(cfg).__name__}")
    pol = physics_policy(policy, like=(weights, x))
    x = check_array(x, "x", shape=(None, cfg.input_dim), kind="floating", finite=True)
    check_weights(weights, cfg)
    check_real_tree(weights, "weights", pol)
    weights = pol.cast_to_param(weights)
    params = DynamicsParams(weights=weights, x=x, cfg=cfg, policy=pol)
    return Stepper.create(_dynamics_step, params, init_fn=_dynamics_init, name="adaptive.dynamics")


def apply_sequence(
    weights: dict,
    xs: Float[ArrayLike, "T B D"],
    cfg: AdaptiveConfig,
    key: jax.Array,
    nodes: NodeState | None = None,
    *,
    policy: str | Policy | None = None,
) -> tuple[NodeState, dict[str, Array]]:
    """Run a sequence of input batches ``xs [T, B, D]`` (``lax.scan`` over T): the arguments of :func:`dynamics`
    (``weights``, the inputs, ``cfg``, ``policy``) and of its ``init`` (``key``, split into one key per input;
    ``nodes``, the start state, default :func:`init_state`).

    Each input runs ``cfg.inner_steps`` steps of :func:`dynamics` from the state the previous one left. Returns
    the final state and the stacked outputs (``logits [T,B,C]`` ..., ``phase_fractions [T,4]`` averaged over
    each input's steps). The state is carried in the policy's ``output_dtype``.
    """
    xs = check_array(xs, "xs", shape=(None, None, cfg.input_dim), kind="floating")
    pol = physics_policy(policy, like=(weights, nodes, xs))
    nodes = init_state(cfg, xs.shape[1], policy=pol) if nodes is None else pol.cast_to_output(nodes)

    def body(s, inp):
        # cfg.inner_steps (K) steps on one input: the last step's outputs, plus the phase fractions averaged over
        # the K steps, nodes and batch (the checks are the builder's and init's)
        x, k = inp
        st = dynamics(weights, x, cfg, policy=pol)
        final, fractions = trajectory(st, st.init(k, s), cfg.inner_steps, observe=observe_phase_fractions)
        return final.nodes, {**final.outputs, "phase_fractions": jnp.mean(fractions, axis=0)}

    return jax.lax.scan(body, nodes, (xs, jax.random.split(key, xs.shape[0])))
