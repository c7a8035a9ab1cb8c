"""Tensor-network primitives: cached optimal-path contraction and entanglement entropies of pure states.

* :func:`contract` is ``einsum`` whose pairwise contraction order is found once per
  ``(subscripts, shapes, optimize)`` signature with ``opt_einsum`` and cached, so tracing the same network
  again under ``jit``/``grad``/``vmap`` costs no path search. The contraction itself is ``jnp.einsum`` with that
  explicit path, hence differentiable and jittable.
* :func:`entanglement_entropy` / :func:`renyi_entropy` compute the von Neumann / Rényi entropy of a pure state
  for an arbitrary bipartition (any set of sites, not only a leading block) from the Schmidt spectrum:

      ψ → Ψ_{A,B} (transpose subsystem sites to the front, reshape),  Ψ = U diag(s) V†,
      p_k = s_k² / Σ s²,   S = −Σ p_k log p_k,   S_α = log(Σ p_k^α) / (1 − α)

  in units of ``log(base)`` (natural log by default, ``base=2`` gives bits). Unnormalised states are
  normalised internally; zero Schmidt values are masked with static shapes (jit/vmap friendly) and with the
  double-``where`` trick so that gradients stay finite.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import opt_einsum
from jaxtyping import Array, ArrayLike, Float, Num

from ivhl_jax.core.validation import check_array, check_choice, check_scalar, is_concrete

__all__ = ["contract", "contraction_path", "entanglement_entropy", "renyi", "renyi_entropy", "schmidt_probabilities"]

_EPS = 1e-30
#: opt_einsum's path strategies (``opt_einsum.paths._PATH_OPTIONS``; checked by name before the cached search)
_OPTIMIZE = (
    "auto",
    "auto-hq",
    "branch-1",
    "branch-2",
    "branch-all",
    "dp",
    "dynamic-programming",
    "eager",
    "greedy",
    "opportunistic",
    "optimal",
    "random-greedy",
    "random-greedy-128",
)


@functools.lru_cache(maxsize=4096)
def _cached_path(subscripts: str, shapes: tuple[tuple[int, ...], ...], optimize: str) -> tuple[Any, float]:
    path, info = opt_einsum.contract_path(subscripts, *shapes, optimize=optimize, shapes=True)
    return tuple(tuple(p) for p in path), float(info.opt_cost)


def contraction_path(
    subscripts: str, *shapes: Sequence[int], optimize: str = "auto"
) -> tuple[list[tuple[int, ...]], float]:
    """Return ``(path, flop_count)`` for ``subscripts`` with operands of the given shapes (cached).

    ``flop_count`` is opt_einsum's estimate of the scalar multiply-adds of the whole contraction, counted as
    in opt_einsum (one FLOP per multiply and per add for inner products).
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"subscripts must be an einsum string, got {type(subscripts).__name__}")
    for i, s in enumerate(shapes):
        if not isinstance(s, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in s
        ):
            raise ValueError(f"shapes[{i}] must be a tuple of positive integers, got {s!r}")
    check_choice(optimize, "optimize", _OPTIMIZE)
    path, cost = _cached_path(subscripts.replace(" ", ""), tuple(tuple(int(d) for d in s) for s in shapes), optimize)
    return [tuple(p) for p in path], cost


