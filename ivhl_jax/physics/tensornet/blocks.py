"""Block-sparse tensors symmetric under an abelian group (Z_n, U(1)).

Each index (a :class:`Leg`) is a direct sum of charge sectors, ``charges[k]`` with ``dims[k]`` states, and a flow
f = ±1. A tensor of charge Q is non-zero only on the blocks whose charges satisfy the conservation law

    Σ_i f_i q_i ≡ Q      (mod n for Z_n; exactly for U(1)),

and a :class:`BlockTensor` stores exactly those blocks, ``blocks[(q_1, …, q_N)]`` of shape (dims of q_1, …, dims
of q_N). The sector layout, flows and charge are static pytree metadata and the blocks are the pytree's leaves,
so a program built on block tensors compiles once per block structure and ``jit``, ``vmap`` and ``grad`` apply as
to dense arrays. :meth:`BlockTensor.to_dense` embeds a tensor in the dense array whose index runs over the sectors
in the leg's order (sector k occupies ``offsets[k]:offsets[k] + dims[k]``).

Operations act block by block:

* :func:`contract` — an ``einsum`` network (each label on at most two operands; no traces or batch labels),
  contracted pairwise along opt_einsum's path for the dense shapes; a pairwise step multiplies only the block
  pairs whose charges agree on the shared labels (a contracted pair of legs must carry the same sectors and
  opposite flows). A Z2 tensordot of two charge-0 tensors thus costs about a quarter of the dense one.
* :meth:`BlockTensor.transpose`, :meth:`BlockTensor.conj` (flows and charge reversed), sums and scalings.
* :func:`matrix_blocks` / :func:`from_matrix_blocks` — fusion: the legs split into rows and columns, each fused
  index a sum of sectors of the fused charge; the tensor is then block diagonal, one matrix per fused charge.
* :func:`polar` (U Vᵀ of the SVD, block by block: the closest isometry), :func:`singular_values` by charge.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ivhl_jax.physics.tensornet.tn import contraction_path

__all__ = [
    "Group",
    "Z2",
    "U1",
    "Zn",
    "Leg",
    "BlockTensor",
    "contract",
    "matrix_blocks",
    "from_matrix_blocks",
    "polar",
    "singular_values",
    "fused_dims",
    "fused_layout",
    "block_eigvalsh",
    "make_leg",
    "scalar",
    "random_block",
    "zeros",
    "from_dense",
    "identity",
    "inner",
    "trace",
]


# ----------------------------------------------------------------------------------------------- groups


@dataclasses.dataclass(frozen=True)
class Group:
    """An abelian group: Z_n (``order = n ≥ 2``, charges 0..n−1, added mod n) or U(1) (``order = 0``, any int)."""

    order: int

    @property
    def name(self) -> str:
        return "U1" if self.order == 0 else f"Z{self.order}"

    def reduce(self, q: int) -> int:
        return int(q) % self.order if self.order else int(q)

    def check_charge(self, q: Any, name: str = "charge") -> int:
        """``q`` as a charge of the group; a ValueError names ``name`` when it is not one."""
        if isinstance(q, bool) or not isinstance(q, (int, np.integer)):
            raise ValueError(
                f"{name}={q!r} is not a charge of {self.name}: charges are integers"
                + (f" 0..{self.order - 1}" if self.order else "")
            )
        if self.order and not 0 <= int(q) < self.order:
            raise ValueError(f"{name}={q} is outside the group {self.name}: its charges are 0..{self.order - 1}")
        return int(q)


Z2 = Group(2)
U1 = Group(0)


def Zn(n: int) -> Group:  # noqa: N802 (the group's name)
    """The cyclic group Z_n (n ≥ 2)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n={n!r}: Z_n needs an integer n >= 2 (use U1 for U(1))")
    return Group(int(n))


def group_from_name(name: Any) -> Group:
    """ "Z2", "Z3", … or "U1" (a :class:`Group` passes through)."""
    if isinstance(name, Group):
        return name
    if isinstance(name, str):
        s = name.upper().replace("(", "").replace(")", "")
        if s in ("U1", "U"):
            return U1
        if s.startswith("Z") and s[1:].isdigit():
            return Zn(int(s[1:]))
    raise ValueError(f"group={name!r}: pass 'Z2', 'Z3', ..., 'U1' or a symmetric.Group")


