"""Distributed FFTs and Fourier multipliers for fields sharded over a device mesh (slab and pencil).

A split-step kinetic propagator is the Fourier multiplier ``ψ ↦ F⁻¹[(1 + m(k)) · F ψ]`` over the grid
axes (see :mod:`ivhl_jax.numerics.spectral`). When ψ is sharded along one grid axis (a *slab*
decomposition, one mesh axis) or two (a *pencil*, two mesh axes), this module computes it without ever
holding the whole field on one device: inside :func:`jax.shard_map`, each device transforms the axes it
holds whole, then a ``jax.lax.all_to_all`` moves the sharding to an axis already transformed, and the
remaining axis is transformed locally. For a 3-D field of shape (X, Y, Z):

* slab ``P("x", None, None)`` on p devices: FFT(Y, Z) → all-to-all (X/p, Y, Z) → (X, Y, Z/p) → FFT(X).
  The transform ends with the field in k-space laid out ``P(None, None, "x")``.
* pencil ``P("x", "y", None)`` on a (p_x, p_y) mesh: FFT(Z) → all-to-all over "y" → (X/p_x, Y, Z/p_y)
  → FFT(Y) → all-to-all over "x" → (X, Y/p_x, Z/p_y) → FFT(X); k-space layout ``P(None, "x", "y")``.

The multiplier is applied in that transposed k-space layout (the factor ``m`` is placed there by
:meth:`FFTLayout.place_factor`, each device receiving only its block), and the inverse transform
retraces the steps, so the field comes back in the layout it was given. Each all-to-all moves a
fraction (p − 1)/p of one shard per device; a slab multiplier costs 2 all-to-alls, a pencil one 4, and
nothing else is communicated (no all-gather). Leading axes that are not transformed (vmap or ensemble
axes) may carry their own sharding and are untouched.

Requirements (checked with one-line errors naming the setting and the fix): every sharded grid axis is
divisible by its mesh axis size (the field's own sharding), each all-to-all target axis is divisible
by the size of the mesh axis it receives, and at least one transformed axis is unsharded (a 2-D field
on a 2-axis pencil has nowhere to transpose to).

Everything here is differentiable (``shard_map``, ``all_to_all`` and the FFT have transposes) and
composes with ``jit``, ``vmap`` and ``lax.scan``. It runs on one process or several
(``jax.distributed``): the mesh may span processes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ivhl_jax.core.mesh import device_mesh, place

__all__ = [
    "FFTLayout",
    "fft_layout",
    "check_layout",
    "spectral_multiply",
    "fftn",
    "ifftn",
    "parse_mesh",
    "mesh_sizes",
    "host_readable",
]

_AxisEntry = Any  # None, a mesh axis name, or a tuple of names


def _names(entry: _AxisEntry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _fmt(spec: Sequence[_AxisEntry]) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


@dataclasses.dataclass(frozen=True)
class FFTLayout:
    """How a grid-shaped field is sharded for the distributed FFT: a mesh and a partition spec.

    Attributes:
      mesh: the :class:`jax.sharding.Mesh` (any axis types; it may span processes).
      spec: one entry per grid axis (a tuple; ``None``, a mesh axis name, or a tuple of names), e.g.
        ``(("x",), None, None)`` for a slab. Shorter specs given to :func:`fft_layout` are padded with None.

    Static and hashable: it is meant to be held as a static (non-pytree) setting of a system.
    Build it with :func:`fft_layout`, which validates it.
    """

    mesh: Mesh
    spec: tuple[_AxisEntry, ...]

    @property
    def ndim(self) -> int:
        return len(self.spec)

    def axis_size(self, entry: _AxisEntry) -> int:
        return math.prod(int(self.mesh.shape[n]) for n in _names(entry))

    @property
    def sharded(self) -> bool:
        """True when some grid axis is split over more than one device."""
        return any(self.axis_size(e) > 1 for e in self.spec)

    def partition_spec(self, ndim: int | None = None) -> PartitionSpec:
        """The real-space :class:`PartitionSpec` of a field with ``ndim`` axes (leading batch axes unsharded)."""
        ndim = self.ndim if ndim is None else ndim
        return PartitionSpec(*((None,) * (ndim - self.ndim) + self.spec))

    def sharding(self, ndim: int | None = None) -> NamedSharding:
        """The real-space :class:`NamedSharding` of a field with ``ndim`` axes (default: the grid's)."""
        return NamedSharding(self.mesh, self.partition_spec(ndim))

    def k_spec(self, shape: Sequence[int], axes: Sequence[int] | None = None) -> PartitionSpec:
        """The layout of ``F ψ`` over ``axes`` (default: all grid axes) as :func:`fftn` leaves it."""
        shape = tuple(int(n) for n in shape)
        axes = _norm_axes(axes, len(shape), self.ndim)
        return PartitionSpec(*_schedule(self, shape, axes)[1])

    def check_shape(self, shape: Sequence[int], name: str = "grid", axes: Sequence[int] | None = None) -> None:
        """Raise a one-line ValueError when ``shape`` (ending in the grid) cannot use this layout."""
        shape = tuple(int(n) for n in shape)
        _schedule(self, shape, _norm_axes(axes, len(shape), self.ndim), name)

    def place(self, x: Any, name: str = "psi") -> jax.Array:
        """``x`` (NumPy or JAX, global shape) on this layout's real-space sharding, each device (and each
        process) building only its own block; an array already laid out so is returned as is."""
        return _place(x, self.sharding(np.ndim(x)), name, self)

    def place_factor(self, m: Any, shape: Sequence[int], axes: Sequence[int] | None = None) -> jax.Array:
        """A Fourier factor ``m`` (broadcastable to ``shape``) on the k-space layout that
        :func:`spectral_multiply` uses for ``axes``: each device holds only the block it multiplies."""
        spec = _factor_spec(self.k_spec(shape, axes), np.shape(m), len(shape))
        return _place(m, NamedSharding(self.mesh, spec), "factor_m1", None)


def _place(x: Any, sharding: NamedSharding, name: str, layout: FFTLayout | None) -> jax.Array:
    """``x`` on ``sharding`` by :func:`ivhl_jax.core.mesh.place` (new buffers), after the checks that name ``name``:
    an array sharded otherwise than the layout, or a replicated one spread over processes, is refused."""
    if (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and not x.sharding.is_equivalent_to(sharding, x.ndim)
    ):
        spec = getattr(x.sharding, "spec", None)
        if layout is not None and spec is not None and any(e is not None for e in spec):
            raise ValueError(
                f"{name} is sharded as {_fmt(tuple(spec))} but the FFT layout is "
                f"{_fmt(tuple(sharding.spec))}; device_put {name} with layout.sharding() or build the "
                f"layout with fft_layout(mesh, {_fmt(tuple(spec))})"
            )
        if not x.is_fully_addressable:
            raise ValueError(
                f"{name} spans processes with sharding {x.sharding}; give it on the layout's sharding "
                "(layout.sharding()) or as a NumPy array of the global shape"
            )
    return place(x, sharding)


def _norm_axes(axes: Sequence[int] | None, ndim: int, grid_ndim: int) -> tuple[int, ...]:
    if ndim < grid_ndim:
        raise ValueError(
            f"the field has {ndim} axes but the FFT layout describes {grid_ndim} grid axes; "
            f"give a field whose last {grid_ndim} axes are the grid"
        )
    if axes is None:
        return tuple(range(ndim - grid_ndim, ndim))
    try:
        axes = tuple(int(a) for a in axes)
    except TypeError:
        raise TypeError(f"axes must be a sequence of axis indices, got {axes!r}") from None
    if not all(-ndim <= a < ndim for a in axes) or len({a % ndim for a in axes}) != len(axes):
        raise ValueError(f"axes must be distinct axis indices of the field (ndim {ndim}), got {axes}")
    return tuple(sorted(a % ndim for a in axes))


@functools.lru_cache(maxsize=256)
def _schedule_cached(
    layout: FFTLayout, shape: tuple[int, ...], axes: tuple[int, ...], name: str
) -> tuple[tuple[tuple[Any, ...], ...], tuple[_AxisEntry, ...]]:
    ndim = len(shape)
    lead = ndim - layout.ndim
    cur: list[_AxisEntry] = [None] * lead + [e for e in layout.spec]
    where = f"{name} shape {shape} on {_fmt(tuple(cur))} (mesh {dict(layout.mesh.shape)})"
    for d, e in enumerate(cur):
        p = layout.axis_size(e)
        if shape[d] % p:
            raise ValueError(
                f"{where}: axis {d} has {shape[d]} points, not divisible by the {p} devices of mesh "
                f"axis {e!r}; use a mesh whose axis sizes divide the grid (e.g. mesh={_suggest(shape)}) "
                f"or a grid size that is a multiple of {p}"
            )
    sharded = {d for d in axes if layout.axis_size(cur[d]) > 1}
    for d in range(ndim):  # entries of size 1 are unsharded: drop them so the schedule never moves them
        if layout.axis_size(cur[d]) == 1:
            cur[d] = None
    ops: list[tuple[Any, ...]] = []
    local = tuple(d for d in axes if d not in sharded)
    if local:
        ops.append(("fft", local))
    done = set(local)
    pending = sorted(sharded)
    while pending:
        d = pending.pop()  # the last sharded axis first: its neighbour toward the minor end is free soonest
        # Move d's sharding to an unsharded axis that no later transform needs: one already transformed
        # (preferred; the last grid axis first) or a grid axis this transform does not touch.
        free = [
            u
            for u in range(ndim - 1, lead - 1, -1)
            if cur[u] is None and u not in pending and u != d and (u in done or u not in axes)
        ]
        free.sort(key=lambda u: (u not in done, -u))
        if not free:
            raise ValueError(
                f"{where}: every transformed axis is sharded, so the distributed FFT has no axis to "
                f"transpose into; leave at least one grid axis unsharded (e.g. shard "
                f"{len(sharded) - 1} of the {len(axes)} transformed axes)"
            )
        p = layout.axis_size(cur[d])
        fits = [u for u in free if shape[u] % p == 0]
        if not fits:
            raise ValueError(
                f"{where}: moving mesh axis {cur[d]!r} ({p} devices) off axis {d} needs an unsharded "
                f"axis divisible by {p}, but the candidates {[shape[u] for u in free]} are not; use a "
                f"mesh whose axis sizes divide every grid axis (e.g. mesh={_suggest(shape)})"
            )
        u = fits[0]
        ops.append(("a2a", cur[d], u, d))  # split u, concatenate d
        cur[u], cur[d] = cur[d], None
        ops.append(("fft", (d,)))
        done.add(d)
    return tuple(ops), tuple(cur)


def _suggest(shape: tuple[int, ...]) -> str:
    g = math.gcd(*shape) if shape else 1
    n = jax.device_count()
    p = max((k for k in range(1, n + 1) if n % k == 0 and g % k == 0), default=1)
    return str(p)


def _schedule(layout: FFTLayout, shape: tuple[int, ...], axes: tuple[int, ...], name: str = "field"):
    return _schedule_cached(layout, shape, axes, name)


def _run(x: jax.Array, ops: tuple[tuple[Any, ...], ...], inverse: bool) -> jax.Array:
    """The local part of the transform (inside shard_map): FFTs over whole axes and all-to-all transposes."""
    seq = reversed(ops) if inverse else ops
    for op in seq:
        if op[0] == "fft":
            x = (jnp.fft.ifftn if inverse else jnp.fft.fftn)(x, axes=op[1])
        else:
            _, name, split, concat = op
            if inverse:
                split, concat = concat, split
            x = jax.lax.all_to_all(x, name, split, concat, tiled=True)
    return x


def _factor_spec(k_spec: PartitionSpec, mshape: tuple[int, ...], ndim: int) -> PartitionSpec:
    """The factor's spec: the field's k-space spec on its trailing axes, None where the factor broadcasts."""
    if len(mshape) > ndim:
        raise ValueError(f"factor_m1 has {len(mshape)} axes, more than the field's {ndim}")
    ks = tuple(k_spec)[ndim - len(mshape) :]
    return PartitionSpec(*(None if n == 1 else e for n, e in zip(mshape, ks)))


def spectral_multiply(
    psi: jax.Array, factor_m1: Any, layout: FFTLayout, axes: Sequence[int] | None = None
) -> jax.Array:
    """``F⁻¹[(1 + m) F ψ]`` over ``axes`` for ψ laid out as ``layout`` (module docstring): local FFTs and
    all-to-all transposes only; the result has ψ's layout.

    Args:
      psi: complex array ending in the grid axes (leading batch axes allowed), global shape.
      factor_m1: ``m = f − 1``, broadcastable to ψ without enlarging it, same precision; best placed with
        :meth:`FFTLayout.place_factor` (any other placement is resliced by XLA on every call).
      layout: an :class:`FFTLayout` (static).
      axes: transformed axes (default: the grid axes).
    """
    if not isinstance(layout, FFTLayout):
        raise TypeError(
            f"layout must be an FFTLayout (build it with fft_layout(mesh, spec)), got {type(layout).__name__}"
        )
    shape = tuple(np.shape(psi))
    ax = _norm_axes(axes, len(shape), layout.ndim)
    ops, kspec = _schedule(layout, shape, ax, "psi")
    mshape = tuple(np.shape(factor_m1))
    try:
        full = np.broadcast_shapes(mshape, shape)
    except ValueError:
        full = None
    if full != shape:
        raise ValueError(f"factor_m1 of shape {mshape} must broadcast to psi's shape {shape} without enlarging it")
    m = jnp.asarray(factor_m1)
    rspec = layout.partition_spec(len(shape))
    fspec = _factor_spec(PartitionSpec(*kspec), mshape, len(shape))

    def local(p, mm):
        p = _run(p, ops, inverse=False)
        return _run(p + p * mm, ops, inverse=True)

    fn = jax.shard_map(local, mesh=layout.mesh, in_specs=(rspec, fspec), out_specs=rspec)
    return fn(psi, m)


def fftn(x: jax.Array, layout: FFTLayout, axes: Sequence[int] | None = None) -> tuple[jax.Array, PartitionSpec]:
    """The forward FFT of ``x`` (laid out as ``layout``) over ``axes``, and the k-space spec it is left in."""
    return _transform(x, layout, axes, "x", inverse=False)


def ifftn(xk: jax.Array, layout: FFTLayout, axes: Sequence[int] | None = None) -> jax.Array:
    """The inverse of :func:`fftn`: ``xk`` in the k-space layout :func:`fftn` leaves, back to ``layout``."""
    return _transform(xk, layout, axes, "xk", inverse=True)[0]


def _transform(
    x: jax.Array, layout: FFTLayout, axes: Sequence[int] | None, name: str, *, inverse: bool
) -> tuple[jax.Array, PartitionSpec]:
    """:func:`fftn` (from ``layout``'s spec to the k-space spec) or, with ``inverse``, :func:`ifftn` (back) of the
    array ``x`` (its argument ``name`` in errors); returns the result and the k-space spec."""
    shape = tuple(np.shape(x))
    ops, kspec = _schedule(layout, shape, _norm_axes(axes, len(shape), layout.ndim), name)
    rspec, k_spec = layout.partition_spec(len(shape)), PartitionSpec(*kspec)
    fn = jax.shard_map(
        functools.partial(_run, ops=ops, inverse=inverse),
        mesh=layout.mesh,
        in_specs=k_spec if inverse else rspec,
        out_specs=rspec if inverse else k_spec,
    )
    return fn(x), k_spec


def fft_layout(mesh: Mesh, spec: PartitionSpec | Sequence[_AxisEntry], shape: Sequence[int] | None = None) -> FFTLayout:
    """Validate and build an :class:`FFTLayout` for fields sharded as ``spec`` over ``mesh``.

    Args:
      mesh: a device mesh (e.g. ``ivhl_jax.core.mesh.device_mesh((4, 2), ("x", "y"))``).
      spec: a PartitionSpec (or sequence) over the grid axes: ``P("x")`` is a slab, ``P("x", "y")`` a
        pencil; missing trailing entries are unsharded.
      shape: the grid shape, checked now if given (otherwise at the first transform).
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh (e.g. ivhl_jax.core.mesh.device_mesh((4, 2), ('x', 'y'))), "
            f"got {type(mesh).__name__}"
        )
    if isinstance(spec, (str, bytes)) or not isinstance(spec, (PartitionSpec, Sequence)):
        raise TypeError(f"spec must be a PartitionSpec over the grid axes, e.g. P('x', 'y'), got {spec!r}")
    entries = tuple(spec)
    used: list[str] = []
    for e in entries:
        names = _names(e)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"spec entries must be None, a mesh axis name or a tuple of names, got {e!r} in {_fmt(entries)}"
            )
        for n in names:
            if n not in mesh.shape:
                raise ValueError(
                    f"spec {_fmt(entries)} names mesh axis {n!r}, which the mesh "
                    f"{dict(mesh.shape)} lacks; use one of {list(mesh.shape)}"
                )
            if n in used:
                raise ValueError(
                    f"spec {_fmt(entries)} uses mesh axis {n!r} twice; each mesh axis may shard one grid axis"
                )
            used.append(n)
    if shape is not None:
        shape = tuple(int(n) for n in shape)
        entries = entries + (None,) * (len(shape) - len(entries))
        if len(entries) > len(shape):
            raise ValueError(f"spec {_fmt(entries)} has more entries than the grid {shape} has axes")
    layout = FFTLayout(mesh, entries)
    if shape is not None:
        layout.check_shape(shape)
    return layout


def check_layout(layout: Any, shape: Sequence[int], *, fft: str = "xla", name: str = "layout") -> FFTLayout:
    """Validate a system's ``layout`` setting for a grid of ``shape``: an :class:`FFTLayout` the grid can use
    with the ``"xla"`` FFT backend. Errors are one line and start with ``name``."""
    if not isinstance(layout, FFTLayout):
        raise TypeError(
            f"{name} must be an FFTLayout (e.g. distributed_fft.parse_mesh('4x2', ndim) or "
            f"fft_layout(mesh, P('x', 'y'))) or None, got {type(layout).__name__} {layout!r}"
        )
    if fft != "xla":
        raise ValueError(
            f"{name}: a sharded field uses the distributed FFT, which runs XLA's FFT on each shard; "
            f"use fft='xla' (got fft={fft!r}) or layout=None"
        )
    shape = tuple(int(n) for n in shape)
    if len(layout.spec) > len(shape):
        raise ValueError(f"{name}: spec {_fmt(layout.spec)} has more entries than the grid {shape} has axes")
    full = FFTLayout(layout.mesh, tuple(layout.spec) + (None,) * (len(shape) - len(layout.spec)))
    try:
        full.check_shape(shape, "grid")
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return full


def host_readable(x: Any) -> bool:
    """False only for a concrete JAX array spread over several processes (no host copy of it can be read);
    validation that reads values on the host skips such arrays (they were checked before they were placed)."""
    return not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or x.is_fully_addressable


def mesh_sizes(text: str | int) -> tuple[int, ...]:
    """The device counts of a mesh setting: ``"8"`` (or 8) → (8,), ``"4x2"`` → (4, 2), ``"1"`` or ``""`` → (1,).
    A ValueError (one line, naming the setting) for anything else; no device is looked at."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise TypeError(f"mesh must be a string like '8' or '4x2', got {type(text).__name__} {text!r}")
    t = text.strip().lower()
    if t in ("", "none"):
        return (1,)
    try:
        sizes = tuple(int(s) for s in t.split("x"))
    except ValueError:
        raise ValueError(f"mesh={text!r} is not of the form '8' or '4x2' (device counts per mesh axis)") from None
    if not 1 <= len(sizes) <= 2 or any(s < 1 for s in sizes):
        raise ValueError(f"mesh={text!r}: give one (slab) or two (pencil) positive sizes, e.g. mesh=8 or mesh=4x2")
    return sizes


def parse_mesh(text: str | int, ndim: int, devices: Sequence[jax.Device] | None = None) -> FFTLayout | None:
    """An :class:`FFTLayout` from a command-line mesh setting: ``"8"`` (slab over the first grid axis),
    ``"4x2"`` (pencil over the first two), ``"1"`` or ``""`` (None: unsharded). Axis names are x, y.

    The product must equal the number of devices (all processes); the grid has ``ndim`` axes.
    """
    sizes = mesh_sizes(text)
    if math.prod(sizes) == 1:
        return None
    if len(sizes) >= ndim:
        raise ValueError(
            f"mesh={text!r} shards {len(sizes)} axes of a {ndim}-D grid; the distributed FFT needs "
            f"one unsharded axis: use at most {ndim - 1} sizes (e.g. mesh={math.prod(sizes)})"
        )
    names = ("x", "y")[: len(sizes)]
    try:
        mesh = device_mesh(sizes, names, devices)
    except ValueError as e:  # e.g. the wrong number of devices: the error names the setting
        raise ValueError(f"mesh={text!r}: {e}") from None
    return FFTLayout(mesh, names + (None,) * (ndim - len(sizes)))
