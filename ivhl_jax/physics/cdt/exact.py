"""Exact results for 1+1D CDT on a torus (NumPy/SciPy, float64): strip counts, the transfer matrix, the exact
law of the slice lengths.

The ensemble is Ambjorn-Loll's: every cyclic up/down word is allowed in every strip, and an unlabelled
triangulation carries the symmetry factor ``1/|Aut(T)|``. The exact marginal of the slice lengths is

    P(l_0..l_{T-1}) ∝ exp(-2 lambda sum l) prod_t S(l_t, l_{t+1}) / prod_t l_t,
    S(a, b) = (a+b-1)! / ((a-1)! (b-1)!)     (strips between two rooted circles),

and ``lambda_c = ln 2``. The Monte Carlo engines are tested against these (and against brute-force
enumeration of strips) in the test-suite.
"""

from __future__ import annotations

import math

import numpy as np

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.physics.cdt.state import LN2

__all__ = [
    "strip_count",
    "log_length_weight",
    "transfer_matrix",
    "exact_mean_length",
    "exact_length_distribution",
    "exact_fixed_volume_distribution",
    "composition_part_law",
    "exact_fixed_volume_coordination",
]


def strip_count(a: int, b: int) -> int:
    """Number of strips between two rooted, oriented circles of a and b vertices: (a+b-1)!/((a-1)!(b-1)!)."""
    check_scalar(a, "a", integer=True, minimum=1)
    check_scalar(b, "b", integer=True, minimum=1)
    return math.comb(int(a) + int(b) - 1, int(a) - 1) * int(b)


