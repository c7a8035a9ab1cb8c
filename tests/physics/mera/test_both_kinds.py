"""Every public ``mera`` function accepts both kinds of MERA that ``mera.evenbly_vidal`` makes: the dense one and the
block-sparse symmetric one of a config with a ``symmetry``; where the symmetric one has charges, the results carry
them, and the two kinds agree where they must (the same start embedded: equal energies and scaling dimensions)."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from ivhl_jax import mera, trajectory

SWEEPS = 100


@pytest.fixture(scope="module")
def both():
    """(dense state, symmetric state, their steppers, model, config): the symmetric Z2 Ising MERA at chi = 4 after
    100 sweeps, and the dense MERA run from its embedding."""
    with jax.enable_x64(True):
        model = mera.ising()
        cfg = mera.MERAConfig(chi=4, layers=1, u_delay=1, symmetry=mera.Symmetry("Z2"))
        sym = mera.evenbly_vidal(model, cfg)
        s, es = trajectory(sym, sym.init(jax.random.key(3)), SWEEPS, observe=mera.observe)
        dense = mera.evenbly_vidal(model, dataclasses.replace(cfg, symmetry=None))
        start = mera.to_dense(sym.init(jax.random.key(3)).mera, model)
        d, ed = trajectory(dense, dense.init(mera=start), SWEEPS, observe=mera.observe)
    return {"dense": (d, dense, np.asarray(ed)), "symmetric": (s, sym, np.asarray(es)), "model": model, "cfg": cfg}


# one call per public function: c holds the state, stepper, MERA, its terms and the model of one kind
CASES = {
    "evenbly_vidal": lambda c: c.stepper.step(c.state),
    "observe": lambda c: mera.observe(c.state, c.stepper.params),
    "energy_per_site": lambda c: mera.energy_per_site(c.m, c.h),
    "scaling_dimensions": lambda c: mera.scaling_dimensions(c.m, 4),
    "charged_scaling_dimensions": lambda c: mera.charged_scaling_dimensions(c.m, 4),
    "conformal_table": lambda c: mera.conformal_table(c.m, "ising", 3),
    "ope_coefficients": lambda c: _measured_or_refused(lambda: mera.ope_coefficients(c.m, "ising")),
    "central_charge": lambda c: mera.central_charge(c.m, c.model, levels=(1, 2)),
    "grow": lambda c: mera.grow(c.m, jax.random.key(1), 6, model=c.model),
    "cold_start": lambda c: mera.cold_start(
        c.stepper, jax.random.key(0), c.model.e0, 5, mera.StuckCheck(after=10, every=10, until=10, window=5)
    ),
    "isometry_errors": lambda c: mera.isometry_errors(c.m),
    "ascend": lambda c: mera.ascend(c.h, c.m.layer(0)),
    "descend": lambda c: mera.descend((c.m.rho_ab, c.m.rho_ba), c.m.layer(0)),
    "cast": lambda c: mera.cast(c.m, jax.numpy.float32),
    "to_dense": lambda c: mera.to_dense(c.m, c.model),
}


# and the submodules' functions that ivhl sim mera calls
SUBMODULE_CASES = {
    "two_site_scaling_dimensions": lambda c: mera.scaling.two_site_scaling_dimensions(c.m, 6),
    "level_hamiltonian": lambda c: mera.conformal.level_hamiltonian(c.m, c.model, 2),
}


def _measured_or_refused(fn):
    """The OPE coefficients, or the library's one-line refusal of a MERA away from the critical fixed point (this
    small chi = 4 MERA may be one)."""
    try:
        return fn()
    except ValueError as exc:
        assert "not at the critical fixed point" in str(exc) and "\n" not in str(exc)
        return None


# builders, records and constructors (they take no MERA) and what a test elsewhere covers for both kinds
NOT_A_MERA_FUNCTION = set(
    "MERAConfig MERAState EvenblyVidalParams MERA Model ising xx potts two_site E0_CRITICAL_ISING E0_XX "
    "E0_CRITICAL_POTTS init_tensors StuckCheck precision_dtype Symmetry CFT CFTS".split()
)


def test_every_public_function_has_a_case():
    assert set(mera.__all__) - NOT_A_MERA_FUNCTION == set(CASES)


@pytest.mark.slow  # compiles both kinds' sweeps, growths and conformal data (~60 s)
@pytest.mark.parametrize("kind", ["dense", "symmetric"])
def test_every_public_function_takes_both_kinds(both, kind):
    state, stepper, energies = both[kind]
    c = types.SimpleNamespace(state=state, stepper=stepper, m=state.mera, h=stepper.params.h, model=both["model"])
    with jax.enable_x64(True):
        out = {name: call(c) for name, call in {**CASES, **SUBMODULE_CASES}.items()}
    assert float(out["energy_per_site"]) == pytest.approx(float(energies[-1]), abs=1e-3)
    dims, charges = out["charged_scaling_dimensions"]
    np.testing.assert_array_equal(out["scaling_dimensions"], dims)
    table = out["conformal_table"]
    assert [r["delta"] for r in table] == dims[:3].tolist() and table[0]["label"] == "1"
    ope = out["ope_coefficients"]
    if kind == "symmetric":
        assert charges[0] == 0 and set(charges.tolist()) == {0, 1}
        # labels are matched within each charge: σ and its descendants odd, 1 and ε even
        assert [r["charge"] for r in table] == charges[:3].tolist()
        assert all((r["charge"] == 1) == (r["primary"] == "σ") for r in table if r["label"])
        assert ope is None or ope["C_σσε"]["allowed"] is True
        grown = out["grow"]
        assert isinstance(grown.w[0], type(state.mera.w[0])) and grown.chi == 6
        assert stepper.init(mera=grown).mera.chi == 6
    else:
        assert not charges.any() and "charge" not in table[0]
    assert ope is None or np.isfinite(ope["C_σσε"]["measured"])
    assert np.isfinite(out["central_charge"]["c"]) and out["central_charge"]["exact"] == 0.5
    assert max(out["isometry_errors"].values()) < 1e-12
    assert out["cast"].w[0].dtype == jax.numpy.float32
    assert out["two_site_scaling_dimensions"][0][0] == 0.0


@pytest.mark.slow
def test_the_two_kinds_agree(both):
    """The same start, embedded: equal energies per sweep (float64, rounding) and equal scaling dimensions."""
    (ds, _, ed), (ss, _, es) = both["dense"], both["symmetric"]
    np.testing.assert_allclose(es[1:], ed[1:], rtol=0, atol=1e-10)
    with jax.enable_x64(True):
        np.testing.assert_allclose(mera.scaling_dimensions(ss.mera, 6), mera.scaling_dimensions(ds.mera, 6), atol=1e-8)


def test_wrong_kind_of_terms_is_one_line():
    with jax.enable_x64(True):
        model = mera.ising()
        cfg = mera.MERAConfig(chi=4, layers=1, symmetry=mera.Symmetry("Z2"))
        st = mera.evenbly_vidal(model, cfg)
        m = st.init(jax.random.key(0)).mera
        with pytest.raises(TypeError, match="h is dense but the MERA is block-sparse") as exc:
            mera.energy_per_site(m, mera.models.blocked_terms(model))
        assert "\n" not in str(exc.value)
        dense = mera.evenbly_vidal(model, dataclasses.replace(cfg, symmetry=None))
        with pytest.raises(TypeError, match="mera must be a symmetric MERA") as exc:
            st.init(mera=dense.init(jax.random.key(0)).mera)
