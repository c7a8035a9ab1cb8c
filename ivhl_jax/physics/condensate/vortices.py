"""Vortex detection and tracking: point vortices of a 2-D ψ (:func:`vortices`) and vortex lines of a 3-D ψ
(:func:`vortex_lines`), jit-compiled, on device, with static maximum sizes (padded arrays and a count), so a
whole trajectory is processed at once (leading batch axes, e.g. time, are vmapped).

Units: ħ = m = 1, trap units (see :mod:`ivhl_jax.physics.condensate`); the grid is the periodic box of
:class:`~ivhl_jax.physics.condensate.Grid` (``indexing="ij"``).

Detection. The phase winding around every plaquette of the periodic grid,

    q = (1/2π) Σ_edges wrap(θ_{next} − θ_{this}) ∈ ℤ,     loop (i, j) → (i+1, j) → (i+1, j+1) → (i, j+1),

(:func:`ivhl_jax.physics.fields.vortex_map`, counter-clockwise about the plaquette's normal) is nonzero exactly
where a vortex pierces the plaquette. Plaquettes whose local mean density over a (2·window + 2)-cell box is
below ``min_density``·max|ψ|² are ignored (the near-empty region outside a trapped cloud has phase
singularities that are not vortices). Wrap-around plaquettes count: the grid is periodic.

Sub-grid position. Near a vortex of unit charge ψ vanishes linearly, ψ ≈ a + b·ξ + c·η in the plaquette's
coordinates (ξ, η) ∈ [0, 1]² (units of the grid spacing). The least-squares fit of (a, b, c) to the four
corner values and the real solution of a + bξ + cη = 0 give the position; it is exact for a field that is
linear across the plaquette (any core resolved over a few grid spacings, any tilt of a 3-D line against the
plaquette) and is clipped to the plaquette, where the winding placed the vortex.

Lines (3-D). Windings are taken on the three face orientations (faces normal to x, y and z). A nonzero face
is a piercing: a point of the line (its sub-grid position in the face) with the line's direction along
+sign(q)·normal (right-hand rule: the circulation is counter-clockwise about the line direction). The line
entering a cell leaves it through one of the cell's other pierced faces (the winding of a closed surface is
zero: in = out); with several lines in one cell, the k-th entering piercing is paired with the k-th leaving
one (faces in a fixed order). The successor map is turned into ordered polylines by pointer jumping
(O(log P) parallel rounds, no sequential walk): closed loops are cut at their lowest piercing and marked
``closed``; lines that end (where the density mask cuts them, e.g. the surface of a trapped cloud) are open.
The length is the sum of the polyline's segments (minimum image in the periodic box; a closed line includes
its closing segment), the circulation Γ = 2π·|q| (ħ/m = 1) of its first piercing.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Inexact, Int

from ivhl_jax.core.validation import check_array, check_scalar
from ivhl_jax.physics import fields
from ivhl_jax.physics.condensate.system import GPSystem, Grid

__all__ = ["Vortices", "VortexLines", "vortices", "vortex_lines"]

# Least-squares fit ψ ≈ a + bξ + cη on the corners (0,0), (1,0), (1,1), (0,1): (a, b, c) = _FIT @ corners.
_DESIGN = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
_FIT = np.linalg.pinv(_DESIGN)


class Vortices(struct.PyTreeNode):
    """Point vortices of a 2-D ψ (padded to a static maximum; leading axes: the batch of the input).

    Attributes:
      positions: (..., M, 2) (x, y) in trap units, inside the box [−L/2, L/2); 0 in the padding.
      charges: (..., M) int32 winding numbers (+1: counter-clockwise about +z); 0 in the padding.
      mask: (..., M) bool, True for the listed vortices.
      count: (...) int32, the number of vortex plaquettes found; larger than M when some were left out
        (the first M in C order of the plaquettes are listed).
    """

    positions: Float[Array, "*batch m 2"]
    charges: Int[Array, "*batch m"]
    mask: Bool[Array, "*batch m"]
    count: Int[Array, "*batch"]


class VortexLines(struct.PyTreeNode):
    """Vortex lines of a 3-D ψ as ordered polylines (padded to static maxima; leading axes: the input's batch).

    Attributes:
      points: (..., P, 3) piercing points in trap units, grouped by line and ordered along each line (in the
        direction of its vorticity); 0 in the padding.
      line_of_point: (..., P) int32 index of each point's line, −1 in the padding (and for points of lines
        beyond ``max_lines``).
      n_points: (...) int32 piercings found (larger than P when some were left out).
      start: (..., Lmax) int32 index in ``points`` of each line's first point.
      size: (..., Lmax) int32 number of points of each line (0 in the padding).
      length: (..., Lmax) polyline length (trap units), with the closing segment of a closed line.
      circulation: (..., Lmax) Γ = 2π|q| (ħ/m = 1) of each line, 0 in the padding.
      closed: (..., Lmax) bool, the line is a closed loop (possibly through the periodic boundary).
      mask: (..., Lmax) bool, True for the listed lines.
      n_lines: (...) int32 lines found (larger than Lmax when some were left out).
    """

    points: Float[Array, "*batch p 3"]
    line_of_point: Int[Array, "*batch p"]
    n_points: Int[Array, "*batch"]
    start: Int[Array, "*batch l"]
    size: Int[Array, "*batch l"]
    length: Float[Array, "*batch l"]
    circulation: Float[Array, "*batch l"]
    closed: Bool[Array, "*batch l"]
    mask: Bool[Array, "*batch l"]
    n_lines: Int[Array, "*batch"]

    def polylines(self) -> list[np.ndarray]:
        """The lines of one (unbatched) result as a list of (m, 3) NumPy arrays, in order (host side)."""
        if np.ndim(self.n_lines) != 0:
            raise ValueError(
                "polylines() needs an unbatched result; index the batch first, e.g. jax.tree.map(lambda a: a[t], lines)"
            )
        pts = np.asarray(self.points)
        return [
            pts[int(s) : int(s) + int(n)]
            for s, n, m in zip(np.asarray(self.start), np.asarray(self.size), np.asarray(self.mask))
            if m
        ]


# ----------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------
def _check_grid(grid: Any, ndim: int, fn: str) -> Grid:
    if isinstance(grid, GPSystem):
        grid = grid.grid
    if not isinstance(grid, Grid):
        raise TypeError(
            f"grid must be a condensate Grid (Grid.uniform(shape, length)) or a GPSystem, got {type(grid).__name__}"
        )
    if grid.ndim != ndim:
        raise ValueError(
            f"{fn} needs a {ndim}-D grid, got a {grid.ndim}-D grid of shape {grid.shape}"
            + (
                "; for 3-D use condensate.vortex_lines"
                if ndim == 2
                else "; for 2-D use condensate.vortices"
                if grid.ndim == 2
                else ""
            )
        )
    return grid


def _check_psi(psi: Any, grid: Grid) -> jax.Array:
    arr = check_array(psi, "psi", kind="inexact")
    if arr.ndim < grid.ndim or tuple(arr.shape[arr.ndim - grid.ndim :]) != grid.shape:
        want = "(..., " + ", ".join(map(str, grid.shape)) + ")"
        raise ValueError(
            f"psi must have shape {want} (the grid's shape, leading batch axes allowed, e.g. time), "
            f"got {tuple(arr.shape)}"
        )
    if isinstance(arr, jax.core.Tracer) or np.all(np.isfinite(np.asarray(arr))):
        return arr.astype(jnp.result_type(arr.dtype, jnp.complex64))
    raise ValueError("psi must be finite (it has NaN or inf values)")


def _check_sizes(min_density: Any, window: Any, **maxima: Any) -> None:
    check_scalar(min_density, "min_density", minimum=0.0, maximum=1.0)
    check_scalar(window, "window", integer=True, nonnegative=True)
    for name, v in maxima.items():
        check_scalar(v, name, integer=True, minimum=1)


def _batched(core, psi: jax.Array, ndim: int, *args: Any):
    """``core`` over the leading batch axes of ψ (one vmap over the flattened batch)."""
    batch = psi.shape[: psi.ndim - ndim]
    if not batch:
        return core(psi, *args)
    flat = psi.reshape((-1,) + psi.shape[psi.ndim - ndim :])
    out = jax.vmap(lambda p: core(p, *args))(flat)
    return jax.tree.map(lambda a: a.reshape(batch + a.shape[1:]), out)


def _local_mean(rho: jax.Array, sizes: tuple[int, ...], lows: tuple[int, ...]) -> jax.Array:
    """Mean of ρ over the periodic box of ``sizes`` cells starting ``lows`` cells below each index."""
    pad = tuple((lo, s - 1 - lo) for s, lo in zip(sizes, lows))
    padded = jnp.pad(rho, pad, mode="wrap")
    total = jax.lax.reduce_window(padded, jnp.zeros((), rho.dtype), jax.lax.add, sizes, (1,) * rho.ndim, "VALID")
    return total / float(np.prod(sizes))


def _plane_windings(psi: jax.Array) -> jax.Array:
    """Periodic plaquette windings over the last two axes: (..., n1, n2) → (..., n1, n2) int32; plaquette (i, j)
    has corners (i, j), (i+1, j), (i+1, j+1), (i, j+1) (indices mod n)."""
    ext = jnp.concatenate([psi, psi[..., :1, :]], axis=-2)
    ext = jnp.concatenate([ext, ext[..., :, :1]], axis=-1)
    return fields.vortex_map(ext)


def _zero_in_plaquette(corners: jax.Array) -> jax.Array:
    """(..., 4) complex corner values (order of ``_DESIGN``) → (..., 2) zero (ξ, η) ∈ [0, 1]² of the linear
    least-squares fit (the plaquette centre when the fit is degenerate)."""
    fit = jnp.asarray(_FIT, corners.real.dtype).astype(corners.dtype)
    a, b, c = (jnp.sum(fit[r] * corners, axis=-1) for r in range(3))
    det = b.real * c.imag - c.real * b.imag
    scale = jnp.abs(b) * jnp.abs(c)
    ok = jnp.abs(det) > 1e-6 * scale
    safe = jnp.where(ok, det, 1.0)
    xi = (-a.real * c.imag + c.real * a.imag) / safe
    eta = (-b.real * a.imag + a.real * b.imag) / safe
    out = jnp.stack([jnp.where(ok, xi, 0.5), jnp.where(ok, eta, 0.5)], axis=-1)
    return jnp.clip(out, 0.0, 1.0)


def _wrap_into_box(x: jax.Array, length: jax.Array) -> jax.Array:
    return (x + 0.5 * length) % length - 0.5 * length


# ----------------------------------------------------------------------------------------------
# 2-D point vortices
# ----------------------------------------------------------------------------------------------
def vortices(
    psi: Inexact[Array, "*batch x y"],
    grid: Grid | GPSystem,
    *,
    max_vortices: int = 64,
    min_density: float | Array = 0.05,
    window: int = 4,
) -> Vortices:
    """Positions (sub-grid) and charges of the vortices of a 2-D ψ (module docstring: windings + zero fit).

    Args:
      psi: (..., n_x, n_y) complex; leading axes (e.g. time) are a batch, processed in one vmapped program.
      grid: the 2-D :class:`Grid` (or a :class:`GPSystem` on it).
      max_vortices: M, the static number of slots (``count`` tells when more were found).
      min_density: plaquettes whose local mean density is below this fraction of max|ψ|² are ignored.
      window: the local mean is over the (2·window + 2)² cells around the plaquette.

    Returns:
      :class:`Vortices` (positions (..., M, 2) in trap units, charges, mask, count). Positions are accurate
      to ~0.01–0.05 grid spacings for vortices whose core spans a few grid spacings (tested to < 0.1 dx).
      Jit-compatible (all options static except ``min_density``).
    """
    grid = _check_grid(grid, 2, "vortices")
    psi = _check_psi(psi, grid)
    _check_sizes(min_density, window, max_vortices=max_vortices)
    md = jnp.asarray(min_density, psi.real.dtype)
    return _batched(lambda p, m: _vortices_core(p, m, grid, int(max_vortices), int(window)), psi, 2, md)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _vortices_core(psi: jax.Array, min_density: jax.Array, grid: Grid, m: int, window: int) -> Vortices:
    rdt = psi.real.dtype
    nx, ny = grid.shape
    rho = psi.real**2 + psi.imag**2
    k = 2 * window + 2
    keep = _local_mean(rho, (k, k), (window, window)) >= min_density * jnp.max(rho)
    w = jnp.where(keep, _plane_windings(psi), 0)
    found = w != 0
    count = jnp.sum(found).astype(jnp.int32)
    (i, j) = jnp.nonzero(found, size=m, fill_value=0)
    mask = jnp.arange(m) < count
    i1, j1 = (i + 1) % nx, (j + 1) % ny
    corners = jnp.stack([psi[i, j], psi[i1, j], psi[i1, j1], psi[i, j1]], axis=-1)
    frac = _zero_in_plaquette(corners)
    dx = jnp.asarray(grid.dx, rdt)
    lo = jnp.asarray([c[0] for c in grid.coords], rdt)
    pos = lo + (jnp.stack([i, j], axis=-1).astype(rdt) + frac) * dx
    pos = _wrap_into_box(pos, jnp.asarray(grid.length, rdt))
    return Vortices(
        positions=jnp.where(mask[:, None], pos, 0.0), charges=jnp.where(mask, w[i, j], 0), mask=mask, count=count
    )


# ----------------------------------------------------------------------------------------------
# 3-D vortex lines
# ----------------------------------------------------------------------------------------------
def vortex_lines(
    psi: Inexact[Array, "*batch x y z"],
    grid: Grid | GPSystem,
    *,
    max_points: int = 4096,
    max_lines: int = 64,
    min_density: float | Array = 0.05,
    window: int = 2,
) -> VortexLines:
    """The vortex lines of a 3-D ψ as ordered polylines with lengths and circulations (module docstring).

    Args:
      psi: (..., n_x, n_y, n_z) complex; leading axes (e.g. time) are a batch, processed in one vmapped program.
      grid: the 3-D :class:`Grid` (or a :class:`GPSystem` on it).
      max_points: P, the static number of piercing slots (a line of length ℓ pierces ~ℓ/dx to √3·ℓ/dx faces).
      max_lines: Lmax, the static number of line slots.
      min_density: faces whose local mean density is below this fraction of max|ψ|² are ignored (a line ends
        there).
      window: the local mean is over a box of ~(2·window + 2)³ cells around the face.

    Returns:
      :class:`VortexLines`. A ring of radius R has length 2πR to O((dx/R)²); a straight line along a periodic
      axis is one closed line of the box's length. Jit-compatible (all options static except ``min_density``).
    """
    grid = _check_grid(grid, 3, "vortex_lines")
    psi = _check_psi(psi, grid)
    _check_sizes(min_density, window, max_points=max_points, max_lines=max_lines)
    md = jnp.asarray(min_density, psi.real.dtype)
    return _batched(lambda p, m: _lines_core(p, m, grid, int(max_points), int(max_lines), int(window)), psi, 3, md)


def _face_windings(psi: jax.Array) -> jax.Array:
    """(3, n_x, n_y, n_z) int32: entry [a, idx] is the winding (flux along +a) of the face normal to axis a through
    grid point idx, spanning idx … idx + e_b + e_c with (b, c) = (a+1, a+2) mod 3 (counter-clockwise about +a)."""
    wz = jnp.transpose(_plane_windings(jnp.transpose(psi, (2, 0, 1))), (1, 2, 0))  # plane (x, y), normal z
    wx = _plane_windings(psi)  # plane (y, z), normal x
    wy = jnp.transpose(_plane_windings(jnp.transpose(psi, (1, 2, 0))), (2, 0, 1))  # plane (z, x), normal y
    return jnp.stack([wx, wy, wz])


def _pointer_jump_rounds(p: int) -> int:
    return max(1, math.ceil(math.log2(max(p, 2)))) + 1


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _lines_core(psi: jax.Array, min_density: jax.Array, grid: Grid, p_max: int, l_max: int, window: int) -> VortexLines:
    w = _masked_windings(psi, min_density, window)
    # Piercings: the nonzero faces, in C order of (axis, x, y, z).
    found = w != 0
    n_found = jnp.sum(found).astype(jnp.int32)
    (fa, fi, fj, fk) = jnp.nonzero(found, size=p_max, fill_value=0)
    valid = jnp.arange(p_max) < n_found
    idx = jnp.stack([fi, fj, fk], axis=-1)  # (P, 3)
    q = jnp.where(valid, w[fa, fi, fj, fk], 0)
    pts = _piercing_points(psi, grid, idx, fa)
    nxt = _successors(w, grid, idx, fa, fi, fj, fk, q, valid, p_max)
    nxt, cut, dist, tail = _cut_and_rank(nxt, valid, p_max)
    return _line_records(pts, q, nxt, cut, dist, tail, valid, n_found, grid, p_max, l_max, psi.real.dtype)


def _masked_windings(psi: jax.Array, min_density: jax.Array, window: int) -> jax.Array:
    """The face windings, zero where the mean density around the face is below ``min_density`` of the peak."""
    rho = psi.real**2 + psi.imag**2
    k = 2 * window + 2
    thresh = min_density * jnp.max(rho)
    keep = []
    for a in range(3):  # the box is centred on the face: 2·window + 1 cells across it, 2·window + 2 along it
        sizes = tuple(k - 1 if b == a else k for b in range(3))
        keep.append(_local_mean(rho, sizes, (window,) * 3) >= thresh)
    return jnp.where(jnp.stack(keep), _face_windings(psi), 0)


def _piercing_points(psi: jax.Array, grid: Grid, idx: jax.Array, fa: jax.Array) -> jax.Array:
    """Sub-grid point of each piercing in its face: corners idx, idx + e_b, idx + e_b + e_c, idx + e_c."""
    rdt = psi.real.dtype
    eye = jnp.eye(3, dtype=idx.dtype)
    eb, ec = eye[(fa + 1) % 3], eye[(fa + 2) % 3]
    n = jnp.asarray(np.array(grid.shape), idx.dtype)

    def at(offset):
        c = (idx + offset) % n
        return psi[c[:, 0], c[:, 1], c[:, 2]]

    corners = jnp.stack([at(0 * eb), at(eb), at(eb + ec), at(ec)], axis=-1)
    frac = _zero_in_plaquette(corners)  # (P, 2) along (b, c)
    dx = jnp.asarray(grid.dx, rdt)
    lo = jnp.asarray([c[0] for c in grid.coords], rdt)
    pts = lo + (idx.astype(rdt) + frac[:, :1] * eb.astype(rdt) + frac[:, 1:] * ec.astype(rdt)) * dx
    return _wrap_into_box(pts, jnp.asarray(grid.length, rdt))


def _successors(w, grid: Grid, idx, fa, fi, fj, fk, q, valid, p_max: int) -> jax.Array:
    """The next piercing of each along its line (−1: none). The entered cell (idx if the flux is along +a, else
    idx − e_a) and its six faces, slots 2a' (the low face F_a'(c)) and 2a' + 1 (the high face F_a'(c + e_a'));
    outgoing flux −w low, +w high."""
    eye = jnp.eye(3, dtype=idx.dtype)
    n = jnp.asarray(np.array(grid.shape), idx.dtype)
    ea = eye[fa]
    cell = jnp.where((q > 0)[:, None], idx, (idx - ea) % n)
    slot_face_axis = jnp.repeat(jnp.arange(3), 2)  # (6,)
    slot_high = jnp.tile(jnp.array([0, 1]), 3)  # (6,)
    face_idx = (cell[:, None, :] + slot_high[None, :, None] * eye[slot_face_axis][None]) % n  # (P, 6, 3)
    face_w = w[slot_face_axis[None, :], face_idx[..., 0], face_idx[..., 1], face_idx[..., 2]]  # (P, 6)
    out_flux = jnp.where(slot_high[None, :] == 1, face_w, -face_w)
    entry_slot = 2 * fa + jnp.where(q > 0, 0, 1)
    is_in, is_out = out_flux < 0, out_flux > 0
    rank = jnp.sum(jnp.where(jnp.arange(6)[None, :] < entry_slot[:, None], is_in, False), axis=1)
    out_rank = jnp.cumsum(is_out, axis=1) - 1
    hit = is_out & (out_rank == rank[:, None])
    has_next = jnp.any(hit, axis=1) & valid
    nslot = jnp.argmax(hit, axis=1)
    nface = jnp.take_along_axis(face_idx, nslot[:, None, None], axis=1)[:, 0]
    # (the padding slots all point at face (0, 0, 0, 0): a max-scatter of −1 leaves a real piercing's id there)
    face_id = (
        jnp.full((3,) + grid.shape, -1, jnp.int32)
        .at[fa, fi, fj, fk]
        .max(jnp.where(valid, jnp.arange(p_max, dtype=jnp.int32), -1))
    )
    nxt = jnp.where(has_next, face_id[slot_face_axis[nslot], nface[:, 0], nface[:, 1], nface[:, 2]], -1)
    return jnp.where(valid, nxt, -1)


def _cut_and_rank(nxt: jax.Array, valid: jax.Array, p_max: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Pointer jumping. Cycles: nodes that still have a successor after 2^R ≥ P steps; each cycle is cut before its
    lowest node. Then list ranking: distance to the tail and the tail of every node. Returns (nxt, cut, dist,
    tail)."""
    rounds = _pointer_jump_rounds(p_max)
    ids = jnp.arange(p_max, dtype=jnp.int32)

    def succ(a, j):
        return jnp.where(j >= 0, a[jnp.maximum(j, 0)], a)

    jump, low = nxt, ids
    for _ in range(rounds):
        low = jnp.minimum(low, succ(low, jump))
        jump = jnp.where(jump >= 0, jump[jnp.maximum(jump, 0)], -1)
    on_cycle = (jump >= 0) & valid
    cut = on_cycle & (nxt == low)
    nxt = jnp.where(cut, -1, nxt)
    dist = (nxt >= 0).astype(jnp.int32)
    tail = jnp.where(nxt >= 0, nxt, ids)
    jump = nxt
    for _ in range(rounds):
        j = jnp.maximum(jump, 0)
        dist = jnp.where(jump >= 0, dist + dist[j], dist)
        tail = jnp.where(jump >= 0, tail[j], tail)
        jump = jnp.where(jump >= 0, jump[j], -1)
    return nxt, cut, dist, tail


def _line_records(pts, q, nxt, cut, dist, tail, valid, n_found, grid: Grid, p_max: int, l_max: int, rdt) -> VortexLines:
    """The piercings sorted into lines (tails numbered in index order) and each line's size, length, circulation
    and closure."""
    box = jnp.asarray(grid.length, rdt)
    is_tail = valid & (nxt < 0)
    line_number = jnp.cumsum(is_tail) - 1  # tails numbered in index order
    n_lines = jnp.sum(is_tail).astype(jnp.int32)
    line = jnp.where(valid, line_number[tail], -1)
    listed = valid & (line < l_max)
    key = jnp.where(listed, line * (p_max + 1) + (p_max - dist), l_max * (p_max + 1) + p_max + 1)
    order = jnp.argsort(key)
    pts_s = jnp.where(listed[order][:, None], pts[order], 0.0)
    line_s = jnp.where(listed[order], line[order], -1).astype(jnp.int32)

    seg_line = jnp.where(line_s >= 0, line_s, l_max)
    size = jax.ops.segment_sum(jnp.ones_like(line_s), seg_line, num_segments=l_max + 1)[:l_max]
    start = (jnp.cumsum(size) - size).astype(jnp.int32)
    d = pts_s[1:] - pts_s[:-1]
    d = d - box * jnp.round(d / box)
    seg = jnp.sqrt(jnp.sum(d * d, axis=-1))
    same = (line_s[1:] == line_s[:-1]) & (line_s[1:] >= 0)
    length = jax.ops.segment_sum(jnp.where(same, seg, 0.0), seg_line[1:], num_segments=l_max + 1)[:l_max]
    lines = jnp.arange(l_max)
    mask = lines < jnp.minimum(n_lines, l_max)
    first = jnp.clip(start, 0, p_max - 1)
    last = jnp.clip(start + size - 1, 0, p_max - 1)
    closed_tail = jnp.zeros(l_max + 1, bool).at[jnp.where(cut & listed, line, l_max)].set(True)[:l_max]
    closed = closed_tail & mask
    dc = pts_s[first] - pts_s[last]
    dc = dc - box * jnp.round(dc / box)
    length = length + jnp.where(closed, jnp.sqrt(jnp.sum(dc * dc, axis=-1)), 0.0)
    q_s = jnp.abs(q[order])
    circulation = jnp.where(mask, 2 * jnp.pi * q_s[first].astype(rdt), 0.0)
    return VortexLines(
        points=pts_s,
        line_of_point=line_s,
        n_points=n_found,
        start=jnp.where(mask, start, 0),
        size=jnp.where(mask, size, 0).astype(jnp.int32),
        length=jnp.where(mask, length, 0.0),
        circulation=circulation,
        closed=closed,
        mask=mask,
        n_lines=n_lines,
    )