def log_length_weight(lengths, lam: float) -> float:
    """log of the exact unnormalised probability of a slice-length vector (see the module docstring)."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size < 1 or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"lengths must be a non-empty 1-D sequence of slice lengths, got {lengths!r}")
    if not (np.all(np.isfinite(arr)) and np.all(arr >= 1) and np.all(arr == np.round(arr))):
        raise ValueError(f"lengths must be integers >= 1, got {lengths!r}")
    check_scalar(lam, "lam")
    ls = [int(v) for v in arr]
    T = len(ls)
    val = -2.0 * lam * sum(ls) - sum(math.log(v) for v in ls)
    return val + sum(math.log(strip_count(ls[t], ls[(t + 1) % T])) for t in range(T))


def transfer_matrix(lam: float, l_max: int) -> np.ndarray:
    """Symmetric transfer matrix M[a, b] = e^{-lam(a+b)} S(a, b) / sqrt(a b) for 3 <= a, b <= l_max.

    Index k corresponds to l = k + 3. Z(T) = Tr M^T (up to the truncation at l_max).
    """
    from scipy.special import gammaln

    check_scalar(lam, "lam")
    check_scalar(l_max, "l_max", integer=True, minimum=3)
    ls = np.arange(3, int(l_max) + 1, dtype=float)
    a, b = ls[:, None], ls[None, :]
    logm = -lam * (a + b) + gammaln(a + b) - gammaln(a) - gammaln(b) - 0.5 * np.log(a * b)
    return np.exp(logm)


def exact_mean_length(lam: float, n_slices: int | None, l_max: int | None = None) -> float:
    """Exact <l_t> on a torus of ``n_slices`` slices from the transfer matrix (lam > ln 2).

    ``n_slices=None``: the T -> infinity limit, ``<psi_0| l |psi_0>`` of the top eigenvector.

    ``l_max`` (truncation) defaults to 40/sqrt(lam - ln 2) + 60, far in the exponential tail
    ``~ exp(-2 sqrt(lam - ln 2) l)``.
    """
    check_scalar(lam, "lam")
    if lam <= LN2:
        raise ValueError(f"lam={lam} must exceed ln 2 = {LN2:.6f}")
    if n_slices is not None:
        check_scalar(n_slices, "n_slices", integer=True, minimum=1)
        n_slices = int(n_slices)
    if l_max is None:
        l_max = int(40.0 / math.sqrt(lam - LN2)) + 60
    check_scalar(l_max, "l_max", integer=True, minimum=3)
    l_max = int(l_max)
    m = transfer_matrix(lam, l_max)
    ls = np.arange(3, l_max + 1, dtype=float)
    if n_slices is None:
        from scipy.sparse.linalg import eigsh

        _, v0 = eigsh(m, k=1, which="LA")
        return float((v0[:, 0] ** 2 * ls).sum() / (v0[:, 0] ** 2).sum())
    w, vec = np.linalg.eigh(m)
    # <l> = Tr(L M^T) / Tr(M^T) in the eigenbasis, powers scaled by the top eigenvalue
    p = (w / w[-1]) ** n_slices
    return float(np.sum(p * ((vec**2) * ls[:, None]).sum(0)) / np.sum(p))


def exact_length_distribution(lam: float, n_slices: int, l_max: int) -> dict[tuple[int, ...], float]:
    """Exact P(l_0, ..., l_{T-1}) for all vectors with 3 <= l_t <= l_max, normalised over that box."""
    import itertools

    check_scalar(lam, "lam")
    check_scalar(n_slices, "n_slices", integer=True, minimum=1)
    check_scalar(l_max, "l_max", integer=True, minimum=3)
    n_slices, l_max = int(n_slices), int(l_max)
    if (l_max - 2) ** n_slices > 10**7:
        raise ValueError(
            f"n_slices={n_slices} and l_max={l_max} give {(l_max - 2) ** n_slices:.3g} length vectors "
            "to enumerate (more than 1e7); use exact_mean_length for large systems"
        )
    vecs = list(itertools.product(range(3, l_max + 1), repeat=n_slices))
    logw = np.array([log_length_weight(v, lam) for v in vecs])
    p = np.exp(logw - logw.max())
    p /= p.sum()
    return dict(zip(vecs, p.tolist()))


def exact_fixed_volume_distribution(n_slices: int, n0: int) -> dict[tuple[int, ...], float]:
    """Exact P(l_0, ..., l_{T-1}) of the fixed-volume ensemble: every vector with l_t >= 3 and sum l_t = ``n0``
    (N2 = 2 n0), weighted as in the module docstring (``exp(-2 lambda n0)`` is constant there, so the law does
    not depend on lambda or on the volume term)."""
    import itertools

    check_scalar(n_slices, "n_slices", integer=True, minimum=1)
    check_scalar(n0, "n0", integer=True, minimum=3 * int(n_slices))
    n_slices, n0 = int(n_slices), int(n0)
    free = n0 - 3 * n_slices  # vertices above the minimum, shared among the slices: C(free + T - 1, T - 1) vectors
    if math.comb(free + n_slices - 1, n_slices - 1) > 10**7:
        raise ValueError(
            f"n_slices={n_slices} and n0={n0} give more than 1e7 length vectors to enumerate; use a smaller n0"
        )
    vecs = [
        tuple(3 + c for c in comp)
        for comp in itertools.product(range(free + 1), repeat=n_slices - 1)
        if sum(comp) <= free
        for comp in [(*comp, free - sum(comp))]
    ]
    logw = np.array([log_length_weight(v, LN2) for v in vecs])
    p = np.exp(logw - logw.max())
    p /= p.sum()
    return dict(zip(vecs, p.tolist()))


def composition_part_law(parts: int, total: int) -> np.ndarray:
    """P(one part = k), k = 0..total, of a uniform weak composition of ``total`` into ``parts`` parts: the law of
    the number of down triangles (b = ``total`` of them) whose apex is one given vertex of the a = ``parts``
    vertices below, in a uniform strip."""
    check_scalar(parts, "parts", integer=True, minimum=2)
    check_scalar(total, "total", integer=True, nonnegative=True)
    a, b = int(parts), int(total)
    return np.array([math.comb(b - k + a - 2, a - 2) for k in range(b + 1)], float) / math.comb(b + a - 1, a - 1)


def exact_fixed_volume_coordination(n_slices: int, n0: int, q_max: int = 32) -> np.ndarray:
    """Exact E[H(q)], q = 0..``q_max`` (the last bin holds q >= q_max), in the fixed-volume ensemble
    (:func:`exact_fixed_volume_distribution`); H(q) is the number of vertices of coordination q (``observe``'s
    ``coordination`` histogram, 33 bins). Given the slice lengths the strips are independent and uniform, and a
    vertex of slice t has coordination 4 + g + h: g one part of a weak composition of l_{t+1} into l_t parts
    (strip t), h one of l_{t-1} into l_t parts (strip t - 1)."""
    check_scalar(q_max, "q_max", integer=True, minimum=4)
    h = np.zeros(int(q_max) + 1)
    n_slices = int(n_slices)
    for ls, p in exact_fixed_volume_distribution(n_slices, n0).items():
        for t in range(n_slices):
            conv = np.convolve(
                composition_part_law(ls[t], ls[(t + 1) % n_slices]), composition_part_law(ls[t], ls[(t - 1) % n_slices])
            )
            for k, c in enumerate(conv):
                h[min(4 + k, int(q_max))] += p * ls[t] * c
    return h
