"""What the field simulations (`ivhl sim bec`, `ivhl sim gft`) share: precision=float64 runs inside a scope."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ivhl_jax.sims import bec, gft

# (module, its config at float64, what builds an array in the config's precision, that array's dtype)
CASES = {
    "bec": (bec, bec.BECConfig(dims=1, grid=16, precision="float64"), lambda c: bec.gp_system(c).potential, np.float64),
    "gft": (gft, gft.GFTConfig(rank=2, grid=8, precision="float64"), gft.initial_state, np.complex128),
}


@pytest.mark.parametrize("name", ["bec", pytest.param("gft", marks=pytest.mark.slow)])  # gft: ~3 s (x64 PRNG compile)
def test_float64_runs_in_a_scope_and_never_turns_x64_on_for_the_process(name):
    module, cfg, build, dtype = CASES[name]
    before = bool(jax.config.jax_enable_x64)
    if not before:
        with pytest.raises(ValueError, match=f"precision=float64 needs 64-bit JAX: run inside sims.{name}"):
            build(cfg)
    with module.precision_scope(cfg):
        assert build(cfg).dtype == dtype
    assert bool(jax.config.jax_enable_x64) == before
