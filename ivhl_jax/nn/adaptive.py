"""Adaptive-node networks: pure, vectorised node dynamics with a stochastic four-phase scheduler.

A clean-room reimplementation (equations only; no code copied) of the "adaptive node" classifier of the
PyTorch package ``adaptiveneuralnetwork`` (github.com/V1B3hR/adaptiveneuralnetwork), called *the reference
model* below; :meth:`AdaptiveConfig.reference` is its configuration. A population of
``N`` uncoupled nodes, each with a hidden vector ``h[H]``, an energy ``E`` and an activity ``a``,
is driven by a linear projection of the input. A non-differentiable scheduler puts every node in
one of four phases (ACTIVE, SLEEP, INTERACTIVE, INSPIRED) each step. One step (shapes per sample):

  u      = W_in x + b_in                                  [H]   (or per node: u_n = W_in[n] x + b_in[n])
  A_n    = max(0, 5 - E_n) + 2 a_n + Var_k(h_nk)           anxiety, pre-update state, unbiased variance
  phi_n  ~ Scheduler(E, a, A)                              no gradient
  D_n    = (1 + s[phi_n]) (W_s h_n + b_s)                  phase gain, s = phase_scales (init 1)
  m_n    = [phi_n != SLEEP]
  h'_n   = tanh(h_n + m_n (D_n + g u))                     g = input_gain (0.1)
  E'_n   = clip((1 - delta) E_n + m_n (w_e.h'_n + b_e)(1 - 0.1 clip(A_n/10, 0, 1)) + (1 - m_n) rho, 0, 50)
  a'_n   = clip(sigmoid(alpha_1 mean_k h'_nk + alpha_2 mean_k u_k + beta), 0, 1)
  logits = W_out f + b_out,  f = a' (readout="activity") | [a', h', E'/50] (options)

``rho`` = ``sleep_recovery`` (default 0: sleep restores nothing). Energy is dimensionless.

Phase scheduler (per node; ``t`` counts steps, ``c = sin(2 pi (t mod P)/P)``, ``Abar`` is an EMA of
anxiety ``Abar <- 0.3 A + 0.7 Abar``, ``r`` a restorative need). A rule cascade gives a weight vector
over the phases; the first rule that applies wins: R0 exploration (prob. eps), R1 ``Abar > theta``,
R2 ``r > 0.6`` and awake, R3 ``E < 2``, R4 ``E > 20`` and ``a < 0.3``, R5 ``a > 0.7``, R6 transition
matrix row of the current phase (re-weighted by anxiety and need). The cascade is evaluated for all
nodes at once by ``where``-priority selection, and each node draws once from ``softmax(logits)``.
``logits = log(w) / T`` (proper probabilities tempered by ``T``); with ``softmax_of_probabilities=True`` the
logits are ``w / T`` (the reference model's policy: a softmax of the probabilities), under which every policy is
nearly uniform. After the draw, ``r`` and the sleep quality ``q`` are updated.

Sampling (performance, same distributions): one uniform ``u`` per node decides both R0 (``u < eps``)
and, rescaled to [0, 1) within its branch, the phase by inverse CDF over the 4 unnormalised masses
``exp(logits)`` (``w`` itself for the proper policy at ``T = 1``, so no transcendental work). That is
one 32-bit random word per node instead of five (R0 uniform + 4 Gumbel), with no log/exp.

Two documented scheduler semantics (``AdaptiveConfig.scheduler``):

* ``"per_sample"`` (default): every sample has its own scheduler state ``[N]``; samples never
  interact, so the output for sample ``b`` depends only on (params, its state, its input, its key).
* ``"shared"`` (the reference model's semantics): one scheduler state ``[N]`` for the whole batch. The
  batch rows are decided as a sequential chain (each decision reads the phase written by the row
  before), the final decision is used for every row, and the anxiety EMA reads only the last row.

One door: :func:`dynamics` builds the stepper on an input batch ``x [B, D]`` (it validates the weights against
the config and ``x``), ``init(key, nodes=None)`` validates the start state (or creates :func:`init_state`), and
``trajectory(stepper, stepper.init(key), K, observe=observe)`` runs K steps; the classifier runs the config's
``inner_steps`` per input with ``observe=observe_phase_fractions`` (the phase fractions it averages over the K
steps), and :func:`apply_sequence` scans that over a sequence of inputs. :func:`step` is the step itself,
``(params, state, x, key) -> (state, outputs)``; each step of the stepper draws its phases with a subkey split
from the key carried in the state. Carrying state across batches (a "time" axis of batches) is the caller's
choice; :func:`detach` stops gradients through the carried state.

Precision: :func:`step`, :func:`apply_sequence`, :func:`dynamics` and the initialisers (:func:`init_params`,
:func:`init_param`, :func:`init_state`) take a
:class:`~ivhl_jax.core.precision.Policy` / preset name; ``policy=None`` (the default) is
:func:`~ivhl_jax.core.precision.default_policy` of the inputs: every dtype the inputs' own (float32 for
float32 weights and input). The weights are rounded to ``param_dtype`` (their storage), each step runs in
``compute_dtype`` (matmuls, nonlinearities, the scheduler's comparisons), and the new node state and the outputs
are returned in ``output_dtype``, which is also the dtype of the state carried between steps. ``"bf16"`` is bf16
compute with float32 weights and state. Measured against a float64 run: docs/guide/precision.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from ivhl_jax.core.precision import Policy, physics_policy
from ivhl_jax.core.validation import check_array, check_choice, check_key, check_scalar
from ivhl_jax.numerics.rollout import Stepper, trajectory

__all__ = [
    "dynamics",
    "observe",
    "observe_phase_fractions",
    "DynamicsParams",
    "DynamicsState",
    "AdaptiveConfig",
    "NodeState",
    "PHASES",
    "init_params",
    "init_state",
    "step",
    "apply_sequence",
    "detach",
    "count_params",
    "node_metrics",
]

PHASES = ("active", "sleep", "interactive", "inspired")
ACTIVE, SLEEP, INTERACTIVE, INSPIRED = range(4)

# Rule weights over (ACTIVE, SLEEP, INTERACTIVE, INSPIRED).
_EXPLORE_W = (0.6, 0.1, 0.25, 0.05)
_TRANSITION = (
    (0.80, 0.04, 0.15, 0.01),
    (0.15, 0.80, 0.04, 0.01),
    (0.15, 0.04, 0.80, 0.01),
    (0.10, 0.05, 0.05, 0.80),
)
E_MAX = 50.0


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """Model and scheduler configuration. Default sizes N=100, H=64, D=784, C=10.

    Attributes:
      num_nodes, hidden_dim, input_dim, output_dim: N, H, D, C.
      energy_decay: delta, fraction of energy lost per step.
      initial_energy: E at the start of a sequence (10).
      circadian_period: P of the scheduler clock.
      anxiety_threshold: theta of rule R1.
      temperature: T of the phase policy.
      exploration_rate: eps, probability of rule R0.
      inner_steps: K dynamics steps per input.
      scheduler: ``"per_sample"`` or ``"shared"`` (see module docstring).
      softmax_of_probabilities: logits ``w / T`` (a softmax of the probabilities) instead of ``log(w) / T``.
      readout: ``"activity"`` (logits from a'), ``"hidden"`` (from h'), ``"hidden+activity"``.
      readout_energy: also feed E'/50 to the readout (makes the energy head trainable).
      per_node_input: node-specific input weights W_in[N, D, H] instead of one shared projection.
      input_gain: g, weight of the projected input in the hidden update (0.1).
      sleep_recovery: rho, energy a sleeping node regains per step (0: none).
      stochastic: sample phases; if False every node stays ACTIVE (a deterministic ablation).
    """

    num_nodes: int = 100
    hidden_dim: int = 64
    input_dim: int = 784
    output_dim: int = 10
    energy_decay: float = 0.01
    initial_energy: float = 10.0
    circadian_period: int = 100
    anxiety_threshold: float = 5.0
    temperature: float = 1.0
    exploration_rate: float = 0.1
    inner_steps: int = 1
    scheduler: str = "per_sample"
    softmax_of_probabilities: bool = False
    readout: str = "activity"
    readout_energy: bool = False
    per_node_input: bool = False
    input_gain: float = 0.1
    sleep_recovery: float = 0.0
    stochastic: bool = True

    def validate(self) -> None:
        for name in ("num_nodes", "hidden_dim", "input_dim", "output_dim", "circadian_period", "inner_steps"):
            check_scalar(getattr(self, name), name, integer=True, minimum=1)
        if self.hidden_dim < 2:
            raise ValueError("hidden_dim must be >= 2 (anxiety uses the unbiased variance over H)")
        check_scalar(self.energy_decay, "energy_decay", minimum=0.0, maximum=1.0)
        check_scalar(self.initial_energy, "initial_energy", minimum=0.0, maximum=E_MAX)
        check_scalar(self.anxiety_threshold, "anxiety_threshold", positive=True)
        check_scalar(self.temperature, "temperature", positive=True)
        check_scalar(self.exploration_rate, "exploration_rate", minimum=0.0, maximum=1.0)
        check_scalar(self.input_gain, "input_gain", nonnegative=True)
        check_scalar(self.sleep_recovery, "sleep_recovery", nonnegative=True)
        check_choice(self.scheduler, "scheduler", ("per_sample", "shared"))
        check_choice(self.readout, "readout", ("activity", "hidden", "hidden+activity"))

    def __post_init__(self):
        self.validate()

    @classmethod
    def reference(cls, **overrides: Any) -> AdaptiveConfig:
        """The reference model's semantics: batch-shared scheduler, softmax of probabilities, activity readout."""
        return cls(**{"scheduler": "shared", "softmax_of_probabilities": True, **overrides})

    @classmethod
    def improved(cls, **overrides: Any) -> AdaptiveConfig:
        """Removes the bottleneck: read out from h (and a, E), per-node inputs, restorative sleep."""
        base = dict(
            scheduler="per_sample",
            softmax_of_probabilities=False,
            readout="hidden+activity",
            readout_energy=True,
            per_node_input=True,
            input_gain=1.0,
            sleep_recovery=0.5,
            inner_steps=2,
        )
        return cls(**{**base, **overrides})

    @property
    def num_features(self) -> int:
        n, h = self.num_nodes, self.hidden_dim
        f = {"activity": n, "hidden": n * h, "hidden+activity": n * h + n}[self.readout]
        return f + (n if self.readout_energy else 0)


