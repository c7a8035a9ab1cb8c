"""Distributed and model-parallel training and simulation on ``jit`` + ``NamedSharding`` + ``jax.shard_map``.

The mesh *is* the parallelism plan. A spec such as ``{"data": -1, "fsdp": 1, "tensor": 2, "pipeline": 1}``
builds a device mesh (``-1`` takes the remaining devices); logical axis names on parameters and
activations (``("embed", "mlp")``, ``("batch", "length")``) are mapped to mesh axes by rules; mesh axes of
size 1 simply vanish, so the same code runs data parallel (``data: 8``), fully sharded (``fsdp: 8``),
tensor parallel (``tensor: 2``) or any mix of them, and on one device.

==========================  ======================================================================
piece                       what it does
==========================  ======================================================================
:func:`make_mesh`           mesh from a spec (Auto axis types: GSPMD propagates shardings)
:data:`DEFAULT_RULES`       logical name → mesh axes (MaxText-style): batch→(data, fsdp), embed→fsdp,
                            mlp/heads/vocab→tensor (Megatron column/row split), stage→pipeline
:func:`param_shardings`     NamedSharding tree for parameters (logical names, else FSDP fallback)
:func:`state_shardings`     the same for a whole :class:`ivhl_jax.train.training.TrainState`
:func:`shard_tree`,         place pytrees / batches on the mesh, also across processes
:func:`shard_batch`
:func:`jit_train_step`      ``ivhl_jax.train.training.make_train_step`` compiled with in/out shardings
:func:`tp_mlp`,             explicit Megatron tensor-parallel layers for use inside ``shard_map``
:func:`tp_attention`
:func:`pipeline_apply`      GPipe microbatch pipeline (``shard_map`` + ``ppermute``), differentiable
:func:`compressed_mean`     optax transform: error-feedback bf16/int8/PowerSGD gradient all-reduce
:func:`compressed_dp_train_step`  data-parallel step with compressed all-reduce inside ``shard_map``
:func:`sharded_map`         split a grid of evaluation points across devices (wave fields)
:func:`collective_bytes`    bytes moved by collectives in a compiled program (parsed from its HLO)
==========================  ======================================================================

Equality with one device: every mode computes the same mathematical function; only the order of
floating-point reductions changes, so losses and parameters agree to round-off (tested on 8 emulated
CPU devices in ``tests/train/test_parallel.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ivhl_jax.core.validation import check_array, check_choice, check_scalar

__all__ = ["AXES", "BATCH_AXES", "DEFAULT_RULES", "mesh_shape", "make_mesh", "axis_size", "batch_axes",
    "logical_to_spec", "fsdp_spec", "unbox", "logical_names", "param_shardings", "shardings_like",
    "state_shardings", "shard_tree", "batch_sharding", "shard_batch", "jit_train_step", "with_constraint",
    "tp_mlp", "attention_core", "tp_attention", "TP_BLOCK_NAMES", "bubble_fraction", "pipeline_apply",
    "COMPRESSION", "ErrorFeedbackState", "PowerSGDState", "powersgd_bytes", "compressed_mean", "allreduce_bytes",
    "compressed_dp_train_step", "sharded_map", "sharded_grid", "collective_bytes"]

AXES = ("data", "fsdp", "tensor", "pipeline")
BATCH_AXES = ("data", "fsdp")

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


# ----------------------------------------------------------------------------------------------
# Mesh
# ----------------------------------------------------------------------------------------------

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
            raise TypeError(f"spec {dict(spec)}: axis {k!r} has size {v!r} of type {type(v).__name__}; "
                            "axis sizes must be positive integers (or -1 for the remaining devices)")
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
            raise ValueError(f"spec {dict(spec)}: the fixed axes use {fixed} devices, which does not divide "
                             f"the {n_devices} available; change the sizes")
        sizes[free[0]] = n_devices // fixed
    elif fixed != n_devices:
        raise ValueError(f"spec {dict(spec)} needs {fixed} devices but {n_devices} are available; "
                         "set one axis to -1 to absorb the rest")
    return sizes


def make_mesh(spec: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Device mesh from ``spec`` (default ``{"data": -1}``: pure data parallelism over all devices).

    Axes keep the spec's order; put the axis with the most traffic (tensor) last so it lands on
    neighbouring devices. Axis types are ``Auto`` (GSPMD sharding propagation), see the shared README.
    """
    spec = {"data": -1} if spec is None else spec
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices must be a non-empty sequence of jax devices (got an empty one); "
                         "pass e.g. jax.devices() or None for all devices")
    sizes = mesh_shape(spec, len(devices))
    names = tuple(sizes)
    shape = tuple(sizes[n] for n in names)
    auto = (jax.sharding.AxisType.Auto,) * len(names)
    if len(devices) == jax.device_count():
        return jax.make_mesh(shape, names, axis_types=auto, devices=devices)
    return Mesh(np.asarray(devices).reshape(shape), names, axis_types=auto)


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


