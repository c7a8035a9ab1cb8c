"""The condensate family's doors take every object its builder makes.

``condensate.strang`` builds steppers for four systems (scalar GP, mixture, spin-1, dipolar); ``observe``,
``energy`` and ``ground_state`` accept each of them, and what does not apply (``bogoliubov`` of a spin-1 or
dipolar condensate, ``chemical_potential`` of a mixture, a spin-1 ``magnetization`` given to another system) is
refused in one line naming the system.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C
from ivhl_jax.numerics.rollout import trajectory


def _gp():
    grid = C.Grid.uniform(32, 12.0)
    return C.GPSystem.create(grid, C.harmonic(grid, 1.0), 20.0), C.gaussian(grid, 1.0).astype(jnp.complex64)


def _gp2d():
    grid = C.Grid.uniform((16, 16), 10.0)
    return C.GPSystem.create(grid, C.harmonic(grid, 1.0), 5.0), C.gaussian(grid, 1.0).astype(jnp.complex64)


def _mixture():
    grid = C.Grid.uniform(32, 12.0)
    system = C.MixtureSystem.create(grid, C.harmonic(grid, 1.0), [[10.0, 5.0], [5.0, 12.0]])
    g = C.gaussian(grid, 1.0).astype(jnp.complex64)
    return system, jnp.stack([g, g])


def _spin1():
    grid = C.Grid.uniform(32, 12.0)
    system = C.Spin1System.create(grid, C.harmonic(grid, 1.0), 10.0, -1.0, q=0.1)
    zeta = jnp.asarray([0.6, 0.5 + 0.4j, 0.3], jnp.complex64) / np.sqrt(0.36 + 0.41 + 0.09)
    return system, zeta[:, None] * C.gaussian(grid, 1.0).astype(jnp.complex64)[None]


def _dipolar():
    grid = C.Grid.uniform((8, 8, 8), 8.0)
    system = C.DipolarSystem.create(grid, C.harmonic(grid, 1.0), 5.0, C.Dipolar.create(eps_dd=0.3))
    return system, C.gaussian(grid, 1.0).astype(jnp.complex64)


CASES = {"gp": _gp, "gp2d": _gp2d, "mixture": _mixture, "spin1": _spin1, "dipolar": _dipolar}
EXTRA = {
    "gp": set(),
    "gp2d": {"lz"},
    "mixture": {"norm_1", "norm_2", "overlap"},
    "spin1": {"magnetization"},
    "dipolar": set(),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("imaginary", [False, True])
def test_trajectory_observes_every_system(name, imaginary):
    system, psi = CASES[name]()
    st = C.strang(system, 1e-3, imaginary=imaginary)
    out, obs = trajectory(st, st.init(psi), 4, save_every=2, observe=C.observe)
    assert out.shape == psi.shape
    parts = {f"energy_{k}" for k in C.energy(psi, system)}
    assert set(obs) == {"norm"} | parts | EXTRA[name]
    for v in obs.values():
        assert v.shape == (2,) and bool(jnp.all(jnp.isfinite(v)))
    # the recorded energy is the energy of the recorded state (same function, same system)
    np.testing.assert_allclose(obs["energy_total"][-1], C.energy(out, system)["total"], rtol=1e-6)
    # real time conserves the norm; the norm is the sum of the components'
    np.testing.assert_allclose(obs["norm"][-1], obs["norm"][0], rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_energy_total_is_the_sum_of_its_parts(name):
    system, psi = CASES[name]()
    e = C.energy(psi, system)
    np.testing.assert_allclose(e["total"], sum(v for k, v in e.items() if k != "total"), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_ground_state_takes_every_system(name):
    system, psi = CASES[name]()
    out, info = C.ground_state(system, 1.0, 1e-2, max_steps=20, check_every=10, psi0=psi)
    assert out.shape == psi.shape
    assert {"steps", "energy", "delta", "converged", "finite"} <= set(info)
    np.testing.assert_allclose(info["energy"], C.energy(out, system)["total"], rtol=1e-5)


@pytest.mark.parametrize("name", ["mixture", "spin1", "dipolar"])
def test_what_does_not_apply_is_refused_naming_the_system(name):
    system, psi = CASES[name]()
    cls = type(system).__name__
    if name == "spin1":  # the BdG door takes the GP, dipolar and mixture systems
        with pytest.raises(TypeError, match=f"bogoliubov.*{cls}"):
            C.bogoliubov(jax.random.key(0), system, psi, 2)
    with pytest.raises(TypeError, match=f"chemical_potential.*{cls}"):
        C.chemical_potential(psi, system)
    with pytest.raises(ValueError, match=f"key and noise apply to a GPSystem, not to a {cls}"):
        C.ground_state(system, noise=0.1, key=jax.random.key(0))
    if name != "spin1":
        with pytest.raises(ValueError, match=f"magnetization applies to a Spin1System, not to a {cls}"):
            C.ground_state(system, magnetization=0.1)


def test_energy_and_observe_refuse_other_objects_in_one_line():
    with pytest.raises(TypeError, match="condensate system .* got str"):
        C.energy(jnp.ones(4, jnp.complex64), "system")
    with pytest.raises(TypeError, match="params of a condensate stepper"):
        C.observe(jnp.ones(4, jnp.complex64), object())
