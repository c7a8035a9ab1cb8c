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

Modules, one job each (every name is importable from here): ``config`` (:class:`AdaptiveConfig`, the phases,
:class:`NodeState`), ``params`` (the weights), ``scheduler`` (anxiety, the rule cascade and the phase draw),
``node`` (:func:`step`: input projection, node update, readout) and ``stepper`` (:func:`dynamics`, its
observables, :func:`apply_sequence`).
"""

# Beside the listed API (__all__), the model's parts stay reachable as ``adaptive.<name>`` (the tests, the benchmarks
# and the Flax model read them): the phase ids, the weight layout, the scheduler and the pieces of a step.
from ivhl_jax.nn.adaptive.config import ACTIVE as ACTIVE
from ivhl_jax.nn.adaptive.config import E_MAX as E_MAX
from ivhl_jax.nn.adaptive.config import INSPIRED as INSPIRED
from ivhl_jax.nn.adaptive.config import INTERACTIVE as INTERACTIVE
from ivhl_jax.nn.adaptive.config import PHASES, AdaptiveConfig, NodeState, detach, init_state
from ivhl_jax.nn.adaptive.config import SLEEP as SLEEP
from ivhl_jax.nn.adaptive.node import check_inputs as check_inputs
from ivhl_jax.nn.adaptive.node import node_metrics, step
from ivhl_jax.nn.adaptive.node import node_update as node_update
from ivhl_jax.nn.adaptive.node import project_input as project_input
from ivhl_jax.nn.adaptive.node import readout as readout
from ivhl_jax.nn.adaptive.params import count_params, init_params
from ivhl_jax.nn.adaptive.params import init_param as init_param
from ivhl_jax.nn.adaptive.params import param_specs as param_specs
from ivhl_jax.nn.adaptive.scheduler import anxiety as anxiety
from ivhl_jax.nn.adaptive.scheduler import phase_fractions as phase_fractions
from ivhl_jax.nn.adaptive.scheduler import phase_logits as phase_logits
from ivhl_jax.nn.adaptive.scheduler import phase_masses as phase_masses
from ivhl_jax.nn.adaptive.scheduler import phase_weights as phase_weights
from ivhl_jax.nn.adaptive.scheduler import sample_phase as sample_phase
from ivhl_jax.nn.adaptive.scheduler import schedule_per_sample as schedule_per_sample
from ivhl_jax.nn.adaptive.scheduler import schedule_shared as schedule_shared
from ivhl_jax.nn.adaptive.stepper import (
    DynamicsParams,
    DynamicsState,
    apply_sequence,
    dynamics,
    observe,
    observe_phase_fractions,
)

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