# ----------------------------------------------------------------------------------------------
# Logical axis rules
# ----------------------------------------------------------------------------------------------

def logical_to_spec(names: Sequence[str | None] | None, mesh: Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES,
                    shape: Sequence[int] | None = None) -> P:
    """PartitionSpec for an array whose dimensions carry logical ``names``.

    Mesh axes that are missing or of size 1 are dropped, a mesh axis is used at most once per array,
    and (when ``shape`` is given) a dimension that the axes do not divide stays replicated.
    """
    if names is None:
        return P()
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(
            n is None or isinstance(n, str) for n in names):
        raise TypeError(f"names must be a sequence of logical axis names (str or None), got {names!r}")
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


def param_shardings(params: Any, mesh: Mesh, logical: Any = None, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES,
                    *, fsdp_fallback: bool = True, min_size: int = 1024) -> Any:
    """NamedSharding for every parameter.

    Args:
      params: parameter pytree (arrays, ShapeDtypeStructs, or flax partitioning boxes — their names
        are used when ``logical`` is None).
      logical: optional tree matching ``params`` whose leaves are tuples (or PartitionSpecs) of logical
        names, or None.
      rules: logical name → mesh axes.
      fsdp_fallback: leaves without names (or whose names map to no ``fsdp`` axis) are split along their
        largest divisible dimension over ``fsdp`` when the mesh has one.
    """
    if logical is None:
        logical = logical_names(params)
    params = unbox(params)
    flat, treedef = jax.tree_util.tree_flatten(params)
    names = treedef.flatten_up_to(logical) if logical is not None else [None] * len(flat)  # type: ignore[attr-defined]

    def one(x, nm):
        shape = tuple(x.shape)
        if isinstance(nm, P):  # a PartitionSpec of *logical* names (flax ``nn.get_partition_spec``)
            nm = tuple(nm) + (None,) * (len(shape) - len(nm))
        if nm is not None and len(nm) != len(shape):
            raise ValueError(f"logical names {nm} do not match a parameter of shape {shape}")
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
            if ps == shape and len(pk) <= len(key) and key[len(key) - len(pk):] == pk:
                if best is None or len(pk) > best[0]:
                    best = (len(pk), s)
        return best[1] if best else rep

    return jax.tree_util.tree_map_with_path(pick, tree)


def state_shardings(state: Any, mesh: Mesh, logical: Any = None, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES,
                    **kwargs: Any) -> Any:
    """Shardings for a :class:`ivhl_jax.train.training.TrainState`: params by :func:`param_shardings`,
    optimiser moments like their parameters, everything else replicated."""
    ps = param_shardings(state.params, mesh, logical, rules, **kwargs)
    rep = NamedSharding(mesh, P())
    return state.replace(step=rep, params=ps,
                         opt_state=shardings_like(state.opt_state, state.params, ps, mesh),
                         loss_scale=jax.tree_util.tree_map(lambda _: rep, state.loss_scale),
                         key=rep, extra=jax.tree_util.tree_map(lambda _: rep, state.extra))


