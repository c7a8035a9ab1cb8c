"""Lee–Huang–Yang (beyond-mean-field) corrections of dipolar condensates and Bose–Bose mixtures: the coefficients,
the density powers the equations use, and the map of a density-locked mixture onto Petrov's reduced units.

Units: ħ = m = 1, trap units (as in :mod:`ivhl_jax.physics.condensate`): lengths in a_ho = √(ħ/(mω₀)), energies in
ħω₀, densities in a_ho⁻³ (ψ normalised to the atom number N), and the contact coupling g = 4πa with a = a_s/a_ho.

**Dipolar condensates** (Lima & Pelster, PRA 84, 041604(R) (2011) and PRA 86, 063609 (2012); the form used by
Wächtler & Santos, PRA 94, 043618 (2016) and Bisset et al., PRA 94, 033619 (2016)): the local-density LHY energy
adds to the GP equation and energy of :class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem` ::

    U ← U + γ_QF |ψ|³,        E ← E + (2/5) γ_QF ∫ |ψ|⁵ dV,
    γ_QF = (32/3) g √(a³/π) Q₅(ε_dd) = (128√π/3) (a_s/a_ho)^{5/2} Q₅(ε_dd),
    Q₅(x) = ∫₀¹ du (1 − x + 3xu²)^{5/2}        (real part for x > 1: the integrand is 0 where 1 − x + 3xu² < 0)

(Q₅(0) = 1, Q₅(1) = 3√3/2; :func:`q5`, :func:`lhy_coefficient`). From a species: the s-wave length a_s, the dipole
length a_dd = m μ₀ μ_m²/(12πħ²) (magnetic moment μ_m), the trap frequency ω₀ and the mass m give a_ho = √(ħ/(mω₀)),
g = 4π a_s/a_ho, ε_dd = a_dd/a_s and γ_QF = (128√π/3)(a_s/a_ho)^{5/2} Q₅(ε_dd) (e.g. ¹⁶⁴Dy: a_dd = 131 a₀).

**Bose–Bose mixtures** (Petrov, PRL 115, 155302 (2015)), two components of equal mass in 3-D with g₁₂ near
−√(g₁₁g₂₂): the LHY energy density and its chemical potentials ::

    E_LHY = (8/(15π²)) (g₁₁n₁ + g₂₂n₂)^{5/2},       μ_i^LHY = (4/(3π²)) g_ii (g₁₁n₁ + g₂₂n₂)^{3/2}

(:class:`~ivhl_jax.physics.condensate.mixture.MixtureSystem` with ``lhy=True``). Near the mean-field collapse the
ground state locks the densities, n₁/n₂ = √(g₂₂/g₁₁): with ψ_i = √c_i ψ (c₁ = √g₂₂/(√g₁₁ + √g₂₂), c₂ = 1 − c₁)
the energy density becomes α n² + β n^{5/2} with α = δg √(g₁₁g₂₂)/(√g₁₁ + √g₂₂)², δg = g₁₂ + √(g₁₁g₂₂) < 0, and
β = (8/(15π²))(g₁₁g₂₂)^{5/4}. Lengths ξ, densities n₀ and times ξ² scale this to Petrov's reduced equation ::

    i ∂φ/∂t = (−½∇² − 3|φ|² + (5/2)|φ|³) φ,       E = ∫ [½|∇φ|² − (3/2)|φ|⁴ + |φ|⁵] dV,
    n₀ = (2|α|/(3β))²,   ξ = (β n₀^{3/2})^{−1/2},   N = n₀ ξ³ Ñ

(:func:`petrov_units`). The reduced equation is the dipolar system's LHY form with no dipoles: a
:class:`~ivhl_jax.physics.condensate.dipolar.DipolarSystem` with g = −3, ε_dd = 0 and ``gamma_qf=5/2`` (no trap:
V = 0) — one equation, one place (the zero dipolar kernel costs one real transform pair per half-step). A homogeneous
droplet minimises E/N = −(3/2)n + n^{3/2} at n = 1 (E/N = μ = −1/2): the flat-top density of a large droplet,
and the self-bound droplet exists for Ñ > Ñ_c ≈ 18.65 (Petrov 2015).

The powers n^{3/2} and n^{5/2} are formed by :func:`density_power` (n·√n, n²·√n), whose derivatives are finite at
n = 0 (a plain √n has an infinite one there), so ground states by gradient (``method="cg"``), BdG linearisations
and ``jax.grad`` through steps see the exact derivative 0 where the density vanishes.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ivhl_jax.core.validation import check_array, check_scalar, is_concrete

__all__ = ["q5", "lhy_coefficient", "density_power", "petrov_units", "MIXTURE_LHY", "PETROV_CRITICAL_NUMBER"]

#: The coefficient 8/(15π²) of Petrov's mixture LHY energy density (ħ = m = 1).
MIXTURE_LHY = 8.0 / (15.0 * math.pi**2)
#: Petrov's critical reduced atom number Ñ_c of the self-bound symmetric droplet (PRL 115, 155302 (2015)).
PETROV_CRITICAL_NUMBER = 18.65

_NODES = 48  # Gauss–Legendre nodes for Q₅ (q5: the accuracy)


@functools.lru_cache(maxsize=1)
def _legendre() -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(_NODES)


def q5(eps_dd: Float[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
    """Q₅(ε) = ∫₀¹ du (1 − ε + 3εu²)^{5/2} (the real part for ε > 1: the integral over u ≥ u₀ = √((ε − 1)/(3ε)),
    where the base is ≥ 0), by 48-point Gauss–Legendre on [u₀, 1]: the integrand is analytic on [0, 1] for ε < 1,
    a constant times u⁵ at ε = 1 and ~ (u − u₀)^{5/2} at u₀ beyond, so the rule is exact to round-off for ε ≤ 1 and
    to ~1e-12 (relative) beyond. JAX, elementwise, differentiable in ε (ε ≥ 0)."""
    e = check_array(eps_dd, "eps_dd", kind="numeric")
    if is_concrete(e):
        check_array(e, "eps_dd", finite=True)
        if np.any(np.asarray(e) < 0):
            raise ValueError(f"eps_dd must be >= 0 (the relative dipolar strength), got {np.asarray(e).tolist()}")
    rdt = e.dtype if jnp.issubdtype(e.dtype, jnp.floating) else jnp.float32
    e = e.astype(rdt)
    x, w = (jnp.asarray(v, rdt) for v in _legendre())
    over = e > 1
    es = jnp.where(over, e, 2.0)  # a safe ε for u₀ where the branch is unused
    u0 = jnp.where(over, jnp.sqrt((es - 1) / (3 * es)), 0.0)[..., None]
    u = u0 + (1 - u0) * (x + 1) / 2  # nodes mapped from [−1, 1] to [u₀, 1]
    base = jnp.maximum(1 - e[..., None] + 3 * e[..., None] * u * u, 0.0)
    return jnp.sum(w * density_power(base, 2.5), axis=-1) * (1 - u0[..., 0]) / 2


def lhy_coefficient(g: Any, eps_dd: Any = 0.0) -> Float[Array, ""]:
    """γ_QF = (32/3) g √(a³/π) Q₅(ε_dd) with a = g/(4π) (module docstring; ħ = m = 1, trap units: g = 4πa_s/a_ho).
    ``g`` > 0 (a repulsive contact coupling: the LHY term is of the s-wave length), ``eps_dd`` ≥ 0; traced values
    pass (γ_QF is then differentiable in both)."""
    for name, v in (("g", g), ("eps_dd", eps_dd)):
        if isinstance(v, (str, bytes)):
            raise TypeError(f"{name} must be a real number, got {v!r}")
    check_scalar(g, "g", positive=True)
    check_scalar(eps_dd, "eps_dd", nonnegative=True)
    gj = jnp.asarray(g)
    rdt = gj.dtype if jnp.issubdtype(gj.dtype, jnp.floating) else jnp.float32
    gj = gj.astype(rdt)
    a = gj / (4 * math.pi)
    return (32.0 / 3.0) * gj * jnp.sqrt(a * a * a / math.pi) * q5(jnp.asarray(eps_dd, rdt))


def density_power(n: Float[ArrayLike, "*shape"], p: float) -> Float[Array, "*shape"]:
    """n^p for p ∈ {3/2, 5/2} as n·√n or n²·√n (one square root, fused into the caller's elementwise pass), with the
    √ taken of max(n, tiny): the value is exact, and its derivatives are finite at n = 0 (where n^{3/2} and n^{5/2}
    have derivative 0)."""
    if p not in (1.5, 2.5):
        raise ValueError(f"p must be 1.5 or 2.5 (the LHY powers n^(3/2) and n^(5/2)), got {p!r}")
    n = jnp.asarray(n)
    root = jnp.sqrt(jnp.maximum(n, jnp.finfo(n.dtype).tiny))
    return n * root if p == 1.5 else n * n * root


def petrov_units(g11: float, g22: float, g12: float) -> dict[str, float]:
    """The scales that map a density-locked two-component mixture with LHY (ħ = m = 1, 3-D; module docstring) onto
    Petrov's reduced equation: ``density`` n₀, ``length`` ξ, ``time`` ξ², ``energy`` 1/ξ² and ``number`` n₀ξ³
    (N = number·Ñ), and the locked fractions ``c1``, ``c2`` (n_i = c_i n). float64 NumPy; needs g₁₁, g₂₂ > 0 and
    δg = g₁₂ + √(g₁₁g₂₂) < 0 (the mean-field collapse side, where the droplet forms)."""
    for name, v in (("g11", g11), ("g22", g22), ("g12", g12)):
        check_scalar(v, name)
    a, b, c = float(g11), float(g22), float(g12)
    if not (a > 0 and b > 0):
        raise ValueError(f"g11 and g22 must be > 0 (repulsive intra-species couplings), got {a} and {b}")
    dg = c + math.sqrt(a * b)
    if not dg < 0:
        raise ValueError(
            f"g12 must be below -sqrt(g11*g22) = {-math.sqrt(a * b):.6g} (delta g < 0: the droplet side), got {c}"
        )
    ra, rb = math.sqrt(a), math.sqrt(b)
    alpha = dg * ra * rb / (ra + rb) ** 2
    beta = MIXTURE_LHY * (a * b) ** 1.25
    n0 = (2 * abs(alpha) / (3 * beta)) ** 2
    xi = (beta * n0**1.5) ** -0.5
    return {
        "density": n0,
        "length": xi,
        "time": xi * xi,
        "energy": 1 / (xi * xi),
        "number": n0 * xi**3,
        "c1": rb / (ra + rb),
        "c2": ra / (ra + rb),
    }
