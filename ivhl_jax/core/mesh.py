"""Device meshes and placing arrays on them, on one process or several.

:func:`device_mesh` builds every mesh of the library (the parallelism spec of
:func:`ivhl_jax.train.parallel.make_mesh`, the ``mesh=8`` / ``mesh=4x2`` setting of the distributed FFT);
:func:`place` puts every array on a sharding. Both work when the devices span processes (``jax.distributed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

__all__ = ["device_mesh", "place"]


def device_mesh(shape: Sequence[int], names: Sequence[str], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh of ``devices`` (default: every device, all processes) with axis sizes ``shape`` and axis ``names``.

    Axis types are ``Auto`` (GSPMD propagates shardings). With every device, the device order is
    :func:`jax.make_mesh`'s (it follows the physical topology, e.g. TPU rings); with a subset, the subset's order
    reshaped row-major. One-line errors name ``shape``/``names``/``devices`` and the fix.
    """
    shape = tuple(shape)
    names = tuple(names)
    if not shape or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in shape):
        raise ValueError(
            f"shape must be a non-empty sequence of positive integers (devices per mesh axis), got {shape}"
        )
    if len(names) != len(shape) or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"names must be {len(shape)} distinct strings, one per mesh axis of shape {shape}; got {names}"
        )
    devs = list(jax.devices() if devices is None else devices)
    if math.prod(shape) != len(devs):
        raise ValueError(
            f"a mesh of shape {shape} needs {math.prod(shape)} devices but devices has {len(devs)}; "
            f"give sizes whose product is {len(devs)} or that many devices"
        )
    auto = (jax.sharding.AxisType.Auto,) * len(shape)
    if len(devs) == jax.device_count():
        return jax.make_mesh(shape, names, axis_types=auto, devices=devs)
    return Mesh(np.asarray(devs).reshape(shape), names, axis_types=auto)


def place(x: Any, sharding: jax.sharding.Sharding) -> Any:
    """``x`` on ``sharding``, always in new buffers: the result never shares memory with ``x``, so donating it
    (a donating step or chunk) never deletes the caller's array, and writing to a NumPy ``x`` later never
    changes it. Placing an array that already has the sharding costs one on-device copy.

    ``x`` may be a NumPy array or scalar, a JAX array (a PRNG key array keeps its key type), or a tracer
    (inside ``jit``: a sharding constraint, nothing is copied). Across processes: a host value must be the same
    on every process (each process fills only its own devices' blocks from it); a JAX array that spans
    processes is resharded by the compiled identity (its blocks move between devices, never through a host).
    """
    if isinstance(x, jax.core.Tracer):
        return jax.lax.with_sharding_constraint(x, sharding)
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(place(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.jit(jnp.copy, out_shardings=sharding)(x)  # a copy: jit forwards a returned input
    if isinstance(x, jax.Array) and (jax.process_count() == 1 or x.sharding.is_equivalent_to(sharding, x.ndim)):
        # copied where it is, then moved: device_put alone may reuse the buffer of a shard that stays on its device
        return jax.device_put(jnp.copy(x), sharding)
    if jax.process_count() == 1:  # a host copy first: XLA:CPU may adopt a NumPy buffer without copying it
        return jax.device_put(np.array(x), sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: np.array(host[idx]))