class NodeState(flax.struct.PyTreeNode):
    """Node and scheduler state of a batch.

    Node fields: ``h [B,N,H]``, ``energy [B,N]``, ``activity [B,N]``. Scheduler fields have shape
    ``S + [N]`` with ``S = [B]`` for the per-sample scheduler and ``S = []`` for the shared one:
    ``phase`` (int32), ``anxiety_ema``, ``restorative`` (r), ``sleep_quality`` (q); ``t`` has shape S.
    """

    h: jax.Array
    energy: jax.Array
    activity: jax.Array
    phase: jax.Array
    anxiety_ema: jax.Array
    restorative: jax.Array
    sleep_quality: jax.Array
    t: jax.Array


def init_state(cfg: AdaptiveConfig, batch: int, *, policy: str | Policy | None = None) -> NodeState:
    """The initial state of a sequence: h = 0, E = initial_energy, a = 0, all ACTIVE, r = 0, q = 1; floating
    fields in the policy's ``output_dtype`` (the dtype a step carries its state in; None: float32)."""
    check_scalar(batch, "batch", integer=True, minimum=1)
    dtype = physics_policy(policy, like=()).output_dtype
    n, hd = cfg.num_nodes, cfg.hidden_dim
    s = (batch,) if cfg.scheduler == "per_sample" else ()
    return NodeState(
        h=jnp.zeros((batch, n, hd), dtype),
        energy=jnp.full((batch, n), cfg.initial_energy, dtype),
        activity=jnp.zeros((batch, n), dtype),
        phase=jnp.full(s + (n,), ACTIVE, jnp.int32),
        anxiety_ema=jnp.zeros(s + (n,), dtype),
        restorative=jnp.zeros(s + (n,), dtype),
        sleep_quality=jnp.ones(s + (n,), dtype),
        t=jnp.zeros(s, jnp.int32),
    )


