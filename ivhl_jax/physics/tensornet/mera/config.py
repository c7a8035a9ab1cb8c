"""MERA settings and state: :class:`MERAConfig` (bond dimensions per layer), the :class:`MERA` pytree, its cold
start (:func:`init_tensors`), precision and isometry checks."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ivhl_jax.core.validation import check_scalar, is_concrete

Layer = tuple[jax.Array, jax.Array, jax.Array]  # (u, w, v)


class MERA(struct.PyTreeNode):
    """Variational state: transitional layers ``0..L-1`` then the scale-invariant layer ``L`` (last entry).

    Attributes:
      u, w, v: tuples of L+1 tensors, shapes (χ_in, χ_in, m, m), (χ_in, m, χ_out), (m, χ_in, χ_out) of each
        layer (χ_in of layer 0 is the blocked site dimension d; χ_out of layer z is χ_in of layer z+1).
      rho_ab, rho_ba: steady-state two-site density matrices at the top of the transitional layers, (χ,)*4.
      sweeps: number of sweeps done (int32 scalar).
    """

    u: tuple
    w: tuple
    v: tuple
    rho_ab: jax.Array
    rho_ba: jax.Array
    sweeps: jax.Array

    @property
    def num_layers(self) -> int:
        return len(self.u)

    def layer(self, z: int) -> Layer:
        return self.u[z], self.w[z], self.v[z]

    @property
    def chi(self) -> int:
        """The bond dimension χ of the scale-invariant layer (the top)."""
        return int(self.w[-1].shape[-1])

    @property
    def chis(self) -> tuple[int, ...]:
        """χ above each layer, bottom first (the last two are equal: the scale-invariant layer maps χ to χ)."""
        return tuple(int(w.shape[-1]) for w in self.w)

    @property
    def chi_mids(self) -> tuple[int, ...]:
        """χ_mid (u's output bond) of each layer, bottom first."""
        return tuple(int(u.shape[-1]) for u in self.u)

    @property
    def d(self) -> int:
        """The bottom (blocked) site dimension."""
        return int(self.w[0].shape[0])


def _per_layer(value: Any, name: str, n: int, allow_none: bool) -> tuple[int | None, ...]:
    """An int (or None) for every layer, or a sequence of n ints, as a tuple of n entries."""
    if value is None:
        if not allow_none:
            raise TypeError(f"{name} must be an int or a sequence of ints, got None")
        return (None,) * n
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ValueError(
                f"{name} needs one entry per layer ({n}: the {n - 1} transitional layers and the "
                f"scale-invariant one, bottom first), got {len(value)}: {tuple(value)}"
            )
        for i, x in enumerate(value):
            check_scalar(x, f"{name}[{i}]", integer=True, minimum=2)
        return tuple(int(x) for x in value)
    check_scalar(value, name, integer=True, minimum=2)
    return (int(value),) * n


@dataclasses.dataclass(frozen=True)
class MERAConfig:
    """Optimisation settings (hashable; static under jit); validated when constructed.

    chi: the bond dimension χ above each layer: an int (every layer carries min(χ, what it can: χ_in·χ_mid);
      the transitional layers must reach χ below the scale-invariant layer) or one int per layer
      (``layers + 1`` entries, bottom first; the last two equal, the scale-invariant layer maps χ to χ).
      The bottom layer carries at most d·χ_mid ≤ d² (d: the blocked site dimension, 4 for spin-½ chains);
      the layers above up to χ_in·χ_mid.
    chi_mid: the bond between u and w/v (u's output), ≤ χ_in of the layer: None (χ_mid = χ, capped at χ_in), an
      int, or one per layer.
    layers: transitional layers below the scale-invariant one;
    power_iters: 𝒟 iterations per sweep for the steady state; u_delay: sweeps before the disentanglers start to
    be updated (they start at the identity, as in mainVarMERA); refsym: impose reflection symmetry (v = w
    reflected, u = u reflected; needs a reflection-symmetric model), which removes spurious minima; si_scales:
    scales j = 0..si_scales−1 whose environments Γ(ρ*, 2^{−j}𝒜^j h) are summed for the SI layer (1 =
    mainVarMERA, the default and the fastest to converge; it approximates the layer's gradient, and where a dense
    MERA orders (the dense 3-state Potts MERA on the guide's χ = 16 ladder), its sweeps can raise the energy:
    then use 2 or 3).
    symmetry: None (dense tensors) or a :class:`~ivhl_jax.physics.tensornet.mera.symmetric.Symmetry` (a Z_n or U(1)
    charge and the sectors of every bond): the sweep then runs on block-sparse symmetric tensors.
    """

    chi: int | tuple[int, ...] = 6
    chi_mid: int | tuple[int, ...] | None = None
    layers: int = 2
    power_iters: int = 4
    u_delay: int = 10
    refsym: bool = True
    si_scales: int = 1
    symmetry: Any = None

    def __post_init__(self) -> None:
        for name in ("chi", "chi_mid"):
            val = getattr(self, name)
            if isinstance(val, list):
                object.__setattr__(self, name, tuple(val))
        self.validate()

    def validate(self) -> MERAConfig:
        check_scalar(self.layers, "layers", integer=True, minimum=1)
        n = int(self.layers) + 1
        chis = _per_layer(self.chi, "chi", n, allow_none=False)
        mids = _per_layer(self.chi_mid, "chi_mid", n, allow_none=True)
        if isinstance(self.chi, tuple) and chis[-1] != chis[-2]:
            raise ValueError(
                f"chi={self.chi}: the scale-invariant layer maps chi to chi, so its entry (the last) "
                f"must equal the one below it, got {chis[-2]} and {chis[-1]}"
            )
        for z, (c, m) in enumerate(zip(chis, mids)):
            if m is not None and c is not None and m > c and not isinstance(self.chi_mid, int):
                raise ValueError(f"chi_mid[{z}]={m} must be <= chi[{z}]={c}")
        if isinstance(self.chi_mid, int) and not isinstance(self.chi, tuple) and self.chi_mid > self.chi:
            raise ValueError(f"chi_mid={self.chi_mid} must be <= chi={self.chi}")
        check_scalar(self.power_iters, "power_iters", integer=True, minimum=1)
        check_scalar(self.u_delay, "u_delay", integer=True, nonnegative=True)
        check_scalar(self.si_scales, "si_scales", integer=True, minimum=1)
        if not isinstance(self.refsym, bool):
            raise TypeError(f"refsym must be True or False, got {self.refsym!r}")
        if self.symmetry is not None:
            if not callable(getattr(self.symmetry, "check_config", None)):
                raise TypeError(f"symmetry must be None or a mera.Symmetry, got {type(self.symmetry).__name__}")
            self.symmetry.check_config(self)
        return self

    @property
    def top_chi(self) -> int:
        """χ of the scale-invariant layer."""
        return int(self.chi[-1]) if isinstance(self.chi, tuple) else int(self.chi)

    @property
    def mid(self) -> int:
        """χ_mid of the scale-invariant layer."""
        return int(self.layer_shapes(self.top_chi)[-1][1])

    def layer_shapes(self, d: int) -> list[tuple[int, int, int]]:
        """(χ_in, χ_mid, χ_out) of each layer (bottom first, the scale-invariant one last) on blocked sites of
        dimension ``d``; a ValueError names ``chi``/``chi_mid`` when a layer cannot carry what is asked."""
        return layer_shapes(self.chi, self.chi_mid, self.layers, d)


def layer_shapes(chi: Any, chi_mid: Any, layers: int, d: int) -> list[tuple[int, int, int]]:
    """(χ_in, χ_mid, χ_out) per layer for bond dimensions ``chi``/``chi_mid`` (an int/None or one per layer, as in
    :class:`MERAConfig`) on sites of dimension ``d``."""
    check_scalar(d, "d", integer=True, minimum=1)
    n = int(layers) + 1
    chis = [int(c or 0) for c in _per_layer(chi, "chi", n, allow_none=False)]
    mids = _per_layer(chi_mid, "chi_mid", n, allow_none=True)
    explicit = isinstance(chi, (tuple, list))
    shapes, chi_in = [], int(d)
    for z in range(n):
        want_m = chis[z] if mids[z] is None else int(mids[z] or 0)
        if isinstance(chi_mid, (tuple, list)) and want_m > chi_in:
            raise ValueError(
                f"chi_mid[{z}]={want_m} is more than layer {z} can carry: u maps its two input sites "
                f"(chi_in={chi_in} each) to two bonds of at most chi_in; pass chi_mid[{z}] <= {chi_in}"
            )
        m = min(int(want_m), chi_in)
        cap = chi_in * m
        want = int(chis[z])
        if explicit and want > cap:
            raise ValueError(
                f"chi[{z}]={want} is more than layer {z} can carry: its isometry maps chi_in * chi_mid "
                f"= {chi_in} * {m} = {cap} states to chi; pass chi[{z}] <= {cap}"
                + (f" (the bottom layer: at most d * chi_mid <= d^2 = {d * d})" if z == 0 else "")
            )
        chi_out = min(want, cap)
        if z == n - 1 and chi_out != chi_in:
            raise ValueError(
                f"chi={chi}: the transitional layers reach chi={chi_in} below the scale-invariant layer, "
                f"which must map chi to chi (it can carry {chi_out}); raise layers (each layer can at "
                f"most multiply chi by chi_mid; the bottom one carries at most d^2 = {d * d})"
            )
        shapes.append((chi_in, m, chi_out))
        chi_in = chi_out
    return shapes


# --------------------------------------------------------------------------------------------- tensors


def random_isometry(key: jax.Array, rows: int, cols: int, dtype: Any = None) -> jax.Array:
    """A Haar-random (rows × cols) real isometry Q (QᵀQ = I), rows ≥ cols."""
    check_scalar(rows, "rows", integer=True, minimum=1)
    check_scalar(cols, "cols", integer=True, minimum=1)
    rows, cols = int(rows), int(cols)
    if cols > rows:
        raise ValueError(f"an isometry needs rows >= cols, got {rows} x {cols}")
    a = jax.random.normal(key, (rows, cols), dtype or jnp.result_type(float))
    q, r = jnp.linalg.qr(a)
    return q * jnp.sign(jnp.diagonal(r))[None, :]


def polar_factor(a: Any, xp: Any = jnp) -> Any:
    """Polar factor U Vᵀ of a = U S Vᵀ, in the array namespace ``xp`` (jax.numpy, or NumPy on the host)."""
    uu, _, vt = xp.linalg.svd(a, full_matrices=False)
    return uu @ vt


def init_tensors(key: jax.Array, config: MERAConfig, d: int = 4, parity: Any = None) -> MERA:
    """Identity disentanglers, isometries = polar factor of a uniform(0,1) random matrix (a near-uniform
    coarse-graining, as mainVarMERA's ``rand`` start), maximally mixed top density matrices, on blocked sites of
    dimension ``d``.

    ``parity``: None, or a symmetry P of the chain, a real symmetric involution (P² = 1) on one blocked site
    (d × d) with [h, P ⊗ P] = 0 (:func:`~ivhl_jax.physics.tensornet.mera.evenbly_vidal` passes its model's,
    :attr:`~ivhl_jax.physics.tensornet.mera.models.Model.parity`). With it every tensor of the start commutes with P:
    each bond gets parity charges ±1 (the bottom one P's eigenvalues; above it ⌈2χ/3⌉ even states, then the odd ones)
    and an isometry is the polar factor of its draws with the entries that change the charge set to zero (a
    block-diagonal matrix, so its polar factor is block-diagonal: w (P_in ⊗ P_mid) = P_out w). A sweep keeps the
    symmetry, so the optimisation cannot settle in a symmetry-broken state: without it, the critical Ising
    chain's start (one column of each polar factor near the all-ones vector, the chain ordered along X) sits on
    an energy plateau near 2e-3 for hundreds of sweeps from about half the keys.

    A concrete ``key`` builds the start on the host (the draws are one compiled program, the polar factors LAPACK
    SVDs in NumPy); a traced one (``jit``, ``vmap`` over keys, ``eval_shape``) the same start inside the trace."""
    if not isinstance(config, MERAConfig):
        raise TypeError(f"config must be a MERAConfig; got {type(config).__name__}")
    check_scalar(d, "d", integer=True, minimum=1)
    d = int(d)
    config.layer_shapes(d)  # a bond dimension a layer cannot carry is named here
    sym = _parity_tuple(parity, d)
    if not is_concrete(key):
        return _init_tensors(key, config, d, sym)
    rows = np.asarray(_start_draws(key, config, d))
    us, ws, vs, rho = _assemble_start(rows, config, d, np, sym)
    us, ws, vs, rho, sweeps = jax.device_put((us, ws, vs, rho, np.zeros((), np.int32)))
    return MERA(tuple(us), tuple(ws), tuple(vs), rho, rho, sweeps)


Parity = tuple[tuple[float, ...], ...]


def _parity_tuple(parity: Any, d: int) -> Parity | None:
    """``parity`` as a hashable (d × d) tuple after its checks (None passes through)."""
    if parity is None:
        return None
    p = np.asarray(parity, dtype=np.float64)
    if p.shape != (d, d) or not np.all(np.isfinite(p)):
        raise ValueError(
            f"parity must be a finite real ({d}, {d}) matrix (a symmetry of one blocked site), got shape {p.shape}"
        )
    if np.abs(p @ p - np.eye(d)).max() > 1e-10 or np.abs(p - p.T).max() > 1e-10:
        raise ValueError(
            "parity must be a real symmetric involution (P = P^T, P @ P = 1), such as a diagonal matrix of +1 and -1"
        )
    return tuple(tuple(float(x) for x in row) for row in p)


def _charges(parity: Parity, shapes: list[tuple[int, int, int]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The basis of the bottom sites in which ``parity`` is diagonal (the identity when it already is) and the
    parity charges (±1) of each layer's input basis, bottom first, then the top's."""
    p = np.asarray(parity)
    if np.abs(p - np.diag(np.diag(p))).max() == 0.0:
        basis, q = np.eye(p.shape[0]), np.diag(p)
    else:
        q, basis = np.linalg.eigh(p)
    charges = [np.where(q > 0, 1, -1)]
    for _chi_in, m, chi_out in shapes:
        q_in = np.multiply.outer(charges[-1], charges[-1][:m]).reshape(-1)
        n_even, n_odd = int(np.sum(q_in > 0)), int(np.sum(q_in < 0))
        even = min(max(-(-2 * chi_out // 3), chi_out - n_odd), n_even)
        charges.append(np.array([1] * even + [-1] * (chi_out - even)))
    return basis, charges


def _symmetric_mask(q_first: np.ndarray, q_second: np.ndarray, q_out: np.ndarray) -> np.ndarray:
    """1 where an isometry's entry (rows: its two input legs, C order) conserves the parity charge, else 0."""
    return (np.multiply.outer(q_first, q_second).reshape(-1)[:, None] == q_out[None, :]).astype(np.float64)


# Compiling a start op by op costs more than the stage's first chunk, nearly all of it the threefry hash of each
# uniform draw compiled separately; so the draws are one vmapped threefry and, for a concrete key, the polar
# factors are host SVDs (the LAPACK gesdd XLA:CPU calls: in float64 the start is bit-identical to the traced one;
# in float32 it agrees to ~3e-7). Row k of the draws is uniform(split(key)[k], (size,)); its first r·c entries are
# uniform(split(key)[k], (r, c)) flattened (threefry counters are the flat element indices).


def _start_draws(key: jax.Array, config: MERAConfig, d: int) -> jax.Array:
    """The cold start's uniform(0, 1) draws in the default float: two rows (w, v) per layer, each as long as the
    largest isometry."""
    size = max(chi_in * m * chi_out for chi_in, m, chi_out in config.layer_shapes(d))
    return _init_draws(key, 2 * (config.layers + 1), size, jnp.result_type(float))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_draws(key: jax.Array, n_keys: int, size: int, dtype: Any) -> jax.Array:
    """uniform(0, 1) draws [n_keys, size]: row k from the k-th key of ``split(key, n_keys)``."""
    return jax.vmap(lambda k: jax.random.uniform(k, (size,), dtype))(jax.random.split(key, n_keys))


def _assemble_start(
    rows: Any, config: MERAConfig, d: int, xp: Any, parity: Parity | None = None
) -> tuple[list[Any], list[Any], list[Any], Any]:
    """The cold start from its draws ``rows`` (:func:`_start_draws`) in the array namespace ``xp`` (NumPy on the
    host, jax.numpy in a trace): (u, w, v per layer, top density matrix); parity-symmetric with ``parity``
    (:func:`init_tensors`)."""
    us, ws, vs = [], [], []
    shapes = config.layer_shapes(d)
    polar = functools.partial(polar_factor, xp=xp)
    if parity is not None:
        basis, charges = _charges(parity, shapes)
        to_chain = xp.asarray(basis, dtype=rows.dtype)
    for z, (chi_in, m, chi_out) in enumerate(shapes):
        e = xp.eye(chi_in, m, dtype=rows.dtype)  # truncated identity: columns orthonormal
        if parity is not None and z == 0:
            e = to_chain[:, :m]  # the first m states of P's eigenbasis (the identity for a diagonal P)
        us.append(xp.einsum("ac,bd->abcd", e, e))
        size = chi_in * m * chi_out
        draw_w = rows[2 * z, :size].reshape(chi_in * m, chi_out)
        draw_v = rows[2 * z + 1, :size].reshape(m * chi_in, chi_out)
        if parity is not None:
            q_in, q_out = charges[z], charges[z + 1]
            draw_w = draw_w * xp.asarray(_symmetric_mask(q_in, q_in[:m], q_out), dtype=rows.dtype)
            draw_v = draw_v * xp.asarray(_symmetric_mask(q_in[:m], q_in, q_out), dtype=rows.dtype)
        w = polar(draw_w).reshape(chi_in, m, chi_out)
        if parity is not None and z == 0:
            w = xp.einsum("ab,bio->aio", to_chain, w)  # the site leg back in the chain's basis
        ws.append(w)
        if config.refsym:
            vs.append(xp.transpose(w, (1, 0, 2)))
        else:
            v = polar(draw_v).reshape(m, chi_in, chi_out)
            if parity is not None and z == 0:
                v = xp.einsum("ab,ibo->iao", to_chain, v)
            vs.append(v)
    top = shapes[-1][2]
    rho = xp.eye(top * top, dtype=rows.dtype).reshape((top,) * 4) / top**2
    return us, ws, vs, rho


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_tensors(key: jax.Array, config: MERAConfig, d: int, parity: Parity | None = None) -> MERA:
    us, ws, vs, rho = _assemble_start(_start_draws(key, config, d), config, d, jnp, parity)
    return MERA(tuple(us), tuple(ws), tuple(vs), rho, rho, jnp.zeros((), jnp.int32))


def check_mera(mera: Any) -> MERA:
    if not isinstance(mera, MERA):
        raise TypeError(
            f"mera must be a MERA (from init_tensors, grow or a stepper's state), got {type(mera).__name__}"
        )
    return mera


def isometry_errors(mera: MERA) -> dict[str, float]:
    """max |x†x − I| over all u, w, v (as maps from their upper legs to their lower legs; a symmetric MERA's
    block tensors as their dense embeddings)."""
    check_mera(mera)

    def err(x: Any, k: int) -> float:
        mat = np.asarray(x.to_dense() if hasattr(x, "to_dense") else x).reshape(-1, math.prod(x.shape[-k:]))
        return float(np.max(np.abs(mat.T.conj() @ mat - np.eye(mat.shape[1]))))

    return {
        "u": max(err(u, 2) for u in mera.u),
        "w": max(err(w, 1) for w in mera.w),
        "v": max(err(v, 1) for v in mera.v),
    }


def precision_dtype(policy: Any) -> Any:
    """The dtype a MERA sweep runs in for a precision ``policy``: None, ``"f64"`` or a float64-compute
    :class:`~ivhl_jax.core.precision.Policy` → float64; ``"f32"`` / float32 compute → float32.

    Every contraction, SVD and eigen-decomposition of the sweep runs in that dtype. bf16/f16 are refused: the
    SVD updates (x = −U Vᵀ must be an isometry to the working precision) and the eigenvalue shift of h need ≥ 24
    mantissa bits (and the CPU SVD rejects bfloat16). float32 sweeps stall near an energy error of 1e-5 per
    site: use them for the early sweeps and small-χ stages of a ladder, followed by a float64 finish
    (:func:`cast`).
    """
    if policy is None:
        return jnp.float64
    from ivhl_jax.core import precision as P

    pol = P.get_policy(policy, argname="policy") if isinstance(policy, str) else policy
    if not isinstance(pol, P.Policy):
        raise TypeError(f"policy must be None, a preset name or a precision.Policy; got {type(policy).__name__}")
    dt = jnp.dtype(pol.compute_dtype)
    if dt == jnp.dtype(jnp.float64):
        return jnp.float64
    if dt == jnp.dtype(jnp.float32):
        return jnp.float32
    raise ValueError(
        f"policy={policy!r}: MERA sweeps support float32 or float64 compute, got {dt.name}; the SVD "
        "updates need >= 24 mantissa bits (use 'f32' for fast early sweeps, 'f64' to finish)"
    )


def require_x64(what: str, f32: str = "") -> None:
    """The one precision rule of the MERA: it computes in float64, so every entry point (the stepper, the scaling
    dimensions, OPE coefficients, central charge, :func:`~ivhl_jax.physics.tensornet.mera.cold_start`) refuses to run
    with JAX's 64-bit mode off, where float64 arrays silently become float32, in one line naming
    ``jax.enable_x64`` (``f32``: the float32 alternative of that entry point, if it has one)."""
    if jnp.result_type(float) != jnp.float64:
        raise RuntimeError(
            f"{what} computes in float64, but JAX's 64-bit mode is off (arrays would silently be "
            f"float32): call it inside `with jax.enable_x64(True):`" + (f" {f32}" if f32 else "")
        )


def cast(mera: MERA, dtype: Any) -> MERA:
    """The MERA with every tensor and density matrix in ``dtype`` (f32 → f64 for the float64 finish of a
    mixed-precision ladder; the isometries are exact to float32 rounding after the cast and are re-made exact by
    the next update's SVD)."""
    check_mera(mera)
    try:
        ok = jnp.issubdtype(jnp.dtype(dtype), jnp.inexact)
    except TypeError:
        ok = False
    if not ok:
        raise TypeError(f"dtype must be a floating or complex dtype such as jnp.float64, got {dtype!r}")
    # every floating leaf (the dense tensors, or a symmetric MERA's blocks); the sweep counter stays an int
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact) else x, mera
    )
