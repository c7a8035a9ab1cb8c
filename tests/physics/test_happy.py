"""ivhl_jax.physics.tensornet.happy: the [[5,1,3]] perfect tensor, the {5,4} pentagon network, its isometry and the
entanglement of boundary regions against the minimal cut (checked with NumPy float64 and exhaustive cuts)."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax.physics.tensornet import happy

_P = {"I": np.eye(2), "X": np.array([[0.0, 1.0], [1.0, 0.0]]), "Z": np.diag([1.0, -1.0])}


def _pauli(s: str) -> np.ndarray:
    return functools.reduce(np.kron, (_P[c] for c in s))


def _np_entropy_bits(rho: np.ndarray) -> float:
    p = np.linalg.eigvalsh(rho / np.trace(rho))
    p = p[p > 1e-13]
    return float(-np.sum(p * np.log2(p)))


def _exhaustive_cut(net: happy.HappyNetwork, region, bulk_open: bool) -> int:
    """Minimum over all 2**n_tensors assignments of pentagons to the two sides (independent of the max-flow)."""
    inside = set(region)
    best = 10**9
    for side in itertools.product((0, 1), repeat=net.n_tensors):
        c = sum(side[a] != side[b] for a, _, b, _ in net.bonds)
        c += sum(side[t] != (i in inside) for i, (t, _) in enumerate(net.boundary))
        if bulk_open:
            c += sum(side)
        best = min(best, c)
    return best


def test_perfect_tensor_every_split_orthogonal():
    with jax.enable_x64(True):
        t = np.asarray(happy.perfect_tensor())
    assert t.shape == (2,) * 6 and t.dtype == np.float64
    splits = 0
    for a in itertools.combinations(range(6), 3):
        b = tuple(i for i in range(6) if i not in a)
        m = np.transpose(t, a + b).reshape(8, 8)
        np.testing.assert_allclose(m @ m.T, np.eye(8), atol=1e-12)
        splits += 1
    assert splits == 20
    for k in (1, 2):  # k legs into 6 − k: an isometry up to 2**((3 − k)/2)
        for a in itertools.combinations(range(6), k):
            b = tuple(i for i in range(6) if i not in a)
            m = np.transpose(t, a + b).reshape(2**k, -1)
            np.testing.assert_allclose(m @ m.T, 2.0 ** (3 - k) * np.eye(2**k), atol=1e-12)


def test_perfect_tensor_is_the_five_qubit_code():
    """Independent check: the edge legs carry the [[5,1,3]] codewords (stabilizers +1, logical Z̄ = (−1)^a)."""
    with jax.enable_x64(True):
        t = np.asarray(happy.perfect_tensor()).reshape(2, 32)
    for g in ("XZZXI", "IXZZX", "XIXZZ", "ZXIXZ", "ZZXIX"):  # the last is the product of the four
        s = _pauli(g)
        np.testing.assert_allclose(s @ t.T, t.T, atol=1e-12)
    np.testing.assert_allclose(_pauli("ZZZZZ") @ t[0], t[0], atol=1e-12)
    np.testing.assert_allclose(_pauli("ZZZZZ") @ t[1], -t[1], atol=1e-12)
    np.testing.assert_allclose(_pauli("XXXXX") @ t[0], t[1], atol=1e-12)
    # distance 3: every weight-1 and weight-2 Pauli has zero logical matrix elements (Knill–Laflamme)
    v = t.T / 2.0
    paulis = {"X": _P["X"], "Z": _P["Z"], "Y": _P["X"] @ _P["Z"]}
    for w in (1, 2):
        for sites in itertools.combinations(range(5), w):
            for letters in itertools.product("XYZ", repeat=w):
                ops = [np.eye(2)] * 5
                for s, letter in zip(sites, letters):
                    ops[s] = paulis[letter]
                e = functools.reduce(np.kron, ops)
                np.testing.assert_allclose(v.T @ e @ v, 0.0, atol=1e-12)


@pytest.mark.parametrize("radius,faces,bonds,n_boundary", [(1, 1, 0, 5), (2, 11, 15, 25), (3, 51, 80, 95)])
def test_tiling_structure(radius, faces, bonds, n_boundary):
    net = happy.network(radius)
    assert (net.n_tensors, len(net.bonds), net.n_boundary, net.n_bulk) == (faces, bonds, n_boundary, faces)
    # a disk: V − E + F = 1; every leg is a bond end or a boundary leg, exactly once
    n_edges = len(net.bonds) + net.n_boundary
    assert len(net.vertices) - n_edges + net.n_tensors == 1
    used = [(t, leg) for t, leg, _, _ in net.bonds] + [(t, leg) for _, _, t, leg in net.bonds] + list(net.boundary)
    assert sorted(used) == [(t, leg) for t in range(net.n_tensors) for leg in range(1, 6)]
    # {5,4}: four pentagons meet at every vertex off the boundary, and each pentagon is a regular pentagon
    # of the tiling (all vertices on its circumcircle about its hyperbolic centre: equal hyperbolic edge lengths)
    deg = np.bincount(net.faces.ravel(), minlength=len(net.vertices))
    boundary_vertices = {int(net.faces[t, (leg - 1) % 5]) for t, leg in net.boundary}
    boundary_vertices |= {int(net.faces[t, leg % 5]) for t, leg in net.boundary}
    assert all(deg[v] == 4 for v in range(len(net.vertices)) if v not in boundary_vertices)
    assert max(deg) <= 4
    z = net.vertices[net.faces]
    d = np.arccosh(
        1
        + 2
        * np.abs(z - np.roll(z, -1, axis=1)) ** 2
        / ((1 - np.abs(z) ** 2) * (1 - np.abs(np.roll(z, -1, axis=1)) ** 2))
    )
    # the regular {p,q} = {5,4} pentagon: cosh(edge/2) = cos(π/p)/sin(π/q), every edge of every pentagon
    side = 2 * math.acosh(math.cos(math.pi / 5) / math.sin(math.pi / 4))
    np.testing.assert_allclose(d, side, rtol=1e-9)
    assert list(np.bincount(net.layer)[1:]) == [1, 10, 40][:radius]


def test_boundary_order_is_a_walk_around_the_patch():
    net = happy.network(2)
    # consecutive boundary legs share a vertex; legs of one pentagon are consecutive edges of it
    ends = [{int(net.faces[t, leg - 1]), int(net.faces[t, leg % 5])} for t, leg in net.boundary]
    for i in range(net.n_boundary):
        assert len(ends[i] & ends[(i + 1) % net.n_boundary]) == 1
    mid = [np.angle(np.mean(net.vertices[list(e)])) % (2 * np.pi) for e in ends]
    assert np.all(np.diff(np.unwrap(mid)) > 0)  # counter-clockwise
    assert happy.network(1).boundary == tuple((0, leg) for leg in range(1, 6))


def test_radius_one_is_the_code_and_an_isometry():
    with jax.enable_x64(True):
        net = happy.network(1)
        v = np.asarray(happy.encoding_map(net)).reshape(32, 2)
        np.testing.assert_allclose(v.T @ v, np.eye(2), atol=1e-12)
        np.testing.assert_allclose(v, np.asarray(happy.perfect_tensor()).reshape(2, 32).T / 2, atol=1e-15)
        np.testing.assert_allclose(happy.encoding_gram(net), np.eye(2), atol=1e-12)
        phi = np.array([[0.6, 0.8]])
        np.testing.assert_allclose(np.asarray(happy.boundary_state(net, phi)).ravel(), v @ phi[0], atol=1e-14)
        np.testing.assert_allclose(np.asarray(happy.encode(net, phi[0])).ravel(), v @ phi[0], atol=1e-14)


def test_radius_one_entropies_equal_min_cut_for_every_region():
    """The six-leg perfect tensor with its bulk leg open: S(A) = min(|A|, 6 − |A|) bits, every region."""
    with jax.enable_x64(True):
        net = happy.network(1)
        v = np.asarray(happy.encoding_map(net)).reshape((2,) * 6)
        psi = np.asarray(happy.boundary_state(net)).reshape((2,) * 5)
        for k in range(1, 5):
            for start in range(5):
                reg = happy.interval(net, start, k)
                s = float(happy.region_entropy(net, reg, base=2))
                cut = happy.min_cut(net, reg)
                assert cut == _exhaustive_cut(net, reg, True) == min(k, 6 - k)
                rest = [i for i in range(6) if i not in reg]
                m = np.transpose(v, list(reg) + rest).reshape(2**k, -1)
                assert abs(_np_entropy_bits(m @ m.T) - cut) < 1e-10
                assert abs(s - cut) < 1e-10, (reg, s, cut)
                # the bulk in a product state: the five-leg codewords are absolutely maximally entangled
                rest5 = [i for i in range(5) if i not in reg]
                m5 = np.transpose(psi, list(reg) + rest5).reshape(2**k, -1)
                assert abs(_np_entropy_bits(m5 @ m5.T) - happy.min_cut(net, reg, bulk_open=False)) < 1e-10


@pytest.mark.slow
def test_radius_two_encoding_is_an_isometry():
    with jax.enable_x64(True):
        net = happy.network(2)
        g = np.asarray(happy.encoding_gram(net))
        assert g.shape == (2**11, 2**11)
        np.testing.assert_allclose(g, np.eye(2**11), atol=1e-12)
        rng = np.random.default_rng(0)
        phi = rng.normal(size=(11, 2))
        psi = np.asarray(happy.boundary_state(net, phi))
        assert psi.shape == (2,) * 25
        np.testing.assert_allclose(np.sum(psi**2), np.prod(np.sum(phi**2, axis=1)), rtol=1e-12)


def test_min_cut_matches_exhaustive_search():
    net = happy.network(2)
    for length in (1, 3, 4, 6, 9, 12, 17):
        for start in range(0, 25, 3):
            reg = happy.interval(net, start, length)
            for bulk_open in (True, False):
                assert happy.min_cut(net, reg, bulk_open=bulk_open) == _exhaustive_cut(net, reg, bulk_open)
    reg = (0, 5, 6, 13)  # any set of legs, not only intervals
    assert happy.min_cut(net, reg) == _exhaustive_cut(net, reg, True)


def test_radius_two_entropies_equal_min_cut_small_regions():
    with jax.enable_x64(True):
        net = happy.network(2)
        for length in (1, 2, 3, 4, 5):
            for start in range(5):  # the patch has five-fold symmetry: starts 0..4 cover every position
                reg = happy.interval(net, start, length)
                s = float(happy.region_entropy(net, reg, base=2))
                assert abs(s - happy.min_cut(net, reg)) < 1e-10, (reg, s)


@pytest.mark.slow
def test_radius_two_entropies_equal_min_cut_all_lengths():
    """Every connected region up to 10 legs: every start up to 5 legs, then the five starts that the patch's
    five-fold rotation maps onto all the others (the cuts' symmetry checked on the way)."""
    with jax.enable_x64(True):
        net = happy.network(2)
        for length in range(1, 11):
            for start in range(25 if length <= 5 else 5):
                reg = happy.interval(net, start, length)
                s = float(happy.region_entropy(net, reg, base=2))
                cut = happy.min_cut(net, reg)
                assert cut == happy.min_cut(net, happy.interval(net, start % 5, length))
                assert abs(s - cut) < 1e-10, (reg, s, cut)


@pytest.mark.slow
def test_product_bulk_cut_is_an_upper_bound():
    """Bulk in |0…0⟩: S(A) ≤ cut without bulk legs, equal for some regions, strictly less for others."""
    with jax.enable_x64(True):
        net = happy.network(2)
        psi = np.asarray(happy.boundary_state(net))
    equal = less = 0
    for length in range(1, 7):
        for start in range(5):
            reg = list(happy.interval(net, start, length))
            rest = [i for i in range(25) if i not in reg]
            m = np.transpose(psi, reg + rest).reshape(2**length, -1)
            s = _np_entropy_bits(m @ m.T)
            cut = happy.min_cut(net, reg, bulk_open=False)
            assert s <= cut + 1e-10
            equal += abs(s - cut) < 1e-10
            less += s < cut - 0.5
    assert equal > 0 and less > 0
    m = np.transpose(psi, [2, 3, 4, 5] + [i for i in range(25) if i not in (2, 3, 4, 5)]).reshape(16, -1)
    assert abs(_np_entropy_bits(m @ m.T) - 3) < 1e-10 and happy.min_cut(net, (2, 3, 4, 5), bulk_open=False) == 4


def _overlap(net, r):
    def f(theta):
        phi = jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=1)
        return jnp.sum(r * happy.boundary_state(net, phi))

    return f


