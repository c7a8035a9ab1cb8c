"""Block-sparse symmetric tensors against their dense embeddings (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.physics.tensornet import blocks as S

pytestmark = pytest.mark.usefixtures("x64")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


GROUPS = {
    "Z2": (S.Z2, [{0: 2, 1: 3}, {0: 1, 1: 2}, {0: 3, 1: 1}]),
    "Z3": (S.Zn(3), [{0: 2, 1: 1, 2: 2}, {0: 1, 1: 2, 2: 1}, {0: 2, 2: 1}]),
    "U1": (S.U1, [{-1: 1, 0: 2, 1: 1}, {-2: 1, 0: 1, 2: 2}, {-1: 2, 1: 1}]),
}


def leg(group, k, flow=1):
    return S.make_leg(GROUPS[group][1][k], GROUPS[group][0], flow)


def dense_mask(t):
    """1 on the allowed entries of t's legs, 0 elsewhere (from the charges of every dense index)."""
    q = sum(l.flow * l.charge_of_index().reshape((-1,) + (1,) * (t.ndim - 1 - i)) for i, l in enumerate(t.legs))
    return (t.group.reduce(0) == 0) and (np.mod(q - t.charge, t.group.order) == 0 if t.group.order else q == t.charge)


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("charge", [0, 1])
def test_dense_roundtrip_and_mask(group, charge):
    g = GROUPS[group][0]
    t = S.random_block(jax.random.key(1), [leg(group, 0), leg(group, 1, -1), leg(group, 2)], g, charge)
    d = np.asarray(t.to_dense())
    mask = dense_mask(t)
    assert np.all(d[~mask] == 0) and np.count_nonzero(d[mask]) == mask.sum() == t.size
    back = S.from_dense(d, t.legs, g, charge)
    assert all(np.array_equal(back.blocks[k], t.blocks[k]) for k in t.blocks)
    bad = d + 1e-3 * (~mask)
    if (~mask).any():
        with pytest.raises(ValueError, match="does not commute"):
            S.from_dense(bad, t.legs, g, charge)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_contract_matches_dense(group):
    g = GROUPS[group][0]
    k = jax.random.split(jax.random.key(2), 4)
    a = S.random_block(k[0], [leg(group, 0), leg(group, 1), leg(group, 2, -1)], g, 1 if group != "Z2" else 0)
    b = S.random_block(k[1], [leg(group, 2), leg(group, 1, -1), leg(group, 0, -1)], g, 0)
    c = S.random_block(k[2], [leg(group, 0), leg(group, 0, -1)], g, 0)
    spec = "abc,cbd,de->ae"
    out = jax.jit(lambda *x: S.contract(spec, *x))(a, b, c)
    ref = np.einsum(spec, *(np.asarray(x.to_dense()) for x in (a, b, c)), optimize=True)
    np.testing.assert_allclose(out.to_dense(), ref, atol=1e-12)
    assert out.charge == a.charge


