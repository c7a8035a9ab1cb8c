"""Before/after timings of the mixture, spin-1 and dipolar steps, interleaved in one process.

    python -m bench.studies.condensate_terms_engine --against REV --rounds 15 \
        --out bench/results/condensate_terms_engine.json

loads ``ivhl_jax/physics/condensate/mixture.py`` and ``dipolar.py`` of ``<rev>`` (``git show``) next to the current
ones and times, in interleaved rounds (``bench.harness.interleaved_rounds``), one jitted block of real-time steps
(``lax.fori_loop`` over the stepper's ``step_fn``) of each tree's stepper built by its own builder from the same
settings and the same float32 start state, on one device:

* a two-component mixture on 2 × 128² (g = [[2, 1], [1, 2]] · 100, harmonic trap), 20 steps per call;
* a spin-1 condensate on 3 × 128² (c₀ = 100, c₂ = −5, q = 0.1), 20 steps per call;
* a dipolar condensate on 48³ (g = 500, ε_dd = 0.5, R_c = 8), 5 steps per call.

Reports per-round ratios new/old (median and quartiles), the medians, and the largest difference of the two
trees' results relative to the field's maximum (the same work).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bench.harness import before_after_setup, before_after_study, blocking_call
from ivhl_jax.physics import condensate as C
from ivhl_jax.physics.condensate import Grid, harmonic
from ivhl_jax.physics.condensate import dipolar as new_dipolar
from ivhl_jax.physics.condensate import mixture as new_mixture


def _start(grid: Grid, n_comp: int | None) -> np.ndarray:
    """A moving Gaussian (float32 complex), one per component with a component-dependent phase."""
    mesh = np.meshgrid(*grid.coords, indexing="ij")
    env = np.exp(-sum(m * m for m in mesh) / 4) * np.exp(0.5j * mesh[0])
    if n_comp is None:
        return env.astype(np.complex64)
    return np.stack([env * np.exp(0.3j * c * mesh[-1]) / np.sqrt(n_comp) for c in range(n_comp)]).astype(np.complex64)


def _builder(module, name):
    """The per-system builder of the older tree's module; the current tree builds every system's stepper through the
    family's one door, ``condensate.strang``."""
    return getattr(module, name, C.strang)


def _cases(old_mix, old_dip):
    g2 = Grid.uniform((128, 128), 16.0)
    g3 = Grid.uniform((48, 48, 48), 16.0)
    v2, v3 = harmonic(g2), harmonic(g3)
    g = [[200.0, 100.0], [100.0, 200.0]]
    for name, mod_old, mod_new, build, psi, steps in (
        ("mixture 2x128^2", old_mix, new_mixture,
         lambda m: _builder(m, "strang_mixture")(m.MixtureSystem.create(g2, v2, g), 1e-3), _start(g2, 2), 20),
        ("spin1 3x128^2", old_mix, new_mixture,
         lambda m: _builder(m, "strang_spin1")(m.Spin1System.create(g2, v2, 100.0, -5.0, q=0.1), 1e-3),
         _start(g2, 3), 20),
        ("dipolar 48^3", old_dip, new_dipolar,
         lambda m: _builder(m, "strang_dipolar")(
             m.DipolarSystem.create(g3, v3, 500.0, m.Dipolar.create(eps_dd=0.5, cutoff=8.0)), 1e-3),
         _start(g3, None), 5),
    ):  # fmt: skip
        yield name, build(mod_old), build(mod_new), psi, steps


def main() -> None:
    a, old = before_after_setup(
        {
            "mixture_before": "ivhl_jax/physics/condensate/mixture.py",
            "dipolar_before": "ivhl_jax/physics/condensate/dipolar.py",
        },
        rounds=15,
        against_help="the git revision whose mixture.py and dipolar.py are timed",
    )
    calls, meta = {}, {}
    for name, st_old, st_new, psi_np, steps in _cases(old["mixture_before"], old["dipolar_before"]):
        outs = {}
        for tag, st in (("old", st_old), ("new", st_new)):
            psi = st.init(jnp.asarray(psi_np))
            f = jax.jit(lambda q, p, st=st, n=steps: jax.lax.fori_loop(0, n, lambda _, x: st.step_fn(x, p), q))
            outs[tag] = np.asarray(jax.block_until_ready(f(psi, st.params)))
            calls[f"{name} {tag}"] = blocking_call(f, psi, st.params)
        scale = float(np.abs(outs["old"]).max())
        meta[name] = {"steps_per_call": steps, "max_rel_diff": float(np.abs(outs["new"] - outs["old"]).max()) / scale}
    before_after_study(calls, meta, rounds=a.rounds, against=a.against, out=a.out)


if __name__ == "__main__":
    main()