# ------------------------------------------------------------------------------------------------- legs


@dataclasses.dataclass(frozen=True)
class Leg:
    """An index: sectors ``charges[k]`` with ``dims[k]`` states each (in this order in the dense embedding), and
    a flow ±1 (a contracted pair of legs has opposite flows)."""

    charges: tuple[int, ...]
    dims: tuple[int, ...]
    flow: int = 1

    @property
    def dim(self) -> int:
        return int(sum(self.dims))

    @property
    def offsets(self) -> dict[int, int]:
        return dict(zip(self.charges, np.cumsum((0,) + self.dims[:-1]).tolist()))

    def sector_dim(self, q: int) -> int:
        return dict(zip(self.charges, self.dims)).get(q, 0)

    def dual(self) -> Leg:
        return Leg(self.charges, self.dims, -self.flow)

    def with_flow(self, flow: int) -> Leg:
        return Leg(self.charges, self.dims, flow)

    def charge_of_index(self) -> np.ndarray:
        """The charge of every dense index (length :attr:`dim`)."""
        return np.repeat(np.asarray(self.charges, np.int64), self.dims)


def make_leg(sectors: Any, group: Group, flow: int = 1, name: str = "sectors") -> Leg:
    """A leg from ``{charge: dim}`` or ``[(charge, dim), ...]`` (sectors of dimension 0 are dropped); charges are
    checked against ``group`` and must be distinct."""
    items = list(sectors.items()) if isinstance(sectors, dict) else list(sectors)
    charges, dims = [], []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"{name} must be {{charge: dim}} or [(charge, dim), ...], got the entry {item!r}")
        q, d = item
        q = group.check_charge(q, f"{name} charge")
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise ValueError(f"{name}: the dimension of charge {q} must be an integer >= 0, got {d!r}")
        if q in charges:
            raise ValueError(f"{name}: charge {q} is listed twice")
        if d:
            charges.append(q)
            dims.append(int(d))
    if not charges:
        raise ValueError(f"{name}: every sector has dimension 0")
    return Leg(tuple(charges), tuple(dims), int(flow))


@functools.lru_cache(maxsize=4096)
def allowed_sectors(legs: tuple[Leg, ...], group: Group, charge: int) -> tuple[tuple[int, ...], ...]:
    """Every charge combination (one sector per leg) that satisfies Σ f_i q_i ≡ charge."""
    out = []
    for sector in itertools.product(*(leg.charges for leg in legs)):
        if group.reduce(sum(leg.flow * q for leg, q in zip(legs, sector)) - charge) == 0:
            out.append(tuple(sector))
    return tuple(out)


# ------------------------------------------------------------------------------------------- the tensor


