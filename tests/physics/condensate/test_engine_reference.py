"""Every condensate equation's steps equal stored float64 reference arrays to rounding (1e-13).

The references (``engine_reference.npz`` beside this file) were produced by this module's ``main()`` from the
revision before the equations were rewritten over the one Strang composition of
:mod:`ivhl_jax.numerics.splitstep`: GP 1D (real time merged, projected and raw; imaginary time), rotating 2D (real
and imaginary), damped rotating 2D, a two-component mixture, a spin-1 condensate (with held magnetisation), a dipolar
condensate and the GFT lattice field, each in real and imaginary time, and the ground states of the four condensate
systems. Regenerate only on purpose: ``python tests/physics/condensate/test_engine_reference.py``.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import condensate as C
from ivhl_jax.numerics.rollout import trajectory
from ivhl_jax.physics import gft

HERE = pathlib.Path(__file__).with_name("engine_reference.npz")
TOL = 1e-13
pytestmark = pytest.mark.slow  # ~1 min for all cases on one core


def _gauss(grid, shift=0.0):
    arg = sum(grid._bcast((x - shift) ** 2 / 2, a) for a, x in enumerate(grid.coords))
    phase = sum(grid._bcast(0.3 * x, a) for a, x in enumerate(grid.coords))
    return np.exp(-arg + 1j * phase).astype(np.complex128)


def _run(stepper, psi, steps=12, save_every=4):
    """The final state of a trajectory (the stepper's multi-step path) and of three single steps."""
    psi = stepper.init(psi)
    final, _ = trajectory(stepper, psi, steps, save_every=save_every)
    one = psi
    for _ in range(3):
        one = stepper.step(one)
    return {"run": np.asarray(final), "step": np.asarray(one)}


def _gp1d():
    grid = C.Grid.uniform(64, 16.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 50.0)
    psi = _gauss(grid, 0.5)
    out = {}
    for name, pn in (("merged", None), ("projected", True), ("raw", False)):
        out.update({f"{name}_{k}": v for k, v in _run(C.strang(system, 2e-3, project_norm=pn), psi).items()})
    out.update({f"imag_{k}": v for k, v in _run(C.strang(system, 1e-2, imaginary=True, norm=2.0), psi).items()})
    return out


def _gp2d(gamma=0.0):
    grid = C.Grid.uniform((16, 16), 10.0)
    system = C.GPSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 10.0, 0.6, gamma=gamma)
    psi = _gauss(grid, 0.4)
    out = {f"real_{k}": v for k, v in _run(C.strang(system, 5e-3), psi).items()}
    if not gamma:
        out.update({f"imag_{k}": v for k, v in _run(C.strang(system, 5e-3, imaginary=True, norm=1.5), psi).items()})
    return out


def _mixture():
    grid = C.Grid.uniform(32, 12.0)
    system = C.MixtureSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), [[10.0, 6.0], [6.0, 12.0]])
    psi = np.stack([_gauss(grid, 0.5), 0.8 * _gauss(grid, -0.5)])
    out = {f"real_{k}": v for k, v in _run(C.strang(system, 2e-3), psi).items()}
    out.update({f"imag_{k}": v for k, v in _run(C.strang(system, 1e-2, imaginary=True, norm=[1.0, 2.0]), psi).items()})
    return out


def _spin1():
    grid = C.Grid.uniform(32, 12.0)
    system = C.Spin1System.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 10.0, -1.5, p=0.2, q=0.1)
    zeta = np.asarray([0.6, 0.5 + 0.4j, 0.3]) / np.sqrt(0.36 + 0.41 + 0.09)
    psi = zeta[:, None] * _gauss(grid, 0.3)[None]
    out = {f"real_{k}": v for k, v in _run(C.strang(system, 2e-3), psi).items()}
    st = C.strang(system, 1e-2, imaginary=True, norm=1.0, magnetization=0.2)
    out.update({f"imag_{k}": v for k, v in _run(st, psi).items()})
    return out


def _dipolar():
    grid = C.Grid.uniform((8, 8, 8), 8.0)
    dip = C.Dipolar.create(eps_dd=0.4, axis=(0.3, 0.0, 1.0), cutoff=3.0)
    system = C.DipolarSystem.create(grid, C.harmonic(grid, 1.0, dtype=jnp.float64), 8.0, dip)
    psi = _gauss(grid, 0.2)
    out = {f"real_{k}": v for k, v in _run(C.strang(system, 5e-3), psi).items()}
    out.update({f"imag_{k}": v for k, v in _run(C.strang(system, 1e-2, imaginary=True, norm=1.2), psi).items()})
    return out


def _gft():
    system = gft.GFTSystem.create((8, 8), mass_sq=-0.5, lam=0.2)
    rng = np.random.default_rng(3)
    phi = (rng.normal(size=(8, 8)) + 1j * rng.normal(size=(8, 8))) * 0.3
    out = {f"real_{k}": v for k, v in _run(gft.strang(system, 0.05), phi).items()}
    out.update({f"imag_{k}": v for k, v in _run(gft.strang(system, 0.05, imaginary=True), phi).items()})
    return out


def _ground():
    g1 = C.Grid.uniform(32, 12.0)
    v1 = C.harmonic(g1, 1.0, dtype=jnp.float64)
    g3 = C.Grid.uniform((8, 8, 8), 8.0)
    v3 = C.harmonic(g3, 1.0, dtype=jnp.float64)
    systems = {
        "gp": C.GPSystem.create(g1, v1, 20.0),
        "mixture": C.MixtureSystem.create(g1, v1, [[10.0, 6.0], [6.0, 12.0]]),
        "spin1": C.Spin1System.create(g1, v1, 10.0, -1.5, q=0.1),
        "dipolar": C.DipolarSystem.create(g3, v3, 8.0, C.Dipolar.create(eps_dd=0.3)),
    }
    out = {}
    for name, system in systems.items():
        psi, info = C.ground_state(system, 1.0, 1e-2, max_steps=60, check_every=20)
        out[name] = np.asarray(psi)
        out[f"{name}_energy"] = np.asarray(info["energy"])
    return out


CASES = {
    "gp1d": _gp1d,
    "gp2d_rotating": _gp2d,
    "gp2d_damped": lambda: _gp2d(gamma=0.05),
    "mixture": _mixture,
    "spin1": _spin1,
    "dipolar": _dipolar,
    "gft": _gft,
    "ground": _ground,
}


def _outputs(case: str) -> dict[str, np.ndarray]:
    with jax.enable_x64(True):
        return {f"{case}/{k}": v for k, v in CASES[case]().items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_equal_the_stored_references(case):
    ref = np.load(HERE)
    got = _outputs(case)
    want = {k: ref[k] for k in ref.files if k.startswith(case + "/")}
    assert set(got) == set(want)
    for key, value in got.items():
        assert value.dtype == want[key].dtype, key
        scale = max(1.0, float(np.max(np.abs(want[key]))))
        err = float(np.max(np.abs(value - want[key]))) / scale
        assert err <= TOL, f"{key}: max deviation {err:.3g} > {TOL}"


def main() -> None:
    arrays: dict[str, np.ndarray] = {}
    for case in CASES:
        arrays.update(_outputs(case))
    np.savez_compressed(HERE, **arrays)
    print(f"wrote {len(arrays)} arrays to {HERE}")


if __name__ == "__main__":
    main()