@pytest.mark.parametrize(
    "group", [pytest.param("U1", marks=pytest.mark.slow), "Z2", pytest.param("Z3", marks=pytest.mark.slow)]
)
def test_mera_diagram_and_scalar(group):
    """A 7-tensor MERA diagram (the ascending t1) and a full contraction, against dense einsum."""
    from ivhl_jax.physics.tensornet.mera.superoperators import _T1  # the diagram the MERA uses

    g = GROUPS[group][0]
    li, lm, lo = leg(group, 0), leg(group, 1), leg(group, 2)
    ks = jax.random.split(jax.random.key(3), 4)
    w = S.random_block(ks[0], [li, lm, lo.dual()], g)
    u = S.random_block(ks[1], [li, li, lm.dual(), lm.dual()], g)
    v = S.random_block(ks[2], [lm, li, lo.dual()], g)
    h = S.random_block(ks[3], [li, li, li.dual(), li.dual()], g)
    out = jax.jit(lambda w, u, v, h: S.contract(_T1, w.conj(), u.conj(), v.conj(), h, w, u, v))(w, u, v, h)
    dn = [np.asarray(x.to_dense()) for x in (w, u, v, h)]
    ref = np.einsum(_T1, dn[0], dn[1], dn[2], dn[3], dn[0], dn[1], dn[2], optimize=True)
    np.testing.assert_allclose(out.to_dense(), ref, atol=1e-10)
    e = jax.jit(lambda o: S.scalar(S.contract("abcd,cdab->", o, o.transpose((2, 3, 0, 1)).dual())))(out)
    np.testing.assert_allclose(e, np.einsum("abcd,cdab->", ref, np.transpose(ref, (2, 3, 0, 1))), rtol=1e-12)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_transpose_fusion_polar_svd(group):
    g = GROUPS[group][0]
    t = S.random_block(jax.random.key(4), [leg(group, 0), leg(group, 1), leg(group, 2, -1)], g)
    np.testing.assert_array_equal(t.transpose((2, 0, 1)).to_dense(), jnp.transpose(t.to_dense(), (2, 0, 1)))
    mats = S.matrix_blocks(t, 1)
    back = S.from_matrix_blocks(mats, t, 1)
    np.testing.assert_array_equal(back.to_dense(), t.to_dense())
    d = np.asarray(t.to_dense()).reshape(-1, t.shape[-1])
    # singular values by charge = the dense ones
    sv = np.sort(np.concatenate([np.asarray(s) for s in S.singular_values(t, 1).values()]))
    np.testing.assert_allclose(sv, np.sort(np.linalg.svd(d, compute_uv=False)), atol=1e-12)
    if any(m.shape[0] < m.shape[1] for m in mats.values()):
        with pytest.raises(ValueError, match="no isometry exists"):
            S.polar(t, 1)
    else:
        p = jax.jit(S.polar, static_argnums=1)(t, 1)
        uu, _, vt = np.linalg.svd(d, full_matrices=False)
        np.testing.assert_allclose(np.asarray(p.to_dense()).reshape(d.shape), uu @ vt, atol=1e-10)
    # fusion of two column legs
    t2 = S.random_block(jax.random.key(5), [leg(group, 0), leg(group, 1), leg(group, 0), leg(group, 2, -1)], g)
    if any(m.shape[0] < m.shape[1] for m in S.matrix_blocks(t2, 2).values()):
        with pytest.raises(ValueError, match="no isometry exists"):
            S.polar(t2, 2)
        return
    p2 = jax.jit(S.polar, static_argnums=1)(t2, 2)
    d2 = np.asarray(t2.to_dense()).reshape(t2.shape[0] * t2.shape[1], -1)
    uu, _, vt = np.linalg.svd(d2, full_matrices=False)
    np.testing.assert_allclose(np.asarray(p2.to_dense()).reshape(d2.shape), uu @ vt, atol=1e-10)


def test_jit_vmap_grad():
    g = S.Z2
    li, lo = S.make_leg({0: 2, 1: 3}, g), S.make_leg({0: 3, 1: 2}, g)
    a = S.random_block(jax.random.key(6), [li, lo.dual()], g)
    b = S.random_block(jax.random.key(7), [lo, li.dual()], g)

    def f(x, y):
        return S.trace(S.contract("ab,bc->ac", x, y))

    ref = jnp.trace(a.to_dense() @ b.to_dense())
    np.testing.assert_allclose(jax.jit(f)(a, b), ref, rtol=1e-12)
    ga = jax.grad(f)(a, b)
    np.testing.assert_allclose(
        ga.to_dense(), jax.grad(lambda x: jnp.trace(x @ b.to_dense()))(a.to_dense()) * dense_mask(a), atol=1e-12
    )
    scales = jnp.array([1.0, 2.0, -0.5])
    out = jax.vmap(lambda s: f(a * s, b))(scales)
    np.testing.assert_allclose(out, scales * ref, rtol=1e-12)


def test_bad_inputs():
    with pytest.raises(ValueError, match="outside the group Z2"):
        S.make_leg({0: 2, 2: 1}, S.Z2)
    with pytest.raises(ValueError, match="opposite flows"):
        li = S.make_leg({0: 1, 1: 1}, S.Z2)
        x = S.random_block(jax.random.key(0), [li, li], S.Z2)
        S.contract("ab,bc->ac", x, x)
    with pytest.raises(ValueError, match="Z_n needs"):
        S.Zn(1)
