"""The block-sparse symmetric MERA against the dense MERA from the same start (float64), its charge-labelled
scaling dimensions, and its bad inputs."""

import dataclasses

import jax
import numpy as np
import pytest

from ivhl_jax import mera, trajectory
from ivhl_jax.physics.tensornet.mera import symmetric as MS


def _run_both(model, cfg, sweeps):
    """Symmetric sweeps and dense sweeps from the symmetric start's dense embedding: (sym state, energies, dense
    energies)."""
    st = mera.evenbly_vidal(model, cfg)
    s0 = st.init(key=jax.random.key(1))
    s, e = trajectory(st, s0, sweeps, observe=mera.observe)
    dst = mera.evenbly_vidal(model, dataclasses.replace(cfg, symmetry=None))
    _, de = trajectory(dst, dst.init(mera=mera.to_dense(s0.mera, model, cfg.symmetry)), sweeps, observe=mera.observe)
    return s, np.asarray(e), np.asarray(de)


def test_z2_ising_energy_equals_dense():
    """Z2 Ising, chi = 4 (2 even + 2 odd), the u updates on from the second sweep: every energy equals the dense
    MERA's to 1e-10 and falls."""
    with jax.enable_x64(True):
        model = mera.ising()
        cfg = mera.MERAConfig(chi=4, layers=1, u_delay=1, symmetry=mera.Symmetry("Z2", sectors={0: 2, 1: 2}))
        s, e, de = _run_both(model, cfg, 6)
        dm = mera.to_dense(s.mera, model, cfg.symmetry)
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
        assert mera.scaling.charge_block_leakage(s.mera) < 1e-12
        dims, charges = mera.charged_scaling_dimensions(s.mera, 36)
        dense = np.sort(mera.scaling_dimensions(mera.to_dense(s.mera), 36))
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
    # without mid_sectors, chi_mid = 3 < chi_in = 6 is split over the input's sectors in proportion (charge 0 first
    # on a tie); without sectors, chi over what each layer's isometry carries
    legs = MS.layer_legs(
        mera.ising(), mera.MERAConfig(chi=6, chi_mid=3, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 3, 1: 3}))
    )
    assert (legs[1].mid.charges, legs[1].mid.dims) == ((0, 1), (2, 1))
    legs = MS.layer_legs(mera.xx(), mera.MERAConfig(chi=7, layers=1, symmetry=mera.Symmetry("U1")))
    assert (legs[0].out.charges, legs[0].out.dims) == ((-1, 0, 1), (2, 3, 2))  # of {-2: 1, -1: 4, 0: 6, 1: 4, 2: 1}
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


def _optimised_z2_chi4():
    model = mera.ising()
    cfg = mera.MERAConfig(chi=4, layers=1, u_delay=1, symmetry=mera.Symmetry("Z2", sectors={0: 2, 1: 2}))
    st = mera.evenbly_vidal(model, cfg)
    s, _ = trajectory(st, st.init(key=jax.random.key(1)), 6, observe=mera.observe)
    return model, cfg, s.mera


def _dense_top_choice(m, chi):
    """The charges of the chi largest eigenvalues of the dense ½(ρ_AB + ρ_BA) at the top (NumPy eigh; the charge
    of an eigenvector read off its support)."""
    leg = m.rho_ab.legs[0]
    rho = 0.5 * (np.asarray(m.rho_ab.to_dense()) + np.asarray(m.rho_ba.to_dense()))
    n = leg.dim
    vals, vecs = np.linalg.eigh(rho.reshape(n * n, n * n))
    q = leg.charge_of_index()
    pair_q = ((q[:, None] + q[None, :]) % 2).reshape(-1)
    counts = {}
    for i in np.argsort(-vals, kind="stable")[:chi]:
        weights = {c: float(np.sum(vecs[pair_q == c, i] ** 2)) for c in (0, 1)}
        c = max(weights, key=weights.get)
        assert weights[c] > 1 - 1e-10  # a symmetric ρ's eigenvectors have one charge
        counts[c] = counts.get(c, 0) + 1
    return counts


