"""One step of the adaptive-node dynamics: the input projection, the node update for given phases, the readout,
and :func:`step` (the scheduler's draw and the node update under a precision policy)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from ivhl_jax.core.precision import Policy, physics_policy
from ivhl_jax.core.validation import check_array
from ivhl_jax.nn.adaptive.config import E_MAX, PHASES, SLEEP, AdaptiveConfig, NodeState, detach
from ivhl_jax.nn.adaptive.scheduler import anxiety, schedule_per_sample, schedule_shared

__all__ = ["project_input", "node_update", "readout", "check_real_tree", "step", "check_inputs", "node_metrics"]


def project_input(
    params: dict, x: Float[Array, "B D"], cfg: AdaptiveConfig
) -> Float[Array, "B H"] | Float[Array, "B N H"]:
    """u = W_in x + b_in: ``[B,H]`` (shared projection) or ``[B,N,H]`` (per-node weights)."""
    if cfg.per_node_input:
        return jnp.einsum("bd,ndh->bnh", x, params["W_in"]) + params["b_in"]
    return x @ params["W_in"] + params["b_in"]


@jax.custom_vjp
def _rows_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for ``x [..., R, K]`` (here ``h [B, N, H] @ W_s``), with a reverse-mode rule tuned for XLA CPU.

    The weight gradient ``dw = Σ_b x_bᵀ g_b`` is written as a batched GEMM over the leading axes plus a
    sum. Autodiff's default, one GEMM contracting all B·R rows at once, makes XLA materialise a
    transposed copy of the cotangent ``g`` on the critical path of the backward pass on CPU. Same math,
    same result up to float32 summation order. Reverse mode only (``jax.jvp`` through it is not defined).
    """
    return x @ w


def _rows_matmul_fwd(x, w):
    return x @ w, (x, w)


def _rows_matmul_bwd(res, g):
    x, w = res
    xb = x.reshape((-1,) + x.shape[-2:])
    gb = g.reshape((-1,) + g.shape[-2:])
    dw = jnp.sum(jnp.matmul(jnp.swapaxes(xb, -1, -2), gb, preferred_element_type=jnp.float32), axis=0)
    return g @ w.T, dw.astype(w.dtype)


_rows_matmul.defvjp(_rows_matmul_fwd, _rows_matmul_bwd)


def node_update(
    params: dict,
    cfg: AdaptiveConfig,
    h: Float[Array, "B N H"],
    energy: Float[Array, "B N"],
    u: Float[Array, "B H"] | Float[Array, "B N H"],
    anx: Float[Array, "B N"],
    phase: Int[Array, "B N"] | Int[Array, " N"],
) -> tuple[Float[Array, "B N H"], Float[Array, "B N"], Float[Array, "B N"]]:
    """Hidden, energy and activity update for given phases (broadcasts over any batch shape).

    ``u`` is ``[B,H]`` or ``[B,N,H]``; ``phase`` is ``[B,N]`` or ``[N]`` (shared). Returns (h', E', a').
    """
    u_n = u[:, None, :] if u.ndim == 2 else u
    scale = 1.0 + params["phase_scales"][phase]
    awake = (phase != SLEEP).astype(h.dtype)
    delta = scale[..., None] * (_rows_matmul(h, params["W_s"]) + params["b_s"])
    h_new = jnp.tanh(h + awake[..., None] * (delta + cfg.input_gain * u_n))
    damp = 1.0 - 0.1 * jnp.clip(anx / 10.0, 0.0, 1.0)
    d_energy = (h_new @ params["w_e"] + params["b_e"]) * damp * awake
    e_new = (1.0 - cfg.energy_decay) * energy + d_energy + cfg.sleep_recovery * (1.0 - awake)
    e_new = jnp.clip(e_new, 0.0, E_MAX)
    u_mean = jnp.mean(u_n, axis=-1)
    a_new = jax.nn.sigmoid(params["alpha"][0] * jnp.mean(h_new, axis=-1) + params["alpha"][1] * u_mean + params["beta"])
    return h_new, e_new, jnp.clip(a_new, 0.0, 1.0)


def readout(
    params: dict,
    cfg: AdaptiveConfig,
    h: Float[Array, "B N H"],
    energy: Float[Array, "B N"],
    activity: Float[Array, "B N"],
) -> Float[Array, "B C"]:
    """logits = W_out f + b_out with f chosen by ``cfg.readout`` / ``cfg.readout_energy``."""
    feats = []
    if cfg.readout in ("hidden", "hidden+activity"):
        feats.append(h.reshape(h.shape[0], -1))
    if cfg.readout in ("activity", "hidden+activity"):
        feats.append(activity)
    if cfg.readout_energy:
        feats.append(energy / E_MAX)
    f = feats[0] if len(feats) == 1 else jnp.concatenate(feats, axis=-1)
    return f @ params["W_out"] + params["b_out"]


