"""Block tensordot against the dense einsum (NumPy, float64) on both of its product layouts: small blocks (whole
fused matrices, one product sliced into blocks) and large ones (row and column strips, one product per block)."""

import jax
import numpy as np
import pytest

from ivhl_jax.physics.tensornet import blocks as S


@pytest.mark.parametrize(
    ("sectors", "spec"),
    [
        pytest.param({0: 2, 1: 1}, "abcd,cdef->abef", marks=pytest.mark.slow),  # small blocks
        # mean output block above the strip threshold, unequal sectors; shared legs out of order on both operands
        pytest.param({0: 9, 1: 7}, "abcd,cdef->abef", marks=pytest.mark.slow),
        pytest.param({0: 9, 1: 7}, "abcd,dbef->acef", marks=pytest.mark.slow),
        ({0: 40, 1: 33}, "ab,bc->ac"),  # matrices, one shared leg: strips
    ],
)
def test_contract_matches_dense_einsum(sectors: dict, spec: str) -> None:
    """Every entry of the block contraction equals NumPy's einsum of the dense embeddings to 1e-12 (relative to
    the largest; float64 round-off of sums of at most a few hundred products), for a charge-1 and a charge-0
    operand."""
    with jax.enable_x64(True):
        ins, _ = spec.split("->")
        la, lb = ins.split(",")
        leg = S.make_leg(sectors, S.Z2)
        flows_a = [1] * (len(la) - 1) + [-1]
        legs_a = [leg.with_flow(f) for f in flows_a]
        legs_b = [leg.with_flow(-legs_a[la.index(c)].flow) if c in la else leg.with_flow(1) for c in lb]
        a = S.random_block(jax.random.key(1), legs_a, S.Z2, charge=1)
        b = S.random_block(jax.random.key(2), legs_b, S.Z2, charge=0)
        got = np.asarray(jax.jit(lambda x, y: S.contract(spec, x, y).to_dense())(a, b))
        want = np.einsum(spec, np.asarray(a.to_dense()), np.asarray(b.to_dense()))
        assert np.max(np.abs(got - want)) <= 1e-12 * np.max(np.abs(want))