def _place(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_place(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.jit(lambda a: a, out_shardings=sharding)(x)
    # Through the host: a fresh copy (``device_put`` would alias the shard already on the device, and a
    # donating train step would then delete the caller's array), and across processes each process
    # fills only its own shards (the host value must then be identical on every process).
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard_tree(tree: Any, shardings: Any) -> Any:
    """Place every leaf with its sharding (a single Sharding or a matching tree of them).

    Works across processes: host values must then be identical on every process (e.g. parameters
    initialised from the same seed).
    """
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree_util.tree_map(lambda x: _place(x, shardings), tree)
    return jax.tree_util.tree_map(_place, tree, shardings)


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
            raise ValueError(f"shard_batch: batch size {x.shape[0]} is not divisible by the {n} devices of the "
                             "batch mesh axes; pad or change the batch size")
        return _place(x, s)

    return jax.tree_util.tree_map(one, batch)


def jit_train_step(train_step: Callable, state_sharding: Any, batch_sharding_tree: Any, mesh: Mesh,
                   *, donate: bool = True) -> Callable:
    """Compile ``train_step(state, batch) -> (state, metrics)`` with explicit in/out shardings.

    Data parallel, FSDP and tensor parallel are all this one call; they differ only in the shardings
    (which :func:`state_shardings` derives from the mesh). Metrics come back replicated.
    """
    rep = NamedSharding(mesh, P())
    return jax.jit(train_step, in_shardings=(state_sharding, batch_sharding_tree),
                   out_shardings=(state_sharding, rep), donate_argnums=(0,) if donate else ())


def with_constraint(x: Any, mesh: Mesh, names: Sequence[str | None], rules: Sequence[tuple[str, Any]] = DEFAULT_RULES
                    ) -> Any:
    """``with_sharding_constraint`` by logical activation names (e.g. ``("batch", "length", "embed")``)."""
    spec = logical_to_spec(names, mesh, rules, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


# ----------------------------------------------------------------------------------------------
# Tensor parallelism (Megatron), explicit form for use inside shard_map
# ----------------------------------------------------------------------------------------------

def tp_mlp(x: jax.Array, w_in: jax.Array, b_in: jax.Array, w_out: jax.Array, b_out: jax.Array, *,
           axis: str = "tensor", activation: Callable = jax.nn.gelu) -> jax.Array:
    """Megatron MLP on one tensor shard: ``y = Σ_shards act(x W_in[:, shard] + b_in[shard]) W_out[shard, :] + b_out``.

    Call inside ``shard_map`` with ``w_in`` column-split (``P(None, axis)``), ``b_in`` split
    (``P(axis)``), ``w_out`` row-split (``P(axis, None)``), ``x`` and ``b_out`` replicated over ``axis``.
    One all-reduce (``psum``) per MLP in the forward pass. Shapes: x (..., E), w_in (E, F/T), w_out (F/T, E).
    """
    h = activation(x @ w_in + b_in)
    return jax.lax.psum(h @ w_out, axis) + b_out


def attention_core(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool = True) -> jax.Array:
    """Softmax attention per head. q, k, v: (B, T, H, D) → (B, T, H, D); scale 1/√D."""
    logits = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    if causal:
        t = q.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, axis=-1), v)


def tp_attention(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array, *,
                 axis: str = "tensor", causal: bool = True) -> jax.Array:
    """Megatron attention on one tensor shard: heads split across ``axis``, one ``psum`` at the output.

    Shapes (local): x (B, T, E); wq/wk/wv (E, H/T, D) (``P(None, axis, None)``); wo (H/T, D, E)
    (``P(axis, None, None)``). Returns (B, T, E), replicated over ``axis``.
    """
    q = jnp.einsum("bte,ehd->bthd", x, wq)
    k = jnp.einsum("bte,ehd->bthd", x, wk)
    v = jnp.einsum("bte,ehd->bthd", x, wv)
    o = attention_core(q, k, v, causal)
    return jax.lax.psum(jnp.einsum("bthd,hde->bte", o, wo), axis)


#: Logical names of the tensor-parallel block parameters used by :func:`tp_attention` / :func:`tp_mlp`.
TP_BLOCK_NAMES = {
    "wq": ("embed", "heads", "kv"), "wk": ("embed", "heads", "kv"), "wv": ("embed", "heads", "kv"),
    "wo": ("heads", "kv", "embed"), "w_in": ("embed", "mlp"), "b_in": ("mlp",), "w_out": ("mlp", "embed"),
    "b_out": ("embed",),
}


# ----------------------------------------------------------------------------------------------
# Pipeline parallelism (GPipe)
# ----------------------------------------------------------------------------------------------

def bubble_fraction(n_stages: int, n_microbatches: int, repeats: int = 1) -> float:
    """Idle fraction of a GPipe schedule: (S − 1) / (R·M + S − 1)."""
    check_scalar(n_stages, "n_stages", integer=True, minimum=1)
    check_scalar(n_microbatches, "n_microbatches", integer=True, minimum=1)
    return (n_stages - 1) / (repeats * n_microbatches + n_stages - 1)


def pipeline_apply(stage_fn: Callable[[Any, jax.Array], jax.Array], stage_params: Any, x: jax.Array, mesh: Mesh, *,
                   n_microbatches: int, axis: str = "pipeline", batch_axis: str | Sequence[str] | None = "auto"
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
            raise ValueError(f"pipeline_apply: stage_params leaves need a leading axis of {s_count} stages "
                             f"(mesh axis {axis!r}); got shape {leaf.shape}")
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
                outs, jnp.where(write, out, outs[jnp.clip(slot, 0, m - 1)]), jnp.clip(slot, 0, m - 1), 0)
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


# ----------------------------------------------------------------------------------------------
# Gradient compression with error feedback
# ----------------------------------------------------------------------------------------------

COMPRESSION = ("none", "bf16", "int8", "powersgd")
_BYTES = {"none": 4, "bf16": 2, "int8": 1}


class ErrorFeedbackState(flax.struct.PyTreeNode):
    """Per-device residual of the compression (added back before the next step's compression)."""

    error: jax.Array


def _quantize(v: jax.Array, method: str, axis: str) -> tuple[jax.Array, jax.Array]:
    if method == "bf16":
        return v.astype(jnp.bfloat16), jnp.ones((), jnp.float32)
    scale = jax.lax.pmax(jnp.max(jnp.abs(v)), axis) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(v / scale), -127, 127).astype(jnp.int8), scale