def check_real_tree(tree: Any, name: str, policy: Policy) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.complexfloating):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} is complex ({jnp.result_type(leaf)}), but the policy "
                f"computes in the real dtype {jnp.dtype(policy.compute_dtype)}; adaptive-node states, "
                "inputs and weights are real"
            )


def step(
    params: dict,
    state: NodeState,
    x: Float[Array, "B D"],
    key: jax.Array,
    cfg: AdaptiveConfig,
    policy: str | Policy | None = None,
) -> tuple[NodeState, dict[str, Array]]:
    """One dynamics step for a batch ``x [B, D]``; returns (new state, outputs).

    outputs: ``logits [B,C]``, ``phase [B,N]`` (int32), ``anxiety [B,N]``, ``energy [B,N]``,
    ``activity [B,N]``. The phase draw has no gradient; everything else is differentiable.
    ``policy``: a precision policy / preset (None: :func:`~ivhl_jax.core.precision.default_policy` of
    ``params``, ``state`` and ``x``, i.e. their own dtype): weights rounded to ``param_dtype``, the step in
    ``compute_dtype``, new state and outputs in ``output_dtype`` (module docstring). Complex weights, state or
    input are a TypeError naming them.
    """
    pol = physics_policy(policy, like=(params, state, x))
    # the policy's own message first (it names the compute dtype), then the shape/finiteness checks
    for tree, name in ((params, "params"), (state, "state"), (x, "x")):
        check_real_tree(tree, name, pol)
    x = check_inputs(cfg, state, x)
    new_state, out = _step(
        pol.cast_to_compute(pol.cast_to_param(params)),
        pol.cast_to_compute(state),
        jnp.asarray(x).astype(pol.compute_dtype),
        key,
        cfg,
    )
    return pol.cast_to_output(new_state), pol.cast_to_output(out)


def _step(
    params: dict, state: NodeState, x: Float[Array, "B D"], key: jax.Array, cfg: AdaptiveConfig
) -> tuple[NodeState, dict[str, Array]]:
    """The step of :func:`step` on checked inputs, all in one compute dtype."""
    u = project_input(params, x, cfg)
    anx = anxiety(state.h, state.energy, state.activity)
    sched_in = detach(state)
    anx_ng = jax.lax.stop_gradient(anx)
    if cfg.scheduler == "per_sample":
        phase, sched = schedule_per_sample(cfg, sched_in, anx_ng, key)
        phase_b = phase
    else:
        phase, sched = schedule_shared(cfg, sched_in, anx_ng, key)
        phase_b = jnp.broadcast_to(phase, state.energy.shape)
    h, e, a = node_update(params, cfg, state.h, state.energy, u, anx, phase)
    new_state = sched.replace(h=h, energy=e, activity=a)
    logits = readout(params, cfg, h, e, a)
    return new_state, {"logits": logits, "phase": phase_b, "anxiety": anx, "energy": e, "activity": a}


def check_inputs(cfg: AdaptiveConfig, state: NodeState, x: Float[ArrayLike, "B D"]) -> Float[Array, "B D"]:
    """Validate ``x`` against the config and the state's batch size (shape errors name the fix)."""
    x = check_array(x, "x", shape=(None, cfg.input_dim), kind="floating", finite=True)
    if state.h.shape != (x.shape[0], cfg.num_nodes, cfg.hidden_dim):
        raise ValueError(
            f"state.h has shape {state.h.shape}, expected {(x.shape[0], cfg.num_nodes, cfg.hidden_dim)}"
            f"; create it with init_state(cfg, batch={x.shape[0]})"
        )
    return x


def node_metrics(state: NodeState, out: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Scalar summaries (phase ratios, mean energy/activity/anxiety, active-node ratio)."""
    fr = out["phase_fractions"]
    m = {f"{p}_ratio": fr[i] for i, p in enumerate(PHASES)}
    m.update(
        mean_energy=jnp.mean(state.energy),
        mean_activity=jnp.mean(state.activity),
        mean_anxiety=jnp.mean(out["anxiety"]),
        max_anxiety=jnp.max(out["anxiety"]),
        active_node_ratio=jnp.mean((state.energy > 1.0) & (state.activity > 0.5)),
        mean_restorative_need=jnp.mean(state.restorative),
    )
    return m
