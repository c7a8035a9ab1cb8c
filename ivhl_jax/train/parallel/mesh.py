"""Device meshes from a parallelism spec: ``{"data": -1, "fsdp": 1, "tensor": 2, "pipeline": 1}``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.flatten_util
import numpy as np
from jax.sharding import Mesh

from ivhl_jax.core.mesh import device_mesh

__all__ = ["AXES", "BATCH_AXES", "mesh_shape", "make_mesh", "axis_size", "batch_axes"]


AXES = ("data", "fsdp", "tensor", "pipeline")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(spec: Mapping[str, int], n_devices: int) -> dict[str, int]:
    """Resolve a spec (one entry may be -1) into concrete axis sizes whose product is ``n_devices``."""
    if not isinstance(spec, Mapping) or not spec:
        raise TypeError(f"spec must be a non-empty mapping axis name -> size, got {spec!r}")
    if isinstance(n_devices, bool) or not isinstance(n_devices, (int, np.integer)) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive integer, got {n_devices!r}; pass a non-empty device list")
    sizes = {}
    for k, v in spec.items():
        if not isinstance(k, str):
            raise TypeError(f"spec axis names must be strings, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(
                f"spec {dict(spec)}: axis {k!r} has size {v!r} of type {type(v).__name__}; "
                "axis sizes must be positive integers (or -1 for the remaining devices)"
            )
    free = [k for k, v in spec.items() if int(v) == -1]
    if len(free) > 1:
        raise ValueError(f"spec {dict(spec)}: at most one axis may be -1 (got {free})")
    for k, v in spec.items():
        v = int(v)
        if v == 0 or v < -1:
            raise ValueError(f"spec {dict(spec)}: axis {k!r} has size {v}; use a positive size or -1")
        sizes[k] = v
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if free:
        if n_devices % fixed:
            raise ValueError(
                f"spec {dict(spec)}: the fixed axes use {fixed} devices, which does not divide "
                f"the {n_devices} available; change the sizes"
            )
        sizes[free[0]] = n_devices // fixed
    elif fixed != n_devices:
        raise ValueError(
            f"spec {dict(spec)} needs {fixed} devices but {n_devices} are available; "
            "set one axis to -1 to absorb the rest"
        )
    return sizes


def make_mesh(spec: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Device mesh from ``spec`` (default ``{"data": -1}``: pure data parallelism over all devices).

    Axes keep the spec's order; put the axis with the most traffic (tensor) last so it lands on
    neighbouring devices. The mesh is :func:`ivhl_jax.core.mesh.device_mesh`'s (``Auto`` axis types: GSPMD
    sharding propagation; with every device, :func:`jax.make_mesh`'s topology-aware order).
    """
    spec = {"data": -1} if spec is None else spec
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError(
            "devices must be a non-empty sequence of jax devices (got an empty one); "
            "pass e.g. jax.devices() or None for all devices"
        )
    sizes = mesh_shape(spec, len(devices))
    return device_mesh(tuple(sizes.values()), tuple(sizes), devices)


def axis_size(mesh: Mesh, axis: str | Sequence[str] | None) -> int:
    """Number of devices along mesh axis ``axis`` (a name, a sequence of names, or None: 1); a name the mesh
    lacks counts as size 1 (so rules may name axes a given mesh does not have)."""
    if axis is None:
        return 1
    if isinstance(axis, str):
        return int(mesh.shape.get(axis, 1))
    if not isinstance(axis, Sequence) or not all(isinstance(a, str) for a in axis):
        raise TypeError(f"axis must be a mesh axis name, a sequence of names or None, got {axis!r}")
    return math.prod(int(mesh.shape.get(a, 1)) for a in axis)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """Mesh axes (of size > 1) that split the batch: data and fsdp."""
    return tuple(a for a in BATCH_AXES if mesh.shape.get(a, 1) > 1)
