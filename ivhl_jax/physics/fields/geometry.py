"""Point sets for fields: the points of a regular grid (:func:`grid_points`) and sources along a helix
(:func:`helix_sources`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ivhl_jax.core.validation import check_scalar

__all__ = ["grid_points", "helix_sources"]


def grid_points(
    shape: Sequence[int],
    lower: Any = -1.0,
    upper: Any = 1.0,
    *,
    z: float | None = None,
    dtype: Any = jnp.float32,
) -> Float[Array, "points d"]:
    """Points of a regular grid, flattened in ``indexing="ij"`` order (axis 0 = x, 1 = y, 2 = z).

    ``field = f(grid_points(shape, ...)).reshape(shape)`` then has ``field[i, j]`` at
    (x_i, y_j). Endpoints are included: x_i = lower + i (upper − lower)/(n − 1).

    Args:
      shape: (H, W) for a 2-D grid or (H, W, L) for a 3-D grid; every entry ≥ 2.
      lower: lower bound, a scalar or one per grid axis.
      upper: upper bound, a scalar or one per grid axis.
      z: for a 2-D ``shape``, place the grid in the plane z = ``z`` of 3-D space (points (H·W, 3));
        None gives 2-D points (H·W, 2).
      dtype: floating dtype of the result.

    Returns:
      (prod(shape), D) array, D = len(shape), or 3 when ``z`` is given.
    """
    try:
        entries = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, (H, W) or (H, W, L), got {shape!r}") from None
    for s in entries:
        check_scalar(s, "shape", integer=True)  # (2.5, 3) is an error, not (2, 3)
    shape = tuple(int(s) for s in entries)
    if len(shape) not in (2, 3) or any(s < 2 for s in shape):
        raise ValueError(f"shape must be (H, W) or (H, W, L) with every entry >= 2, got {shape}")
    if z is not None and len(shape) != 2:
        raise ValueError("z is only meaningful for a 2-D shape (a slice of 3-D space)")
    lo = np.broadcast_to(np.asarray(lower, np.float64), (len(shape),))
    hi = np.broadcast_to(np.asarray(upper, np.float64), (len(shape),))
    if np.any(~np.isfinite(lo)) or np.any(~np.isfinite(hi)) or np.any(hi <= lo):
        raise ValueError(f"need finite lower < upper on every axis, got lower={lower}, upper={upper}")
    axes = [np.linspace(lo[i], hi[i], n) for i, n in enumerate(shape)]
    mesh = np.meshgrid(*axes, indexing="ij")
    pts = np.stack([m.reshape(-1) for m in mesh], axis=-1)
    if z is not None:
        check_scalar(z, "z")
        pts = np.concatenate([pts, np.full((pts.shape[0], 1), float(z))], axis=-1)
    return jnp.asarray(pts, dtype=dtype)


def helix_sources(
    count: int, radius: float = 1.0, pitch: float = 0.5, turns: float = 3.0, *, dtype: Any = jnp.float32
) -> Float[Array, "count 3"]:
    """``count`` points evenly spaced in angle along a circular helix about the z axis.

        s_i = i / count,  α_i = 2π · turns · s_i,
        r_i = (radius cos α_i, radius sin α_i, pitch · turns · s_i − z̄),

    ``pitch`` is the rise per turn; z̄ centres the helix on z = 0.

    Returns:
      (count, 3) source positions.
    """
    check_scalar(count, "count", integer=True, minimum=1)
    check_scalar(radius, "radius", nonnegative=True)
    check_scalar(pitch, "pitch")
    check_scalar(turns, "turns")
    s = np.arange(int(count), dtype=np.float64) / int(count)
    alpha = 2 * np.pi * float(turns) * s
    zz = float(pitch) * float(turns) * s
    zz = zz - 0.5 * (zz[0] + zz[-1])
    pts = np.stack([float(radius) * np.cos(alpha), float(radius) * np.sin(alpha), zz], axis=-1)
    return jnp.asarray(pts, dtype=dtype)
