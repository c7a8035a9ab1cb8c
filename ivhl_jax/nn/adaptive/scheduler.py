"""The stochastic four-phase scheduler of the adaptive nodes: anxiety, the rule cascade
(:func:`phase_weights`), the phase distribution and its one-uniform draw, and the per-sample and batch-shared
schedulers (module docstring of :mod:`ivhl_jax.nn.adaptive`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from ivhl_jax.core.validation import check_scalar
from ivhl_jax.nn.adaptive.config import ACTIVE, INTERACTIVE, SLEEP, AdaptiveConfig, NodeState

__all__ = [
    "anxiety",
    "phase_weights",
    "phase_logits",
    "phase_masses",
    "sample_phase",
    "schedule_per_sample",
    "schedule_shared",
    "phase_fractions",
]


#: A per-node input of the rule cascade: any shape that broadcasts with the other inputs (``[N]``, ``[B, N]``,
#: a scalar).
NodeField = Real[ArrayLike, " ..."]

# Rule weights over (ACTIVE, SLEEP, INTERACTIVE, INSPIRED).
_EXPLORE_W = (0.6, 0.1, 0.25, 0.05)
_TRANSITION = (
    (0.80, 0.04, 0.15, 0.01),
    (0.15, 0.80, 0.04, 0.01),
    (0.15, 0.04, 0.80, 0.01),
    (0.10, 0.05, 0.05, 0.80),
)


def anxiety(
    h: Float[Array, "*batch N H"], energy: Float[Array, "*batch N"], activity: Float[Array, "*batch N"]
) -> Float[Array, "*batch N"]:
    """A = max(0, 5 - E) + 2 a + Var_k(h_k) (unbiased over the hidden axis)."""
    return jnp.maximum(0.0, 5.0 - energy) + 2.0 * activity + jnp.var(h, axis=-1, ddof=1)


def _w(*vals) -> jax.Array:
    return jnp.asarray(vals, jnp.float32)


def phase_weights(
    phase: Int[ArrayLike, " ..."],
    energy: NodeField,
    activity: NodeField,
    anxiety_ema: NodeField,
    restorative: NodeField,
    circadian: NodeField,
    explore: Bool[ArrayLike, " ..."],
    anxiety_threshold: float = 5.0,
) -> Float[Array, "... 4"]:
    """The rule cascade: weights ``[..., 4]`` over (ACTIVE, SLEEP, INTERACTIVE, INSPIRED).

    All inputs broadcast together (``explore`` is the boolean outcome of the eps-draw of rule R0).
    The first applicable rule wins; evaluation is branch-free (``where`` from the lowest priority up).
    """
    phase, energy, activity, abar, r, circadian, explore = jnp.broadcast_arrays(
        phase, energy, activity, anxiety_ema, restorative, circadian, explore
    )
    e = lambda v: v[..., None]
    # R6: row of the transition matrix, re-weighted by anxiety and restorative need.
    w = jnp.asarray(_TRANSITION, jnp.float32)[phase]
    w = w * jnp.where(e(abar > 2.5), _w(0.7, 1.5, 1.3, 1.0), 1.0)
    w = w * jnp.where(e(r > 0.4), _w(1.0, 1.4, 1.0, 0.6), 1.0)
    # R5: high activity.
    r5 = jnp.where(e(abar > 2.0), _w(0.2, 0.0, 0.8, 0.0), _w(0.7, 0.0, 0.3, 0.0))
    w = jnp.where(e(activity > 0.7), r5, w)
    # R4: plenty of energy, little activity; calm and circadian day -> inspiration.
    calm = (abar < 1.5) & (circadian > 0.5)
    r4 = jnp.where(e(calm), _w(0.1, 0.0, 0.3, 0.6), _w(0.3, 0.0, 0.7, 0.0))
    w = jnp.where(e((energy > 20.0) & (activity < 0.3)), r4, w)
    # R3: low energy -> sleep or interact.
    rho = jnp.where(abar > 2.5, 0.9, 0.7)
    r3 = jnp.stack([jnp.zeros_like(rho), rho, 1.0 - rho, jnp.zeros_like(rho)], axis=-1)
    w = jnp.where(e(energy < 2.0), r3, w)
    # R2: restorative need of an awake node.
    w = jnp.where(e((r > 0.6) & (phase != SLEEP)), _w(0.0, 0.8, 0.2, 0.0), w)
    # R1: high (EMA) anxiety, severity-weighted.
    sev = jnp.minimum(1.0, abar / (2.0 * anxiety_threshold))
    r1 = jnp.stack([(1.0 - sev) * 0.1, 0.6 * sev, 0.3 * sev, jnp.zeros_like(sev)], axis=-1)
    w = jnp.where(e(abar > anxiety_threshold), r1, w)
    # R0: exploration with the (normalised) phase weights.
    w = jnp.where(e(explore), _w(*_EXPLORE_W), w)
    return w


def phase_logits(
    weights: Float[Array, "*batch 4"], temperature: float, softmax_of_probabilities: bool
) -> Float[Array, "*batch 4"]:
    """Logits of the phase distribution: ``log(w)/T`` (proper), or ``w/T`` (a softmax of the probabilities)."""
    check_scalar(temperature, "temperature", positive=True)
    if softmax_of_probabilities:
        return weights / temperature
    return jnp.where(weights > 0, jnp.log(jnp.where(weights > 0, weights, 1.0)), -jnp.inf) / temperature


def phase_masses(
    weights: Float[Array, "*batch 4"], temperature: float, softmax_of_probabilities: bool
) -> Float[Array, "*batch 4"]:
    """Unnormalised probabilities ``q = exp(logits - max logits)`` of :func:`phase_logits` (last axis).

    For the proper policy at ``T = 1`` this is ``w`` itself (``q ∝ exp(log w) = w``): no transcendental
    work in the hot loop. Zero weights of the proper policy give ``q = 0`` exactly.
    """
    if not softmax_of_probabilities and temperature == 1.0:
        return weights
    logits = phase_logits(weights, temperature, softmax_of_probabilities)
    return jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))


def sample_phase(masses: Float[Array, "*batch 4"], u: Float[Array, "*batch"]) -> Int[Array, "*batch"]:
    """Inverse-CDF draw of one phase per node: ``masses [..., 4]`` (unnormalised), ``u [...]`` uniform in [0, 1).

    Returns ``k = #{j < 3 : u·Σq >= q_0 + ... + q_j}`` (int32), i.e. phase ``k`` with probability
    ``q_k / Σq``. The comparison is on the unnormalised running sum, whose last entry is the total, so
    a zero mass is an empty interval and that phase is never drawn (also not at ``u`` just below 1).
    """
    c0 = masses[..., 0]
    c1 = c0 + masses[..., 1]
    c2 = c1 + masses[..., 2]
    t = u * (c2 + masses[..., 3])
    # A reduction, not a sum of three compares: XLA CPU then materialises the phases once instead of
    # fusing (and recomputing) the whole draw into every [B, N, H] kernel that reads them.
    return jnp.sum(t[..., None] >= jnp.stack([c0, c1, c2], axis=-1), axis=-1, dtype=jnp.int32)


# Largest float32 below 1: keeps the rescaled uniform of _decide strictly below 1 after rounding.
_BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))


def _decide(cfg: AdaptiveConfig, key, phase, energy, activity, abar, r, circadian):
    """One phase draw per node (phase [..., N]) from the cascade. ``key`` covers all nodes.

    One uniform ``u`` per node drives both random choices: rule R0 fires iff ``u < eps``, and the
    categorical draw uses ``u`` rescaled to [0, 1) within the R0 / not-R0 branch (conditionally on the
    branch it is again uniform), so the phase distribution is ``softmax(phase_logits)`` of the cascade,
    at one 32-bit random word per node. ``u`` lies on a 2^-23 grid, so each phase probability is
    realised to within ~1e-6 (absolute).
    """
    # float32 explicitly (the default dtype without x64): the same random stream under every policy
    # and under x64, so a float64 reference run draws the same phases.
    u = jax.random.uniform(key, energy.shape, jnp.float32)
    eps = cfg.exploration_rate
    if eps <= 0.0:
        explore, v = jnp.zeros(u.shape, bool), u
    elif eps >= 1.0:
        explore, v = jnp.ones(u.shape, bool), u
    else:
        explore = u < eps
        v = jnp.minimum(jnp.where(explore, u * (1.0 / eps), (u - eps) * (1.0 / (1.0 - eps))), _BELOW_ONE)
    w = phase_weights(phase, energy, activity, abar, r, circadian, explore, cfg.anxiety_threshold)
    return sample_phase(phase_masses(w, cfg.temperature, cfg.softmax_of_probabilities), v)


def _circadian(t: jax.Array, period: int) -> jax.Array:
    return jnp.sin(2.0 * jnp.pi * (t % period).astype(jnp.float32) / period)


def _after_decision(phase, abar, r, q, restorative_strength: float = 0.1):
    """Restorative need and sleep quality updates for the chosen phases."""
    eta = jnp.where(abar > 5.0, 0.7, 1.0)
    sleeping = phase == SLEEP
    r = r + jnp.where(phase == ACTIVE, 0.05, 0.0) + jnp.where(phase == INTERACTIVE, 0.03, 0.0)
    r = r - jnp.where(sleeping, restorative_strength * eta, 0.0)
    q = jnp.where(sleeping, q + 0.02 * eta, q * 0.995)
    return jnp.clip(r, 0.0, 1.0), jnp.clip(q, 0.0, 1.0)


def schedule_per_sample(
    cfg: AdaptiveConfig, state: NodeState, anx: Float[Array, "B N"], key: jax.Array
) -> tuple[Int[Array, "B N"], NodeState]:
    """Per-sample scheduler: returns (phase [B,N], new scheduler fields); one uniform per (sample, node)."""
    if not cfg.stochastic:
        phase = jnp.full_like(state.phase, ACTIVE)
        return phase, state.replace(phase=phase, t=state.t + 1)
    t = state.t + 1
    circ = _circadian(t, cfg.circadian_period)[:, None]
    abar = 0.3 * anx + 0.7 * state.anxiety_ema
    phase = _decide(cfg, key, state.phase, state.energy, state.activity, abar, state.restorative, circ)
    r, q = _after_decision(phase, abar, state.restorative, state.sleep_quality)
    return phase, state.replace(phase=phase, anxiety_ema=abar, restorative=r, sleep_quality=q, t=t)


def schedule_shared(
    cfg: AdaptiveConfig, state: NodeState, anx: Float[Array, "B N"], key: jax.Array
) -> tuple[Int[Array, " N"], NodeState]:
    """The batch-shared scheduler: a sequential decision chain over the batch rows, whose
    final decision is used for every row; the anxiety EMA reads only the last row. Returns phase [N]."""
    if not cfg.stochastic:
        phase = jnp.full_like(state.phase, ACTIVE)
        return phase, state.replace(phase=phase, t=state.t + 1)
    t = state.t + 1
    circ = _circadian(t, cfg.circadian_period)
    abar = 0.3 * anx[-1] + 0.7 * state.anxiety_ema
    keys = jax.random.split(key, anx.shape[0])

    def chain(phase, row):
        k, en, ac = row
        return _decide(cfg, k, phase, en, ac, abar, state.restorative, circ), None

    phase, _ = jax.lax.scan(chain, state.phase, (keys, state.energy, state.activity))
    r, q = _after_decision(phase, abar, state.restorative, state.sleep_quality)
    return phase, state.replace(phase=phase, anxiety_ema=abar, restorative=r, sleep_quality=q, t=t)


def phase_fractions(phase: Int[Array, " ..."]) -> Float[Array, " 4"]:
    """Fraction of (sample, node) slots in each phase, ``[4]``."""
    return jnp.mean(jax.nn.one_hot(phase, 4, dtype=jnp.float32), axis=tuple(range(phase.ndim)))