def _wire(q: jax.Array) -> jax.Array:
    # Move bf16 as raw 16-bit words: some backends (XLA:CPU) widen bf16 collectives to f32 otherwise.
    return jax.lax.bitcast_convert_type(q, jnp.uint16) if q.dtype == jnp.bfloat16 else q


def _unwire(q: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.bitcast_convert_type(q, dtype) if q.dtype != dtype else q


def _dequantize(q: jax.Array, scale: jax.Array) -> jax.Array:
    return q.astype(jnp.float32) * scale


class PowerSGDState(flax.struct.PyTreeNode):
    """Per-leaf error-feedback residual (per device) and the warm-started right factor Q (shared)."""

    error: tuple
    q: tuple


def _powersgd(axis: str, rank: int) -> optax.GradientTransformation:
    def as_matrix(x):
        return x.reshape(x.shape[0], -1)

    def init(params):
        leaves = jax.tree_util.tree_leaves(params)
        errors: list[Any] = []
        qs: list[Any] = []
        for i, x in enumerate(leaves):
            if x.ndim < 2 or min(x.shape[0], x.size // x.shape[0]) <= rank:
                errors.append(None)
                qs.append(None)  # small or 1-D: sent uncompressed
                continue
            m = x.size // x.shape[0]
            errors.append(jnp.zeros((x.shape[0], m), jnp.float32))
            # The same Q on every device (fixed key): the factors must agree across devices.
            qs.append(jax.random.normal(jax.random.fold_in(jax.random.key(17), i), (m, rank), jnp.float32))
        return PowerSGDState(error=tuple(errors), q=tuple(qs))

    def update(grads, state, params=None):
        del params
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        outs: list[Any] = []
        errors: list[Any] = []
        qs: list[Any] = []
        for g, e, q in zip(leaves, state.error, state.q, strict=True):
            if q is None:
                outs.append(jax.lax.pmean(g, axis))
                errors.append(None)
                qs.append(None)
                continue
            mat = as_matrix(g).astype(jnp.float32) + e
            p_ = jax.lax.pmean(mat @ q, axis)
            p_, _ = jnp.linalg.qr(p_)
            q_new = jax.lax.pmean(mat.T @ p_, axis)
            approx = p_ @ q_new.T
            outs.append(approx.reshape(g.shape).astype(g.dtype))
            errors.append(mat - approx)
            qs.append(q_new)
        return treedef.unflatten(outs), PowerSGDState(error=tuple(errors), q=tuple(qs))  # type: ignore[attr-defined]

    return optax.GradientTransformation(init, update)


def powersgd_bytes(params: Any, n_devices: int, rank: int) -> float:
    """Ring-model bytes per device per step of rank-``rank`` PowerSGD: two f32 all-reduces of the
    factors P (rows × r) and Q (cols × r) per matrix, small/1-D leaves sent uncompressed."""
    check_scalar(n_devices, "n_devices", integer=True, minimum=1)
    check_scalar(rank, "rank", integer=True, minimum=1)
    n = n_devices
    total = 0
    for x in jax.tree_util.tree_leaves(params):
        rows = x.shape[0] if x.ndim else 1
        cols = x.size // max(rows, 1)
        total += (rows + cols) * rank if x.ndim >= 2 and min(rows, cols) > rank else x.size
    return 2.0 * (n - 1) / n * total * 4


def compressed_mean(axis: str, method: str = "int8", *, rank: int = 4) -> optax.GradientTransformation:
    """Optax transform: replace each device's gradient by the compressed mean over mesh axis ``axis``.

    Runs inside ``shard_map`` (``axis`` bound). All gradient leaves are flattened into one f32 vector
    ``v = g + e`` (``e``: this device's error-feedback residual) and all-reduced in two phases, both in
    the compressed dtype: a reduce-scatter (``all_to_all`` of quantised chunks, summed in f32 by the
    chunk owner) and an ``all_gather`` of the re-quantised mean chunk. Both quantisation residuals are
    fed back (the owner's phase-2 residual ×n, so that it enters the next mean exactly once), which is
    what makes compressed SGD/Adam converge like uncompressed (Seide et al. 2014; Karimireddy et al. 2019).

    ``method``: ``"none"`` (f32 ``pmean``, no state), ``"bf16"`` (2 bytes/value) or ``"int8"``
    (1 byte/value, one shared scale per phase = one scalar ``pmax``). Wire bytes per device per step
    for n devices and L values: 2·(n−1)/n·L·bytes (ring model), see :func:`allreduce_bytes`.
    ``"powersgd"``: rank-``rank`` PowerSGD (Vogels et al. 2019) per weight matrix ``M`` (leaf reshaped
    to rows × rest): ``P = mean(M Q)``, orthonormalised, ``Q = mean(Mᵀ P)``, update ``P Qᵀ``, with
    per-device error feedback ``M − P Qᵀ`` and Q warm-started; vectors go uncompressed.
    """
    check_choice(method, "method", COMPRESSION)
    if method == "powersgd":
        check_scalar(rank, "rank", integer=True, minimum=1)
        return _powersgd(axis, int(rank))

    def init(params):
        if method == "none":
            return optax.EmptyState()
        flat, _ = jax.flatten_util.ravel_pytree(params)
        return ErrorFeedbackState(error=jnp.zeros(flat.shape, jnp.float32))

    def update(grads, state, params=None):
        del params
        if method == "none":
            return jax.tree_util.tree_map(lambda g: jax.lax.pmean(g, axis), grads), state
        flat, unravel = jax.flatten_util.ravel_pytree(grads)
        n = jax.lax.psum(1, axis)
        length = flat.shape[0]
        pad = (-length) % n
        v = jnp.pad(flat.astype(jnp.float32), (0, pad)) + jnp.pad(state.error, (0, pad))
        q, s1 = _quantize(v, method, axis)
        err = v - _dequantize(q, s1)
        chunks = q.reshape(n, -1)
        recv = _unwire(jax.lax.all_to_all(_wire(chunks), axis, 0, 0, tiled=True), q.dtype)  # row j: from device j
        mean_chunk = jnp.sum(recv.astype(jnp.float32), axis=0) * s1 / n
        q2, s2 = _quantize(mean_chunk, method, axis)
        me = jax.lax.axis_index(axis)
        resid2 = (mean_chunk - _dequantize(q2, s2)) * n
        err = jax.lax.dynamic_update_slice_in_dim(
            err, jax.lax.dynamic_slice_in_dim(err, me * chunks.shape[1], chunks.shape[1]) + resid2,
            me * chunks.shape[1], 0)
        full = _dequantize(_unwire(jax.lax.all_gather(_wire(q2), axis, tiled=True), q2.dtype), s2)
        out = unravel(full[:length].astype(flat.dtype))
        return out, ErrorFeedbackState(error=err[:length])

    return optax.GradientTransformation(init, update)


def allreduce_bytes(n_values: int, n_devices: int, method: str = "none") -> float:
    """Bytes each device sends per gradient all-reduce in the ring/bandwidth-optimal model:
    reduce-scatter + all-gather = 2·(n−1)/n·L·bytes_per_value (+ the scalar scales for int8)."""
    check_choice(method, "method", COMPRESSION[:3])
    check_scalar(n_values, "n_values", integer=True, nonnegative=True)
    check_scalar(n_devices, "n_devices", integer=True, minimum=1)
    n = n_devices
    extra = 2 * 4 * (n - 1) if method == "int8" else 0
    return 2.0 * (n - 1) / n * n_values * _BYTES[method] + extra


def _metric_mean(metrics: dict, axis: str) -> dict:
    return jax.tree_util.tree_map(lambda m: jax.lax.pmean(m.astype(jnp.float32), axis), metrics)


def compressed_dp_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, mesh: Mesh, *,
                             method: str = "int8", axis: str = "data", policy: str = "fp32", rank: int = 4
                             ) -> tuple[Callable, Callable]:
    """Data-parallel training with a compressed gradient all-reduce, built on ``make_train_step``.

    Returns ``(init_state, step)``: ``init_state(params, key)`` builds a TrainState whose optimiser is
    ``chain(compressed_mean(axis, method), optimizer)`` (the error-feedback residual is per device,
    stored sharded over ``axis``); ``step(state, batch) -> (state, metrics)`` is jitted; the batch's
    leading axis is split over ``axis``; metrics are averaged over devices. ``loss_fn`` follows
    ``ivhl_jax.train.training`` (returns the mean over its local batch). Loss scaling (fp16) is not
    supported here: its skip decision would be local to each device.
    """
    from ivhl_jax.core import precision
    from ivhl_jax.train import training

    check_choice(method, "method", COMPRESSION)
    if precision.get_policy(policy).compute_dtype == jnp.float16:
        raise ValueError("compressed_dp_train_step: fp16 loss scaling is not supported; use policy 'fp32' or 'bf16'")
    if axis not in mesh.shape:
        raise ValueError(f"compressed_dp_train_step: mesh has no axis {axis!r} (axes: {tuple(mesh.shape)})")
    opt = optax.chain(compressed_mean(axis, method, rank=rank), optimizer)
    inner = training.make_train_step(loss_fn, opt, policy)

    def specs_of(state):
        def spec(path, _):
            return P(axis) if any(getattr(k, "name", None) == "error" for k in path) else P()
        return jax.tree_util.tree_map_with_path(spec, state)

    def init_state(params, key):
        def local(p, k):
            return training.init_train_state(p, opt, key=k, policy=policy)

        abstract = jax.eval_shape(lambda p, k: training.init_train_state(p, opt, key=k, policy=policy), params, key)
        specs = specs_of(abstract)
        fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P()), out_specs=specs, check_vma=False))
        return fn(params, key)

    cache: dict = {}

    def jitted(state, batch):
        k = (jax.tree_util.tree_structure(state), jax.tree_util.tree_structure(batch))
        if k not in cache:
            specs = specs_of(state)
            bspec = jax.tree_util.tree_map(lambda _: P(axis), batch)

            def local(st, b):
                new, metrics = inner(st, b)
                return new, _metric_mean(metrics, axis)

            cache[k] = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(specs, bspec), out_specs=(specs, P()),
                                             check_vma=False), donate_argnums=(0,))
        return cache[k]

    def step(state, batch):
        return jitted(state, batch)(state, batch)

    step.jitted = jitted  # type: ignore[attr-defined]  # ``step.jitted(state, batch).lower(state, batch).compile()`` for HLO inspection
    return init_state, step


