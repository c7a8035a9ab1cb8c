"""One training step for every model: precision policy, loss scaling, clipping, accumulation.

The train state is a pytree, so a whole training loop can run inside ``lax.scan``, be sharded,
and be checkpointed bit-exactly (parameters, optimiser state, loss scale, PRNG key, step).

``make_train_step(loss_fn, optimizer, policy)`` returns ``train_step(state, batch) -> (state,
metrics)``. ``loss_fn(params, batch, key, extra) -> (loss, (metrics, new_extra))`` receives the
parameters already cast to the policy's compute dtype (the cast is differentiable, so gradients
arrive in the fp32 master dtype), a fresh PRNG key for dropout/sampling, and ``extra`` — model
state that is not trained by gradients (BatchNorm statistics, recurrent node state).

With fp16 compute the loss is multiplied by the dynamic loss scale before differentiation; if any
gradient is non-finite the update is skipped (parameters, optimiser state and ``extra`` unchanged)
and the scale halves (see :class:`ivhl_jax.core.precision.DynamicLossScale`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from ivhl_jax.core import precision
from ivhl_jax.core.validation import check_array, check_choice, check_key, check_scalar, is_concrete

__all__ = ["LossFn", "TrainState", "make_optimizer", "init_train_state", "make_train_step", "make_eval_step"]

LossFn = Callable[[Any, Any, jax.Array, Any], tuple[jax.Array, tuple[dict[str, jax.Array], Any]]]


class TrainState(flax.struct.PyTreeNode):
    """Everything a training run needs to continue exactly where it stopped."""

    step: jax.Array
    params: Any
    opt_state: Any
    loss_scale: Any
    key: jax.Array
    extra: Any = None


def make_optimizer(
    *,
    name: str = "adamw",
    learning_rate: float = 3e-4,
    warmup_steps: int = 0,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.1,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
    accumulate: int = 1,
) -> optax.GradientTransformation:
    """Adam/AdamW with linear warm-up + cosine decay, global-norm clipping and gradient accumulation.

    Args:
      name: ``"adam"`` or ``"adamw"`` (decoupled weight decay).
      learning_rate: peak learning rate.
      warmup_steps: linear warm-up from 0 to the peak (optimizer updates, not micro-steps).
      total_steps: if given, cosine decay from the peak to ``min_lr_ratio × peak`` at this step.
      clip_norm: clip gradients to this global L2 norm (None: no clipping).
      accumulate: average gradients over this many micro-batches before one update
        (``optax.MultiSteps``); the effective batch is ``accumulate × batch``.
    """
    check_choice(name, "name", ("adam", "adamw"))
    check_scalar(learning_rate, "learning_rate", positive=True)
    check_scalar(warmup_steps, "warmup_steps", integer=True, nonnegative=True)
    check_scalar(min_lr_ratio, "min_lr_ratio", minimum=0.0, maximum=1.0)
    check_scalar(b1, "b1", minimum=0.0, maximum=1.0)
    check_scalar(b2, "b2", minimum=0.0, maximum=1.0)
    for beta_name, beta in (("b1", b1), ("b2", b2)):
        if is_concrete(beta) and not float(beta) < 1.0:  # 1 - β^t = 0: Adam's bias correction divides by zero
            raise ValueError(f"{beta_name} must be < 1, got {beta}")
    check_scalar(eps, "eps", nonnegative=True)
    check_scalar(weight_decay, "weight_decay", nonnegative=True)
    check_scalar(accumulate, "accumulate", integer=True, minimum=1)
    if total_steps is not None:
        check_scalar(total_steps, "total_steps", integer=True, minimum=max(1, warmup_steps))
        if total_steps > max(warmup_steps, 1):
            schedule = optax.warmup_cosine_decay_schedule(
                0.0, learning_rate, max(warmup_steps, 1), total_steps, end_value=learning_rate * min_lr_ratio
            )
        elif warmup_steps:  # a run as long as its warm-up (a smoke run): nothing is left to decay
            schedule = optax.linear_schedule(0.0, learning_rate, warmup_steps)
        else:  # a one-step run without warm-up: the peak
            schedule = learning_rate
    elif warmup_steps:
        schedule = optax.linear_schedule(0.0, learning_rate, warmup_steps)
    else:
        schedule = learning_rate
    if name == "adamw":
        opt = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    else:
        opt = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    if clip_norm is not None:
        check_scalar(clip_norm, "clip_norm", positive=True)
        opt = optax.chain(optax.clip_by_global_norm(clip_norm), opt)
    if accumulate > 1:
        opt = optax.MultiSteps(opt, every_k_schedule=accumulate)
    return opt


def init_train_state(
    params: Any,
    optimizer: optax.GradientTransformation,
    *,
    key: jax.Array,
    policy: str | precision.Policy = "fp32",
    extra: Any = None,
    **loss_scale_kwargs: Any,
) -> TrainState:
    """Parameters are stored in the policy's ``param_dtype`` (fp32 master weights by default).

    Every parameter leaf must be a numeric array with finite values (checked outside a trace; a NaN
    in the initial weights would otherwise train silently into NaN) and ``key`` a single PRNG key; the
    ValueError/TypeError names the offending leaf (``params['w']``) or ``key``.
    """
    check_key(key, "key")
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        check_array(leaf, f"params{jax.tree_util.keystr(path)}", kind="numeric", finite=True)
    policy = precision.get_policy(policy)
    params = policy.cast_to_param(params)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        loss_scale=precision.loss_scale_for(policy, **loss_scale_kwargs),
        key=key,
        extra=extra,
    )


def make_train_step(
    loss_fn: LossFn, optimizer: optax.GradientTransformation, policy: str | precision.Policy = "fp32"
) -> Callable[[TrainState, Any], tuple[TrainState, dict]]:
    """Build ``train_step(state, batch) -> (state, metrics)`` (pure; jit/scan/shard it as you like).

    metrics: the loss function's metrics plus ``loss`` (unscaled, fp32), ``grad_norm``,
    ``loss_scale`` and ``skipped`` (1 if the update was dropped for non-finite gradients).
    """
    policy = precision.get_policy(policy)

    def train_step(state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        key, step_key = jax.random.split(state.key)

        def scaled_loss(params):
            loss, (metrics, new_extra) = loss_fn(policy.cast_to_compute(params), batch, step_key, state.extra)
            return state.loss_scale.scale(loss.astype(jnp.float32)), (loss, metrics, new_extra)

        grads, (loss, metrics, new_extra) = jax.grad(scaled_loss, has_aux=True)(state.params)
        grads = state.loss_scale.unscale(grads)
        grads = policy.cast_to_param(grads)
        finite = precision.all_finite(grads)

        def update(operands):
            params, opt_state = operands
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_opt_state

        # A cond, not a leafwise where: XLA:CPU copied the optimizer's arithmetic into each leaf's select fusion
        # (the skip test reads every gradient first); the branch computes it once. Under vmap it becomes the
        # select again.
        params, opt_state = jax.lax.cond(finite, update, lambda operands: operands, (state.params, state.opt_state))
        extra = precision.select_tree(finite, new_extra, state.extra) if state.extra is not None else new_extra
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            loss_scale=state.loss_scale.adjust(finite),
            key=key,
            extra=extra,
        )
        out = dict(metrics)
        out.update(
            loss=loss.astype(jnp.float32),
            grad_norm=optax.tree.norm(grads),
            loss_scale=jnp.asarray(getattr(state.loss_scale, "loss_scale", 1.0), jnp.float32),
            skipped=(~finite).astype(jnp.int32),
        )
        return new_state, out

    return train_step


def make_eval_step(loss_fn: LossFn, policy: str | precision.Policy = "fp32") -> Callable[[TrainState, Any], dict]:
    """``eval_step(state, batch) -> metrics`` with the same loss function (no update, fixed key)."""
    policy = precision.get_policy(policy)

    def eval_step(state: TrainState, batch: Any) -> dict:
        loss, (metrics, _) = loss_fn(policy.cast_to_compute(state.params), batch, state.key, state.extra)
        out = dict(metrics)
        out["loss"] = loss.astype(jnp.float32)
        return out

    return eval_step