class BlockTensor(struct.PyTreeNode):
    """A symmetric tensor: its allowed blocks (the pytree's leaves) and static legs, group and total charge."""

    blocks: dict
    legs: tuple = struct.field(pytree_node=False)
    group: Group = struct.field(pytree_node=False)
    charge: int = struct.field(pytree_node=False, default=0)

    @property
    def shape(self) -> tuple[int, ...]:
        """The dense shape."""
        return tuple(leg.dim for leg in self.legs)

    @property
    def ndim(self) -> int:
        return len(self.legs)

    @property
    def dtype(self) -> Any:
        return next(iter(self.blocks.values())).dtype if self.blocks else jnp.result_type(float)

    @property
    def size(self) -> int:
        """Stored numbers (the sum of the block sizes)."""
        return int(sum(math.prod(self.block_shape(k)) for k in self.blocks))

    def block_shape(self, sector: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(leg.sector_dim(q) for leg, q in zip(self.legs, sector))

    def to_dense(self) -> jax.Array:
        """The dense array (sectors in each leg's order); zeros outside the allowed blocks."""
        return _to_dense(self)

    def _to_dense(self) -> jax.Array:
        out = jnp.zeros(self.shape, self.dtype)
        offs = [leg.offsets for leg in self.legs]
        for sector, blk in self.blocks.items():
            idx = tuple(slice(o[q], o[q] + d) for o, q, d in zip(offs, sector, blk.shape))
            out = out.at[idx].set(blk)
        return out

    def conj(self) -> BlockTensor:
        """Complex conjugate: the flows and the charge reversed (the blocks conjugated)."""
        return BlockTensor(
            {k: jnp.conj(b) for k, b in self.blocks.items()},
            tuple(leg.dual() for leg in self.legs),
            self.group,
            self.group.reduce(-self.charge),
        )

    def dual(self) -> BlockTensor:
        """The same blocks read with the flows and the charge reversed (the structure of :meth:`conj`)."""
        return BlockTensor(
            dict(self.blocks), tuple(leg.dual() for leg in self.legs), self.group, self.group.reduce(-self.charge)
        )

    def transpose(self, perm: Sequence[int]) -> BlockTensor:
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError(f"perm={perm} is not a permutation of the {self.ndim} legs")
        return BlockTensor(
            {tuple(k[p] for p in perm): jnp.transpose(b, perm) for k, b in self.blocks.items()},
            tuple(self.legs[p] for p in perm),
            self.group,
            self.charge,
        )

    def map(self, fn: Any) -> BlockTensor:
        return BlockTensor({k: fn(b) for k, b in self.blocks.items()}, self.legs, self.group, self.charge)

    def __add__(self, other: BlockTensor) -> BlockTensor:
        _same_structure(self, other, "+")
        return BlockTensor({k: b + other.blocks[k] for k, b in self.blocks.items()}, self.legs, self.group, self.charge)

    def __sub__(self, other: BlockTensor) -> BlockTensor:
        _same_structure(self, other, "-")
        return BlockTensor({k: b - other.blocks[k] for k, b in self.blocks.items()}, self.legs, self.group, self.charge)

    def __mul__(self, scalar: Any) -> BlockTensor:
        return self.map(lambda b: b * scalar)

    __rmul__ = __mul__

    def __truediv__(self, scalar: Any) -> BlockTensor:
        return self.map(lambda b: b / scalar)

    def __neg__(self) -> BlockTensor:
        return self.map(lambda b: -b)

    def astype(self, dtype: Any) -> BlockTensor:
        return self.map(lambda b: jnp.asarray(b, dtype))


_to_dense = jax.jit(BlockTensor._to_dense)


def _same_structure(a: Any, b: Any, op: str) -> None:
    if not isinstance(b, BlockTensor) or a.legs != b.legs or a.charge != b.charge or a.group != b.group:
        raise ValueError(f"block tensors combined by {op} need the same legs, group and charge")


def _canonical(t: BlockTensor) -> BlockTensor:
    """Every allowed block present (zeros for those no term reached), in a fixed order: one pytree structure per
    (legs, group, charge)."""
    dtype = t.dtype
    blocks = {
        k: t.blocks[k] if k in t.blocks else jnp.zeros(t.block_shape(k), dtype)
        for k in allowed_sectors(t.legs, t.group, t.charge)
    }
    return BlockTensor(blocks, t.legs, t.group, t.charge)


def _checked_legs(legs: Any, group: Group, charge: Any) -> tuple[tuple[Leg, ...], int]:
    legs = tuple(legs)
    for i, leg in enumerate(legs):
        if not isinstance(leg, Leg):
            raise TypeError(f"legs[{i}] must be a symmetric.Leg, got {type(leg).__name__}")
        for q in leg.charges:
            group.check_charge(q, f"legs[{i}] charge")
    return legs, group.check_charge(charge)


def zeros(legs: Sequence[Leg], group: Group = Z2, charge: int = 0, dtype: Any = None) -> BlockTensor:
    """Zero blocks on every allowed charge combination."""
    legs_t, q = _checked_legs(legs, group, charge)
    dt = dtype or jnp.result_type(float)
    return BlockTensor(
        {
            k: jnp.zeros(tuple(leg.sector_dim(c) for leg, c in zip(legs_t, k)), dt)
            for k in allowed_sectors(legs_t, group, q)
        },
        legs_t,
        group,
        q,
    )


def random_block(
    key: jax.Array, legs: Sequence[Leg], group: Group = Z2, charge: int = 0, dtype: Any = None
) -> BlockTensor:
    """Standard-normal blocks on every allowed charge combination (one compiled draw per structure)."""
    legs_t, q = _checked_legs(legs, group, charge)
    return _random_block(key, legs_t, group, q, jnp.dtype(dtype or jnp.result_type(float)))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _random_block(key: jax.Array, legs: tuple[Leg, ...], group: Group, charge: int, dtype: Any) -> BlockTensor:
    sectors = allowed_sectors(legs, group, charge)
    rng = jax.random.split(key, max(1, len(sectors)))
    return BlockTensor(
        {
            k: jax.random.normal(r, tuple(leg.sector_dim(c) for leg, c in zip(legs, k)), dtype)
            for r, k in zip(rng, sectors)
        },
        legs,
        group,
        charge,
    )


def from_dense(
    arr: Any, legs: Sequence[Leg], group: Group = Z2, charge: int = 0, atol: float | None = 1e-10, name: str = "arr"
) -> BlockTensor:
    """The allowed blocks of a dense array; with ``atol`` (default), a ValueError names ``name`` when the array is
    not symmetric (a disallowed entry larger than ``atol`` times its largest entry)."""
    legs_t, q = _checked_legs(legs, group, charge)
    shape = tuple(leg.dim for leg in legs_t)
    if tuple(np.shape(arr)) != shape:
        raise ValueError(f"{name} has shape {tuple(np.shape(arr))}, the legs need {shape}")
    sectors = allowed_sectors(legs_t, group, q)
    offs = [leg.offsets for leg in legs_t]

    def idx(k: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(o[c], o[c] + leg.sector_dim(c)) for o, c, leg in zip(offs, k, legs_t))

    if atol is not None:
        a = np.asarray(arr)
        mask = np.ones(shape, bool)
        for k in sectors:
            mask[idx(k)] = False
        scale = max(float(np.abs(a).max()) if a.size else 0.0, 1e-300)
        bad = float(np.abs(a[mask]).max()) if mask.any() else 0.0
        if bad > atol * scale:
            raise ValueError(
                f"{name} does not commute with the {group.name} symmetry: an entry between charge sectors "
                f"that the symmetry forbids is {bad:.2e} (relative {bad / scale:.1e} > {atol:g})"
            )
    return BlockTensor({k: jnp.asarray(arr[idx(k)]) for k in sectors}, legs_t, group, q)


def identity(leg: Leg, group: Group, n: int = 1, dtype: Any = None) -> BlockTensor:
    """The identity operator on n copies of ``leg``: legs (leg, …, leg, leg†, …, leg†), 𝟙[a…, b…] = δ_ab."""
    legs = (leg.with_flow(1),) * n + (leg.with_flow(-1),) * n
    dt = dtype or jnp.result_type(float)
    out = {}
    for k in allowed_sectors(legs, group, 0):
        shape = tuple(leg.sector_dim(c) for c in k)
        if k[:n] == k[n:]:
            m = math.prod(shape[:n])
            out[k] = jnp.eye(m, dtype=dt).reshape(shape)
        else:
            out[k] = jnp.zeros(shape, dt)
    return BlockTensor(out, legs, group, 0)


# ------------------------------------------------------------------------------------------ contraction


def _pair(a: BlockTensor, la: str, b: BlockTensor, lb: str, keep: str) -> tuple[BlockTensor, str]:
    """Pairwise block tensordot over the labels the two share (none of them may be kept)."""
    if a.group != b.group:
        raise ValueError(f"cannot contract tensors of the groups {a.group.name} and {b.group.name}")
    shared = [c for c in la if c in lb]
    for c in shared:
        if c in keep:
            raise NotImplementedError(f"label {c!r} is on two operands and kept: batch labels are not supported")
        la_, lb_ = a.legs[la.index(c)], b.legs[lb.index(c)]
        if la_.charges != lb_.charges or la_.dims != lb_.dims:
            raise ValueError(
                f"label {c!r}: the contracted legs carry different sectors ({la_.charges}, {la_.dims}) "
                f"and ({lb_.charges}, {lb_.dims})"
            )
        if la_.flow != -lb_.flow:
            raise ValueError(f"label {c!r}: contracted legs need opposite flows, got {la_.flow} and {lb_.flow}")
    ia = [la.index(c) for c in shared]
    ib = [lb.index(c) for c in shared]
    fa = [i for i, c in enumerate(la) if c not in shared]
    fb = [i for i, c in enumerate(lb) if c not in shared]
    grp = a.group
    # fusion: A as rows (its free legs) x columns (the shared legs), B as rows (shared) x columns (its free legs),
    # block diagonal in the fused charge qs of the shared legs (A's flows). An output block (free sectors of A and
    # B) comes from a single qs, so nothing is summed afterwards.
    rows_a = _fused(tuple(a.legs[i] for i in fa), grp)
    shared_parts = _fused(tuple(a.legs[i] for i in ia), grp)
    cols_b = _fused(tuple(b.legs[i] for i in fb), grp)
    perm_a, perm_b = fa + ia, ib + fb
    blocks: dict[tuple[int, ...], jax.Array] = {}
    dtype = jnp.result_type(a.dtype, b.dtype)

    def get(t: BlockTensor, sector: tuple[int, ...], perm: list[int], nr: int, nc: int) -> jax.Array:
        inv = [0] * len(perm)
        for pos, i in enumerate(perm):
            inv[i] = pos
        orig = tuple(sector[inv[i]] for i in range(len(perm)))
        if orig not in t.blocks:
            return jnp.zeros((nr, nc), dtype)
        x = t.blocks[orig]
        if perm != sorted(perm):
            x = jnp.transpose(x, perm)
        return x.reshape(nr, nc)

    groups = []
    for qs, sparts in shared_parts.items():
        ra = rows_a.get(grp.reduce(a.charge - qs))
        cb = cols_b.get(grp.reduce(b.charge + qs))
        if not ra or not cb:
            continue
        rows = [(rk, rn, [get(a, rk + sk, perm_a, rn, sn) for sk, _, sn in sparts]) for rk, _, rn in ra]
        cols = [(ck, cn, [get(b, sk + ck, perm_b, sn, cn) for sk, _, sn in sparts]) for ck, _, cn in cb]
        groups.append((rows, cols))
    for (rk, ck), prod in _group_products(groups).items():
        shape = tuple(a.legs[i].sector_dim(q) for i, q in zip(fa, rk)) + tuple(
            b.legs[i].sector_dim(q) for i, q in zip(fb, ck)
        )
        blocks[rk + ck] = prod.reshape(shape)
    legs = tuple(a.legs[i] for i in fa) + tuple(b.legs[i] for i in fb)
    out = BlockTensor(blocks, legs, grp, grp.reduce(a.charge + b.charge))
    return out, "".join(la[i] for i in fa) + "".join(lb[i] for i in fb)


def _group_products(groups: list[Any]) -> dict[tuple[Any, Any], jax.Array]:
    """The blocks of a block tensordot as matrices, ``{(row sector, column sector): A_r B_c}``. ``groups`` holds
    one (rows, cols) per fused charge of the shared legs: rows = [(row sector, rows, [A's blocks of that row sector
    as matrices, one per shared sector])], cols = [(column sector, columns, [B's blocks, the same shared sectors in
    the same order])].

    Per fused charge, A's whole fused matrix (its row sectors stacked, the shared sectors side by side) times one
    column strip of B per column sector (B's blocks of that column sector stacked along the shared index): one
    product per column sector, whose row sectors are contiguous row ranges, so every output block is read out of
    the product in place. Fused charges of the same layout (equal row, column and shared sector sizes, as in Z_n
    with equal sectors) are stacked and multiplied as one batched product: fewer and larger operations, each
    operand gathered by one copy."""
    families: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for rows, cols in groups:
        layout = (
            tuple(rn for _, rn, _ in rows),
            tuple(cn for _, cn, _ in cols),
            tuple(part.shape[1] for part in rows[0][2]),
        )
        families[layout].append((rows, cols))
    out = {}
    for fam in families.values():
        mat_a = jnp.stack([_concat([_concat(parts, 1) for _, _, parts in rows], 0) for rows, _ in fam])
        for j in range(len(fam[0][1])):
            prod = jnp.matmul(mat_a, jnp.stack([_concat(cols[j][2], 0) for _, cols in fam]))
            for g, (rows, cols) in enumerate(fam):
                ro = 0
                for rk, rn, _ in rows:
                    out[(rk, cols[j][0])] = prod[g, ro : ro + rn]
                    ro += rn
    return out


def _concat(parts: list[jax.Array], axis: int) -> jax.Array:
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=axis)