def test_spectrum_sectors_and_grow_keep_the_energy():
    """The sectors of a larger χ are the charges of the largest eigenvalues of the top two-site density matrix
    (against NumPy's eigh of the dense ρ); growing to them with mix=0 keeps the energy (to 1e-12) and every
    tensor an isometry."""
    with jax.enable_x64(True):
        model, cfg, m = _optimised_z2_chi4()
        sym = MS.spectrum_sectors(m, cfg.symmetry, 7)
        assert dict(sym.sectors[-1]) == _dense_top_choice(m, 7)
        assert sum(d for _, d in sym.sectors[-1]) == 7 and sym.sectors[0] == sym.sectors[-1]
        grown, cfg2 = MS.grow_by_spectrum(m, jax.random.key(2), model, cfg, 7, mix=0.0)
        assert cfg2.symmetry == sym and grown.chis == (7, 7)
        e_old = mera.energy_per_site(m, MS.symmetric_terms(model, cfg.symmetry))
        e_new = mera.energy_per_site(grown, MS.symmetric_terms(model, cfg2.symmetry))
        np.testing.assert_allclose(e_new, e_old, rtol=0, atol=1e-12)
        assert max(mera.isometry_errors(mera.to_dense(grown)).values()) < 1e-12
        with pytest.raises(ValueError, match=r"would shrink in charge 0") as exc:
            MS.grow_symmetric(grown, jax.random.key(3), model, cfg)
        assert "\n" not in str(exc.value)


@pytest.mark.slow
@pytest.mark.parametrize("group", ["Z2", "U1"])
def test_grown_ladder_equals_dense(group):
    """A ladder stage grown from the spectra (Z2 Ising χ 4 → 6; U(1) XX χ 4 → 10, where new charges ±2 appear):
    the symmetric sweeps after the growth equal the dense sweeps from the grown MERA's embedding to 1e-10."""
    with jax.enable_x64(True):
        if group == "Z2":
            model, sectors, chi = mera.ising(), {0: 2, 1: 2}, 6
        else:
            model, sectors, chi = mera.xx(), {-1: 1, 0: 2, 1: 1}, 10
        cfg = mera.MERAConfig(chi=4, layers=1, u_delay=1, symmetry=mera.Symmetry(group, sectors=sectors))
        st = mera.evenbly_vidal(model, cfg)
        s, _ = trajectory(st, st.init(key=jax.random.key(1)), 6, observe=mera.observe)
        grown, cfg2 = MS.grow_by_spectrum(s.mera, jax.random.key(2), model, cfg, chi)
        if group == "U1":
            assert len(cfg2.symmetry.sectors[-1]) > 3  # charges beyond -1, 0, 1
        st2 = mera.evenbly_vidal(model, cfg2)
        s2, e = trajectory(st2, st2.init(mera=grown), 5, observe=mera.observe)
        dst = mera.evenbly_vidal(model, dataclasses.replace(cfg2, symmetry=None))
        _, de = trajectory(dst, dst.init(mera=mera.to_dense(grown, model, cfg2.symmetry)), 5, observe=mera.observe)
    np.testing.assert_allclose(np.asarray(e), np.asarray(de), rtol=0, atol=1e-10)
    assert e[-1] < e[0]


def test_steppers_of_equal_models_share_a_structure():
    """The stepper's static parameters are hashable and compare equal for equal models (two separately built
    mera.ising() steppers: jit's cache compares them, which must not raise)."""
    with jax.enable_x64(True):
        cfg = mera.MERAConfig(chi=4, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 2, 1: 2}))
        a, b = (mera.evenbly_vidal(mera.ising(), cfg) for _ in range(2))
        ta, tb = (jax.tree_util.tree_structure(x.params) for x in (a, b))
        assert ta == tb and hash(ta) == hash(tb)