def contract(subscripts: str, *tensors: Num[ArrayLike, " ..."], optimize: str = "auto") -> Num[Array, " ..."]:
    """Einstein summation with a cached optimal pairwise contraction order.

    Args:
      subscripts: an einsum specification, e.g. ``"abc,cd,bde->ae"`` (explicit ``->`` output recommended).
      *tensors: the operands (any array-likes, real or complex).
      optimize: opt_einsum strategy used to find the path once per shape signature
        (``"auto"``, ``"optimal"``, ``"greedy"``, ``"branch-2"`` ...).

    Returns:
      the contracted tensor (``jnp.einsum`` semantics; jittable, differentiable, vmappable).
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"subscripts must be an einsum string, got {type(subscripts).__name__}")
    if not tensors:
        raise ValueError("contract needs at least one tensor")
    n_in = subscripts.split("->")[0].count(",") + 1
    if n_in != len(tensors):
        raise ValueError(f"subscripts {subscripts!r} name {n_in} operands but {len(tensors)} tensors were given")
    arrays = [jnp.asarray(t) for t in tensors]
    if len(arrays) <= 2:
        return jnp.einsum(subscripts, *arrays)
    path, _ = contraction_path(subscripts, *(t.shape for t in arrays), optimize=optimize)
    return jnp.einsum(subscripts, *arrays, optimize=path)


# ----------------------------------------------------------------------------------------------- entropies


def _normalise_state(state: Any, dims: Sequence[int] | None) -> tuple[jax.Array, tuple[int, ...], tuple[int, ...]]:
    """Return (psi with shape batch+dims, batch_shape, dims).

    Outside a trace a state with NaN/inf entries, or one of zero norm (its entropy would be NaN), raises a
    ValueError naming ``state``.
    """
    psi = check_array(state, "state", kind="numeric", finite=True)
    if not (jnp.issubdtype(psi.dtype, jnp.floating) or jnp.issubdtype(psi.dtype, jnp.complexfloating)):
        psi = psi.astype(jnp.result_type(float))
    if dims is None:
        if psi.ndim < 1:
            raise ValueError("state must have one axis per site (shape (d_1, ..., d_n)); got a scalar")
        _check_nonzero(psi, psi.ndim)
        return psi, (), tuple(psi.shape)
    dims = tuple(int(d) for d in dims)
    if any(d < 1 for d in dims):
        raise ValueError(f"dims must be positive site dimensions, got {dims}")
    total = math.prod(dims)
    if psi.shape[-len(dims) :] == dims:
        batch = psi.shape[: psi.ndim - len(dims)]
    elif psi.shape[-1] == total:
        batch = psi.shape[:-1]
        psi = psi.reshape(batch + dims)
    else:
        raise ValueError(
            f"state of shape {psi.shape} matches neither (..., prod(dims)={total}) nor (..., *dims={dims}); "
            "pass dims equal to the local dimensions of the sites"
        )
    _check_nonzero(psi, len(dims))
    return psi, tuple(batch), dims


def _check_nonzero(psi: jax.Array, n_sites: int) -> None:
    if not is_concrete(psi) or psi.size == 0:
        return
    a = np.abs(np.asarray(psi)).reshape(psi.shape[: psi.ndim - n_sites] + (-1,))
    if np.any(np.max(a, axis=-1) == 0):
        raise ValueError("state has zero norm (every amplitude is 0), so it has no Schmidt decomposition")


def _subsystem(subsystem: Any, n: int) -> tuple[int, ...]:
    if isinstance(subsystem, str | bytes):
        raise TypeError(f"subsystem must be a list of site indices (e.g. [0, 1]), got the string {subsystem!r}")
    if isinstance(subsystem, int | np.integer):
        raise TypeError("subsystem must be a list of site indices (e.g. [0, 1]); for a cut after k sites use range(k)")
    sites = tuple(int(s) % n if -n <= int(s) < n else int(s) for s in subsystem)
    if any(not 0 <= s < n for s in sites):
        raise ValueError(f"subsystem sites {tuple(subsystem)} out of range for a {n}-site state")
    if len(set(sites)) != len(sites):
        raise ValueError(f"subsystem has repeated sites: {tuple(subsystem)}")
    return sites


def schmidt_probabilities(
    state: Num[ArrayLike, " ..."], subsystem: Sequence[int], dims: Sequence[int] | None = None
) -> Float[Array, "*batch schmidt"]:
    """Schmidt probabilities p_k = s_k²/Σs² of ``state`` across (subsystem | rest); shape (*batch, min(d_A, d_B))."""
    psi, batch, dims = _normalise_state(state, dims)
    sites = _subsystem(subsystem, len(dims))
    rest = tuple(i for i in range(len(dims)) if i not in sites)
    d_a = math.prod(dims[i] for i in sites)
    d_b = math.prod(dims[i] for i in rest)
    nb = len(batch)
    perm = tuple(range(nb)) + tuple(nb + i for i in sites + rest)
    mat = jnp.transpose(psi, perm).reshape(batch + (d_a, d_b))
    if max(d_a, d_b) > 4 * min(d_a, d_b):
        # A very rectangular matrix (a small region of a large state): its singular values are those of the
        # small triangular factor R of its tall orientation (M = QR, Q isometric), and the SVD then works on
        # min(d_A, d_B)² numbers instead of asking LAPACK for a workspace of the long side.
        tall = mat if d_a > d_b else jnp.swapaxes(mat, -1, -2)
        mat = jnp.linalg.qr(tall, mode="reduced")[1]
    s = jnp.linalg.svd(mat, compute_uv=False)
    p = jnp.square(s)
    return p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), _EPS)


def _log(x: jax.Array, base: float) -> jax.Array:
    out = jnp.log(x)
    return out if base == math.e else out / math.log(base)


def _nonnegative(s: jax.Array) -> jax.Array:
    """An entropy's value with its rounding below zero (−0.0 from −Σ 0, or −1e-16 from p = 1 + ε) as +0.0, so a
    product state prints 0, never −0.0; the gradient is ``s``'s own, unchanged (the correction is a
    ``stop_gradient`` constant: ``jnp.maximum`` would halve it at 0, and XLA folds ``s + 0.0`` to ``s``)."""
    return s + jax.lax.stop_gradient(jnp.maximum(s, 0.0) - s)


def entanglement_entropy(
    state: Num[ArrayLike, " ..."],
    subsystem: Sequence[int],
    dims: Sequence[int] | None = None,
    base: float = math.e,
    *,
    eps: float = 1e-14,
) -> Float[Array, "*batch"]:
    """Von Neumann entanglement entropy S_A = −Σ_k p_k log_base p_k of a pure state.

    Args:
      state: amplitudes, shape ``(d_1, ..., d_n)`` (``dims=None``), or ``(*batch, prod(dims))`` /
        ``(*batch, *dims)`` when ``dims`` is given (leading axes are a batch, handled like ``vmap``).
        Need not be normalised.
      subsystem: site indices of A (any subset, any order; e.g. ``[0, 2, 5]``).
      dims: local dimensions of the n sites (required for flat state vectors or batches).
      base: logarithm base (``math.e`` → nats, 2 → bits).
      eps: Schmidt probabilities ≤ eps are treated as exactly zero (0·log 0 = 0, zero gradient).

    Returns:
      S_A with shape ``batch`` (a scalar for a single state), ≥ 0: rounding below zero (a product state's −0.0)
      is returned as 0.0, with the gradient of the sum unchanged.
    """
    check_scalar(base, "base", positive=True)
    if base == 1:
        raise ValueError("base must not be 1")
    p = schmidt_probabilities(state, subsystem, dims)
    keep = p > eps
    p_safe = jnp.where(keep, p, 1.0)
    return _nonnegative(-jnp.sum(jnp.where(keep, p * _log(p_safe, base), 0.0), axis=-1))


def renyi_entropy(
    state: Num[ArrayLike, " ..."],
    subsystem: Sequence[int],
    alpha: float,
    dims: Sequence[int] | None = None,
    base: float = math.e,
    *,
    eps: float = 1e-14,
) -> Float[Array, "*batch"]:
    """Rényi entropy S_α = log_base(Σ_k p_k^α)/(1 − α) of a pure state (α=1: von Neumann; α=inf: min-entropy).

    Arguments as in :func:`entanglement_entropy`; ``alpha`` must be ≥ 0 (a Python number). ≥ 0 like it: a product
    state's −0.0 (log 1 / (1 − α) for α > 1) is returned as 0.0, gradients unchanged.
    """
    alpha = float(alpha)
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0 (a Python number; math.inf for the min-entropy), got {alpha}")
    if alpha == 1.0:
        return entanglement_entropy(state, subsystem, dims, base, eps=eps)
    p = schmidt_probabilities(state, subsystem, dims)
    if math.isinf(alpha):
        return _nonnegative(-_log(jnp.max(p, axis=-1), base))
    keep = p > eps
    p_safe = jnp.where(keep, p, 1.0)
    moment = jnp.sum(jnp.where(keep, p_safe**alpha, 0.0), axis=-1)
    return _nonnegative(_log(moment, base) / (1.0 - alpha))


renyi = renyi_entropy