def contract(subscripts: str, *tensors: BlockTensor, optimize: str = "auto") -> BlockTensor:
    """``einsum`` of block tensors (explicit ``->`` output; every label on one operand and the output, or on two
    operands). Returns a :class:`BlockTensor` with every allowed block (a full contraction: legs ``()``, one block
    its sector ``()``, the scalar; :func:`scalar` reads it)."""
    if not isinstance(subscripts, str) or "->" not in subscripts:
        raise ValueError(f"subscripts must be an einsum string with an explicit '->' output, got {subscripts!r}")
    spec = subscripts.replace(" ", "")
    lhs, out = spec.split("->")
    ins = lhs.split(",")
    if len(ins) != len(tensors):
        raise ValueError(f"subscripts name {len(ins)} operands, got {len(tensors)} tensors")
    for i, (s, t) in enumerate(zip(ins, tensors)):
        if not isinstance(t, BlockTensor):
            raise TypeError(f"operand {i} must be a BlockTensor, got {type(t).__name__}")
        if len(s) != t.ndim or len(set(s)) != len(s):
            raise ValueError(f"operand {i}: subscripts {s!r} need {t.ndim} distinct labels")
    counts: dict[str, int] = defaultdict(int)
    for s in ins + [out]:
        for c in s:
            counts[c] += 1
    bad = [c for c, n in counts.items() if n != 2]
    if bad:
        raise NotImplementedError(
            f"labels {bad} appear {[counts[c] for c in bad]} times: each label must be on two "
            "operands, or on one operand and the output"
        )
    ops = list(zip(ins, tensors))
    if len(ops) > 1:
        path, _ = contraction_path(spec, *(t.shape for t in tensors), optimize=optimize)
        for step in path:
            picked = [ops[i] for i in step]
            for i in sorted(step, reverse=True):
                ops.pop(i)
            (sa, ta), rest = picked[0], picked[1:]
            for sb, tb in rest:
                remaining = out + "".join(s for s, _ in ops) + "".join(s for s, _ in rest if s is not sb)
                ta, sa = _pair(ta, sa, tb, sb, remaining)
            ops.append((sa, ta))
    ((s, t),) = ops
    res = t.transpose([s.index(c) for c in out])
    return _canonical(res)