def test_jit_and_grad_through_the_contraction():
    with jax.enable_x64(True):
        net = happy.network(1)
        rng = np.random.default_rng(1)
        f = _overlap(net, jnp.asarray(rng.normal(size=(2,) * 5)))
        theta = jnp.asarray([0.7])
        np.testing.assert_allclose(jax.jit(f)(theta), f(theta), rtol=1e-12)
        h = 1e-6
        fd = (f(theta + h) - f(theta - h)) / (2 * h)
        np.testing.assert_allclose(jax.grad(f)(theta)[0], fd, rtol=1e-7)
        reg = happy.interval(net, 1, 2)
        assert abs(float(jax.jit(lambda: happy.region_entropy(net, reg, base=2))()) - 2) < 1e-10


@pytest.mark.slow
def test_jit_and_grad_through_the_radius_two_contraction():
    """The 2**25-amplitude state: jit equals eager, grad·v equals a central difference along v."""
    with jax.enable_x64(True):
        net = happy.network(2)
        rng = np.random.default_rng(1)
        f = _overlap(net, jnp.asarray(rng.normal(size=(2,) * 25)))
        theta = jnp.asarray(rng.uniform(0, np.pi, size=11))
        value, g = jax.value_and_grad(f)(theta)
        np.testing.assert_allclose(jax.jit(f)(theta), value, rtol=1e-12)
        v = jnp.asarray(rng.normal(size=11))
        h = 1e-5
        fd = (f(theta + h * v) - f(theta - h * v)) / (2 * h)
        np.testing.assert_allclose(jnp.dot(g, v), fd, rtol=1e-7)