# ----------------------------------------------------------------------------------------------
# Sharded simulations
# ----------------------------------------------------------------------------------------------

def sharded_map(fn: Callable[..., Any], points: jax.Array, *args: Any, mesh: Mesh,
                axis: str | Sequence[str] | None = None) -> Any:
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
    out = jax.shard_map(lambda p, *a: fn(p, *a), mesh=mesh, in_specs=(spec, *arg_specs), out_specs=spec,
                        check_vma=False)(padded, *args)
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
        raise ValueError(f"sharded_grid: dimension {dim} of size {grid.shape[dim]} is not divisible by the "
                         f"{axis_size(mesh, axes)} devices of {axes}")
    return _place(grid, NamedSharding(mesh, P(*spec)))


# ----------------------------------------------------------------------------------------------
# Communication accounting
# ----------------------------------------------------------------------------------------------

_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")
_DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "s32": 4, "u32": 4, "pred": 1,
                "s64": 8, "u64": 8, "c64": 8, "c128": 16, "s16": 2, "u16": 2}
_SHAPE = re.compile(r"\b(f64|f32|bf16|f16|s8|u8|s16|u16|s32|u32|s64|u64|pred|c64|c128)\[([0-9,]*)\]")


def collective_bytes(compiled_or_text: Any, n_devices: int | None = None) -> dict[str, Any]:
    """Per-device bytes of the results of each collective in a compiled program (from its HLO text).

    Counts every ``all-reduce``, ``all-gather``, ``all-to-all``, ``reduce-scatter`` and
    ``collective-permute`` instruction (``-start`` variants included, ``-done`` skipped), summing the
    sizes of its result shapes. A loop body is counted once (multiply by trip count yourself).
    Returns ``{"total": bytes, "by_op": {op: bytes}, "count": {op: n}}``; with ``n_devices`` also
    ``"wire_total"``: bytes each device sends under the bandwidth-optimal (ring) model — all-reduce
    2(n−1)/n·size, all-gather and all-to-all (n−1)/n·size, reduce-scatter (n−1)·size, permute size.
    """
    if n_devices is not None:
        check_scalar(n_devices, "n_devices", integer=True, minimum=1)
    text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
    by_op: dict[str, int] = {}
    count: dict[str, int] = {}
    for line in text.splitlines():
        if "=" not in line:
            continue
        rhs = line.split("=", 1)[1].strip()
        op = None
        for c in _COLLECTIVES:
            if re.search(rf"\s{c}(-start)?\(", " " + rhs):
                op = c
                break
        if op is None or re.search(r"-done\(", rhs):
            continue
        head = rhs.split(op, 1)[0]
        nbytes = 0
        for dt, dims in _SHAPE.findall(head):
            size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
            nbytes += size * _DTYPE_BYTES[dt]
        if op in ("all-gather", "collective-permute") and "-start" in rhs and head.count("[") > 1:
            nbytes //= 2  # async start returns (operand, result)
        by_op[op] = by_op.get(op, 0) + nbytes
        count[op] = count.get(op, 0) + 1
    out: dict[str, Any] = {"total": int(sum(by_op.values())), "by_op": by_op, "count": count}
    if n_devices is not None:
        n = int(n_devices)
        factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "all-to-all": (n - 1) / n,
                  "reduce-scatter": float(n - 1), "collective-permute": 1.0}
        out["wire_total"] = float(sum(factor[op] * b for op, b in by_op.items()))
    return out