def scalar(t: BlockTensor) -> jax.Array:
    """The value of a rank-0 block tensor (a full contraction)."""
    if t.ndim != 0:
        raise ValueError(f"scalar needs a rank-0 BlockTensor, got {t.ndim} legs")
    return t.blocks[()] if () in t.blocks else jnp.zeros((), t.dtype)


def inner(a: BlockTensor, b: BlockTensor) -> jax.Array:
    """Σ a·b over all entries (same legs; the real inner product of the dense arrays)."""
    _same_structure(a, b, "inner")
    return functools.reduce(jnp.add, [jnp.vdot(b.blocks[k], x) for k, x in a.blocks.items()], jnp.zeros((), a.dtype))


def trace(o: BlockTensor) -> jax.Array:
    """tr o of an operator with legs (out…, in…) (the first half paired with the second half)."""
    n = o.ndim // 2
    if o.ndim != 2 * n:
        raise ValueError(f"trace needs an even number of legs (outs then ins), got {o.ndim}")
    total = jnp.zeros((), o.dtype)
    for k, b in o.blocks.items():
        if k[:n] == k[n:]:
            m = math.prod(b.shape[:n])
            total = total + jnp.trace(b.reshape(m, m))
    return total


# ------------------------------------------------------------------------------------------------ fusion