def detach(state: NodeState) -> NodeState:
    """Stop gradients through a state carried from a previous batch (truncated backpropagation of length 1)."""
    return jax.tree_util.tree_map(jax.lax.stop_gradient, state)


# --------------------------------------------------------------------------------------------- params


def param_specs(cfg: AdaptiveConfig) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """name -> (shape, fan_in) for every parameter; fan_in None means a constant init (phase scales = 1).

    Layout: kernels are ``[in, out]`` (x @ W). Initialisation is PyTorch's ``nn.Linear`` default,
    uniform in ``±1/sqrt(fan_in)`` for weights and biases.
    """
    n, h, d, c = cfg.num_nodes, cfg.hidden_dim, cfg.input_dim, cfg.output_dim
    in_shape = (n, d, h) if cfg.per_node_input else (d, h)
    in_bias = (n, h) if cfg.per_node_input else (h,)
    return {
        "W_in": (in_shape, d),
        "b_in": (in_bias, d),
        "W_s": ((h, h), h),
        "b_s": ((h,), h),
        "phase_scales": ((4,), None),
        "w_e": ((h,), h),
        "b_e": ((), h),
        "alpha": ((2,), 2),
        "beta": ((), 2),
        "W_out": ((cfg.num_features, c), cfg.num_features),
        "b_out": ((c,), cfg.num_features),
    }


