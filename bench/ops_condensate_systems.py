"""Bench ops of the multi-component and dipolar condensates, each a jitted block of Strang steps through the family's
one door ``condensate.strang``: a two-component mixture and a spin-1 field in a 2-D trap (real and imaginary time),
and a dipolar 3-D cloud. Used by ``bench/studies/compare_revisions.py`` to time two revisions of the engine on the
same work (the ops call only the public door, so they run on either revision).
"""

from __future__ import annotations

import numpy as np

from ivhl_jax.bench.harness import BenchCase

SIZES_2D = {"small": 64, "medium": 256, "large": 512}
SIZES_3D = {"small": 16, "medium": 48, "large": 96}
STEPS = 20


def _nothing(state, params):
    """Record nothing (a module-level observe, so the compiled loop is reused)."""
    return None


def _case(op: str, size: str, system, start: np.ndarray, dt: float, imaginary: bool, n: int) -> BenchCase:
    import jax.numpy as jnp

    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    dt = min(dt, 0.5 * C.max_stable_dt(system.grid))  # the finer grids need a shorter step
    stepper = C.strang(system, dt, imaginary=imaginary)
    psi = stepper.init(jnp.asarray(start, jnp.complex64))

    def fn(p):
        return trajectory(stepper, p, STEPS, save_every=STEPS, observe=_nothing)[0]

    return BenchCase(
        op=op,
        size=size,
        fn=fn,
        args=(psi,),
        params={"points": n, "components": int(start.size // n), "steps_per_call": STEPS, "dt": dt},
        items_per_call=STEPS,
        items_name="steps",
        op_by_op=False,
        notes=("imaginary-time" if imaginary else "real-time") + " Strang steps of " + op.split("_")[0],
    )


def _mixture(size: str, imaginary: bool) -> BenchCase:
    from ivhl_jax.physics import condensate as C

    n = SIZES_2D[size]
    grid = C.Grid.uniform((n, n), 16.0)
    system = C.MixtureSystem.create(grid, C.harmonic(grid), np.array([[100.0, 80.0], [80.0, 90.0]]))
    x, y = np.meshgrid(*grid.coords, indexing="ij")
    start = np.stack([np.exp(-((x - 0.5) ** 2 + y**2) / 2), np.exp(-((x + 0.5) ** 2 + y**2) / 2)])
    start = start / np.sqrt(np.sum(start**2, axis=(1, 2), keepdims=True) * grid.cell_volume)
    op = "mixture_ground_step" if imaginary else "mixture_step"
    return _case(op, size, system, start.astype(complex), 2e-3, imaginary, n * n)


def mixture_step(size: str) -> BenchCase:
    """Two components in a 2-D trap (g₁₁ = 100, g₂₂ = 90, g₁₂ = 80), n² over a 16² box, real time."""
    return _mixture(size, False)


def mixture_ground_step(size: str) -> BenchCase:
    """The same mixture in imaginary time (each N_i projected three times per step)."""
    return _mixture(size, True)


def spin1_step(size: str) -> BenchCase:
    """Spin-1 in a 2-D trap (c₀ = 100, c₂ = −5, q = 0.1), a transverse-spin start, n² over a 16² box, real time."""
    from ivhl_jax.physics import condensate as C

    n = SIZES_2D[size]
    grid = C.Grid.uniform((n, n), 16.0)
    system = C.Spin1System.create(grid, C.harmonic(grid), 100.0, -5.0, p=0.0, q=0.1)
    x, y = np.meshgrid(*grid.coords, indexing="ij")
    env = np.exp(-(x**2 + y**2) / 2)
    start = np.stack([0.5 * env, np.sqrt(0.5) * env * np.exp(1j * 0.3 * x), 0.5 * env])
    start = start / np.sqrt(np.sum(np.abs(start) ** 2) * grid.cell_volume)
    return _case("spin1_step", size, system, start, 2e-3, False, n * n)


def dipolar_step(size: str) -> BenchCase:
    """A dipolar 3-D cloud (g = 500, ε_dd = 0.5 along z, cutoff 7), n³ over a 16³ box, real time."""
    from ivhl_jax.physics import condensate as C

    n = SIZES_3D[size]
    grid = C.Grid.uniform((n, n, n), 16.0)
    dip = C.Dipolar.create(eps_dd=0.5, axis=(0.0, 0.0, 1.0), cutoff=7.0)
    system = C.DipolarSystem.create(grid, C.harmonic(grid), 500.0, dip)
    x, y, z = np.meshgrid(*grid.coords, indexing="ij")
    start = np.exp(-(x**2 + y**2 + 0.5 * z**2) / 2)
    start = start / np.sqrt(np.sum(start**2) * grid.cell_volume)
    return _case("dipolar_step", size, system, start.astype(complex), 1e-3, False, n**3)


OPS = {
    "mixture_step": mixture_step,
    "mixture_ground_step": mixture_ground_step,
    "spin1_step": spin1_step,
    "dipolar_step": dipolar_step,
}
