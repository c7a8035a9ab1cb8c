"""A Pallas kernel for the point-source sum of :func:`ivhl_jax.physics.fields.superpose` (GPU candidate).

    re_n + i im_n = Σ_j A_j e^{i(k_j r_nj + θ_j)} / (r_nj + ε),    r_nj = |x_n − s_j|

Each program of the grid owns ``block_points`` points (one register tile) and loops over the sources
``block_sources`` at a time: a (block_points, block_sources) tile of pair terms is formed in registers and
summed over the sources into two (block_points,) accumulators, so the program reads N·D + M·(D + 4) values and
writes 2N, with no (N, M) temporary and one launch for all pairs. Written for the Triton backend: every array
the kernel touches has a power-of-two size (points and sources are padded: a padded source has A = 0, ε = 1 and
adds exactly 0), the loop is a ``fori_loop`` (``scf.for``), the only reductions are float sums, and the phase
uses ``sin``/``cos`` (libdevice on a GPU; correct for every finite float32, so no range check or ``lax.cond``).

Where it runs: :func:`ivhl_jax.physics.fields.superpose` uses it when the backend table's (or ``ivhl tune``'s)
``fields_method`` is ``"pallas"`` and the work dtype is float32 (other dtypes take the XLA ``"reduce"`` kernel).
Compiled on a CUDA GPU through Triton (named in ``compiler_params``, whatever Pallas's default GPU backend), Pallas's
interpreter elsewhere (exact but slow: tests and tiny sizes only); lowering for CUDA works from a CPU
(``jit(f).trace(...).lower(lowering_platforms=("cuda",))``), which the tests use to check it is one Triton call.
``ivhl tune`` races it on GPUs only; no table row chooses it.

Accuracy (float32): the same per-pair arithmetic as the XLA kernels up to the sin/cos implementation (libdevice
sinf/cosf, ≤ 2 ulp; the XLA kernels' polynomial, ≤ 2.4e-7 absolute) and the summation order (a blocked sum
over the sources; pairwise within a tile). Stated error against the XLA ``"reduce"`` kernel on the same inputs:
≤ 2e-6 × Σ_j |A_j| / (r_nj + ε) per point for |k r + θ| ≲ 100 rad (each kernel is ~5e-7 of that scale from the
float64 sum; the float32 rounding of k·r itself, ≈ |k r|·6e-8, is common to both).

Reverse mode: the forward value is the kernel's; the VJP is that of the XLA ``"reduce"`` kernel
(:func:`ivhl_jax.numerics.fastmath.point_source_sum`), whose rematerialised blocks keep O(chunk × M) residuals.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jaxtyping import Array, ArrayLike, Float, Real

from ivhl_jax.core.validation import check_array, check_scalar
from ivhl_jax.numerics import fastmath

__all__ = ["point_source_sum", "BLOCK_POINTS", "BLOCK_SOURCES", "STATED_ERROR"]

#: Points per program (a register tile; a power of two, as Triton requires).
BLOCK_POINTS = 128
#: Sources per loop step of a program (a power of two).
BLOCK_SOURCES = 32
#: The kernel's stated error against the XLA "reduce" kernel, relative to Σ_j |A_j| / (r_nj + ε) per point
#: (float32, |k r + θ| ≲ 100 rad; the module docstring derives it).
STATED_ERROR = 2e-6


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _kernel(*refs: Any, d: int, block_sources: int, n_source_blocks: int) -> None:
    """One program: ``block_points`` points (D refs) against every source (D + 4 refs of length M_pad)."""
    pts = [r[...] for r in refs[:d]]
    src_refs = refs[d : 2 * d]
    amp_ref, k_ref, theta_ref, eps_ref, re_ref, im_ref = refs[2 * d :]

    def body(j, acc):
        sl = pl.ds(pl.multiple_of(j * block_sources, block_sources), block_sources)
        r2 = jnp.zeros((pts[0].shape[0], block_sources), jnp.float32)
        for p, s_ref in zip(pts, src_refs, strict=True):
            diff = p[:, None] - s_ref[sl][None, :]
            r2 = r2 + diff * diff
        r = jnp.sqrt(r2)
        w = amp_ref[sl][None, :] / (r + eps_ref[sl][None, :])
        phase = k_ref[sl][None, :] * r + theta_ref[sl][None, :]
        return acc[0] + jnp.sum(w * jnp.cos(phase), axis=1), acc[1] + jnp.sum(w * jnp.sin(phase), axis=1)

    zero = jnp.zeros((pts[0].shape[0],), jnp.float32)
    re, im = jax.lax.fori_loop(0, n_source_blocks, body, (zero, zero))
    re_ref[...] = re
    im_ref[...] = im


def _launch(points, sources, amplitudes, wavenumbers, theta, softening, *, block_points, block_sources, interpret):
    """The padded pallas_call on float32 work arrays: (re, im), each (N,)."""
    n, d = points.shape
    m = sources.shape[0]
    bp = min(block_points, _pow2_at_least(n))
    bs = min(block_sources, _pow2_at_least(m))
    n_pad, m_pad = -(-n // bp) * bp, -(-m // bs) * bs
    pts = [jnp.pad(points[:, i], (0, n_pad - n)) for i in range(d)]
    src = [jnp.pad(sources[:, i], (0, m_pad - m)) for i in range(d)]
    # A padded source: A = 0 and ε = 1, so its term is exactly 0 (never 0/0).
    per_source = [
        jnp.pad(amplitudes, (0, m_pad - m)),
        jnp.pad(wavenumbers, (0, m_pad - m)),
        jnp.pad(theta, (0, m_pad - m)),
        jnp.pad(jnp.broadcast_to(softening, (m,)), (0, m_pad - m), constant_values=1.0),
    ]
    point_spec = pl.BlockSpec((bp,), lambda i: (i,))
    source_spec = pl.BlockSpec((m_pad,), lambda i: (0,))
    out = jax.ShapeDtypeStruct((n_pad,), jnp.float32)

    def call(interp: bool, *args):
        return pl.pallas_call(
            functools.partial(_kernel, d=d, block_sources=bs, n_source_blocks=m_pad // bs),
            out_shape=(out, out),
            grid=(n_pad // bp,),
            in_specs=[point_spec] * d + [source_spec] * (d + 4),
            out_specs=(point_spec, point_spec),
            interpret=interp,
            # Triton, named: where Pallas's default GPU backend is Mosaic GPU this kernel still lowers to Triton
            compiler_params=None if interp else pltriton.CompilerParams(num_warps=4),
        )(*args)

    args = (*pts, *src, *per_source)
    if interpret is None:  # compiled where lowered for a CUDA GPU, interpreted elsewhere (a lowering-time choice)
        re, im = jax.lax.platform_dependent(
            *args, cuda=functools.partial(call, False), default=functools.partial(call, True)
        )
    else:
        re, im = call(bool(interpret), *args)
    return re[:n], im[:n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _sum(points, sources, per_source, softening, block_points, block_sources, interpret, chunk):
    amplitudes, wavenumbers, theta = per_source
    # e^{i(kr + θ)} = σ e^{i(kr + θ_r)}, |θ_r| ≤ π/2: a large θ (−ωt at late times) never enters the per-pair phase.
    theta_r, sigma = fastmath.reduce_mod_pi(theta)
    return _launch(
        points,
        sources,
        amplitudes * sigma,
        wavenumbers,
        theta_r,
        softening,
        block_points=block_points,
        block_sources=block_sources,
        interpret=interpret,
    )


def _xla_sum(chunk, points, sources, per_source, softening):
    amplitudes, wavenumbers, theta = per_source
    return fastmath.point_source_sum(
        points, sources, amplitudes, wavenumbers, theta, softening, chunk=chunk, method="reduce"
    )


def _sum_fwd(points, sources, per_source, softening, block_points, block_sources, interpret, chunk):
    inputs = (points, sources, per_source, softening)
    return _sum(*inputs, block_points, block_sources, interpret, chunk), inputs


def _sum_bwd(block_points, block_sources, interpret, chunk, res, cotangent):
    del block_points, block_sources, interpret
    _, vjp = jax.vjp(functools.partial(_xla_sum, chunk), *res)
    return vjp(cotangent)


_sum.defvjp(_sum_fwd, _sum_bwd)


def point_source_sum(
    points: Float[ArrayLike, "n d"],
    sources: Real[ArrayLike, "m d"],
    per_source: Real[ArrayLike, "3 m"],
    softening: Real[ArrayLike, ""],
    *,
    chunk: int = 1 << 16,
    block_points: int = BLOCK_POINTS,
    block_sources: int = BLOCK_SOURCES,
    interpret: bool | None = None,
) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
    """(Re, Im) of Σ_j A_j e^{i(k_j r + θ_j)}/(r + ε) at every point, float32, from the Pallas kernel.

    Args:
      points: (N, D) float32. sources: (M, D), M ≥ 1.
      per_source: (3, M): the rows A_j, k_j and θ_j (what :func:`ivhl_jax.numerics.fastmath.point_source_sum`
        takes as three arrays).
      softening: ε ≥ 0.
      chunk: points per block of the XLA kernel the VJP runs (reverse mode only).
      block_points, block_sources: the kernel's tile (powers of two; smaller for tiny N or M).
      interpret: None (compiled on a CUDA GPU, Pallas's interpreter elsewhere), True or False.

    Returns:
      (re, im), each (N,) float32; within :data:`STATED_ERROR` × Σ_j |A_j|/(r + ε) of the XLA kernel.

    Raises:
      ValueError / TypeError naming the argument: wrong ranks or lengths, a non-float32 ``points``, no sources,
      a block that is not a positive power of two.
    """
    points = check_array(points, "points", ndim=2, kind="floating")
    if points.dtype != jnp.float32:
        raise TypeError(
            f"points must be float32 for the Pallas field kernel, got {points.dtype} "
            "(other dtypes: ivhl_jax.numerics.fastmath.point_source_sum)"
        )
    sources = check_array(sources, "sources", shape=(None, points.shape[1]), kind="numeric").astype(jnp.float32)
    m = sources.shape[0]
    if m == 0:
        raise ValueError("sources must hold at least one source, got shape (0, D)")
    per_source = check_array(per_source, "per_source", shape=(3, m), kind="numeric").astype(jnp.float32)
    check_scalar(softening, "softening", nonnegative=True)
    for name, b in (("block_points", block_points), ("block_sources", block_sources)):
        check_scalar(b, name, integer=True, minimum=1)
        if int(b) & (int(b) - 1):
            raise ValueError(f"{name} must be a power of two (Triton tiles), got {b}")
    check_scalar(chunk, "chunk", integer=True, minimum=1)
    return _sum(
        points,
        sources,
        per_source,
        jnp.asarray(softening, jnp.float32),
        int(block_points),
        int(block_sources),
        interpret,
        int(chunk),
    )
