"""Scale-invariant modified binary MERA for translation-invariant nearest-neighbour chains, optimised by
Evenbly–Vidal sweeps.

A model is a two-site term on spins of dimension d (:func:`ising`, :func:`xx`, :func:`potts`, or your own with
:func:`two_site`); the library blocks two spins into one MERA site of dimension d². The one way to run sweeps is
the stepper::

    import jax
    from ivhl_jax import mera, trajectory

    with jax.enable_x64(True):
        stepper = mera.evenbly_vidal(mera.ising(), mera.MERAConfig(chi=6, chi_mid=4, layers=1))
        state, energies = trajectory(stepper, stepper.init(jax.random.key(0)), 500, observe=mera.observe)
    mera.scaling_dimensions(state.mera)

(``chunked(stepper, n)`` with :func:`ivhl_jax.run.runner.run_chunked` adds checkpoints and progress;
:func:`grow` enlarges χ between the stages of a ladder, and
:func:`cold_start` re-initialises a cold start that stalls; a symmetric MERA's attempts each begin as the best of a
few short trial starts.)

Submodules, by job: :mod:`~ivhl_jax.physics.tensornet.mera.config` (settings, state, cold start),
:mod:`~ivhl_jax.physics.tensornet.mera.models` (chains and their blocking),
:mod:`~ivhl_jax.physics.tensornet.mera.superoperators` (ascending/descending superoperators, layer maps),
:mod:`~ivhl_jax.physics.tensornet.mera.sweep` (the sweep and its stepper),
:mod:`~ivhl_jax.physics.tensornet.mera.ladder` (growth, stuck starts), :mod:`~ivhl_jax.physics.tensornet.mera.scaling`
(scaling superoperators and dimensions), :mod:`~ivhl_jax.physics.tensornet.mera.conformal` (OPE coefficients, central
charge), :mod:`~ivhl_jax.physics.tensornet.mera.cft` (the CFT record of each critical chain),
:mod:`~ivhl_jax.physics.tensornet.mera.symmetric` (what only a symmetric MERA has: sectors, charge-sorted terms, growth
by spectra). Every function takes a dense MERA or the block-sparse symmetric one that a config with a ``symmetry`` gives
(one implementation, on the tensor operations of :mod:`ivhl_jax.physics.tensornet.ops`).
"""

from ivhl_jax.physics.tensornet.mera.cft import CFT, CFTS
from ivhl_jax.physics.tensornet.mera.config import (
    MERA,
    MERAConfig,
    cast,
    init_tensors,
    isometry_errors,
    precision_dtype,
)
from ivhl_jax.physics.tensornet.mera.conformal import central_charge, ope_coefficients
from ivhl_jax.physics.tensornet.mera.ladder import StuckCheck, cold_start, grow
from ivhl_jax.physics.tensornet.mera.models import (
    E0_CRITICAL_ISING,
    E0_CRITICAL_POTTS,
    E0_XX,
    Model,
    ising,
    potts,
    two_site,
    xx,
)
from ivhl_jax.physics.tensornet.mera.scaling import charged_scaling_dimensions, conformal_table, scaling_dimensions
from ivhl_jax.physics.tensornet.mera.superoperators import ascend, descend
from ivhl_jax.physics.tensornet.mera.sweep import EvenblyVidalParams, MERAState, energy_per_site, evenbly_vidal, observe
from ivhl_jax.physics.tensornet.mera.symmetric import Symmetry, to_dense

__all__ = [
    "evenbly_vidal",
    "observe",
    "MERAConfig",
    "MERAState",
    "EvenblyVidalParams",
    "MERA",
    "Model",
    "ising",
    "xx",
    "potts",
    "two_site",
    "E0_CRITICAL_ISING",
    "E0_XX",
    "E0_CRITICAL_POTTS",
    "init_tensors",
    "grow",
    "cold_start",
    "StuckCheck",
    "energy_per_site",
    "scaling_dimensions",
    "ope_coefficients",
    "central_charge",
    "isometry_errors",
    "ascend",
    "descend",
    "precision_dtype",
    "cast",
    "Symmetry",
    "to_dense",
    "charged_scaling_dimensions",
    "conformal_table",
    "CFT",
    "CFTS",
]