def init_param(
    key: jax.Array, shape: tuple[int, ...], fan_in: int | None, *, policy: str | Policy | None = None
) -> Float[Array, " ..."]:
    """One parameter of ``shape``: uniform in ``±1/sqrt(fan_in)``, or ones when ``fan_in`` is None; in the
    policy's ``param_dtype`` (None: float32)."""
    dtype = physics_policy(policy, like=()).param_dtype
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"shape must be a tuple of sizes, got {shape!r}")
    for i, d in enumerate(shape):
        check_scalar(d, f"shape[{i}]", integer=True, nonnegative=True)
    shape = tuple(int(d) for d in shape)
    if fan_in is not None:
        check_scalar(fan_in, "fan_in", integer=True, minimum=1)
    if fan_in is None:
        return jnp.ones(shape, dtype)
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def init_params(key: jax.Array, cfg: AdaptiveConfig, *, policy: str | Policy | None = None) -> dict[str, jax.Array]:
    """All parameters as a flat dict (see :func:`param_specs`), in the policy's ``param_dtype`` (None: float32)."""
    specs = param_specs(cfg)
    keys = jax.random.split(key, len(specs))
    return {name: init_param(k, shape, fan, policy=policy) for k, (name, (shape, fan)) in zip(keys, specs.items())}