def _fused(legs: tuple[Leg, ...], group: Group) -> dict[int, list[tuple[tuple[int, ...], int, int]]]:
    """Fused charge Q = Σ f_i q_i of a set of legs → [(sector charges, offset in the fused sector, size)]."""
    out: dict[int, list[tuple[tuple[int, ...], int, int]]] = defaultdict(list)
    sizes: dict[int, int] = defaultdict(int)
    for sector in itertools.product(*(leg.charges for leg in legs)):
        q = group.reduce(sum(leg.flow * c for leg, c in zip(legs, sector)))
        n = math.prod(leg.sector_dim(c) for leg, c in zip(legs, sector))
        out[q].append((tuple(sector), sizes[q], n))
        sizes[q] += n
    return dict(out)


def fused_layout(legs: Sequence[Leg], group: Group) -> dict[int, list[tuple[tuple[int, ...], int, int]]]:
    """How :func:`matrix_blocks` lays out a fused index: fused charge Q = Σ f_i q_i of ``legs`` → a list of
    (sector charges, offset in the fused sector, size), in the order of the fused matrix's rows/columns."""
    return {q: list(parts) for q, parts in _fused(tuple(legs), group).items()}


def fused_dims(legs: Sequence[Leg], group: Group) -> dict[int, int]:
    """The dimension of each fused charge Q = Σ f_i q_i of the product of ``legs``."""
    return {q: sum(n for _, _, n in parts) for q, parts in _fused(tuple(legs), group).items()}