def _xx_ring_levels(n_sites, charges, k=24):
    """(E − E₀)·N/(2πv) and the S^z charge of the lowest levels of the periodic XX chain H = −¼Σ(XX + YY)
    (v = 1), by exact diagonalisation in each S^z sector (SciPy, float64)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

    levels = []
    for q in charges:
        states = [s for s in range(1 << n_sites) if bin(s).count("1") == n_sites // 2 - q]
        index = {s: i for i, s in enumerate(states)}
        rows, cols = [], []
        for s in states:
            for i in range(n_sites):
                j = (i + 1) % n_sites
                if (s >> i) & 1 != (s >> j) & 1:
                    rows.append(index[s ^ ((1 << i) | (1 << j))])
                    cols.append(index[s])
        h = sp.csr_matrix((np.full(len(rows), -0.5), (rows, cols)), shape=(len(states),) * 2)
        levels += [(e, q) for e in sla.eigsh(h, k=min(k, len(states) - 2), which="SA", return_eigenvectors=False)]
    e0 = min(e for e, _ in levels)
    return [((e - e0) * n_sites / (2 * np.pi), q) for e, q in levels]


def test_xx_cft_table_against_exact_diagonalisation():
    """The XX chain's CFT table (every operator up to Δ = 5/4, with its U(1) charge) is the low spectrum of the
    periodic 12-site chain: each level's Δ within the finite-size shift (0.06) of a table entry of the same charge,
    and the multiset of (Δ, charge) equal."""
    table = sorted((op.delta, op.charges[0]) for op in mera.CFTS["xx"].operators)
    assert len(table) == 17 and max(d for d, _ in table) == 1.25
    levels = sorted((d, q) for d, q in _xx_ring_levels(12, range(-3, 4)) if d < 1.5)
    assert len(levels) == len(table)
    for (d, _), (dt, _) in zip(levels, table):
        assert abs(d - dt) < 0.06
    from collections import Counter

    assert Counter((round(d * 4) / 4, q) for d, q in levels) == Counter(table)


def test_more_bad_inputs_one_line():
    """Sectors that do not add up in a transitional layer or in χ_mid, spin charges outside the group or of the
    wrong length, a model that does not commute with the symmetry (Potts in its σ basis under Z3, checked
    numerically on its term), a ladder that would shrink: one line naming the argument."""
    cases = [
        (
            lambda: mera.evenbly_vidal(
                mera.ising(),
                mera.MERAConfig(
                    chi=(6, 8, 8),
                    layers=2,
                    symmetry=mera.Symmetry("Z2", sectors=[{0: 3, 1: 2}, {0: 4, 1: 4}, {0: 4, 1: 4}]),
                ),
            ),
            r"symmetry.sectors\[0\] add up to 5 .* chi=6",
        ),
        (
            lambda: mera.evenbly_vidal(
                mera.ising(),
                mera.MERAConfig(
                    chi=6,
                    chi_mid=3,
                    layers=1,
                    symmetry=mera.Symmetry("Z2", sectors={0: 3, 1: 3}, mid_sectors={0: 2, 1: 2}),
                ),
            ),
            r"symmetry.mid_sectors\[0\] add up to 4 .* chi_mid=3",
        ),
        (
            lambda: mera.Symmetry("Z2", sectors={0: 2, 1: 2}, spin_charges=(0, 2)),
            r"spin_charges=2 is outside the group Z2",
        ),
        (lambda: mera.Symmetry("U1", sectors={0: 2, 0.5: 2}), r"0.5 is not a charge of U1"),
        (
            lambda: mera.evenbly_vidal(
                mera.ising(),
                mera.MERAConfig(
                    chi=4, layers=1, symmetry=mera.Symmetry("Z2", sectors={0: 2, 1: 2}, spin_charges=(0, 1, 1))
                ),
            ),
            r"spin_charges has 3 entries, the model's spins have d=2",
        ),
        (
            lambda: mera.evenbly_vidal(
                mera.potts(),
                mera.MERAConfig(
                    chi=9, layers=1, symmetry=mera.Symmetry("Z3", sectors={0: 3, 1: 3, 2: 3}, spin_charges=(0, 1, 2))
                ),
            ),
            r"potts\(f=1\) does not commute with the Z3 symmetry",
        ),
    ]
    with jax.enable_x64(True):
        for fn, pattern in cases:
            with pytest.raises(ValueError, match=pattern) as exc:
                fn()
            assert "\n" not in str(exc.value)
        # the same chain in its charge basis commutes (its term is the σ-basis term conjugated by the Fourier
        # transform: the same spectrum on an open chain of 4 spins)
        MS.check_commutes(MS.potts_charge_basis(), mera.Symmetry("Z3", sectors={0: 3, 1: 3, 2: 3}))
        rings = []
        for model in (mera.potts(), MS.potts_charge_basis()):
            t = np.asarray(model.term).reshape(9, 9)
            h = sum(np.kron(np.kron(np.eye(3**i), t), np.eye(3 ** (2 - i))) for i in range(3))  # 4 open spins
            rings.append(np.linalg.eigvalsh(h))
        np.testing.assert_allclose(rings[0], rings[1], atol=1e-10)
        model, cfg, m = _optimised_z2_chi4()
        shrink = r"layer 0 would shrink from \(chi_mid, chi\) = \(4, 4\) to \(2, 4\); a ladder only grows"
        with pytest.raises(ValueError, match=shrink) as exc:
            MS.spectrum_sectors(m, cfg.symmetry, 4, 2)
        assert "\n" not in str(exc.value)


@pytest.mark.slow
def test_z3_potts_matches_dense():
    """Z3 Potts in its charge basis (χ = 9 = 3 + 3 + 3, χ_mid = 3 = 1 + 1 + 1): energies equal to the dense MERA's
    to 1e-10, and the scaling dimensions carry Z3 charges (the charged ones come in conjugate pairs 1, 2)."""
    with jax.enable_x64(True):
        model = MS.potts_charge_basis()
        sym = mera.Symmetry("Z3", sectors={0: 3, 1: 3, 2: 3}, mid_sectors=[None, {0: 1, 1: 1, 2: 1}])
        cfg = mera.MERAConfig(chi=9, chi_mid=(9, 3), layers=1, u_delay=1, symmetry=sym)
        s, e, de = _run_both(model, cfg, 6)
        dims, charges = mera.charged_scaling_dimensions(s.mera, 81)
    np.testing.assert_allclose(e[1:], de[1:], rtol=0, atol=1e-10)
    assert e[-1] < e[1]
    assert sorted(np.unique(charges).tolist()) == [0, 1, 2]
    np.testing.assert_allclose(np.sort(dims[charges == 1]), np.sort(dims[charges == 2]), atol=1e-8)


@pytest.mark.slow  # three eager spectra and growths (~30 s)
def test_xx_grown_sectors_keep_plus_minus_q_equal():
    """XX commutes with the spin flip (charge conjugation q → −q), so the sectors grown from the spectra give every
    charge q and −q the same dimension on every bond, also where the total is odd (the odd state goes to charge
    0), starting from an unoptimised MERA whose spectra in q and −q differ; a U(1) chain in a field has no such
    symmetry."""
    with jax.enable_x64(True):
        model = mera.xx()
        cfg = mera.MERAConfig(chi=4, layers=1, symmetry=mera.Symmetry("U1", sectors={-1: 1, 0: 2, 1: 1}))
        assert MS.charge_conjugation_symmetric(model, cfg.symmetry)
        m = mera.evenbly_vidal(model, cfg).init(key=jax.random.key(1)).mera
        for chi, mid in ((7, 5), (10, 8), (12, 10)):
            grown, cfg2 = MS.grow_by_spectrum(m, jax.random.key(2), model, cfg, chi, mid, mix=0.0)
            assert grown.chis == (chi, chi) and grown.chi_mids[-1] == mid
            for sectors, total in zip(cfg2.symmetry.sectors + cfg2.symmetry.mid_sectors[1:], (chi, chi, mid)):
                d = dict(sectors)
                assert sum(d.values()) == total
                assert all(d.get(-q, 0) == n for q, n in d.items()), (chi, mid, d)
        field = mera.two_site(np.asarray(model.term) + 0.3 * np.diag([1.0, 0.0, 0.0, -1.0]).reshape(2, 2, 2, 2))
        assert not MS.charge_conjugation_symmetric(field, mera.Symmetry("U1", {0: 1}, spin_charges=(0, 1)))


@pytest.mark.parametrize("name", ["xx", "potts"])
def test_default_sectors_keep_plus_minus_q_equal(name):
    """Without sectors, a layer's χ is split in proportion to what its isometry carries; for a chain symmetric under
    q → −q (XX, Potts in its charge basis) every bond's split keeps q and −q equal on every layer, the odd state on
    charge 0 (a split that favours −q on a tie drifts further on every layer above: XX at χ/χ_mid 8/6 with three
    layers would carry charges −4 … 1). Ising's Z2 split is unchanged ({0: 4, 1: 4} at χ = 8)."""
    model, group = (mera.xx(), "U1") if name == "xx" else (MS.potts_charge_basis(), "Z3")
    g = mera.Symmetry(group).group
    for chi, mid, layers in ((8, 6, 3), (8, 6, 2), (12, 9, 2), (16, 12, 3), (5, 4, 1)):
        cfg = mera.MERAConfig(chi=chi, chi_mid=mid, layers=layers, refsym=True, symmetry=mera.Symmetry(group))
        for z, ll in enumerate(MS.layer_legs(model, cfg)):
            for leg in (ll.mid, ll.out):
                d = dict(zip(leg.charges, leg.dims))
                assert all(d.get(int(g.reduce(-q)), 0) == n for q, n in d.items()), (chi, mid, layers, z, d)
    legs = MS.layer_legs(mera.xx(), mera.MERAConfig(chi=8, chi_mid=6, layers=3, symmetry=mera.Symmetry("U1")))
    assert [dict(zip(ll.out.charges, ll.out.dims)) for ll in legs] == [{-1: 2, 0: 4, 1: 2}] * 4
    legs = MS.layer_legs(mera.ising(), mera.MERAConfig(chi=8, chi_mid=6, layers=2, symmetry=mera.Symmetry("Z2")))
    assert dict(zip(legs[-1].out.charges, legs[-1].out.dims)) == {0: 4, 1: 4}


