"""The HLO guards of the split-step engine hold for every equation over it.

One compiled step of each system (GP free, rotating and damped; mixture; spin-1; dipolar; GFT) runs the FFTs its
kinetic symbol and its local propagator need and no more, and on a slab layout over 8 devices it moves only shards
(all-to-all) and scalars (all-reduce): never an all-gather of the field. The per-system tests (test_stepper,
test_gft: passes over the field of the merged run) pin the rest.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from ivhl_jax import condensate as C
from ivhl_jax.core.hlo import collectives
from ivhl_jax.physics import gft

pytestmark = pytest.mark.slow  # 14 compiles, ~1 min on one core


def _systems(layout2, layout3):
    g2 = C.Grid.uniform((16, 16), 8.0)
    g3 = C.Grid.uniform((16, 16, 16), 8.0)
    v2, v3 = C.harmonic(g2), C.harmonic(g3)
    dip = C.Dipolar.create(eps_dd=0.3, cutoff=4.0)
    spinor = jnp.asarray([0.6, 0.5 + 0.4j, 0.3], jnp.complex64)[:, None, None] * C.gaussian(g2)[None]
    psi2 = C.gaussian(g2).astype(jnp.complex64)
    return {
        # name: (system, psi, FFTs of one single-device step)
        "gp": (C.GPSystem.create(g2, v2, 10.0, layout=layout2), psi2, 2),
        "gp_rotating": (C.GPSystem.create(g2, v2, 10.0, 0.5, layout=layout2), psi2, 6),  # A(dt/2) B(dt) A(dt/2)
        "gp_damped": (C.GPSystem.create(g2, v2, 10.0, 0.5, layout=layout2, gamma=0.05), psi2, 6),
        "mixture": (C.MixtureSystem.create(g2, v2, [[2.0, 1.0], [1.0, 2.0]], layout=layout2), spinor[:2], 4),
        "spin1": (C.Spin1System.create(g2, v2, 20.0, -1.0, q=0.2, layout=layout2), spinor, 6),
        "dipolar": (C.DipolarSystem.create(g3, v3, 5.0, dip, layout=layout3), C.gaussian(g3).astype(jnp.complex64), 6),
        "gft": (gft.GFTSystem.create((16, 16), -0.5, 0.2, layout=layout2), psi2, 2),
    }


def _stepper(system, imaginary):
    if isinstance(system, gft.GFTSystem):
        return gft.strang(system, 0.05, imaginary=imaginary)
    return C.strang(system, 1e-3, imaginary=imaginary)


def _layouts():
    from ivhl_jax.core.mesh import device_mesh
    from ivhl_jax.numerics import distributed_fft

    if jax.device_count() < 8:
        pytest.skip("needs 8 (emulated) devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    mesh = device_mesh((8,), ("x",))
    return tuple(distributed_fft.fft_layout(mesh, PartitionSpec("x"), s) for s in ((16, 16), (16, 16, 16)))


@pytest.mark.parametrize("imaginary", [False, True])
@pytest.mark.parametrize("name", ["gp", "gp_rotating", "gp_damped", "mixture", "spin1", "dipolar", "gft"])
def test_every_equation_runs_its_ffts_and_moves_no_field_whole_on_a_layout(name, imaginary):
    if imaginary and name == "gp_damped":
        pytest.skip("damping is a real-time scheme (imaginary time is already a gradient flow)")
    system, psi, n_fft = _systems(None, None)[name]
    st = _stepper(system, imaginary)
    p = st.init(np.asarray(psi))
    hlo = jax.jit(st.step_fn).lower(p, st.params).compile().as_text()
    # the real-time GP and GFT steps compile their step twice, as the branches of a lax.cond on the local-phase bound
    # (fast or full-range sine reduction): one of them runs
    branches = 2 if not imaginary and name.startswith(("gp", "gft")) else 1
    assert len(re.findall(r" fft\(", hlo)) == branches * n_fft, name
    split, _, _ = _systems(*_layouts())[name]
    st = _stepper(split, imaginary)
    p = st.init(np.asarray(psi))
    kinds = collectives(jax.jit(st.step_fn).lower(p, st.params).compile())
    shard = p.addressable_shards[0].data.nbytes
    assert not any(k == "all-gather" for k, _ in kinds), kinds
    assert all(n == shard for k, n in kinds if k == "all-to-all"), kinds
    assert all(n <= 64 for k, n in kinds if k == "all-reduce"), kinds  # scalars: norms, max|θ|