def _matrix_layout(legs: tuple[Leg, ...], group: Group, charge: int, k: int) -> Any:
    """(Q, row parts, column parts) for each fused charge Q of the last ``k`` legs whose rows (fused charge
    Q + ``charge`` of the other legs) exist: the layout of a tensor's block-diagonal matrix."""
    n = len(legs)
    rows, cols = _fused(tuple(legs[: n - k]), group), _fused(tuple(legs[n - k :]), group)
    for qc, col_parts in cols.items():
        qr = group.reduce(-qc + charge)
        if qr in rows:
            yield qc, rows[qr], col_parts


def matrix_blocks(t: BlockTensor, k: int) -> dict[int, jax.Array]:
    """Fusion of the first N−k legs (rows) and the last k legs (columns): the tensor as a block-diagonal matrix,
    ``{Q: matrix}`` with Q the fused charge of the columns (rows: fused charge Q + charge)."""
    n = t.ndim
    if not 0 < k < n:
        raise ValueError(f"k={k} must split the {n} legs into rows and columns (0 < k < {n})")
    out = {}
    for qc, row_parts, col_parts in _matrix_layout(t.legs, t.group, t.charge, k):
        mat_rows = []
        for rk, _, rn in row_parts:
            mat_rows.append(
                jnp.concatenate([t.blocks[rk + ck].reshape(rn, cn) for ck, _, cn in col_parts], axis=1)
                if len(col_parts) > 1
                else t.blocks[rk + col_parts[0][0]].reshape(rn, col_parts[0][2])
            )
        out[qc] = jnp.concatenate(mat_rows, axis=0) if len(mat_rows) > 1 else mat_rows[0]
    return out


def from_matrix_blocks(mats: dict[int, jax.Array], like: BlockTensor, k: int) -> BlockTensor:
    """The inverse of :func:`matrix_blocks` (``like`` gives the legs, group and charge)."""
    blocks = {}
    for qc, row_parts, col_parts in _matrix_layout(like.legs, like.group, like.charge, k):
        m = mats[qc]
        for rk, ro, rn in row_parts:
            for ck, co, cn in col_parts:
                blocks[rk + ck] = m[ro : ro + rn, co : co + cn].reshape(like.block_shape(rk + ck))
    return _canonical(BlockTensor(blocks, like.legs, like.group, like.charge))


def polar(t: BlockTensor, k: int) -> BlockTensor:
    """The polar factor U Vᵀ of the block-diagonal matrix of :func:`matrix_blocks` (``t = U S Vᵀ`` per fused
    charge): the isometry closest to ``t`` (columns: the last k legs), with ``t``'s structure. A fused charge
    whose rows are fewer than its columns cannot hold an isometry: ValueError."""
    mats = matrix_blocks(t, k)
    out = {}
    for q, m in mats.items():
        if m.shape[0] < m.shape[1]:
            raise ValueError(
                f"fused charge {q}: {m.shape[0]} rows < {m.shape[1]} columns, no isometry exists; "
                "give that charge fewer states on the output legs"
            )
        uu, _, vt = jnp.linalg.svd(m, full_matrices=False)
        out[q] = uu @ vt
    return from_matrix_blocks(out, t, k)


def singular_values(t: BlockTensor, k: int) -> dict[int, jax.Array]:
    """Singular values of each fused-charge block of :func:`matrix_blocks`, ``{Q: s}`` (descending)."""
    return {q: jnp.linalg.svd(m, compute_uv=False) for q, m in matrix_blocks(t, k).items()}


def block_eigvalsh(o: BlockTensor) -> dict[int, jax.Array]:
    """Eigenvalues of a Hermitian charge-0 operator (legs outs then ins) in each fused-charge block."""
    n = o.ndim // 2
    return {q: jnp.linalg.eigvalsh(m) for q, m in matrix_blocks(o, n).items()}
