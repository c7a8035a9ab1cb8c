"""Scalar wave fields from point sources, optical vortices, and phase-winding (vortex) detection.

Conventions used throughout (units: lengths in arbitrary units L, wavenumbers in 1/L, angular
frequencies in 1/T, time in T; the default ``frequencies=None`` means ω = c·k with c = 1 L/T):

* Time dependence is ``exp(−iωt)``: every source emits an **outgoing** spherical (3-D) or
  circular (2-D) wave ``A e^{i(k r − ω t + φ)} / (r + ε)``; its phase fronts move away from the
  source as t grows.
* Grids use ``indexing="ij"``: array axis 0 is x, axis 1 is y (axis 2 is z). A field evaluated at
  ``grid_points(shape, ...)`` reshapes to ``shape`` with that meaning.
* Vortex charge is positive when the phase increases **counter-clockwise** about the vortex axis
  (right-hand rule; in the (x, y) plane with the default axis +z, counter-clockwise seen from +z).
  :func:`vortex` with charge q, :func:`winding_number` of a loop traversed counter-clockwise around
  it, and :func:`vortex_map` at the plaquette that holds it all give q.

Public API: :func:`superpose`, :func:`vortex`, :func:`intensity`, :func:`phase`,
:func:`winding_number`, :func:`vortex_map`, :func:`grid_points`, :func:`helix_sources`,
:func:`focus_phases` (inverse design of source phases with optax), and the time loop:
:func:`superposition` (the stepper; it validates its settings) → ``trajectory(..., observe=observe)``.

Speed: :func:`superpose` takes its default block size and kernel from the backend table
(:func:`ivhl_jax.core.backend.defaults`): on CPU blocks of ``fields_pair_budget // M`` points through the
CPU loop kernels; on GPU/TPU the largest block whose reverse-mode residuals fit
``fields_memory_fraction`` of the device's memory, each block one fused XLA reduction over the sources.
``fields_method="pallas"`` (raced on GPUs by ``ivhl tune``) runs the Pallas tile kernel of
:mod:`ivhl_jax.physics.fields_pallas` instead for float32 work (other dtypes: the XLA reduction).

Modules, one job each (every name is importable from here): ``waves`` (:func:`superpose`, :func:`intensity`,
:func:`phase`), ``vortices`` (:func:`vortex`, :func:`winding_number`, :func:`vortex_map`), ``geometry``
(:func:`grid_points`, :func:`helix_sources`), ``design`` (:func:`focus_phases`), ``stepper`` (the time loop) and
``inputs`` (the argument checks and precision shared by the kernels).
"""

from ivhl_jax.physics.fields.design import focus_phases
from ivhl_jax.physics.fields.geometry import grid_points, helix_sources
from ivhl_jax.physics.fields.stepper import SuperpositionParams, WaveState, field_at, observe, superposition
from ivhl_jax.physics.fields.vortices import vortex, vortex_map, winding_number

# default_chunk (the block size superpose picks; read by the benchmarks) is re-exported outside the listed API
from ivhl_jax.physics.fields.waves import default_chunk as default_chunk
from ivhl_jax.physics.fields.waves import intensity, phase, superpose

__all__ = [
    "superpose",
    "vortex",
    "intensity",
    "phase",
    "winding_number",
    "vortex_map",
    "grid_points",
    "helix_sources",
    "focus_phases",
    "WaveState",
    "SuperpositionParams",
    "superposition",
    "field_at",
    "observe",
]
