"""The tensor operations a tensor-network algorithm is written against, provided by both kinds of tensor: a dense
array (the trivial charge: one sector per leg) and a block-sparse symmetric
:class:`~ivhl_jax.physics.tensornet.blocks.BlockTensor`.

Both kinds bring ``+``, ``-``, scaling by a number, ``.conj()``, ``.transpose(perm)`` and ``.shape`` (the dense
shape) themselves; the operations below dispatch on the operands' kind (a network with one block tensor is a
block network). An algorithm written with these and the methods runs unchanged on both kinds, and compiles once
per tensor structure (the sector layout of a block tensor is static).

* :func:`contract` — an ``einsum`` network with a cached optimal pairwise order.
* :func:`polar` — the closest isometry x = U Vᵀ of t = U S Vᵀ (rows: the first legs, columns: the last ``k``).
* :func:`operator_identity` — the identity operator on the output legs of a (outs…, ins…) operator.
* :func:`bond_identity` — the identity operator on copies of a tensor's bond.
* :func:`max_eigenvalue` — the largest eigenvalue of a Hermitian (outs…, ins…) operator.
* :func:`trace`, :func:`pair` — tr o and tr(ρ o) of operators.
* :func:`dense` — the dense embedding of a tensor.
* :func:`where` — elementwise choice between two tensors of one structure by a traced boolean.
* :func:`tree_sum` — the sum of a list of tensors.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from ivhl_jax.physics.tensornet import blocks as S
from ivhl_jax.physics.tensornet.blocks import BlockTensor
from ivhl_jax.physics.tensornet.tn import contract as dense_contract

__all__ = [
    "is_block",
    "contract",
    "polar",
    "operator_identity",
    "bond_identity",
    "max_eigenvalue",
    "trace",
    "pair",
    "dense",
    "where",
    "tree_sum",
]


def is_block(*tensors: Any) -> bool:
    """Whether any of ``tensors`` is a block-sparse :class:`~ivhl_jax.physics.tensornet.blocks.BlockTensor`."""
    return any(isinstance(t, BlockTensor) for t in tensors)


def contract(subscripts: str, *tensors: Any) -> Any:
    """``einsum`` of dense arrays (:func:`ivhl_jax.physics.tensornet.tn.contract`) or of block tensors
    (:func:`ivhl_jax.physics.tensornet.blocks.contract`; every operand a block tensor, a full contraction a rank-0 one:
    :func:`pair` reads scalars)."""
    if is_block(*tensors):
        return S.contract(subscripts, *tensors)
    return dense_contract(subscripts, *tensors)


def polar(t: Any, k: int) -> Any:
    """The polar factor U Vᵀ of t = U S Vᵀ read as a matrix (columns: the last ``k`` legs): the isometry closest to
    ``t``, of ``t``'s shape (block by block for a block tensor: the polar factor of a block-diagonal matrix is
    block diagonal)."""
    if isinstance(t, BlockTensor):
        return S.polar(t, k)
    shape = t.shape
    uu, _, vt = jnp.linalg.svd(t.reshape(-1, math.prod(shape[-k:])), full_matrices=False)
    return (uu @ vt).reshape(shape)


def operator_identity(o: Any) -> Any:
    """The identity operator with the structure of the operator ``o`` (legs: n outputs then n inputs)."""
    n = len(o.shape) // 2
    if isinstance(o, BlockTensor):
        return S.identity(o.legs[0].with_flow(1), o.group, n, o.dtype)
    m = math.prod(o.shape[:n])
    return jnp.eye(m, dtype=o.dtype).reshape(o.shape)


def bond_identity(t: Any, axis: int, n: int) -> Any:
    """The identity operator on ``n`` copies of the bond of ``t``'s leg ``axis`` (legs: n outputs, n inputs)."""
    if isinstance(t, BlockTensor):
        return S.identity(t.legs[axis].with_flow(1), t.group, n, t.dtype)
    dim = int(t.shape[axis])
    return jnp.eye(dim**n, dtype=t.dtype).reshape((dim,) * (2 * n))


def max_eigenvalue(o: Any) -> jax.Array:
    """The largest eigenvalue of a Hermitian operator (outs…, ins…) (per charge block for a block tensor)."""
    if isinstance(o, BlockTensor):
        return jnp.max(jnp.stack([jnp.max(e) for e in S.block_eigvalsh(o).values()]))
    n = len(o.shape) // 2
    m = math.prod(o.shape[:n])
    return jnp.max(jnp.linalg.eigvalsh(o.reshape(m, m)))


def trace(o: Any) -> jax.Array:
    """tr o of an operator (outs…, ins…)."""
    if isinstance(o, BlockTensor):
        return S.trace(o)
    n = len(o.shape) // 2
    m = math.prod(o.shape[:n])
    return jnp.trace(o.reshape(m, m))


def pair(rho: Any, op: Any) -> jax.Array:
    """tr(ρ o) = Σ ρ[a b c d] o[c d a b] of two two-site operators (out, out, in, in)."""
    if is_block(rho, op):
        return S.scalar(S.contract("abcd,cdab->", rho, op))
    return jnp.einsum("abcd,cdab->", rho, op)


def dense(t: Any) -> Any:
    """The dense array of ``t`` (a block tensor's embedding, sectors in each leg's order; a dense array as it is)."""
    return t.to_dense() if isinstance(t, BlockTensor) else t


def where(cond: jax.Array, a: Any, b: Any) -> Any:
    """``a`` where the (traced) boolean ``cond`` holds, else ``b`` (two tensors of one structure)."""
    return jax.tree_util.tree_map(lambda x, y: jnp.where(cond, x, y), a, b)


def tree_sum(xs: list[Any]) -> Any:
    """x₀ + x₁ + … of a non-empty list of tensors of one structure."""
    return functools.reduce(lambda a, b: a + b, xs)
