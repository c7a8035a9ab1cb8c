"""Logical axis names → mesh axes (MaxText-style rules), and placing parameters, train states and batches on a mesh."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.flatten_util
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ivhl_jax.core.mesh import place
from ivhl_jax.core.validation import check_scalar
from ivhl_jax.train.parallel.mesh import axis_size, batch_axes

__all__ = [
    "DEFAULT_RULES",
    "logical_to_spec",
    "fsdp_spec",
    "unbox",
    "logical_names",
    "param_shardings",
    "shardings_like",
    "state_shardings",
    "shard_tree",
    "batch_sharding",
    "shard_batch",
    "jit_train_step",
    "with_constraint",
]


#: Logical axis name → mesh axis (or tuple of mesh axes, or None = replicated). First match wins.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("activation_batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("seq", None),
    ("layers", None),
    ("stage", "pipeline"),
    ("nodes", "fsdp"),
    ("hidden", "tensor"),
)


def logical_to_spec(
    names: Sequence[str | None] | None,
    mesh: Mesh,
    rules: Sequence[tuple[str, Any]] = DEFAULT_RULES,
    shape: Sequence[int] | None = None,
) -> P:
    """PartitionSpec for an array whose dimensions carry logical ``names``.

    Mesh axes that are missing or of size 1 are dropped, a mesh axis is used at most once per array,
    and (when ``shape`` is given, ``names`` holds one name or None per dimension) a dimension that the axes do not
    divide stays replicated.
    """
    if names is None:
        return P()
    if (
        isinstance(names, str)
        or not isinstance(names, Sequence)
        or not all(n is None or isinstance(n, str) for n in names)
    ):
        raise TypeError(f"names must be a sequence of logical axis names (str or None), got {names!r}")
    if shape is not None and len(names) != len(shape):
        raise ValueError(
            f"names {tuple(names)} do not match an array of shape {tuple(shape)}: one logical name (or None) per "
            "dimension"
        )
    table: dict[str, Any] = {}
    for rule_name, target in rules:
        table.setdefault(rule_name, target)
    used: set[str] = set()
    out: list[Any] = []
    for d, name in enumerate(names):
        target = table.get(name) if name is not None else None
        if target is None:
            out.append(None)
            continue
        axes = (target,) if isinstance(target, str) else tuple(target)
        axes = tuple(a for a in axes if mesh.shape.get(a, 1) > 1 and a not in used)
        if shape is not None and axes and shape[d] % axis_size(mesh, axes):
            axes = ()
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return P(*out)


def fsdp_spec(shape: Sequence[int], mesh: Mesh, axis: str = "fsdp", min_size: int = 1024) -> P:
    """FSDP fallback for an unnamed array: split its largest dimension that ``axis`` divides."""
    for i, d in enumerate(shape):
        check_scalar(d, f"shape[{i}]", integer=True, nonnegative=True)
    check_scalar(min_size, "min_size", integer=True, nonnegative=True)
    shape = tuple(int(d) for d in shape)
    n = axis_size(mesh, axis)
    if n == 1 or math.prod(shape) < min_size:
        return P()
    for d in sorted(range(len(shape)), key=lambda i: -shape[i]):
        if shape[d] % n == 0:
            spec: list[Any] = [None] * len(shape)
            spec[d] = axis
            return P(*spec)
    return P()


def _is_box(x: Any) -> bool:
    return hasattr(x, "names") and hasattr(x, "unbox")


def unbox(tree: Any) -> Any:
    """Strip flax ``nn.Partitioned`` / ``LogicallyPartitioned`` boxes (leaves unchanged otherwise)."""
    return jax.tree_util.tree_map(lambda x: x.unbox() if _is_box(x) else x, tree, is_leaf=_is_box)


def logical_names(tree: Any) -> Any:
    """Tree of logical-name tuples from flax partitioning boxes (None for unboxed leaves)."""
    return jax.tree_util.tree_map(lambda x: tuple(x.names) if _is_box(x) else None, tree, is_leaf=_is_box)


def _names_leaf(x: Any) -> bool:
    return x is None or isinstance(x, P) or (isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x))


def param_shardings(
    params: Any,
    mesh: Mesh,
    logical: Any = None,
    rules: Sequence[tuple[str, Any]] = DEFAULT_RULES,
    *,
    fsdp_fallback: bool = True,
    min_size: int = 1024,
) -> Any:
    """NamedSharding for every parameter.

    Args:
      params: parameter pytree (arrays, ShapeDtypeStructs, or flax partitioning boxes — their names
        are used when ``logical`` is None).
      logical: optional tree matching ``params`` whose leaves are tuples (or PartitionSpecs) of logical
        names, or None.
      rules: logical name → mesh axes.
      fsdp_fallback: leaves without names (or whose names map to no ``fsdp`` axis) are split along their
        largest divisible dimension over ``fsdp`` when the mesh has one.
      min_size: leaves of fewer elements stay replicated under the fallback (as in :func:`fsdp_spec`).
    """
    check_scalar(min_size, "min_size", integer=True, nonnegative=True)
    if logical is None:
        logical = logical_names(params)
    params = unbox(params)
    flat, treedef = jax.tree_util.tree_flatten(params)
    names = treedef.flatten_up_to(logical) if logical is not None else [None] * len(flat)  # type: ignore[attr-defined]

    def one(x, nm):
        shape = tuple(x.shape)
        if isinstance(nm, P):  # a PartitionSpec of *logical* names (flax ``nn.get_partition_spec``)
            nm = tuple(nm) + (None,) * (len(shape) - len(nm))
        spec = logical_to_spec(nm, mesh, rules, shape)
        if fsdp_fallback and "fsdp" not in jax.tree_util.tree_leaves(tuple(spec)) and not any(spec):
            spec = fsdp_spec(shape, mesh, "fsdp", min_size)
        return NamedSharding(mesh, spec)

    return treedef.unflatten([one(x, nm) for x, nm in zip(flat, names, strict=True)])  # type: ignore[attr-defined]


def _path_key(path) -> tuple:
    return tuple(str(k) for k in path)


def shardings_like(tree: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
    """Shardings for a tree that contains parameter-shaped leaves (optimiser moments, error buffers).

    A leaf whose key path ends with a parameter's path and has its shape gets that parameter's
    sharding; every other leaf (counts, scalars, keys) is replicated.
    """
    pflat = jax.tree_util.tree_flatten_with_path(params)[0]
    sflat = jax.tree_util.tree_leaves(shardings, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))
    table = [(_path_key(p), tuple(x.shape), s) for (p, x), s in zip(pflat, sflat, strict=True)]
    rep = NamedSharding(mesh, P())

    def pick(path, x):
        key = _path_key(path)
        shape = tuple(getattr(x, "shape", ()))
        best = None
        for pk, ps, s in table:
            if ps == shape and len(pk) <= len(key) and key[len(key) - len(pk) :] == pk:
                if best is None or len(pk) > best[0]:
                    best = (len(pk), s)
        return best[1] if best else rep

    return jax.tree_util.tree_map_with_path(pick, tree)


def state_shardings(
    state: Any, mesh: Mesh, logical: Any = None, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES, **kwargs: Any
) -> Any:
    """Shardings for a :class:`ivhl_jax.train.training.TrainState`: params by :func:`param_shardings`,
    optimiser moments like their parameters, everything else replicated."""
    ps = param_shardings(state.params, mesh, logical, rules, **kwargs)
    rep = NamedSharding(mesh, P())
    return state.replace(
        step=rep,
        params=ps,
        opt_state=shardings_like(state.opt_state, state.params, ps, mesh),
        loss_scale=jax.tree_util.tree_map(lambda _: rep, state.loss_scale),
        key=rep,
        extra=jax.tree_util.tree_map(lambda _: rep, state.extra),
    )


def shard_tree(tree: Any, shardings: Any) -> Any:
    """Place every leaf with its sharding (a single Sharding or a matching tree of them).

    Each leaf goes through :func:`ivhl_jax.core.mesh.place`: new buffers (a donating train step never deletes
    the caller's arrays). Works across processes: host values must then be identical on every process (e.g.
    parameters initialised from the same seed).
    """
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree_util.tree_map(lambda x: place(x, shardings), tree)
    return jax.tree_util.tree_map(place, tree, shardings)


def batch_sharding(mesh: Mesh, ndim: int = 1, axes: Sequence[str] | None = None) -> NamedSharding:
    """Leading (batch) dimension split over the data/fsdp mesh axes, the rest replicated."""
    check_scalar(ndim, "ndim", integer=True, minimum=1)
    ndim = int(ndim)
    if axes is not None and len(set(axes)) != len(tuple(axes)):
        raise ValueError(f"axes must name each mesh axis at most once, got {tuple(axes)}")
    axes = batch_axes(mesh) if axes is None else tuple(a for a in axes if mesh.shape.get(a, 1) > 1)
    lead = None if not axes else axes[0] if len(axes) == 1 else axes
    return NamedSharding(mesh, P(lead, *([None] * (ndim - 1))))


def shard_batch(batch: Any, mesh: Mesh, *, axes: Sequence[str] | None = None, process_local: bool = False) -> Any:
    """Split a batch pytree along its leading dimension over the batch mesh axes.

    ``process_local=False``: every process holds the same global batch (single process: the batch).
    ``process_local=True``: each process passes only its own rows (``global / process_count``), as a
    per-host data loader produces them; they are stitched into one global array.
    """
    n = axis_size(mesh, batch_axes(mesh) if axes is None else axes)

    def one(x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim == 0:
            raise ValueError("shard_batch: every batch leaf needs a leading batch dimension; got a scalar")
        s = batch_sharding(mesh, x.ndim, axes)
        if process_local:
            return jax.make_array_from_process_local_data(s, np.asarray(x))
        if x.shape[0] % n:
            raise ValueError(
                f"shard_batch: batch size {x.shape[0]} is not divisible by the {n} devices of the "
                "batch mesh axes; pad or change the batch size"
            )
        return place(x, s)

    return jax.tree_util.tree_map(one, batch)


def jit_train_step(
    train_step: Callable, state_sharding: Any, batch_sharding_tree: Any, mesh: Mesh, *, donate: bool = True
) -> Callable:
    """Compile ``train_step(state, batch) -> (state, metrics)`` with explicit in/out shardings.

    Data parallel, FSDP and tensor parallel are all this one call; they differ only in the shardings
    (which :func:`state_shardings` derives from the mesh). Metrics come back replicated.
    """
    rep = NamedSharding(mesh, P())
    return jax.jit(
        train_step,
        in_shardings=(state_sharding, batch_sharding_tree),
        out_shardings=(state_sharding, rep),
        donate_argnums=(0,) if donate else (),
    )


def with_constraint(
    x: Any, mesh: Mesh, names: Sequence[str | None], rules: Sequence[tuple[str, Any]] = DEFAULT_RULES
) -> Any:
    """``with_sharding_constraint`` by logical activation names (e.g. ``("batch", "length", "embed")``), one name
    (or None) for each dimension of ``x``."""
    spec = logical_to_spec(names, mesh, rules, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
