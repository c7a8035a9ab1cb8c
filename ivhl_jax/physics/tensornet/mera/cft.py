"""The conformal field theories of the library's critical chains, one :class:`CFT` record each (:data:`CFTS`): the
central charge, the velocity of the chain's excitations, the low-lying scaling operators (Δ, label, the primary
each descends from, the charges it carries under the chain's lattice symmetry) and the OPE coefficients of the
primaries. Every consumer (the models, the scaling dimensions' labels, the OPE and central-charge measurements,
``ivhl sim mera``) reads these records.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Operator:
    """A scaling operator: its dimension Δ, its label, the primary it belongs to (itself for a primary) and the
    charges it may carry under the chain's lattice symmetry (a charged multiplet lists each member's charge)."""

    delta: float
    label: str
    primary: str
    charges: tuple[int, ...] = (0,)

    @property
    def descendant(self) -> bool:
        return self.label != self.primary


@dataclasses.dataclass(frozen=True)
class CFT:
    """One theory: ``name``, central charge ``c``, the ``velocity`` of the chain's excitations (in the units of the
    library's chain: Ising −ΣXX − ΣZ: 2; XX −¼Σ(XX + YY): 1; 3-state Potts: 3√3/2), the lattice ``symmetry`` whose
    charges label the operators, the low-lying ``operators`` (ascending Δ) and the OPE coefficients of the
    primaries ``ope``: ((α, β, γ), |C_αβγ| in the CFT's normalisation, m), m the number of equal entries of the
    C tensor in its complex basis (1 for Ising σσε; 2 for Potts σσ†ε and σσσ, whose σ, σ† form a real doublet)."""

    name: str
    c: float
    velocity: float
    symmetry: str
    operators: tuple[Operator, ...]
    ope: tuple[tuple[tuple[str, str, str], float, int], ...] = ()

    def primary(self, label: str) -> tuple[float, int]:
        """(Δ, multiplicity) of the primary ``label``: the multiplicity counts the primaries of the same Δ."""
        delta = next(op.delta for op in self.operators if op.label == label)
        return delta, sum(1 for op in self.operators if not op.descendant and op.delta == delta)

    def charges(self, label: str) -> tuple[int, ...]:
        """The charges of the operator ``label``."""
        return next(op.charges for op in self.operators if op.label == label)


def _op(delta: float, label: str, primary: str | None = None, charges: tuple[int, ...] = (0,)) -> Operator:
    return Operator(float(delta), label, label if primary is None else primary, charges)


# Ising (c = 1/2): the Virasoro towers of 1, σ (1/16, 1/16) and ε (1/2, 1/2) to level 2; σ odd under the spin flip
# ∏Z, 1 and ε even. C_σσε = 1/2 (Belavin, Polyakov & Zamolodchikov 1984).
_SIGMA = (1,)
ISING = CFT(
    "ising",
    0.5,
    2.0,
    "Z2",
    (
        _op(0.0, "1"),
        _op(0.125, "σ", charges=_SIGMA),
        _op(1.0, "ε"),
        _op(1.125, "∂σ", "σ", _SIGMA),
        _op(1.125, "∂̄σ", "σ", _SIGMA),
        _op(2.0, "T", "1"),
        _op(2.0, "T̄", "1"),
        _op(2.0, "∂ε", "ε"),
        _op(2.0, "∂̄ε", "ε"),
        _op(2.125, "∂²σ", "σ", _SIGMA),
        _op(2.125, "∂∂̄σ", "σ", _SIGMA),
        _op(2.125, "∂̄²σ", "σ", _SIGMA),
    ),
    ope=((("σ", "σ", "ε"), 0.5, 1),),
)

# 3-state Potts (c = 4/5): σ, σ† (1/15, 1/15), ε (2/5, 2/5), Z, Z† (2/3, 2/3) and level-1 descendants; in the Z3
# charge basis (mera.symmetric.potts_charge_basis) σ and Z carry ±1, ε none. C_σσ†ε = 0.5462 and C_σσσ = 1.0923
# (McCabe & Wydro 2002, the values Pfeifer, Evenbly & Vidal compare with).
_Z3 = (1, 2)
POTTS = CFT(
    "potts",
    0.8,
    1.5 * math.sqrt(3.0),
    "Z3",
    (
        _op(0.0, "1"),
        _op(2 / 15, "σ", charges=_Z3),
        _op(2 / 15, "σ†", charges=_Z3),
        _op(0.8, "ε"),
        _op(17 / 15, "∂σ", "σ", _Z3),
        _op(17 / 15, "∂̄σ", "σ", _Z3),
        _op(17 / 15, "∂σ†", "σ†", _Z3),
        _op(17 / 15, "∂̄σ†", "σ†", _Z3),
        _op(4 / 3, "Z", charges=_Z3),
        _op(4 / 3, "Z†", charges=_Z3),
        _op(1.8, "∂ε", "ε"),
        _op(1.8, "∂̄ε", "ε"),
        _op(2.0, "T", "1"),
        _op(2.0, "T̄", "1"),
    ),
    ope=((("σ", "σ", "ε"), 0.5462, 2), (("σ", "σ", "σ"), 1.0923, 2)),
)


def _vertex(n: int, m: int) -> Operator:
    return _op(n * n / 4 + m * m, f"V({n},{m})", charges=(n,))


# XX chain: the c = 1 compact boson at the free-fermion radius. Its primaries are the vertex operators V(n,m), U(1)
# charge n (S^z) and winding m, with Δ = n²/4 + m² and spin n·m, and the currents J, J̄ (Δ = 1); the list is
# complete up to Δ = 5/4 (17 operators; exact diagonalisation of the periodic chain has the same levels and
# charges, tests/physics/mera/test_symmetric.py).
XX = CFT(
    name="xx",
    c=1.0,
    velocity=1.0,
    symmetry="U1",
    operators=(
        _op(0.0, "1"),
        _vertex(1, 0),
        _vertex(-1, 0),
        _vertex(2, 0),
        _vertex(-2, 0),
        _vertex(0, 1),
        _vertex(0, -1),
        _op(1.0, "J"),
        _op(1.0, "J̄"),
        *(_vertex(n, m) for n in (1, -1) for m in (1, -1)),
        _op(1.25, "∂V(1,0)", "V(1,0)", (1,)),
        _op(1.25, "∂̄V(1,0)", "V(1,0)", (1,)),
        _op(1.25, "∂V(-1,0)", "V(-1,0)", (-1,)),
        _op(1.25, "∂̄V(-1,0)", "V(-1,0)", (-1,)),
    ),
)

#: The CFT of each of the library's critical chains, by name.
CFTS: dict[str, CFT] = {c.name: c for c in (ISING, POTTS, XX)}


def get(cft: Any, need: str = "") -> CFT:
    """The :class:`CFT` record ``cft`` (a name in :data:`CFTS` or a record); ``need="ope"``: one with tabulated
    OPE coefficients. A ValueError names ``cft`` and the choices."""
    if isinstance(cft, CFT):
        rec = cft
    elif isinstance(cft, str) and cft in CFTS:
        rec = CFTS[cft]
    else:
        raise ValueError(f"cft must be one of {sorted(CFTS)} (or a mera.cft.CFT record), got {cft!r}")
    if need == "ope" and not rec.ope:
        names = sorted(n for n, c in CFTS.items() if c.ope)
        raise ValueError(f"cft must be one of {names} (the CFTs whose OPE coefficients are tabulated), got {cft!r}")
    return rec