@pytest.mark.slow  # an eager spectrum of a three-layer MERA and two growths (~30 s)
def test_grow_inserts_layers_as_the_dense_ladder():
    """A config with more transitional layers inserts copies of the scale-invariant layer below it: with the same
    sectors and mix=0 the dense embedding equals the dense ladder's ``mera.grow(..., layers=)`` of the embedded
    MERA exactly; a grown-by-spectrum stage with an extra layer has the new χ on every layer and stays isometric."""
    with jax.enable_x64(True):
        model = mera.ising()
        sym = mera.Symmetry("Z2", sectors={0: 2, 1: 2})
        cfg = mera.MERAConfig(chi=4, layers=1, symmetry=sym)
        m = mera.evenbly_vidal(model, cfg).init(key=jax.random.key(1)).mera
        deeper = dataclasses.replace(cfg, layers=2)
        grown = MS.grow_symmetric(m, jax.random.key(2), model, deeper, mix=0.0)
        assert grown.num_layers == 3
        want = mera.grow(mera.to_dense(m), jax.random.key(3), 4, mix=0.0, layers=2)
        for a, b in zip(jax.tree.leaves(mera.to_dense(grown)), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        big, cfg2 = MS.grow_by_spectrum(m, jax.random.key(4), model, cfg, 6, layers=2)
        assert cfg2.layers == 2 and big.chis == (6, 6, 6)
        assert max(mera.isometry_errors(mera.to_dense(big)).values()) < 1e-12
        with pytest.raises(ValueError, match="can only add layers") as exc:
            MS.grow_symmetric(grown, jax.random.key(5), model, cfg)
        assert "\n" not in str(exc.value)


@pytest.mark.slow  # 300 dense sweeps at chi 6
def test_dense_xx_mera_orders_where_the_symmetric_one_cannot():
    """Why a dense MERA can reach a lower energy than a symmetric one at the same χ: at χ/χ_mid 6/4 the dense XX
    MERA (the library's unsymmetric start) breaks U(1), one spin's ⟨X⟩ (charge ±1, zero in the exact ground state)
    well away from zero, so its energy is below what any U(1)-symmetric MERA of that χ spans. The symmetric MERA's
    embedding has ⟨X⟩ = 0 to rounding (bench/results/mera_symmetry_breaking.json, docs/guide/tensor-networks.md)."""

    def one_spin_x(m):
        rhos = (m.rho_ab, m.rho_ba)
        for z in reversed(range(m.num_layers - 1)):
            rhos = mera.descend(rhos, m.layer(z))
        one = np.einsum("abcb->ac", np.asarray(rhos[0]))
        spin = np.einsum("abcb->ac", one.reshape(2, 2, 2, 2))
        return float(spin[0, 1] + spin[1, 0])

    with jax.enable_x64(True):
        model = mera.xx()
        cfg = mera.MERAConfig(chi=6, chi_mid=4, layers=1)
        st = mera.evenbly_vidal(model, cfg)
        s, e = trajectory(st, st.init(jax.random.key(0)), 300, observe=mera.observe)
        assert abs(one_spin_x(s.mera)) > 0.02  # measured -0.048
        sym_cfg = dataclasses.replace(cfg, symmetry=mera.Symmetry("U1"))
        s0 = mera.evenbly_vidal(model, sym_cfg).init(jax.random.key(0))
        assert abs(one_spin_x(mera.to_dense(s0.mera, model, sym_cfg.symmetry))) < 1e-12
