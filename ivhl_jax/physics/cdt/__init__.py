"""1+1-dimensional causal dynamical triangulations (CDT) on a torus: Metropolis Monte Carlo in JAX.

Model
-----
``T`` periodic time slices; slice ``t`` is a circle of ``l_t >= 3`` vertices. Strip ``t`` (between
slices ``t`` and ``t+1``) is a cyclic sequence of ``l_t`` *up* triangles (base on slice ``t``, apex on
``t+1``) and ``l_{t+1}`` *down* triangles (base on ``t+1``, apex on ``t``), glued along timelike links.
The action is ``S = lambda N2 + eps (N2 - V)^2`` with ``N2 = 2 N0 = 2 sum_t l_t`` triangles (the
curvature term is topological in 2D, Gauss-Bonnet); ``lambda_c = ln 2``. Moves: the (2,2) flip and the
(2,4)/(4,2) insertion/removal (:mod:`~ivhl_jax.physics.cdt.moves`), validated against exact enumeration
(:mod:`~ivhl_jax.physics.cdt.exact`).

The one way to run chains
-------------------------
::

    from ivhl_jax import cdt, trajectory
    stepper = cdt.metropolis(cdt.LN2, eps=0.02, target=512)                    # one step = one sweep
    chain = stepper.init(jax.random.key(0), 16, 3)                             # T = 16 slices of 3 vertices
    chain, obs = trajectory(stepper, chain, 200, save_every=2, observe=cdt.observe)
    profile = cdt.at_target_mean(obs["lengths"], obs["at_target"])             # the fixed-volume ensemble

Many chains: ``jax.vmap`` over ``stepper.init`` keys and over ``trajectory``; long runs with checkpoints:
``chunked(stepper, ...)`` (``ivhl sim cdt``). Three engines apply the same moves to the same packed buffer
(:mod:`~ivhl_jax.physics.cdt.state`): ``engine="jax"`` (XLA, any device), ``engine="host"``
(:mod:`~ivhl_jax.physics.cdt.host`, a compiled CPU loop) and ``engine="pallas"``
(:mod:`~ivhl_jax.physics.cdt.pallas_engine`, one kernel launch per sweep for all chains; compiled on a GPU,
interpreted elsewhere), bit-identical given the same random words.

Modules: ``state`` (the buffer), ``moves`` (moves and the JAX engine's kernel), ``host`` / ``host_kernels`` (the
host engine), ``stepper`` (the stepper, its parameters and the JAX sweep, ``observe``), ``observables`` (geometry of a
triangulation), ``graph`` (distances, spheres, curvature on plain arrays), ``spectral`` (random-walk return
probability and spectral dimension), ``exact`` (enumeration and the transfer matrix), ``pallas_engine``
(imported on first use by ``engine="pallas"``).

2+1 dimensions (S² × S¹, tetrahedra; the reference code JorenB/3d-cdt's conventions): ``metropolis_3d(k0, k3,
target=..., eps=...)`` and ``observe_3d``; modules ``d3_state`` (the buffer, the starting geometry), ``d3_host`` (the
numba moves and their Metropolis–Hastings ratios), ``d3_stepper`` (the stepper), ``d3_checks`` (the invariant check).
"""

from ivhl_jax.physics.cdt import spectral
from ivhl_jax.physics.cdt.d3_state import MOVE_NAMES_3D, CDT3State
from ivhl_jax.physics.cdt.d3_stepper import (
    Chain3d,
    Metropolis3dParams,
    default_capacity_3d,
    metropolis_3d,
    observe_3d,
)
from ivhl_jax.physics.cdt.exact import (
    exact_fixed_volume_coordination,
    exact_fixed_volume_distribution,
    exact_length_distribution,
    exact_mean_length,
    transfer_matrix,
)
from ivhl_jax.physics.cdt.graph import hausdorff_from_scaling, hausdorff_from_spheres, mean_distance
from ivhl_jax.physics.cdt.observables import (
    center_profiles,
    coordination_histogram,
    coordination_numbers,
    max_timelike_degree,
    sphere_volumes,
    timelike_degrees,
    vertex_distances,
    volume_correlator,
)
from ivhl_jax.physics.cdt.state import LN2, MOVE_NAMES, CDTState
from ivhl_jax.physics.cdt.stepper import (
    ENGINES,
    Chain,
    MetropolisParams,
    at_target_mean,
    at_target_mean_error,
    default_attempts,
    default_capacity,
    max_capacity,
    metropolis,
    observe,
)

__all__ = [
    # parameters, the stepper, its state and observable
    "metropolis",
    "observe",
    "at_target_mean",
    "at_target_mean_error",
    "MetropolisParams",
    "Chain",
    "CDTState",
    "LN2",
    "MOVE_NAMES",
    "ENGINES",
    "max_capacity",
    "default_attempts",
    "default_capacity",
    # 2+1 dimensions: triangulations of S^2 x S^1 by tetrahedra
    "metropolis_3d",
    "observe_3d",
    "Metropolis3dParams",
    "Chain3d",
    "CDT3State",
    "MOVE_NAMES_3D",
    "default_capacity_3d",
    # geometry of a triangulation (chain.geometry) and of measured profiles
    "coordination_histogram",
    "coordination_numbers",
    "timelike_degrees",
    "max_timelike_degree",
    "vertex_distances",
    "sphere_volumes",
    "volume_correlator",
    "center_profiles",
    "mean_distance",
    "hausdorff_from_spheres",
    "hausdorff_from_scaling",
    # random walks on a triangulation: cdt.spectral.return_probability, spectral_dimension, mixing_time
    "spectral",
    # exact answers
    "exact_mean_length",
    "exact_length_distribution",
    "exact_fixed_volume_distribution",
    "exact_fixed_volume_coordination",
    "transfer_matrix",
]
