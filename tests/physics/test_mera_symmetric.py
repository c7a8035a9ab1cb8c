"""The block-sparse symmetric MERA against the dense MERA from the same start (float64), its charge-labelled
scaling dimensions, and its bad inputs."""

import dataclasses

import jax
import numpy as np
import pytest

from ivhl_jax import mera, trajectory
from ivhl_jax.physics.mera import symmetric as MS


def _run_both(model, cfg, sweeps):
    """Symmetric sweeps and dense sweeps from the symmetric start's dense embedding: (sym state, energies, dense
    energies)."""
    st = mera.evenbly_vidal(model, cfg)
    s0 = st.init(key=jax.random.key(1))
    s, e = trajectory(st, s0, sweeps, observe=mera.observe)
    dst = mera.evenbly_vidal(model, dataclasses.replace(cfg, symmetry=None))
    _, de = trajectory(dst, dst.init(mera=mera.dense_mera(s0.mera, model, cfg.symmetry)), sweeps, observe=mera.observe)
    return s, np.asarray(e), np.asarray(de)


def test_z2_ising_energy_equals_dense():
    """Z2 Ising, chi = 4 (2 even + 2 odd), the u updates on from the second sweep: every energy equals the dense
    MERA's to 1e-10 and falls."""
    with jax.enable_x64(True):
        model = mera.ising()
        cfg = mera.MERAConfig(chi=4, layers=1, u_delay=1, symmetry=mera.Symmetry("Z2", sectors={0: 2, 1: 2}))
        s, e, de = _run_both(model, cfg, 6)
        dm = mera.dense_mera(s.mera, model, cfg.symmetry)
    np.testing.assert_allclose(e[1:], de[1:], rtol=0, atol=1e-10)
    assert e[-1] < e[1]
    assert max(mera.isometry_errors(dm).values()) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("refsym", [True, False])
def test_z2_ising_chi6_matches_dense_and_charges(refsym):
    """chi = 6 with chi_mid = 4 (mid sectors given): 40 sweeps equal to the dense ones; the scaling superoperator is
    block diagonal in charge and its sector spectra together are the dense spectrum; σ (the smallest Δ > 0) is odd,
    ε even."""
    with jax.enable_x64(True):
        model = mera.ising()
        sym = mera.Symmetry("Z2", sectors={0: 3, 1: 3}, mid_sectors=[{0: 2, 1: 2}, {0: 2, 1: 2}])
        cfg = mera.MERAConfig(chi=6, chi_mid=4, layers=1, u_delay=2, refsym=refsym, symmetry=sym)
        s, e, de = _run_both(model, cfg, 40)
        np.testing.assert_allclose(e[1:], de[1:], rtol=0, atol=1e-10)
        assert MS.charge_block_leakage(s.mera) < 1e-12
        dims, charges = mera.charged_scaling_dimensions(s.mera, 36)
        dense = np.sort(mera.scaling_dimensions(mera.dense_mera(s.mera), 36))
        np.testing.assert_allclose(np.sort(dims), dense, atol=1e-8)
        assert abs(dims[0]) < 1e-10 and charges[0] == 0
        assert charges[1] == 1  # σ
        table = mera.conformal_table(s.mera, "ising", 6)
        assert table[1]["label"] == "σ" and table[1]["charge"] == 1
        assert all(r["charge"] == 0 for r in table if r["label"] in ("1", "ε"))


@pytest.mark.slow
def test_u1_xx_matches_dense():
    """U(1) XX chain (S^z sectors -1, 0, 1): energies equal to the dense MERA's to 1e-10."""
    with jax.enable_x64(True):
        model = mera.xx()
        sym = mera.Symmetry("U1", sectors={-1: 1, 0: 2, 1: 1})
        cfg = mera.MERAConfig(chi=4, layers=1, u_delay=1, symmetry=sym)
        s, e, de = _run_both(model, cfg, 8)
    np.testing.assert_allclose(e[1:], de[1:], rtol=0, atol=1e-10)
    assert e[-1] < e[1]


def test_bad_inputs_one_line():
    with pytest.raises(ValueError, match=r"add up to 5 .* chi=6") as exc:
        mera.MERAConfig(chi=6, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 3, 1: 2}))
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="outside the group Z2") as exc:
        mera.Symmetry("Z2", sectors={0: 2, 2: 2})
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match=r"ising\(g=1\) does not commute with the U1 symmetry") as exc:
        mera.evenbly_vidal(
            mera.ising(),
            mera.MERAConfig(
                chi=4, layers=1, symmetry=mera.Symmetry("U1", sectors={-1: 1, 0: 2, 1: 1}, spin_charges=(0, 1))
            ),
        )
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match=r"symmetry.sectors\[0\]: charge 1 has 12 states.* at most 8"):
        mera.evenbly_vidal(
            mera.ising(), mera.MERAConfig(chi=16, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 4, 1: 12}))
        )
    with pytest.raises(ValueError, match="pass symmetry.mid_sectors"):
        mera.evenbly_vidal(
            mera.ising(),
            mera.MERAConfig(chi=6, chi_mid=3, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 3, 1: 3})),
        )
    with pytest.raises(ValueError, match="no default Z3 charges"):
        mera.evenbly_vidal(
            mera.potts(), mera.MERAConfig(chi=9, layers=1, symmetry=mera.Symmetry("Z3", sectors={0: 3, 1: 3, 2: 3}))
        )


def test_init_needs_a_key_and_takes_policy():
    """No default start: a fresh symmetric MERA needs ``key`` (one-line TypeError naming it); ``policy`` is the
    only precision argument (float32 with 'f32')."""
    with jax.enable_x64(True):
        model = mera.ising()
        cfg = mera.MERAConfig(chi=4, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 2, 1: 2}))
        st = mera.evenbly_vidal(model, cfg)
        with pytest.raises(TypeError, match=r"needs key") as exc:
            st.init()
        assert "\n" not in str(exc.value)
        with pytest.raises(TypeError, match=r"key must be a PRNG key"):
            MS.init_symmetric(0, model, cfg)
        m32 = MS.init_symmetric(jax.random.key(0), model, cfg, policy="f32")
        assert m32.w[0].blocks[(0, 0, 0)].dtype == np.float32
        m64 = st.init(key=jax.random.key(0)).mera
        np.testing.assert_allclose(m64.w[0].blocks[(0, 0, 0)], m32.w[0].blocks[(0, 0, 0)], atol=1e-6)
        st32 = mera.evenbly_vidal(model, cfg, policy="f32")
        assert st32.init(mera=m64).mera.w[0].blocks[(0, 0, 0)].dtype == np.float32