def test_bad_input():
    with pytest.raises(ValueError, match="radius"):
        happy.network(0)
    with pytest.raises(ValueError, match="radius"):
        happy.network(happy.MAX_RADIUS + 1)
    with pytest.raises(TypeError, match="radius"):
        happy.network(1.5)
    net = happy.network(2)
    with pytest.raises(ValueError, match="bulk"):
        happy.boundary_state(net, np.ones((3, 2)))
    with pytest.raises(ValueError, match="bulk"):
        happy.boundary_state(net, np.full((11, 2), np.nan))
    with pytest.raises(ValueError, match="psi"):
        happy.encode(net, np.ones(7))
    with pytest.raises(ValueError, match="radius"):
        happy.encoding_map(net)  # 36 legs
    with pytest.raises(ValueError, match="out of range"):
        happy.min_cut(net, (0, 25))
    with pytest.raises(ValueError, match="repeated"):
        happy.min_cut(net, (1, 1))
    with pytest.raises(TypeError, match="region"):
        happy.min_cut(net, "abc")
    with pytest.raises(ValueError, match="at most 12"):
        happy.reduced_density_matrix(net, happy.interval(net, 0, 13))
    with pytest.raises(TypeError, match="HappyNetwork"):
        happy.boundary_state(2)
    with pytest.raises(ValueError, match="radius"):
        happy.boundary_state(happy.network(3))


def test_radius_two_gram_is_compiled_without_folding_the_network(capfd):
    """The perfect tensor is an argument of the compiled contraction: with it a constant, every operand of V†V is
    one and XLA evaluates the whole network while compiling (seconds, with "constant folding" alarms on stderr,
    its intermediates baked into the program). No constant of the compiled program is larger than the tensor
    (64 entries), nothing is printed, and V†V is the identity."""
    import re

    with jax.enable_x64(True):
        net = happy.network(2)
        gram = np.asarray(happy.encoding_gram(net))
        np.testing.assert_allclose(gram, np.eye(2**net.n_bulk), atol=1e-12)
        t = happy.perfect_tensor()
        text = happy._contract.lower(happy._gram_spec(net), 2 * net.n_tensors, t).compile().as_text()
    sizes = [
        math.prod(int(x) for x in dims.split(",") if x)
        for dims in re.findall(r"f(?:32|64)\[([\d,]*)\]\S* constant\(", text)
    ]
    assert max(sizes, default=1) <= 64, sorted(sizes)[-5:]
    err = capfd.readouterr().err.lower()
    assert "constant folding" not in err and "constant-folding" not in err
