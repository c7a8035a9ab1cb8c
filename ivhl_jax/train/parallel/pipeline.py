"""GPipe microbatch pipeline over a ``"pipeline"`` mesh axis (``shard_map`` + ``ppermute``), differentiable."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.train.parallel.mesh import axis_size, batch_axes

__all__ = ["bubble_fraction", "pipeline_apply"]


def bubble_fraction(n_stages: int, n_microbatches: int, repeats: int = 1) -> float:
    """Idle fraction of a GPipe schedule: (S − 1) / (R·M + S − 1)."""
    check_scalar(n_stages, "n_stages", integer=True, minimum=1)
    check_scalar(n_microbatches, "n_microbatches", integer=True, minimum=1)
    return (n_stages - 1) / (repeats * n_microbatches + n_stages - 1)


def pipeline_apply(
    stage_fn: Callable[[Any, jax.Array], jax.Array],
    stage_params: Any,
    x: jax.Array,
    mesh: Mesh,
    *,
    n_microbatches: int,
    axis: str = "pipeline",
    batch_axis: str | Sequence[str] | None = "auto",
) -> jax.Array:
    """Run ``x`` through S pipeline stages, GPipe style, and return the last stage's output.

    ``stage_fn(params_of_one_stage, h) -> h`` must keep the activation shape. ``stage_params`` is a
    pytree whose leaves have a leading stage axis of length S = ``mesh.shape[axis]`` (stage s uses
    ``leaf[s]``). The batch is cut into ``n_microbatches``; at tick t stage s works on microbatch
    t − s and passes its output to stage s + 1 with ``ppermute``. M + S − 1 ticks in all, so a
    fraction :func:`bubble_fraction` of stage-ticks is idle. Differentiable (the transpose of
    ``ppermute`` sends gradients backwards through the pipeline). The microbatch batch dimension is
    additionally split over the data/fsdp axes when ``batch_axis="auto"``.

    Shapes: x (B, ...) with B divisible by ``n_microbatches`` (× the batch-axis size); returns (B, ...).
    """
    s_count = axis_size(mesh, axis)
    leaves = jax.tree_util.tree_leaves(stage_params)
    for leaf in leaves:
        if leaf.shape[0] != s_count:
            raise ValueError(
                f"pipeline_apply: stage_params leaves need a leading axis of {s_count} stages "
                f"(mesh axis {axis!r}); got shape {leaf.shape}"
            )
    check_scalar(n_microbatches, "n_microbatches", integer=True, minimum=1)
    m = int(n_microbatches)
    if x.shape[0] % m:
        raise ValueError(f"pipeline_apply: batch {x.shape[0]} is not divisible by n_microbatches={m}")
    if batch_axis == "auto":
        baxes = batch_axes(mesh)
    elif batch_axis is None:
        baxes = ()
    else:
        baxes = (batch_axis,) if isinstance(batch_axis, str) else tuple(batch_axis)
    mb = x.shape[0] // m
    if mb % axis_size(mesh, baxes):
        raise ValueError(f"pipeline_apply: microbatch size {mb} is not divisible by the batch axes {baxes}")
    xs = x.reshape(m, mb, *x.shape[1:])
    blead = None if not baxes else baxes[0] if len(baxes) == 1 else baxes
    x_spec = P(None, blead)
    p_spec = jax.tree_util.tree_map(lambda _: P(axis), stage_params)
    perm = [(i, (i + 1) % s_count) for i in range(s_count)]

    def local(params, xs_local):
        params = jax.tree_util.tree_map(lambda a: a[0], params)
        stage = jax.lax.axis_index(axis)
        zero = jnp.zeros_like(xs_local[0])

        def tick(carry, t):
            buf, outs = carry
            feed = xs_local[jnp.clip(t, 0, m - 1)]
            inp = jnp.where(stage == 0, feed, buf)
            out = stage_fn(params, inp)
            slot = t - (s_count - 1)
            write = (stage == s_count - 1) & (slot >= 0)
            outs = jax.lax.dynamic_update_index_in_dim(
                outs, jnp.where(write, out, outs[jnp.clip(slot, 0, m - 1)]), jnp.clip(slot, 0, m - 1), 0
            )
            buf = jax.lax.ppermute(out, axis, perm) if s_count > 1 else out
            return (buf, outs), None

        outs0 = jnp.zeros_like(xs_local)
        if s_count > 1:  # the carries differ per stage: mark them varying over the pipeline axis
            zero, outs0 = (jax.lax.pcast(a, (axis,), to="varying") for a in (zero, outs0))
        (_, outs), _ = jax.lax.scan(tick, (zero, outs0), jnp.arange(m + s_count - 1))
        # Only the last stage holds the result; summing over stages replicates it.
        outs = jnp.where(stage == s_count - 1, outs, 0)
        return jax.lax.psum(outs, axis) if s_count > 1 else outs

    fn = jax.shard_map(local, mesh=mesh, in_specs=(p_spec, x_spec), out_specs=x_spec)
    return fn(stage_params, xs).reshape(x.shape)
