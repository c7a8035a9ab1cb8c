"""Sharded simulations: split a grid of evaluation points (a wave field) across devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ivhl_jax.core.mesh import place
from ivhl_jax.core.validation import check_array, check_scalar
from ivhl_jax.train.parallel.mesh import axis_size

__all__ = ["sharded_map", "sharded_grid"]


def sharded_map(
    fn: Callable[..., Any], points: jax.Array, *args: Any, mesh: Mesh, axis: str | Sequence[str] | None = None
) -> Any:
    """Evaluate ``fn(points_block, *args)`` with the points split across devices, ``args`` replicated.

    For pointwise fields (wave-field superposition on a grid: each evaluation point is independent)
    this is exact: no communication but the final gather. ``points`` (N, ...) is padded to a multiple
    of the device count and the padding dropped from every output leaf (outputs have leading dim N).
    Defaults to all mesh axes.
    """
    points = check_array(points, "points")
    if points.ndim < 1:
        raise ValueError(f"points must have a leading (point) axis, got a scalar of shape {tuple(points.shape)}")
    axes = tuple(mesh.axis_names) if axis is None else ((axis,) if isinstance(axis, str) else tuple(axis))
    n = axis_size(mesh, axes)
    count = points.shape[0]
    pad = (-count) % n
    padded = jnp.concatenate([points, jnp.repeat(points[-1:], pad, axis=0)], axis=0) if pad else points
    lead = axes[0] if len(axes) == 1 else axes
    spec = P(lead)
    arg_specs = jax.tree_util.tree_map(lambda _: P(), args)
    out = jax.shard_map(
        lambda p, *a: fn(p, *a), mesh=mesh, in_specs=(spec, *arg_specs), out_specs=spec, check_vma=False
    )(padded, *args)
    return jax.tree_util.tree_map(lambda o: o[:count], out)


def sharded_grid(grid: jax.Array, mesh: Mesh, axis: str | Sequence[str] | None = None, dim: int = 0) -> jax.Array:
    """Place a field grid with dimension ``dim`` split across the given mesh axes (default: all)."""
    grid = jnp.asarray(grid)
    check_scalar(dim, "dim", integer=True, minimum=-grid.ndim, maximum=grid.ndim - 1)
    dim = int(dim) % grid.ndim
    axes = tuple(mesh.axis_names) if axis is None else ((axis,) if isinstance(axis, str) else tuple(axis))
    spec: list[Any] = [None] * grid.ndim
    spec[dim] = axes[0] if len(axes) == 1 else axes
    if grid.shape[dim] % axis_size(mesh, axes):
        raise ValueError(
            f"sharded_grid: dimension {dim} of size {grid.shape[dim]} is not divisible by the "
            f"{axis_size(mesh, axes)} devices of {axes}"
        )
    return place(grid, NamedSharding(mesh, P(*spec)))
