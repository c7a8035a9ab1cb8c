"""Performance kernels behind the public field functions.

``point_source_sum`` is the hot loop of :func:`ivhl_jax.fields.superpose`: for N points and M
sources it evaluates

    ψ_n = Σ_j A_j · exp(i (k_j r_nj + θ_j)) / (r_nj + ε),    r_nj = |x_n − s_j|,

returning the real and imaginary parts. It processes points in chunks so that no N×M
intermediate larger than ``chunk × M`` is ever materialised.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Squared distances below this are treated as this value: the gradient of |d| at d = 0 is
# undefined (NaN in autodiff); this keeps the field and its gradient finite on a source.
_TINY_R2 = 1e-20


def safe_norm(d: jax.Array, axis: int = -1) -> jax.Array:
    """Euclidean norm along ``axis`` whose value and gradient are finite at 0 (gradient 0 there)."""
    r2 = jnp.sum(d * d, axis=axis)
    safe = r2 > _TINY_R2
    return jnp.where(safe, jnp.sqrt(jnp.where(safe, r2, 1.0)), 0.0)


def _chunk_sum(pts, sources, amplitudes, wavenumbers, theta, softening):
    d = pts[:, None, :] - sources[None, :, :]
    r = safe_norm(d)
    w = amplitudes / (r + softening)
    ph = wavenumbers * r + theta
    return jnp.sum(w * jnp.cos(ph), axis=1), jnp.sum(w * jnp.sin(ph), axis=1)


def point_source_sum(points: jax.Array, sources: jax.Array, amplitudes: jax.Array, wavenumbers: jax.Array,
                     theta: jax.Array, softening: float | jax.Array, *, chunk: int = 2048
                     ) -> tuple[jax.Array, jax.Array]:
    """Real and imaginary parts of Σ_j A_j e^{i(k_j r + θ_j)}/(r + ε) at every point.

    Args:
      points: (N, D) float. sources: (M, D). amplitudes, wavenumbers, theta: (M,).
      softening: ε ≥ 0 (scalar).
      chunk: points per block; peak temporary memory ~ chunk × M × 4 values.

    Returns:
      (re, im), each (N,) in the points' dtype.
    """
    n = points.shape[0]
    if n <= chunk:
        return _chunk_sum(points, sources, amplitudes, wavenumbers, theta, softening)
    n_blocks = -(-n // chunk)
    pad = n_blocks * chunk - n
    padded = jnp.pad(points, ((0, pad), (0, 0)))
    blocks = padded.reshape(n_blocks, chunk, points.shape[1])
    re, im = jax.lax.map(lambda p: _chunk_sum(p, sources, amplitudes, wavenumbers, theta, softening), blocks)
    return re.reshape(-1)[:n], im.reshape(-1)[:n]