def count_params(params: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


# --------------------------------------------------------------------------------------------- scheduler


def anxiety(
    h: Float[Array, "*batch N H"], energy: Float[Array, "*batch N"], activity: Float[Array, "*batch N"]
) -> Float[Array, "*batch N"]:
    """A = max(0, 5 - E) + 2 a + Var_k(h_k) (unbiased over the hidden axis)."""
    return jnp.maximum(0.0, 5.0 - energy) + 2.0 * activity + jnp.var(h, axis=-1, ddof=1)


def _w(*vals) -> jax.Array:
    return jnp.asarray(vals, jnp.float32)


def phase_weights(
    phase: Int[ArrayLike, " ..."],
    energy: Real[ArrayLike, " ..."],
    activity: Real[ArrayLike, " ..."],
    anxiety_ema: Real[ArrayLike, " ..."],
    restorative: Real[ArrayLike, " ..."],
    circadian: Real[ArrayLike, " ..."],
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


# --------------------------------------------------------------------------------------------- dynamics


def project_input(
    params: dict, x: Float[Array, "B D"], cfg: AdaptiveConfig
) -> Float[Array, "B H"] | Float[Array, "B N H"]:
    """u = W_in x + b_in: ``[B,H]`` (shared projection) or ``[B,N,H]`` (per-node weights)."""
    if cfg.per_node_input:
        return jnp.einsum("bd,ndh->bnh", x, params["W_in"]) + params["b_in"]
    return x @ params["W_in"] + params["b_in"]


@jax.custom_vjp
def _rows_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for ``x [..., R, K]`` (here ``h [B, N, H] @ W_s``), with a reverse-mode rule tuned for XLA CPU.

    The weight gradient ``dw = Σ_b x_bᵀ g_b`` is written as a batched GEMM over the leading axes plus a
    sum. Autodiff's default, one GEMM contracting all B·R rows at once, makes XLA materialise a
    transposed copy of the cotangent ``g`` on the critical path of the backward pass on CPU. Same math,
    same result up to float32 summation order. Reverse mode only (``jax.jvp`` through it is not defined).
    """
    return x @ w


def _rows_matmul_fwd(x, w):
    return x @ w, (x, w)


def _rows_matmul_bwd(res, g):
    x, w = res
    xb = x.reshape((-1,) + x.shape[-2:])
    gb = g.reshape((-1,) + g.shape[-2:])
    dw = jnp.sum(jnp.matmul(jnp.swapaxes(xb, -1, -2), gb, preferred_element_type=jnp.float32), axis=0)
    return g @ w.T, dw.astype(w.dtype)


_rows_matmul.defvjp(_rows_matmul_fwd, _rows_matmul_bwd)


def node_update(
    params: dict,
    cfg: AdaptiveConfig,
    h: Float[Array, "B N H"],
    energy: Float[Array, "B N"],
    u: Float[Array, "B H"] | Float[Array, "B N H"],
    anx: Float[Array, "B N"],
    phase: Int[Array, "B N"] | Int[Array, " N"],
) -> tuple[Float[Array, "B N H"], Float[Array, "B N"], Float[Array, "B N"]]:
    """Hidden, energy and activity update for given phases (broadcasts over any batch shape).

    ``u`` is ``[B,H]`` or ``[B,N,H]``; ``phase`` is ``[B,N]`` or ``[N]`` (shared). Returns (h', E', a').
    """
    u_n = u[:, None, :] if u.ndim == 2 else u
    scale = 1.0 + params["phase_scales"][phase]
    awake = (phase != SLEEP).astype(h.dtype)
    delta = scale[..., None] * (_rows_matmul(h, params["W_s"]) + params["b_s"])
    h_new = jnp.tanh(h + awake[..., None] * (delta + cfg.input_gain * u_n))
    damp = 1.0 - 0.1 * jnp.clip(anx / 10.0, 0.0, 1.0)
    d_energy = (h_new @ params["w_e"] + params["b_e"]) * damp * awake
    e_new = (1.0 - cfg.energy_decay) * energy + d_energy + cfg.sleep_recovery * (1.0 - awake)
    e_new = jnp.clip(e_new, 0.0, E_MAX)
    u_mean = jnp.mean(u_n, axis=-1)
    a_new = jax.nn.sigmoid(params["alpha"][0] * jnp.mean(h_new, axis=-1) + params["alpha"][1] * u_mean + params["beta"])
    return h_new, e_new, jnp.clip(a_new, 0.0, 1.0)


def readout(
    params: dict,
    cfg: AdaptiveConfig,
    h: Float[Array, "B N H"],
    energy: Float[Array, "B N"],
    activity: Float[Array, "B N"],
) -> Float[Array, "B C"]:
    """logits = W_out f + b_out with f chosen by ``cfg.readout`` / ``cfg.readout_energy``."""
    feats = []
    if cfg.readout in ("hidden", "hidden+activity"):
        feats.append(h.reshape(h.shape[0], -1))
    if cfg.readout in ("activity", "hidden+activity"):
        feats.append(activity)
    if cfg.readout_energy:
        feats.append(energy / E_MAX)
    f = feats[0] if len(feats) == 1 else jnp.concatenate(feats, axis=-1)
    return f @ params["W_out"] + params["b_out"]


def _check_real_tree(tree: Any, name: str, policy: Policy) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.complexfloating):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} is complex ({jnp.result_type(leaf)}), but the policy "
                f"computes in the real dtype {jnp.dtype(policy.compute_dtype)}; adaptive-node states, "
                "inputs and weights are real"
            )


def step(
    params: dict,
    state: NodeState,
    x: Float[Array, "B D"],
    key: jax.Array,
    cfg: AdaptiveConfig,
    policy: str | Policy | None = None,
) -> tuple[NodeState, dict[str, Array]]:
    """One dynamics step for a batch ``x [B, D]``; returns (new state, outputs).

    outputs: ``logits [B,C]``, ``phase [B,N]`` (int32), ``anxiety [B,N]``, ``energy [B,N]``,
    ``activity [B,N]``. The phase draw has no gradient; everything else is differentiable.
    ``policy``: a precision policy / preset (None: :func:`~ivhl_jax.core.precision.default_policy` of
    ``params``, ``state`` and ``x``, i.e. their own dtype): weights rounded to ``param_dtype``, the step in
    ``compute_dtype``, new state and outputs in ``output_dtype`` (module docstring). Complex weights, state or
    input are a TypeError naming them.
    """
    pol = physics_policy(policy, like=(params, state, x))
    # the policy's own message first (it names the compute dtype), then the shape/finiteness checks
    for tree, name in ((params, "params"), (state, "state"), (x, "x")):
        _check_real_tree(tree, name, pol)
    x = check_inputs(cfg, state, x)
    new_state, out = _step(
        pol.cast_to_compute(pol.cast_to_param(params)),
        pol.cast_to_compute(state),
        jnp.asarray(x).astype(pol.compute_dtype),
        key,
        cfg,
    )
    return pol.cast_to_output(new_state), pol.cast_to_output(out)


def _step(
    params: dict, state: NodeState, x: Float[Array, "B D"], key: jax.Array, cfg: AdaptiveConfig
) -> tuple[NodeState, dict[str, Array]]:
    """The step of :func:`step` on checked inputs, all in one compute dtype."""
    u = project_input(params, x, cfg)
    anx = anxiety(state.h, state.energy, state.activity)
    sched_in = detach(state)
    anx_ng = jax.lax.stop_gradient(anx)
    if cfg.scheduler == "per_sample":
        phase, sched = schedule_per_sample(cfg, sched_in, anx_ng, key)
        phase_b = phase
    else:
        phase, sched = schedule_shared(cfg, sched_in, anx_ng, key)
        phase_b = jnp.broadcast_to(phase, state.energy.shape)
    h, e, a = node_update(params, cfg, state.h, state.energy, u, anx, phase)
    new_state = sched.replace(h=h, energy=e, activity=a)
    logits = readout(params, cfg, h, e, a)
    return new_state, {"logits": logits, "phase": phase_b, "anxiety": anx, "energy": e, "activity": a}


def check_inputs(cfg: AdaptiveConfig, state: NodeState, x: Float[ArrayLike, "B D"]) -> Float[Array, "B D"]:
    """Validate ``x`` against the config and the state's batch size (shape errors name the fix)."""
    x = check_array(x, "x", shape=(None, cfg.input_dim), kind="floating", finite=True)
    if state.h.shape != (x.shape[0], cfg.num_nodes, cfg.hidden_dim):
        raise ValueError(
            f"state.h has shape {state.h.shape}, expected {(x.shape[0], cfg.num_nodes, cfg.hidden_dim)}"
            f"; create it with init_state(cfg, batch={x.shape[0]})"
        )
    return x


def _run_inner(
    params: dict,
    state: NodeState,
    x: Float[ArrayLike, "B D"],
    key: jax.Array,
    cfg: AdaptiveConfig,
    policy: str | Policy | None = None,
) -> tuple[NodeState, dict[str, Array]]:
    """``cfg.inner_steps`` (K) steps on the same input: the last step's outputs, plus ``phase_fractions [4]``
    averaged over the K steps, nodes and batch (the checks are the builder's and ``init``'s)."""
    st = dynamics(params, x, cfg, policy=policy)
    final, fractions = trajectory(st, st.init(key, state), cfg.inner_steps, observe=observe_phase_fractions)
    return final.nodes, {**final.outputs, "phase_fractions": jnp.mean(fractions, axis=0)}


def phase_fractions(phase: Int[Array, " ..."]) -> Float[Array, " 4"]:
    """Fraction of (sample, node) slots in each phase, ``[4]``."""
    return jnp.mean(jax.nn.one_hot(phase, 4, dtype=jnp.float32), axis=tuple(range(phase.ndim)))


def apply_sequence(
    params: dict,
    state: NodeState,
    xs: Float[ArrayLike, "T B D"],
    key: jax.Array,
    cfg: AdaptiveConfig,
    policy: str | Policy | None = None,
) -> tuple[NodeState, dict[str, Array]]:
    """Run a sequence ``xs [T, B, D]`` from an explicit initial state (``lax.scan`` over T).

    Each input runs ``cfg.inner_steps`` steps of :func:`dynamics` from the state the previous one left. Returns
    the final state and the stacked outputs (``logits [T,B,C]`` ..., ``phase_fractions [T,4]`` averaged over
    each input's steps). ``policy`` as in
    :func:`step` (the state is carried in its ``output_dtype``).
    """
    xs = check_array(xs, "xs", shape=(None, None, cfg.input_dim), kind="floating")
    pol = physics_policy(policy, like=(params, state, xs))
    state = pol.cast_to_output(state)

    def body(s, inp):
        x, k = inp
        return _run_inner(params, s, x, k, cfg, pol)

    return jax.lax.scan(body, state, (xs, jax.random.split(key, xs.shape[0])))


def node_metrics(state: NodeState, out: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Scalar summaries (phase ratios, mean energy/activity/anxiety, active-node ratio)."""
    fr = out["phase_fractions"]
    m = {f"{p}_ratio": fr[i] for i, p in enumerate(PHASES)}
    m.update(
        mean_energy=jnp.mean(state.energy),
        mean_activity=jnp.mean(state.activity),
        mean_anxiety=jnp.mean(out["anxiety"]),
        max_anxiety=jnp.max(out["anxiety"]),
        active_node_ratio=jnp.mean((state.energy > 1.0) & (state.activity > 0.5)),
        mean_restorative_need=jnp.mean(state.restorative),
    )
    return m


# ----------------------------------------------------------------------------------------------
# the stepper protocol: K-free dynamics on a fixed input, the PRNG key in the state


class DynamicsParams(flax.struct.PyTreeNode):
    """Weights (:func:`init_params`), the input batch ``x [B, D]`` and the static :class:`AdaptiveConfig`."""

    weights: dict
    x: jax.Array
    cfg: AdaptiveConfig = flax.struct.field(pytree_node=False)
    policy: Policy = flax.struct.field(pytree_node=False, default_factory=Policy)


class DynamicsState(flax.struct.PyTreeNode):
    """Node/scheduler state, the PRNG key, and the outputs of the last step (``logits [B,C]`` ...)."""

    nodes: NodeState
    key: jax.Array
    outputs: dict


def _dynamics_step(state: DynamicsState, params: DynamicsParams) -> DynamicsState:
    key, sub = jax.random.split(state.key)
    nodes, out = step(params.weights, state.nodes, params.x, sub, params.cfg, params.policy)
    return DynamicsState(nodes=nodes, key=key, outputs=out)


def _check_nodes(cfg: AdaptiveConfig, nodes: Any, batch: int) -> None:
    """Shapes of a start :class:`NodeState` for ``batch`` samples (as :func:`init_state` makes them)."""
    if not isinstance(nodes, NodeState):
        raise TypeError(f"nodes must be a NodeState (adaptive.init_state(cfg, batch)), got {type(nodes).__name__}")
    want = init_state(cfg, batch)
    for field in ("h", "energy", "activity", "phase", "anxiety_ema", "restorative", "sleep_quality", "t"):
        got = tuple(np.shape(getattr(nodes, field)))
        if got != getattr(want, field).shape:
            raise ValueError(
                f"nodes.{field} has shape {got}, expected {getattr(want, field).shape} for x of batch "
                f"{batch} and this config; create it with init_state(cfg, batch={batch})"
            )


def _dynamics_init(params: DynamicsParams, key: jax.Array, nodes: NodeState | None = None) -> DynamicsState:
    """The start state: ``nodes`` (validated against the config and x) or :func:`init_state`, and ``key``."""
    check_key(key, "key")
    if nodes is None:
        nodes = init_state(params.cfg, params.x.shape[0], policy=params.policy)
    else:
        _check_nodes(params.cfg, nodes, params.x.shape[0])
        _check_real_tree(nodes, "state", params.policy)
        nodes = params.policy.cast_to_output(nodes)
    _, out = jax.eval_shape(lambda: step(params.weights, nodes, params.x, key, params.cfg, params.policy))
    zeros = jax.tree_util.tree_map(lambda o: jnp.zeros(o.shape, o.dtype), out)
    return DynamicsState(nodes=nodes, key=key, outputs=zeros)


def observe(state: DynamicsState, params: DynamicsParams) -> dict:
    """The last step's outputs (``logits [B,C]``, ``phase``, ``anxiety``, ``energy``, ``activity`` ``[B,N]``)
    plus its phase fractions ``[4]``."""
    del params
    return {**state.outputs, "phase_fractions": phase_fractions(state.outputs["phase"])}


def observe_phase_fractions(state: DynamicsState, params: DynamicsParams) -> Float[Array, " 4"]:
    """The fraction of (sample, node) slots in each phase after the step, ``[4]`` (the classifier averages it
    over its ``inner_steps``)."""
    del params
    return phase_fractions(state.outputs["phase"])


def _check_weights(weights: Any, cfg: AdaptiveConfig) -> None:
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be the dict of init_params(key, cfg), got {type(weights).__name__}")
    for name, (shape, _) in param_specs(cfg).items():
        if name not in weights:
            raise ValueError(f"weights has no '{name}'; build them with init_params(key, cfg)")
        if tuple(np.shape(weights[name])) != tuple(shape):
            raise ValueError(
                f"weights['{name}'] has shape {tuple(np.shape(weights[name]))}, expected {tuple(shape)} "
                "for this config; build them with init_params(key, cfg)"
            )


def dynamics(
    weights: dict, x: Float[ArrayLike, "B D"], cfg: AdaptiveConfig, *, policy: str | Policy | None = None
) -> Stepper[DynamicsState, DynamicsParams]:
    """Stepper of the adaptive-node dynamics on a fixed input ``x [B, D]``: ``step`` is one :func:`step`
    with a subkey split from the state's key; ``init(key, nodes=None)`` starts from ``nodes`` (shapes checked
    against the config and ``x``) or from :func:`init_state`. The weights (shapes of :func:`init_params` for
    ``cfg``) and ``x`` (finite, real) are checked here.
    ``policy``: weights stored in its ``param_dtype`` (cast here), each step in ``compute_dtype``, the
    state carried in ``output_dtype`` (module docstring); None is the default policy of ``weights`` and ``x``."""
    if not isinstance(cfg, AdaptiveConfig):
        raise TypeError(f"cfg must be an AdaptiveConfig; got {type(cfg).__name__}")
    pol = physics_policy(policy, like=(weights, x))
    x = check_array(x, "x", shape=(None, cfg.input_dim), kind="floating", finite=True)
    _check_weights(weights, cfg)
    _check_real_tree(weights, "weights", pol)
    weights = pol.cast_to_param(weights)
    return Stepper.create(
        _dynamics_step,
        DynamicsParams(weights=weights, x=x, cfg=cfg, policy=pol),
        init_fn=_dynamics_init,
        name="adaptive.dynamics",
    )
